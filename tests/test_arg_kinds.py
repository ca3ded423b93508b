"""A step's argument kinds read off what the arguments are, beyond the usual signatures, and a
step that cannot be traced at micro-batch size: its other candidates stand, and the warning (or,
with ``pipeline=True``, the error) names what was split, what was kept whole and the fix."""

from __future__ import annotations

import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autoplan
from autoplan.exec import run
from autoplan.search._api import NoPipelineWarning
from autoplan.tracing._workload import infer_arg_kinds

FAST = {"xla_backend_optimization_level": 0}


def _params(d: int = 16):
    rng = np.random.default_rng(0)
    return [{"w": jnp.asarray(rng.standard_normal((d, d)) / 8, jnp.float32),
             "b": jnp.zeros(d, jnp.float32)} for _ in range(2)]


def _xy(n: int = 32, d: int = 16):
    rng = np.random.default_rng(1)
    return (jnp.asarray(rng.standard_normal((n, d)), jnp.float32),
            jnp.asarray(rng.standard_normal((n, d)), jnp.float32))


def _loss(p, x, y, key=None):
    for i, layer in enumerate(p):
        x = jnp.tanh(x @ layer["w"] + layer["b"])
        if key is not None:
            keep = jax.random.bernoulli(jax.random.fold_in(key, i), 0.9, x.shape)
            x = jnp.where(keep, x / 0.9, 0.0)
    return jnp.mean((x - y) ** 2)


def four_arg_step(p, x, y, key):
    """Parameters under a short name, inputs and labels apart, and a dropout key."""
    loss, g = jax.value_and_grad(_loss)(p, x, y, key)
    return loss, jax.tree.map(lambda a, b: a - 0.1 * b, p, g)


def three_arg_step(params, x, y):
    loss, g = jax.value_and_grad(_loss)(params, x, y)
    return loss, jax.tree.map(lambda a, b: a - 0.1 * b, params, g)


def fixed_batch_step(params, batch):
    """A step that writes its batch size in: it cannot run on a micro-batch."""
    def loss(p):
        h = batch.reshape(32, -1)
        return jnp.mean(jnp.tanh(h @ p["w"]) ** 2)
    value, g = jax.value_and_grad(loss)(params[0])
    return value, [jax.tree.map(lambda a, b: a - 0.1 * b, params[0], g), params[1]]


def test_labels_beside_the_inputs_are_batch_arguments_whatever_their_name():
    x, y = _xy()
    kinds = infer_arg_kinds(four_arg_step, (_params(), x, y, jax.random.key(0)))
    assert kinds == ("parameter", "batch", "batch", "key")
    # three arguments: the third was taken for optimizer state by its position
    assert infer_arg_kinds(three_arg_step, (_params(), x, y)) == ("parameter", "batch", "batch")
    # an argument whose leading dimension is not the batch's keeps the positional kind
    assert infer_arg_kinds(three_arg_step, (_params(), x, y[:5])) == (
        "parameter", "batch", "optimizer_state")
    # raw keys are never taken for examples, even when their leading dimension is the batch's
    raw = jnp.zeros((32, 2), jnp.uint32)
    assert infer_arg_kinds(three_arg_step, (_params(), x, raw))[2] != "batch"
    # momentum shaped like the parameters is state, even when its leading dimension is the
    # batch's (a batch of 16 and 16 features)
    assert infer_arg_kinds(three_arg_step, (_params(), x[:16], _params()))[2] == "optimizer_state"
    # a batch whose leaves lead with two dimensions (examples, and a (16, 16) mask) decides none
    mixed = {"x": x, "mask": jnp.ones((16, 16))}
    assert infer_arg_kinds(fixed_batch_step, (_params(), mixed)) == ("parameter", "batch")
    assert infer_arg_kinds(three_arg_step, (_params(), mixed, y))[2] != "batch"

    # Flax NNX: the graph definition (no arrays) first, the state second
    def nnx_step(graphdef, state, x, y):
        return x

    assert infer_arg_kinds(nnx_step, ((), _params(), x, y)) == ("input", "parameter", "batch",
                                                                 "batch")


def test_a_four_argument_dropout_step_gets_micro_batched_plans_that_match_one_device():
    x, y = _xy()
    wl = autoplan.Workload(four_arg_step, (_params(), x, y, jax.random.key(3)))
    assert wl.arg_kinds == ("parameter", "batch", "batch", "key")
    graph = autoplan.trace(wl)
    assert {gi.name: gi.kind for gi in graph.inputs if gi.name in ("x", "y")} == {
        "x": "batch", "y": "batch"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoPipelineWarning)
        res = autoplan.search(wl, "cpu:8", pipeline=True, baselines=False, cache=False)
    plan = next(p for p in res.plans if p.schedule.microbatches > 1)
    report = run(plan, wl, steps=2, compiler_options=FAST)
    assert report.equivalence.matched, report.equivalence.message


def test_a_step_that_cannot_be_micro_batched_keeps_its_other_plans_and_says_why():
    x, _ = _xy(32, 16)
    wl = autoplan.Workload(fixed_batch_step, (_params(), x))
    with pytest.warns(NoPipelineWarning) as got:
        res = autoplan.search(wl, "cpu:8", cache=False, baselines=False)
    assert res.plans and all(p.schedule.microbatches == 1 for p in res.plans)
    message = str(next(w.message for w in got if w.category is NoPipelineWarning))
    assert "could not be traced at micro-batch size" in message
    assert "'batch' (batch) were split into" in message and "params (parameter)" in message
    assert "arg_kinds=('parameter', 'batch')" in message and "microbatches=1" in message
    assert res.stats["pipeline_not_traced"] in message
    assert res.notes == [f"no micro-batched candidates: {res.stats['pipeline_not_traced']}"]
    # not stored in the plan cache (its key is the full-batch step's, which a mended step
    # keeps): searched again, it says the same
    for _ in range(2):
        with pytest.warns(NoPipelineWarning):
            again = autoplan.search(wl, "cpu:8", baselines=False)
        assert again.stats["cache"] == "not stored" and again.notes == res.notes
    # where no other candidate fits either, the error says why none was micro-batched
    with pytest.raises(autoplan.InfeasiblePlanError,
                       match="No micro-batched candidate was searched: .*micro-batch size"):
        autoplan.search(wl, "cpu:8", cache=False, baselines=False, memory_budget=1e3)
    with pytest.raises(autoplan.TraceError, match=r"micro-batch size.*JAX said: \w+"):
        autoplan.search(wl, "cpu:8", cache=False, baselines=False, pipeline=True)


def test_labels_given_the_kind_input_are_named_in_the_warning():
    x, y = _xy()
    wl = autoplan.Workload(three_arg_step, (_params(), x, y),
                           arg_kinds=("parameter", "batch", "input"))
    with pytest.warns(NoPipelineWarning, match=r"kept whole \(params \(parameter\), y \(input\)\)"):
        res = autoplan.search(wl, "cpu:8", cache=False, baselines=False)
    assert res.best.schedule.microbatches == 1


def test_the_command_line_plans_a_four_argument_step(tmp_path, monkeypatch, capsys):
    from autoplan.cli import main

    monkeypatch.setattr(sys, "path", list(sys.path))  # (the loader leaves the folder on it)

    (tmp_path / "kinds_step.py").write_text(textwrap.dedent("""
        import jax, jax.numpy as jnp
        import autoplan

        def step(p, x, y, key):
            def loss(p):
                h = jnp.tanh(x @ p["w"])
                h = jnp.where(jax.random.bernoulli(key, 0.9, h.shape), h / 0.9, 0.0)
                return jnp.mean((h - y) ** 2)
            value, g = jax.value_and_grad(loss)(p)
            return value, jax.tree.map(lambda a, b: a - 0.1 * b, p, g)

        def workload():
            return autoplan.Workload(step, ({"w": jnp.ones((16, 16)) / 16}, jnp.ones((32, 16)),
                                            jnp.zeros((32, 16)), jax.random.key(0)))
    """))
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "plan.json"
    try:
        assert main(["plan", "kinds_step:workload", "--cluster", "cpu:8", "--pipeline", "yes",
                     "--no-cache", "-o", str(path)]) == 0
        assert "plan written" in capsys.readouterr().out
        plan = autoplan.Plan.from_json(str(path))
        assert {i.name: i.kind for i in plan.inputs if i.name in ("x", "y")} == {
            "x": "batch", "y": "batch"}
    finally:
        sys.modules.pop("kinds_step", None)


def count_normalised_step(params, batch):
    """A batch that carries its example count: a scalar no micro-batch can take a part of."""
    def loss(p):
        return jnp.sum((jnp.tanh(batch["x"] @ p[0]["w"]) - batch["y"]) ** 2) / batch["n"]
    value, g = jax.value_and_grad(loss)(params)
    return value, jax.tree.map(lambda a, b: a - 0.1 * b, params, g)


def test_a_scalar_in_the_batch_keeps_the_other_plans_and_names_the_leaf():
    x, y = _xy()
    wl = autoplan.Workload(count_normalised_step, (_params(), {"x": x, "y": y, "n": 32.0}))
    with pytest.warns(NoPipelineWarning, match=r"batch\['n'\] \(of kind 'batch'\) has shape \(\)"):
        res = autoplan.search(wl, "cpu:8", cache=False, baselines=False)
    assert res.plans and all(p.schedule.microbatches == 1 for p in res.plans)
    assert "an argument of their own, of kind 'input'" in res.notes[0]
    with pytest.raises(autoplan.TraceError, match="cannot be split into 8 micro-batches"):
        autoplan.search(wl, "cpu:8", cache=False, baselines=False, pipeline=True)


def test_a_flax_train_state_step_with_labels_apart_runs_micro_batched_equal_to_one_device():
    """``TrainState.create`` keeps ``step=0`` as a Python int, which JAX takes as a weak
    ``int32`` and the step returns as one: the executor reads the arguments as JAX does (it
    read NumPy's ``int64`` and refused the step's result), and ``y`` is a batch argument."""
    import optax
    from flax import linen as nn
    from flax.training import train_state

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(16)(nn.tanh(nn.Dense(16)(x)))

    def step(state, x, y):
        def loss(p):
            return jnp.mean((state.apply_fn({"params": p}, x) - y) ** 2)
        value, g = jax.value_and_grad(loss)(state.params)
        return value, state.apply_gradients(grads=g)

    x, y = _xy()
    net = Net()
    state = train_state.TrainState.create(apply_fn=net.apply, tx=optax.adam(1e-2),
                                          params=net.init(jax.random.key(0), x)["params"])
    assert isinstance(state.step, int)
    wl = autoplan.Workload(step, (state, x, y))
    assert wl.arg_kinds[1:] == ("batch", "batch")
    res = autoplan.search(wl, "cpu:8", pipeline=True, baselines=False, cache=False)
    plan = next(p for p in res.plans if p.schedule.microbatches > 1)
    report = run(plan, wl, steps=2, compiler_options=FAST)
    assert report.equivalence.matched, report.equivalence.message
