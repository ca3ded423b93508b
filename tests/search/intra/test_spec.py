"""Sharding specs over a logical mesh (autoplan.search.intra._spec_space) and resharding costs (_reshard)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from autoplan import Cluster, SearchError
from autoplan.plans._spec import Spec
from autoplan.search.intra._reshard import reshard
from autoplan.search.intra._spec_space import (
    alpa_name,
    bytes_per_device,
    check_spec,
    checked_spec,
    enumerate_specs,
    shard_shape,
    spec_is_valid,
    tiles,
)

CL = Cluster.preset("p3.16xlarge")
M24 = CL.logical_mesh((2, 4))
M18 = CL.logical_mesh((1, 8))
M22 = CL.logical_mesh((2, 2))


def test_enumerate_matrix_on_2x4():
    specs = enumerate_specs((8, 8), M24)
    assert specs[0] == (None, None)
    assert len(specs) == len(set(specs)) == 9  # (3 choices for x) * (3 for y)
    assert ((("x", "y")), None) in specs and (None, ("x", "y")) in specs
    assert (("y", "x"), None) not in specs  # mesh order only
    assert [alpa_name(s, M24) for s in specs].count("S^01R") == 1


def test_enumerate_respects_divisibility_and_unit_axes():
    # dim 0 of size 3 is never split; the size-1 axis x of a 1x8 mesh is never used
    for s in enumerate_specs((3, 16), M24):
        assert s[0] is None
    for s in enumerate_specs((16, 16), M18):
        assert all("x" not in (e or ()) for e in s)
    assert enumerate_specs((3, 5), M24) == [(None, None)]
    assert enumerate_specs((), M24) == [()]
    # 2 is divisible by x (2) but not by y (4) nor by both
    assert set(enumerate_specs((2,), M24)) == {(None,), (("x",),)}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16]), min_size=0, max_size=4),
       st.sampled_from([(1, 2), (2, 2), (2, 4), (1, 8), (4, 2)]))
def test_enumerated_specs_are_valid_and_distinct(shape, mesh_shape):
    mesh = CL.logical_mesh(mesh_shape)
    specs = enumerate_specs(shape, mesh)
    assert specs[0] == (None,) * len(shape)
    assert len(specs) == len(set(specs))
    for s in specs:
        assert spec_is_valid(s, shape, mesh), (s, check_spec(s, shape, mesh))
        used = [a for e in s if e for a in e]
        assert len(used) == len(set(used))
        assert checked_spec(Spec.of(s).to_pspec(), shape, mesh) == s
        assert math.prod(shard_shape(shape, s, mesh)) * tiles(s, mesh) == math.prod(shape)


def test_tiles_shard_shape_bytes():
    s = (("x",), ("y",))
    assert tiles(s, M24) == 8
    assert shard_shape((8, 16), s, M24) == (4, 4)
    assert bytes_per_device((8, 16), "float32", s, M24) == 8 * 16 * 4 / 8
    assert bytes_per_device((8, 16), "bfloat16", (None, None), M24) == 8 * 16 * 2
    assert alpa_name(s, M24) == "S^0S^1"
    assert alpa_name((None, ("x", "y")), M24) == "RS^01"
    assert alpa_name((), M24) == "scalar"


def test_pspec_roundtrip_and_errors():
    assert Spec.of((None, ("y",))).to_pspec() == P(None, "y")
    assert Spec.of((("x", "y"), None)).to_pspec() == P(("x", "y"))
    assert checked_spec(P("x"), (8, 8), M24) == (("x",), None)
    with pytest.raises(SearchError, match="not divisible"):
        checked_spec(P("y"), (6, 8), M24)
    with pytest.raises(SearchError, match="used twice"):
        checked_spec(P("x", "x"), (8, 8), M24)
    with pytest.raises(SearchError, match="not a mesh axis"):
        checked_spec(P("z"), (8, 8), M24)
    with pytest.raises(SearchError, match="entries"):
        checked_spec(P("x", None, None), (8, 8), M24)


# ---- resharding ------------------------------------------------------------------------------

def test_reshard_slicing_is_free():
    shape = (1024, 1024)
    for dst in enumerate_specs(shape, M24):
        assert reshard((None, None), dst, shape, "float32", M24) == (0.0, ())
    # adding an axis to an already split dim (prefix kept) is a slice
    assert reshard((("x",), None), (("x", "y"), None), shape, "float32", M24)[0] == 0.0
    assert reshard((("x",), None), (("x",), ("y",)), shape, "float32", M24)[0] == 0.0


def test_reshard_all_gather_hand_value():
    shape, nbytes = (1024, 1024), 1024 * 1024 * 4
    t, comms = reshard((("y",), None), (None, None), shape, "float32", M24)
    assert [(c.kind, c.axes) for c in comms] == [("all-gather", ("y",))]
    # gathered size B = the whole tensor (x unused): alpha_y + beta_y (n-1)/n B
    assert comms[0].bytes == nbytes
    assert t == pytest.approx(M24.alpha[1] + M24.beta[1] * 3 / 4 * nbytes)
    assert t == pytest.approx(M24.collective_time("all-gather", nbytes, [1]))


def test_reshard_all_to_all_when_split_moves_dim():
    shape, nbytes = (1024, 1024), 1024 * 1024 * 4
    t, comms = reshard((("y",), None), (None, ("y",)), shape, "float32", M24)
    assert [(c.kind, c.axes) for c in comms] == [("all-to-all", ("y",))]
    # B of an all-to-all is each device's buffer: a quarter of the tensor
    assert comms[0].bytes == nbytes / 4
    assert t == pytest.approx(M24.collective_time("all-to-all", nbytes / 4, [1]))
    assert t == pytest.approx(M24.alpha[1] + M24.beta[1] * 3 / 4 * nbytes / 4)
    # with x also splitting (kept), each device holds an eighth
    t2, comms2 = reshard((("x",), ("y",)), (("x", "y"), None), shape, "float32", M24)
    assert [(c.kind, c.axes) for c in comms2] == [("all-to-all", ("y",))]
    assert comms2[0].bytes == nbytes / 8
    # both axes of a dimension moving together: one all-to-all over both
    t3, comms3 = reshard((("x", "y"), None), (None, ("x", "y")), shape, "float32", M24)
    assert [(c.kind, c.axes, c.bytes) for c in comms3] == [("all-to-all", ("x", "y"), nbytes / 8)]


def test_reshard_split_from_its_dimension_is_gathered():
    """An axis leaving a dimension it shared with another (``RS(xy) -> S(y)R``) cannot move by
    all-to-all (XLA's all-to-all moves one dimension's whole sharding): every leaving axis is
    gathered, in one all-gather over the combined group, and the result sliced."""
    shape, nbytes = (64, 1024), 64 * 1024 * 4
    t, comms = reshard((None, ("x", "y")), (("y",), None), shape, "float32", M24)
    assert [(c.kind, c.axes, c.bytes) for c in comms] == [("all-gather", ("x", "y"), nbytes)]
    assert t == pytest.approx(M24.collective_time("all-gather", nbytes, [0, 1]))


def test_reshard_gathers_leaving_axes_in_one_all_gather():
    # S^01 -> R: one all-gather over both axes, run hierarchically on a datasheet cluster: the
    # inner (in-node) axis gathers half the bytes, the cross-node axis then the whole tensor
    mesh = Cluster.preset("p3.16xlarge", nodes=2).logical_mesh((2, 8))
    shape, nbytes = (64, 1024), 64 * 1024 * 4
    t, comms = reshard((("x", "y"), None), (None, None), shape, "float32", mesh)
    assert [(c.kind, c.axes, c.bytes) for c in comms] == [("all-gather", ("x", "y"), nbytes)]
    expect = (mesh.alpha[1] + mesh.beta[1] * 7 / 8 * nbytes / 2
              + mesh.alpha[0] + mesh.beta[0] * 1 / 2 * nbytes)
    assert t == pytest.approx(expect)
    assert t == pytest.approx(mesh.collective_time("all-gather", nbytes, [0, 1]))


def test_reshard_backward_discount():
    cl = Cluster.preset("p3.16xlarge", gamma=0.5)
    mesh = cl.logical_mesh((1, 8))
    nbytes = 4096 * 4
    tf, _ = reshard((("y",),), (None,), (4096,), "float32", mesh)
    tb, _ = reshard((("y",),), (None,), (4096,), "float32", mesh, backward=True)
    assert tf == pytest.approx(mesh.alpha[1] + mesh.beta[1] * 7 / 8 * nbytes)
    assert tb == pytest.approx(mesh.alpha[1] + 0.5 * mesh.beta[1] * 7 / 8 * nbytes)
