"""PRNG keys in a training step: typed keys, raw uint32 keys, keys made inside the step and an
``nnx.Rngs`` state are traced, given the argument kind ``key``, kept replicated by the search,
run equal to one device (the random bits drawn sharded where the plan says) and exported."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

import autoplan
from autoplan._dtype import dtype_bytes, is_key_dtype, is_partitionable_key
from autoplan.exec import run
from autoplan.search.intra._strategies import strategies

FAST = {"xla_backend_optimization_level": 0}
TX = optax.sgd(0.1)


def _params():
    rng = np.random.default_rng(0)
    return {"w1": jnp.asarray(rng.standard_normal((16, 64)) / 4, jnp.float32),
            "w2": jnp.asarray(rng.standard_normal((64, 4)) / 8, jnp.float32)}


def _batch():
    rng = np.random.default_rng(1)
    return {"x": jnp.asarray(rng.standard_normal((32, 16)), jnp.float32),
            "y": jnp.asarray(rng.standard_normal((32, 4)), jnp.float32)}


def _dropout_loss(p, batch, key):
    h = jnp.tanh(batch["x"] @ p["w1"])
    keep = jax.random.bernoulli(key, 0.8, h.shape)
    h = jnp.where(keep, h / 0.8, 0.0)
    return jnp.mean((h @ p["w2"] - batch["y"]) ** 2)


def dropout_step(params, opt_state, batch, key):
    """A dropout step whose key is an argument (typed or raw)."""
    loss, g = jax.value_and_grad(_dropout_loss)(params, batch, jax.random.fold_in(key, 7))
    updates, opt_state = TX.update(g, opt_state, params)
    return loss, optax.apply_updates(params, updates), opt_state


def inner_key_step(params, opt_state, batch):
    """A step that makes its keys itself: jax.random.key, split and fold_in."""
    k1, k2 = jax.random.split(jax.random.key(0))
    key = jax.random.fold_in(k1, 3)
    loss, g = jax.value_and_grad(_dropout_loss)(params, batch, key)
    g = jax.tree.map(lambda x: x + 1e-3 * jax.random.normal(k2, x.shape), g)
    updates, opt_state = TX.update(g, opt_state, params)
    return loss, optax.apply_updates(params, updates), opt_state


def _workload(key, fn=dropout_step):
    params = _params()
    args = (params, TX.init(params), _batch()) + ((key,) if key is not None else ())
    return autoplan.Workload(fn, args)


def test_key_dtypes_have_their_key_datas_bytes():
    assert dtype_bytes("key<fry>") == 8 and dtype_bytes("key<rbg>") == 16
    assert dtype_bytes(str(jax.random.key(0).dtype)) == jax.random.key(0).dtype.itemsize
    assert is_key_dtype("key<fry>") and not is_key_dtype("uint32")
    assert is_partitionable_key("key<fry>") and not is_partitionable_key("key<rbg>")


@pytest.mark.parametrize("make", [jax.random.key, jax.random.PRNGKey], ids=["typed", "raw"])
def test_a_key_argument_is_traced_as_kind_key(make):
    wl = _workload(make(3))
    assert wl.arg_kinds == ("parameter", "optimizer_state", "batch", "key")
    g = autoplan.trace(wl)
    (gi,) = [gi for gi in g.inputs if gi.kind == "key"]
    t = g.tensors[gi.tensor]
    assert (t.dtype, t.nbytes) == (("key<fry>", 8) if make is jax.random.key else ("uint32", 8))
    assert gi.tensor in g.key_tensors
    prims = [op.primitive for op in g]
    assert "random_bits" in prims and "random_fold_in" in prims
    assert ("random_wrap" in prims) == (make is jax.random.PRNGKey)
    bits = next(op for op in g if op.primitive == "random_bits")
    assert bits.flops > bits.out_shapes[0][0] * bits.out_shapes[0][1]  # threefry's rounds
    # the key is not batch: the batch is the leading dimension of the batch argument alone
    assert wl.config == {"batch": 32}


def test_keys_made_inside_the_step_are_traced():
    g = autoplan.trace(_workload(None, inner_key_step))
    prims = {op.primitive for op in g}
    assert {"random_seed", "random_split", "random_fold_in", "random_bits"} <= prims
    assert any(t.dtype == "key<fry>" for t in g.tensors)


def test_an_nnx_rngs_state_is_a_key_argument():
    rngs = nnx.split(nnx.Rngs(0, dropout=1))[1]

    def step(params, batch, rngs_state):
        r = nnx.merge(nnx.split(nnx.Rngs(0, dropout=1))[0], rngs_state)
        return _dropout_loss(params, batch, r.dropout())

    wl = autoplan.Workload(step, (_params(), _batch(), rngs))
    assert wl.arg_kinds == ("parameter", "batch", "key")
    g = autoplan.trace(wl)
    kinds = {gi.path: (gi.kind, g.tensors[gi.tensor].dtype) for gi in g.inputs if gi.arg == 2}
    assert kinds["['dropout']['key'].value"] == ("key", "key<fry>")
    assert kinds["['dropout']['count'].value"] == ("key", "uint32")


def test_kinds_that_would_shard_a_key_are_refused():
    params = _params()
    args = (params, TX.init(params), _batch(), jax.random.key(0))
    with pytest.raises(autoplan.ModelError, match=r"argument 3 \('key'\) holds PRNG keys "
                       r"\(key<fry>\), so its kind should be 'key'.*Got arg_kinds\[3\] = 'batch'"):
        autoplan.Workload(dropout_step, args,
                          arg_kinds=("parameter", "optimizer_state", "batch", "batch"))
    with pytest.raises(autoplan.TraceError, match="should be 'key'"):
        autoplan.trace(dropout_step, *args,
                       arg_kinds=("parameter", "optimizer_state", "batch", "parameter"))
    with pytest.raises(autoplan.ModelError, match=r"kind 'key' should hold PRNG keys.*Got "
                       r"float32 at batch\['x'\].*Fix: give it the kind 'input'"):
        autoplan.Workload(dropout_step, args,
                          arg_kinds=("parameter", "optimizer_state", "key", "key"))
    # a raw key given its kind by hand is accepted
    raw = (params, TX.init(params), _batch(), jax.random.PRNGKey(0))
    wl = autoplan.Workload(dropout_step, raw, arg_kinds=("parameter", "optimizer_state", "batch",
                                                         "key"))
    assert wl.arg_kinds[3] == "key"


def test_key_operators_are_replicated_and_random_bits_shards():
    g = autoplan.trace(_workload(None, inner_key_step))
    mesh = autoplan.Cluster.preset("cpu", 8).logical_mesh((8, 1))
    unknown: set[str] = set()
    for op in g:
        if op.primitive in ("random_seed", "random_split", "random_fold_in"):
            (st,) = strategies(op, g, mesh, unknown)
            assert all(not any(s) for s in st.out_specs)
        if op.primitive == "random_bits":
            sts = strategies(op, g, mesh, unknown)
            assert len(sts) > 1 and any(any(s) for st in sts for s in st.out_specs)
            assert all(not any(s) for st in sts for s in st.in_specs if s is not None)
    assert not unknown
    # bits drawn from an RBG key stay replicated (no promise that sharded draws agree)
    rbg = autoplan.trace(lambda x, k: x * jax.random.uniform(k, x.shape),
                         jnp.ones((32, 8)), jax.random.key(0, impl="rbg"))
    op = next(op for op in rbg if op.primitive == "random_bits")
    assert op.in_dtypes[0] == "key<rbg>" and len(strategies(op, rbg, mesh)) == 1


@pytest.mark.parametrize("make", [jax.random.key, jax.random.PRNGKey], ids=["typed", "raw"])
def test_dropout_plans_run_equal_to_one_device_with_sharded_draws(make):
    wl = _workload(make(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error", autoplan.algorithms.UnsupportedPrimitiveWarning)
        res = autoplan.search(wl, "cpu:8", pipeline=False, mesh_shape=(8, 1))
    dp = next(p for p in res.baselines if p.label == "baseline: data parallel")
    (bits,) = [o for o in dp.stages[0].ops if o.primitive == "random_bits"]
    # the mask is drawn split over the batch like the activation it masks, from the whole key
    specs = {t.role: t.spec.to_pspec() for t in bits.tensors}
    assert specs == {"input": PartitionSpec(), "output": PartitionSpec("x")}
    for plan in (res.best, dp):
        key_specs = [i.spec.to_pspec() for i in plan.inputs if i.kind == "key"]
        assert key_specs == [PartitionSpec()]
        report = run(plan, wl, steps=3, compiler_options=FAST, rtol=1e-5, atol=1e-6)
        assert report.equivalence.matched, report.equivalence.message
        assert report.constraints_applied > 0
    # three steps differ (the parameters move), each equal to one device
    assert len(set(report.losses)) == 3


def test_key_shardings_go_into_the_users_own_jit():
    wl = _workload(jax.random.key(3))
    plan = next(p for p in autoplan.search(wl, "cpu:8", pipeline=False).baselines
                if p.label == "baseline: data parallel")
    sh = plan.named_shardings()
    assert sh[3] == NamedSharding(plan.mesh(), PartitionSpec())
    assert plan.partition_specs()[3] == PartitionSpec()
    step = jax.jit(dropout_step, in_shardings=sh,
                   out_shardings=(NamedSharding(plan.mesh(), PartitionSpec()), sh[0], sh[1]))
    args = jax.device_put(wl.args, sh)
    loss, new_params, _ = step(*args)
    ref_loss, ref_params, _ = jax.jit(dropout_step)(*wl.args)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(ref_params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # the plan file keeps the key's kind and replicated spec
    again = autoplan.Plan.from_json(plan.to_json())
    assert [(i.kind, i.spec.to_pspec()) for i in again.inputs if i.arg == 3] == \
        [("key", PartitionSpec())]


def test_plan_and_run_a_dropout_workload_from_the_command_line(tmp_path, monkeypatch, capsys):
    import sys
    from pathlib import Path

    from autoplan.cli import main

    folder = Path(__file__).parent / "user_models"
    monkeypatch.chdir(folder)
    path = tmp_path / "plan.json"
    try:
        assert main(["plan", "matrix_steps:workload_equinox_dropout", "--cluster", "cpu:8",
                     "--pipeline", "no", "-o", str(path)]) == 0
        assert "plan written" in capsys.readouterr().out
        plan = autoplan.Plan.from_json(str(path))
        wl = autoplan.load_workload("matrix_steps:workload_equinox_dropout")
        assert wl.arg_kinds[3] == "key"
        report = run(plan, wl, steps=3, compiler_options=FAST)
        assert report.equivalence.matched, report.equivalence.message
    finally:
        sys.modules.pop("matrix_steps", None)


def test_micro_batched_plans_of_a_step_with_random_draws_say_so_and_match_their_reference():
    """Run once per micro-batch, a dropout step draws numbers of its own for each micro-batch:
    the plan says so, and the run is compared with the same micro-batches on one device."""
    wl = _workload(jax.random.key(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = autoplan.search(wl, "cpu:8", pipeline=True, baselines=False)
    plan = next(p for p in res.plans if p.is_pipeline or p.schedule.microbatches > 1)
    assert "draws random numbers per micro-batch" in plan.summary()
    report = run(plan, wl, steps=2, compiler_options=FAST)
    assert report.equivalence.matched, report.equivalence.message

def test_the_keys_example_of_getting_started_runs(capsys):
    import pathlib
    import re

    doc = pathlib.Path(__file__).resolve().parents[1] / "docs" / "getting_started.md"
    text = doc.read_text()
    section = text[text.index("## What your step may contain"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "jax.random.bernoulli(key" in code
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, str(doc), "exec"), {})  # noqa: S102 - the documented example
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == "('parameter', 'optimizer_state', 'batch', 'key')"
    assert out[1].startswith("matched")
    assert 0.0 < float(out[-1]) < 10.0


CLOSED_KEY = jax.random.key(42)  # a concrete key a step closes over: a constant of its jaxpr


def scanned_keys_step(params, batch, key):
    """Keys stacked by a scan, drawn from under vmap, and a key constant."""
    _, keys = jax.lax.scan(lambda c, i: (c, jax.random.fold_in(c, i)), key, jnp.arange(4))

    def loss_fn(p):
        h = jnp.tanh(batch @ p)
        noise = jax.vmap(lambda k: jax.random.normal(k, (h.shape[1],)))(keys)
        mask = jax.random.bernoulli(CLOSED_KEY, 0.5, h.shape)
        return jnp.mean(jnp.where(mask, h, 0.0) ** 2) + 1e-3 * noise.sum()

    loss, g = jax.value_and_grad(loss_fn)(params)
    return loss, params - 0.1 * g


def test_stacked_keys_and_key_constants_trace_and_run():
    from autoplan.exec import flatten

    p = jnp.full((8, 16), 0.1)
    b = jnp.asarray(np.random.default_rng(0).normal(size=(16, 8)), jnp.float32)
    wl = autoplan.Workload(scanned_keys_step, (p, b, jax.random.key(1)))
    assert wl.arg_kinds == ("parameter", "batch", "key")
    g = autoplan.trace(wl)
    assert [op.out_dtypes for op in g if op.primitive == "scan_stack"] == [("key<fry>",)]
    assert [g.tensors[t].dtype for t in g.consts] == ["key<fry>"]
    # the executor's walk evaluates the keys as the step does
    out = flatten(scanned_keys_step, *wl.args)(*wl.args)
    assert float(out[0]) == float(scanned_keys_step(*wl.args)[0])
    res = autoplan.search(wl, "cpu:8", pipeline=False)
    for plan in (res.best, *res.baselines):
        assert run(plan, wl, steps=1, compiler_options=FAST).equivalence.matched


def test_a_dropout_plan_with_sharded_draws_is_launched_on_two_processes(tmp_path, monkeypatch):
    """The NNX dropout row (typed keys in an nnx.Rngs state) under the data-parallel plan, whose
    random bits are drawn split over the batch, launched on 2 worker processes by name."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    folder = root / "tests" / "user_models"
    monkeypatch.chdir(folder)
    try:
        wl = autoplan.load_workload("matrix_steps:workload_nnx_dropout")
        res = autoplan.search(wl, "cpu:8", pipeline=False)
    finally:
        sys.modules.pop("matrix_steps", None)
    dp = next(p for p in res.baselines if p.label == "baseline: data parallel")
    assert any(str(t.spec) != "RR" for o in dp.stages[0].ops if o.primitive == "random_bits"
               for t in o.tensors if t.role == "output")
    path = tmp_path / "plan.json"
    dp.to_json(str(path))
    script = tmp_path / "autoplan_cli.py"
    script.write_text("import sys\nfrom autoplan.cli import main\nsys.exit(main())\n")
    env = {**os.environ, "PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, str(script), "launch", str(path), "--model",
                          "matrix_steps:workload_nnx_dropout", "--steps", "3"], cwd=folder,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "process 1: losses" in out.stdout and "matched single-device results" in out.stdout


def test_the_graph_summary_lists_the_keys():
    g = autoplan.trace(_workload(jax.random.key(3)))
    assert "  PRNG keys      : 1 leaves (8 B), replicated" in g.summary().splitlines()
    assert "PRNG keys" not in autoplan.trace(_workload(None, inner_key_step)).summary()


def per_example_key_step(params, batch):
    """Keys inside the batch, one per example (``batch['keys']``: typed keys of shape (B,))."""
    def loss_fn(p):
        h = jnp.tanh(batch["x"] @ p["w1"])
        keep = jax.vmap(lambda k: jax.random.bernoulli(k, 0.8, h.shape[1:]))(batch["keys"])
        return jnp.mean((jnp.where(keep, h / 0.8, 0.0) @ p["w2"] - batch["y"]) ** 2)

    loss, g = jax.value_and_grad(loss_fn)(params)
    return loss, jax.tree.map(lambda a, b: a - 0.1 * b, params, g)


def test_keys_are_never_pinned_sharded():
    wl = _workload(jax.random.key(3))
    with pytest.raises(autoplan.SearchError, match=r"should not shard PRNG keys.*Got "
                       r"P\('x',\) for key \(kind 'key'\)"):
        autoplan.search(wl, "cpu:8", pipeline=False, pins={r"^key$": PartitionSpec("x")})
    # keys in the batch, one per example: the data-parallel baseline splits the batch's arrays
    # and keeps the keys whole
    batch = {**_batch(), "keys": jax.random.split(jax.random.key(0), 32)}
    wl = autoplan.Workload(per_example_key_step, (_params(), batch))
    assert wl.arg_kinds == ("parameter", "batch") and wl.config == {"batch": 32}
    res = autoplan.search(wl, "cpu:8", pipeline=False, mesh_shape=(8, 1),
                          pins={r"batch": PartitionSpec("x")})
    for plan in (res.best, *res.baselines):
        specs = {i.path: i.spec.to_pspec() for i in plan.inputs if i.kind == "batch"}
        assert specs["['keys']"] == PartitionSpec()
        assert run(plan, wl, steps=1, compiler_options=FAST).equivalence.matched
    assert specs["['x']"] == PartitionSpec("x")


def test_a_wider_sharded_pin_leaves_out_the_keys_it_matches():
    """A sharded pattern over the batch pins the batch's arrays and not its PRNG keys, which
    stay replicated (a replicated pin still reaches them)."""
    from autoplan.search.intra._intra import make_logical_mesh
    from autoplan.search.intra._pins import pin_specs, pinned_by

    batch = {**_batch(), "keys": jax.random.split(jax.random.key(0), 32)}
    g = autoplan.trace(autoplan.Workload(per_example_key_step, (_params(), batch)))
    names = {gi.name: gi.tensor for gi in g.inputs}
    key = names["batch['keys']"]
    assert key in g.key_tensors
    sharded = pinned_by(g, {r"batch": PartitionSpec("x")})
    assert set(sharded) == {names["batch['x']"], names["batch['y']"]}
    mesh = make_logical_mesh(autoplan.Cluster.parse("cpu:8"), (8, 1))
    specs = pin_specs(g, mesh, {r"batch": PartitionSpec("x")})
    assert key not in specs and specs[names["batch['x']"]] == (("x",), None)
    assert key in pinned_by(g, {r"batch": PartitionSpec()})


def test_a_duck_typed_workload_with_keys_gets_the_kind_key_or_a_clear_refusal():
    import types

    params = _params()
    args = (params, TX.init(params), _batch(), jax.random.key(0))
    loaded = autoplan.load_workload(types.SimpleNamespace(fn=dropout_step, args=args))
    assert loaded.arg_kinds == ("parameter", "optimizer_state", "batch", "key")
    bad = types.SimpleNamespace(fn=dropout_step, args=args,
                                arg_kinds=("parameter", "optimizer_state", "batch", "batch"))
    with pytest.raises(autoplan.ModelError, match="should be 'key'"):
        autoplan.load_workload(bad)


def test_the_graph_names_its_random_draws():
    g = autoplan.trace(_workload(jax.random.key(3)))
    assert [g.ops[i].primitive for i in g.random_draws] == ["random_bits"]
    plain = autoplan.trace(lambda w, x: (x @ w).sum(), jnp.ones((4, 2)), jnp.ones((8, 4)))
    assert plain.random_draws == () and plain.key_tensors == frozenset()


def test_an_nnx_rngs_object_is_a_key_argument_and_its_misuse_names_the_fix():
    def step(params, batch, rngs):
        key = rngs.dropout()  # drawn at the step's top level
        return jax.value_and_grad(_dropout_loss)(params, batch, key)

    wl = autoplan.Workload(step, (_params(), _batch(), nnx.Rngs(0, dropout=1)))
    assert wl.arg_kinds == ("parameter", "batch", "key")
    plan = autoplan.search(wl, "cpu:8", pipeline=False).best
    assert run(plan, wl, steps=1, compiler_options=FAST).equivalence.matched

    def inside(params, batch, rngs):  # the Rngs advanced inside jax.value_and_grad
        return jax.value_and_grad(lambda p: _dropout_loss(p, batch, rngs.dropout()))(params)

    with pytest.raises(autoplan.TraceError, match=r"TraceContextError.*Fix: draw keys from an "
                       r"nnx.Rngs before entering jax.grad"):
        autoplan.trace(autoplan.Workload(inside, (_params(), _batch(), nnx.Rngs(0, dropout=1))))
