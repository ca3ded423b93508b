"""Every documented step signature in every executor (intra-operator, gradient accumulation,
pipeline), for several steps, equal to the same step run on one device; and the steps no
executor can run, refused before any work."""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from exec_cases import FAST

import autoplan
from autoplan.exec import run

B, F, H, OUT = 16, 8, 16, 4
STEPS = 3


def _init():
    ks = jax.random.split(jax.random.key(0), 5)
    params = {"l0": {"w": jax.random.normal(ks[0], (F, H)) * 0.3},
              "l1": {"w": jax.random.normal(ks[1], (H, H)) * 0.3},
              "l2": {"w": jax.random.normal(ks[2], (H, OUT)) * 0.3}}
    batch = {"x": jax.random.normal(ks[3], (B, F)), "y": jax.random.normal(ks[4], (B, OUT))}
    return params, batch


def _forward(p, x):
    for i in range(3):
        with jax.named_scope(f"layers_{i}"):
            x = x @ p[f"l{i}"]["w"]
            x = jnp.tanh(x) if i < 2 else x
    return x


def _loss(p, batch):
    return jnp.mean((_forward(p, batch["x"]) - batch["y"]) ** 2)


def _aux_loss(p, batch):
    err = _forward(p, batch["x"]) - batch["y"]
    # (means over the batch: what micro-batches average is the full batch's value)
    return jnp.mean(err ** 2), {"mae": jnp.mean(jnp.abs(err)), "bias": jnp.mean(err, axis=0)}


TX = optax.adam(1e-2)


def sgd_step(params, batch):
    loss, g = jax.value_and_grad(_loss)(params, batch)
    return loss, jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, params, g)


def adam_step(params, opt_state, batch):
    loss, g = jax.value_and_grad(_loss)(params, batch)
    updates, opt_state = TX.update(g, opt_state, params)
    return loss, optax.apply_updates(params, updates), opt_state


def lr_step(params, opt_state, batch, lr):
    loss, g = jax.value_and_grad(_loss)(params, batch)
    updates, opt_state = TX.update(g, opt_state, params)
    updates = jax.tree_util.tree_map(lambda u: u * lr * 100.0, updates)
    return loss, optax.apply_updates(params, updates), opt_state


def counter_step(params, opt_state, step, batch):
    loss, g = jax.value_and_grad(_loss)(params, batch)
    updates, opt_state = TX.update(g, opt_state, params)
    scale = 1.0 / (1.0 + step.astype(jnp.float32))
    updates = jax.tree_util.tree_map(lambda u: u * scale, updates)
    return loss, optax.apply_updates(params, updates), opt_state, step + 1


def aux_step(params, opt_state, batch):
    (loss, aux), g = jax.value_and_grad(_aux_loss, has_aux=True)(params, batch)
    updates, opt_state = TX.update(g, opt_state, params)
    return (loss, aux), optax.apply_updates(params, updates), opt_state


def eval_step(params, batch):
    return _aux_loss(params, batch)


def _args(name):
    params, batch = _init()
    opt = TX.init(params)
    return {"sgd_step": (params, batch), "adam_step": (params, opt, batch),
            "lr_step": (params, opt, batch, jnp.float32(1e-2)),
            "counter_step": (params, opt, jnp.int32(0), batch),
            "aux_step": (params, opt, batch), "eval_step": (params, batch)}[name]


STEPS_BY_NAME = {f.__name__: f for f in (sgd_step, adam_step, lr_step, counter_step, aux_step,
                                         eval_step)}
KINDS = {"lr_step": ("parameter", "optimizer_state", "batch", "input"),
         "counter_step": ("parameter", "optimizer_state", "input", "batch")}


@functools.cache
def _workload(name):
    return autoplan.Workload(STEPS_BY_NAME[name], _args(name), KINDS.get(name))


@functools.cache
def _plans(name):
    wl = _workload(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        intra = autoplan.plan(wl, "cpu:8", pipeline=False, mesh_shape=(2, 4), baselines=False)
        piped = autoplan.search(wl, "cpu:8", pipeline=True, baselines=False,
                                microbatches=2).plans
    accum = next((p for p in piped if not p.is_pipeline), None)
    stages = next((p for p in piped if p.is_pipeline), None)
    return {"intra": intra, "accumulation": accum, "pipeline": stages}


def _reference_losses(name, steps):
    """The step run ``steps`` times on one device, each from the last one's returned state."""
    fn = jax.jit(STEPS_BY_NAME[name])
    args = list(_args(name))
    losses = []
    for _ in range(steps):
        out = fn(*args)
        losses.append(float(jax.tree_util.tree_leaves(out)[0]))
        if name in ("sgd_step",):
            args[0] = out[1]
        elif name in ("adam_step", "aux_step", "lr_step"):
            args[0], args[1] = out[1], out[2]
        elif name == "counter_step":
            args[0], args[1], args[2] = out[1], out[2], out[3]
    return losses


@pytest.mark.parametrize("mode", ["intra", "accumulation", "pipeline"])
@pytest.mark.parametrize("name", list(STEPS_BY_NAME))
def test_every_signature_runs_in_every_executor(name, mode):
    plan = _plans(name)[mode]
    assert plan is not None, f"no {mode} plan for {name}"
    rep = run(plan, _workload(name), steps=STEPS, compiler_options=FAST, time_tasks=False)
    assert rep.mode == ("intra-op" if mode == "intra" else mode)
    assert rep.equivalence.matched, rep.equivalence.message
    ref = _reference_losses(name, STEPS)
    np.testing.assert_allclose(rep.losses, ref, rtol=1e-5, atol=1e-6)
    if name != "eval_step":  # the state advanced: a training step lowers the loss
        assert rep.losses[-1] < rep.losses[0]
    else:
        assert rep.losses[0] == pytest.approx(rep.losses[-1], rel=1e-6)
    if name == "counter_step":
        assert int(np.asarray(rep.outputs[3])) == STEPS


def test_signature_forms():
    from autoplan.tracing._signature import step_signature

    forms = {}
    for name, fn in STEPS_BY_NAME.items():
        args = _args(name)
        kinds = KINDS.get(name) or autoplan.Workload(fn, args).arg_kinds
        forms[name] = step_signature(jax.eval_shape(fn, *args), args, kinds).form
    assert forms == {"sgd_step": "(loss, params)", "adam_step": "(loss, params, opt_state)",
                     "lr_step": "(loss, params, opt_state)",
                     "counter_step": "(loss, params, opt_state, arg2)",
                     "aux_step": "((loss, aux), params, opt_state)",
                     "eval_step": "(loss, aux)"}


# ---- steps no executor can run -------------------------------------------------------------
def vector_loss_step(params, batch):
    per_example = jnp.mean((_forward(params, batch["x"]) - batch["y"]) ** 2, axis=-1)
    return per_example, params


def cast_step(params, batch):
    loss, g = jax.value_and_grad(_loss)(params, batch)
    new = jax.tree_util.tree_map(lambda p, d: (p - 0.1 * d).astype(jnp.float16), params, g)
    return loss, new


def reordered_step(params, opt_state, batch):
    loss, params, opt_state = adam_step(params, opt_state, batch)
    return loss, opt_state, params


def list_step(params, batch):
    loss, new = sgd_step(params, batch)
    return loss, [new["l0"], new["l1"], new["l2"]], params


@pytest.mark.parametrize("fn, words", [
    (vector_loss_step, ["scalar loss", "shape (16,)", "jnp.mean"]),
    (cast_step, ["argument 0 (params)", "f16", "f32", "astype"]),
    (reordered_step, ["in the arguments' order", "(loss, params, opt_state)"]),
    (list_step, ["result 1", "((loss, aux), params"]),
])
@pytest.mark.parametrize("mode", ["intra", "accumulation"])
def test_steps_no_executor_can_run_are_refused_before_any_work(fn, words, mode):
    params, batch = _init()
    args = (params, TX.init(params), batch) if fn is reordered_step else (params, batch)
    wl = autoplan.Workload(fn, args)
    # any plan of the same arguments: the step is refused before the plan is looked at
    plan = _plans("adam_step" if fn is reordered_step else "sgd_step")[mode]
    with pytest.raises(autoplan.StepSignatureError) as err:
        run(plan, wl, steps=2, compiler_options=FAST)
    msg = str(err.value)
    assert all(w in msg for w in words), msg
    assert "Fix:" in msg


VECTOR_MODULE = '''
import jax, jax.numpy as jnp
import autoplan


def workload(abstract: bool = True, seed: int = 0):
    params = {"w": jnp.ones((8, 4))}
    batch = jnp.ones((16, 8))

    def train_step(params, batch):
        per_example = jnp.mean((batch @ params["w"]) ** 2, axis=-1)
        return per_example[:2], params

    return autoplan.Workload(train_step, (params, batch))
'''


def test_launch_refuses_a_vector_loss_before_any_worker(tmp_path, monkeypatch):
    from autoplan.exec import launch

    (tmp_path / "vector_step.py").write_text(VECTOR_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import vector_step

    wl = vector_step.workload()
    plan = autoplan.plan(autoplan.Workload(lambda params, batch: (jnp.mean(batch @ params["w"]),
                                                                  params), wl.args),
                         "cpu:8", pipeline=False, baselines=False)
    with pytest.raises(autoplan.StepSignatureError, match=r"shape \(2,\)"):
        launch(plan, "vector_step:workload", platform="cpu", timeout=120)


TWO_ARG_MODULE = '''
import jax, jax.numpy as jnp
import autoplan


def workload(abstract: bool = False, seed: int = 0):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    params = {"w": jax.random.normal(k1, (8, 16)) * 0.3, "v": jax.random.normal(k2, (16, 4)) * 0.3}
    batch = jax.random.normal(k3, (16, 8))

    def train_step(params, batch):
        def loss_fn(p):
            return jnp.mean((jnp.tanh(batch @ p["w"]) @ p["v"]) ** 2)
        loss, g = jax.value_and_grad(loss_fn)(params)
        return loss, jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, params, g)

    return autoplan.Workload(train_step, (params, batch))
'''


def test_launch_runs_a_two_argument_step_for_several_steps(tmp_path, monkeypatch):
    from autoplan.exec import launch

    (tmp_path / "two_arg_step.py").write_text(TWO_ARG_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import two_arg_step

    wl = two_arg_step.workload()
    plan = autoplan.plan(wl, "cpu:8", pipeline=False, mesh_shape=(2, 4), baselines=False)
    result = launch(plan, "two_arg_step:workload", 2, 4, steps=3, timeout=240,
                    compiler_options=FAST).wait()
    assert result.matched
    local = run(plan, wl, steps=3, compiler_options=FAST)
    np.testing.assert_allclose(result.loss, local.losses, rtol=1e-5, atol=1e-6)
    assert result.loss[-1] < result.loss[0]
