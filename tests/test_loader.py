"""Workloads named by a spec: zoo names, a user's ``module:function`` found through the current
directory, the abstract/concrete protocol, and a clear error for every way a spec can be wrong."""

from __future__ import annotations

import pathlib
import sys
import textwrap

import jax
import numpy as np
import pytest

import autoplan
from autoplan import ModelError
from autoplan.tracing._loader import is_function_spec, load_workload, parse_spec, workload_spec

USER_MODELS = pathlib.Path(__file__).resolve().parent / "user_models"


@pytest.fixture
def user_dir(monkeypatch, tmp_path):
    """Run in a folder of the user's modules, as a user would: the loader finds them through the
    current directory (sys.path and sys.modules are restored afterwards)."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(USER_MODELS))])
    before = set(sys.modules)
    yield monkeypatch
    for name in set(sys.modules) - before:
        del sys.modules[name]


def write(folder: pathlib.Path, name: str, text: str) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(text))


def test_zoo_specs_round_trip():
    wl = load_workload("gpt", size="tiny", layers=1)
    assert (wl.name, wl.size, wl.config["layers"]) == ("gpt", "tiny", 1)
    assert wl.abstract
    assert workload_spec(wl) == {"model": "gpt", "size": "tiny", "layers": 1}
    assert workload_spec(load_workload({"model": "mlp"})) == {"model": "mlp", "size": "tiny"}
    assert not load_workload("mlp", abstract=False).abstract
    assert parse_spec("gpt", size=None, batch=8) == {"model": "gpt", "batch": 8}  # None dropped
    assert not is_function_spec("gpt") and is_function_spec("pkg.mod:fn")


def test_a_user_module_is_found_through_the_current_directory(user_dir):
    user_dir.chdir(USER_MODELS)
    assert not any(p in ("", str(USER_MODELS)) for p in sys.path)
    wl = load_workload("optax_mlp:workload", layers=2)
    assert isinstance(wl, autoplan.Workload) and wl.origin.kind == "function"
    assert wl.name == "optax_mlp:workload"
    assert wl.arg_kinds == ("parameter", "optimizer_state", "batch")
    assert wl.config == {"layers": 2, "batch": 16}  # the batch: the batch leaves' leading dimension
    assert wl.spec == {"model": "optax_mlp:workload", "layers": 2}
    assert workload_spec(wl) == wl.spec
    assert wl.abstract  # the function takes 'abstract': planning gets shapes only
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(wl.args))
    concrete = wl.concrete(seed=3)
    assert not concrete.abstract
    again = load_workload(wl.spec, abstract=False, seed=3)
    for a, b in zip(jax.tree_util.tree_leaves(concrete.args), jax.tree_util.tree_leaves(again.args)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # deterministic from the seed
    g = autoplan.trace(wl)
    assert g.name == "optax_mlp:workload"
    assert g.fingerprint == autoplan.trace(concrete).fingerprint
    assert g.fingerprint != autoplan.trace(load_workload("optax_mlp:workload", layers=3)).fingerprint


def test_the_concrete_data_protocol(user_dir, tmp_path):
    user_dir.chdir(tmp_path)
    write(tmp_path, "steps_mod", """
        import types
        import jax, jax.numpy as jnp

        def step(w, x):
            return ((x @ w) ** 2).sum()

        W = jax.ShapeDtypeStruct((4, 2), jnp.float32)
        X = jax.ShapeDtypeStruct((8, 4), jnp.float32)

        def concrete_only():            # arrays for planning and running alike
            return types.SimpleNamespace(fn=step, args=(jnp.ones((4, 2)), jnp.ones((8, 4))))

        class Shapes:
            fn = staticmethod(step)
            args = (W, X)
            def concrete(self, seed):
                k = jax.random.key(seed)
                return types.SimpleNamespace(fn=step, args=(jax.random.normal(k, (4, 2)),
                                                            jnp.ones((8, 4))))

        def with_concrete():            # shapes, and a concrete(seed) method
            return Shapes()

        def shapes_only():              # shapes and no way to make data
            return types.SimpleNamespace(fn=step, args=[W, X])

        WORKLOAD = types.SimpleNamespace(fn=step, args=(jnp.ones((4, 2)), jnp.ones((8, 4))))

        def public_record():            # autoplan.Workload: shapes, and init(seed) for data
            import autoplan
            return autoplan.Workload(step, (W, X), init=lambda seed: (
                jax.random.normal(jax.random.key(seed), (4, 2)), jnp.ones((8, 4))))
        """)
    wl = load_workload("steps_mod:concrete_only")
    assert not wl.abstract and wl.arg_kinds == ("parameter", "batch")
    assert load_workload("steps_mod:concrete_only", abstract=False).spec == {"model": "steps_mod:concrete_only"}
    assert load_workload("steps_mod:with_concrete").abstract
    data = load_workload("steps_mod:with_concrete", abstract=False, seed=1)
    assert not data.abstract and data.spec == {"model": "steps_mod:with_concrete"}
    assert load_workload("steps_mod:shapes_only").args[0].shape == (4, 2)  # a list is a tuple
    with pytest.raises(ModelError, match="no way to make concrete ones"):
        load_workload("steps_mod:shapes_only", abstract=False)
    rec = load_workload("steps_mod:public_record")
    assert rec.abstract and rec.config["batch"] == 8 and rec.spec == {"model": "steps_mod:public_record"}
    assert not load_workload("steps_mod:public_record", abstract=False, seed=2).abstract
    obj = load_workload("steps_mod:WORKLOAD")  # a workload object named directly
    assert obj.spec == {"model": "steps_mod:WORKLOAD"} and not obj.abstract
    with pytest.raises(ModelError, match="is a workload object, not a function"):
        load_workload("steps_mod:WORKLOAD", layers=2)


def test_objects_built_here_are_used_as_they_are_but_have_no_spec():
    import types

    import jax.numpy as jnp

    zoo = autoplan.models.get("mlp")
    assert load_workload(zoo) is zoo
    bare = load_workload(types.SimpleNamespace(fn=lambda w, x: (x @ w).sum(),
                                               args=(jnp.ones((2, 2)), jnp.ones((4, 2)))))
    assert isinstance(bare, autoplan.Workload) and bare.spec is None and bare.origin.kind == "object"
    assert workload_spec(bare) is None  # cannot travel to a worker


def test_bad_specs_are_clear_errors(user_dir, tmp_path):
    user_dir.chdir(tmp_path)
    write(tmp_path, "bad_mod", """
        import types
        import jax.numpy as jnp

        def raises(n: int = 1):
            raise ValueError("the user's own bug")

        def returns_a_number():
            return 3

        def good(hidden: int = 4):
            return types.SimpleNamespace(fn=lambda w: w.sum(), args=(jnp.ones((hidden,)),))
        """)
    write(tmp_path, "broken_import", "import no_such_dependency_xyz\n")
    cases = [
        ("nosuchmodel", {}, "zoo model name .* or a user's 'module:function'. Got 'nosuchmodel'"),
        ("bad mod:fn", {}, "should be written 'module:function'"),
        ("pkg.mod:", {}, "should be written 'module:function'"),
        ("no_such_module_xyz:fn", {}, "no module named 'no_such_module_xyz' in the current directory"),
        ("broken_import:fn", {}, "importing module 'broken_import' failed: .*no_such_dependency_xyz"),
        ("bad_mod:missing", {}, r"has no attribute 'missing'. Functions it defines: \['good', 'raises', 'returns_a_number'\]"),
        ("bad_mod:good", {"depth": 3}, r"was given keyword argument\(s\) \['depth'\] it does not take"),
        ("bad_mod:raises", {}, "raised ValueError: the user's own bug .*bad_mod.py:6 in raises"),
        ("bad_mod:returns_a_number", {}, "should return an autoplan.models.Workload or an object with fn"),
        ({"size": "tiny"}, {}, "should have a 'model' key"),
        (3, {}, "should be a zoo model name"),
        ("gpt", {"size": "huge"}, "Size of model 'gpt' should be one of"),
    ]
    for spec, kwargs, message in cases:
        with pytest.raises(ModelError, match=message):
            load_workload(spec, **kwargs)
    with pytest.raises(ModelError, match="JSON values"):
        parse_spec("bad_mod:good", hidden=object())
    assert load_workload("bad_mod:good", hidden=3).args[0].shape == (3,)


def test_zoo_loaded_and_user_workloads_are_one_type_with_their_origin(user_dir):
    import jax.numpy as jnp

    user_dir.chdir(USER_MODELS)
    zoo = autoplan.models.get("mlp", layers=5)
    loaded = load_workload("optax_mlp:workload", layers=2)
    user = autoplan.Workload(lambda w, x: (x @ w).sum(), (jnp.ones((4, 2)), jnp.ones((8, 4))))
    assert autoplan.models.Workload is autoplan.Workload
    assert all(type(wl) is autoplan.Workload for wl in (zoo, loaded, user))
    assert (zoo.origin.kind, zoo.origin.model, zoo.size, dict(zoo.origin.kwargs)) == (
        "zoo", "mlp", "tiny", {"layers": 5})
    assert (loaded.origin.kind, loaded.origin.model, loaded.size, dict(loaded.origin.kwargs)) == (
        "function", "optax_mlp:workload", None, {"layers": 2})
    assert (user.origin.kind, user.size, user.spec) == ("object", None, None)
    assert zoo.spec == {"model": "mlp", "size": "tiny", "layers": 5} == workload_spec(zoo)
    assert str(zoo.origin) == "mlp (tiny)" and str(loaded.origin) == "optax_mlp:workload"
    # made concrete, each keeps its origin
    assert zoo.concrete(1).origin == zoo.origin and loaded.concrete(1).origin == loaded.origin


def test_there_is_one_arg_kinds():
    import re

    from autoplan.tracing._graph import ARG_KINDS
    from autoplan.tracing._workload import ARG_KINDS as workload_kinds

    assert workload_kinds is ARG_KINDS
    root = pathlib.Path(autoplan.__file__).parent
    defined = [p.relative_to(root).as_posix() for p in root.rglob("*.py")
               if re.search(r"^ARG_KINDS\b[^=\n]*=", p.read_text(), re.M)]
    assert defined == ["tracing/_graph.py"]
    assert set(autoplan.models.get("mlp").arg_kinds) <= set(ARG_KINDS)
