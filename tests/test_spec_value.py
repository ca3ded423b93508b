"""The Spec value (autoplan.plans._spec): canonical form, PartitionSpec round trip, tiles, divisibility,
printing, pickling, and the deprecated converters of autoplan.plans._plan."""

from __future__ import annotations

import copy
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from autoplan import ArgumentError, ArgumentTypeError
from autoplan.plans._spec import Spec, split_error, tile_count, zero_spec

MESH, NAMES = (2, 4), ("x", "y")


def test_equivalent_forms_are_one_value():
    forms = [Spec(("x",), None), Spec("x", None), Spec(["x"], ()), Spec.of([["x"], None]),
             Spec.from_pspec(P("x"), 2), Spec.from_pspec(P("x", None), 2), Spec.of((("x",), None))]
    assert len(set(forms)) == 1
    assert all(f == (("x",), None) and hash(f) == hash((("x",), None)) for f in forms)
    assert all(type(f) is Spec and tuple(f) == (("x",), None) for f in forms)
    assert Spec(("x",), None) != Spec(None, ("x",)) and Spec("x") != Spec("x", None)
    assert {Spec(("x", "y"), None): 1}[(("x", "y"), None)] == 1  # plain tuples find Spec keys
    s = Spec("x", None)
    assert Spec.of(s) is s


def test_entries_are_canonical():
    s = Spec(None, "x", ["y", "z"], ())
    assert tuple(s) == (None, ("x",), ("y", "z"), None)
    assert len(s) == 4 and s[1] == ("x",) and list(s) == [None, ("x",), ("y", "z"), None]
    assert Spec() == () and Spec.replicated(3) == (None, None, None)
    with pytest.raises(ArgumentTypeError, match="mesh-axis name"):
        Spec(3)
    with pytest.raises(ArgumentTypeError, match="strings"):
        Spec([1, 2])


@pytest.mark.parametrize("pspec, ndim, spec", [
    (P(), 0, ()),
    (P(), 2, (None, None)),
    (P("x"), 2, (("x",), None)),
    (P(None, "y"), 3, (None, ("y",), None)),
    (P(("x", "y"), None, "z"), 3, (("x", "y"), None, ("z",))),
    (P(("x", "y")), 1, (("x", "y"),)),
])
def test_pspec_round_trip(pspec, ndim, spec):
    s = Spec.from_pspec(pspec, ndim)
    assert s == spec and len(s) == ndim
    assert s.to_pspec() == pspec  # one-axis entries as names, trailing None dropped
    assert Spec.from_pspec(s.to_pspec(), ndim) == s


def test_from_pspec_refuses_more_entries_than_dimensions():
    with pytest.raises(ArgumentError, match="at most one entry per dimension"):
        Spec.from_pspec(P("x", None, "y"), 2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.sampled_from(["x", "y", "z"]),
                          st.lists(st.sampled_from(["x", "y", "z"]), min_size=1, max_size=3).map(tuple)),
                max_size=5))
def test_round_trip_of_any_entries(entries):
    s = Spec(*entries)
    assert len(s) == len(entries)
    assert Spec.from_pspec(s.to_pspec(), len(s)) == s
    assert pickle.loads(pickle.dumps(s)) == s
    assert s.axes == tuple(a for e in s if e for a in e)


def test_tiles_and_axes():
    assert Spec(("x",), ("y",)).tiles(MESH, NAMES) == 8
    assert Spec(None, ("x", "y")).tiles(MESH, NAMES) == 8
    assert Spec(None, "y").tiles(MESH, NAMES) == 4
    assert Spec(None, None).tiles(MESH, NAMES) == 1 and Spec().tiles(MESH, NAMES) == 1
    assert Spec(("y", "x"), None).axes == ("y", "x")
    assert tile_count(((("x",)), None), {"x": 2, "y": 4}) == 2  # plain spec tuples too
    assert tile_count(None, {"x": 2}) == 1
    with pytest.raises(ArgumentError, match="mesh axes"):
        Spec("z", None).tiles(MESH, NAMES)


def test_zero_adds_its_axes_after_the_ones_a_dimension_already_uses():
    sizes = {"x": 2, "y": 2, "z": 4}
    # S(y)R over x, y: x joins y on dimension 0, the tiles double
    z = zero_spec(Spec("y", None), (8, 4), ("x", "y"), sizes)
    assert z == Spec(("y", "x"), None) and z.tiles((2, 2, 4), ("x", "y", "z")) == 4
    # the first dimension the extra axes divide, given what already splits it
    assert zero_spec(Spec("z", None), (4, 6), ("x",), sizes) == Spec("z", "x")
    assert zero_spec(Spec("z", None), (16, 6), ("x",), sizes) == Spec(("z", "x"), None)
    # nothing to add: every axis used already, or of size 1
    assert zero_spec(Spec("x", "y"), (8, 4), ("x", "y"), sizes) == Spec("x", "y")
    assert zero_spec(Spec(None), (8,), ("w",), {"w": 1}) == Spec(None)
    # no dimension divides the extra axes: the spec as it was
    assert zero_spec(Spec("y", None), (2, 3), ("x",), sizes) == Spec("y", None)


def test_divides():
    assert Spec("x", "y").divides((6, 8), MESH, NAMES)
    assert Spec(("x", "y"), None).divides((16, 3), MESH, NAMES)
    assert not Spec(("x", "y"), None).divides((12, 3), MESH, NAMES)  # 12 % 8
    assert not Spec(None, "y").divides((8, 6), MESH, NAMES)  # 6 % 4
    assert not Spec("x", None).divides((8,), MESH, NAMES)  # one entry per dimension
    assert not Spec("z", None).divides((8, 8), MESH, NAMES)  # not a mesh axis
    assert not Spec("x", "x").divides((8, 8), MESH, NAMES)  # an axis used twice
    assert Spec().divides((), MESH, NAMES)
    assert split_error(Spec(None, "y"), (8, 6), dict(zip(NAMES, MESH))) == (
        "dimension 1 of size 6 is not divisible by 4 (axes ('y',))")


def test_printing():
    assert str(Spec(("x",), None)) == "S(x)R"
    assert str(Spec(("x", "y"), None, "z")) == "S(x,y)RS(z)"
    assert str(Spec(None)) == "R" and str(Spec()) == "scalar"
    assert f"{Spec('x'):>6}|" == "  S(x)|"
    assert repr(Spec("x", None)) == "Spec(('x',), None)"
    assert Spec(("x",), None).pspec_text() == "P('x', None)"
    assert Spec(("x",), None).pspec_text(trim=True) == "P('x')"
    assert Spec(None, ("x", "y")).pspec_text() == "P(None, ('x', 'y'))"
    assert Spec(None).pspec_text(trim=True) == "P()"


def test_pickle_and_copy_keep_the_type():
    s = Spec(("x", "y"), None, "z")
    for again in (pickle.loads(pickle.dumps(s)), copy.copy(s), copy.deepcopy(s)):
        assert type(again) is Spec and again == s and hash(again) == hash(s)


def test_plans_store_specs():
    from autoplan.plans._plan import InputSpec, TensorSharding

    t = TensorSharding("w", "weight", (8, 4), "float32", [["x"], None])
    i = InputSpec(0, "params", "['w']", "parameter", (8, 4), "float32", (None, ("y",)))
    assert type(t.spec) is Spec and t.spec == (("x",), None) and t.tiles(MESH, NAMES) == 2
    assert type(i.spec) is Spec and i.spec == (None, ("y",))


@pytest.mark.parametrize("name, args, expected, new", [
    ("spec_to_pspec", ((("x",), None),), P("x"), "Spec.to_pspec"),
    ("pspec_to_spec", (P("x"), 2), (("x",), None), "Spec.from_pspec"),
    ("spec_str", ((("x",), None),), "S(x)R", "str(Spec)"),
])
def test_deprecated_converters_warn_and_still_work(name, args, expected, new):
    import autoplan.plans._plan as plan_module

    with pytest.warns(DeprecationWarning, match=f"{name} is deprecated.*{new.replace('(', '.').replace(')', '.')}"):
        assert getattr(plan_module, name)(*args) == expected
