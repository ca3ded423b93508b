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
from autoplan.algorithms import group_layers
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


# ------------------------------------------------------------------------------------------
# parameters carried in an optimizer-state argument
# ------------------------------------------------------------------------------------------


def _linen_train_state():
    """A linen MLP of five Dense layers, its ``TrainState`` step ``(state, x, y)`` and the same
    step with the parameters and Adam's state apart, ``(params, opt_state, x, y)``."""
    import optax
    from flax import linen as nn
    from flax.training import train_state

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(4):
                x = nn.tanh(nn.Dense(64)(x))
            return nn.Dense(16)(x)

    net, tx = Net(), optax.adam(1e-3)
    x, y = _xy(64, 64)
    y = y[:, :16]
    params = net.init(jax.random.key(0), x)["params"]

    def bundled(state, x, y):
        def loss(p):
            return jnp.mean((state.apply_fn({"params": p}, x) - y) ** 2)
        value, g = jax.value_and_grad(loss)(state.params)
        return value, state.apply_gradients(grads=g)

    def apart(params, opt_state, x, y):
        def loss(p):
            return jnp.mean((net.apply({"params": p}, x) - y) ** 2)
        value, g = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(g, opt_state, params)
        return value, optax.apply_updates(params, updates), opt_state

    state = train_state.TrainState.create(apply_fn=net.apply, tx=tx, params=params)
    return (autoplan.Workload(bundled, (state, x, y)),
            autoplan.Workload(apart, (params, tx.init(params), x, y)))


def test_a_train_states_parameters_are_parameters_and_its_moments_follow_their_layers():
    """A ``TrainState`` is one argument, read as optimizer state for its optax state; the
    parameters it carries are parameters (gradient buffers, the parameters' levers), and Adam's
    moments sit in their parameters' layers (they all went to the last layer, whose pipeline
    stage was then predicted to hold the whole optimizer state). The pipeline plans and their
    predictions are the ones of the same step with the parameters and Adam's state apart (but
    for the step counter's 4 bytes)."""
    bundled, apart = _linen_train_state()
    g = autoplan.trace(bundled)
    kinds = {gi.path.split("[")[0]: gi.kind for gi in g.inputs if gi.arg == 0}
    assert kinds == {".step": "optimizer_state", ".params": "parameter",
                     ".opt_state": "optimizer_state"}
    assert g.bytes_of_kind("parameter") == autoplan.trace(apart).bytes_of_kind("parameter") > 0
    owned = {ly.name: ly.params for ly in group_layers(g)}
    assert all(sum("mu" in n for n in names) == sum(".params" in n for n in names) > 0
               for ly, names in owned.items() if "Dense" in ly), owned
    plans = []
    for wl in (bundled, apart):
        res = autoplan.search(wl, "cpu:8", pipeline=True, baselines=False, cache=False,
                              microbatches=4)
        plans.append(next(p for p in res.plans if len(p.stages) > 1))
    a, b = plans
    assert a.describe() == b.describe()
    assert a.predicted.step_time == pytest.approx(b.predicted.step_time, rel=1e-9)
    for sa, sb in zip(a.stages, b.stages):
        assert sb.memory <= sa.memory <= sb.memory + 16
    report = run(a, bundled, steps=1, compiler_options=FAST)
    assert report.equivalence.matched, report.equivalence.message


def test_parameters_beside_an_optimizer_and_state_kept_by_hand():
    """``nnx.split((model, optimizer))``: the model's ``Param`` variables are parameters, Adam's
    moments (``Param`` variables too, inside the optimizer's state) are state; a dict that holds
    an optax state beside ``params`` carries parameters; momentum kept by hand under a
    ``params`` key, with no optax state, stays state."""
    import optax
    from flax import nnx

    model = nnx.Linear(8, 8, rngs=nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    graphdef, both = nnx.split((model, opt))
    x = jnp.ones((16, 8))

    def nnx_step(state, x):
        m, o = nnx.merge(graphdef, state)
        value, g = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(m)
        o.update(m, g)
        return value, nnx.state((m, o))

    g = autoplan.trace(autoplan.Workload(nnx_step, (both, x)))
    kinds = {gi.path: gi.kind for gi in g.inputs if gi.arg == 0}
    assert {p for p, k in kinds.items() if k == "parameter"} == {
        "[0]['bias'].value", "[0]['kernel'].value"}
    assert all(k == "optimizer_state" for p, k in kinds.items() if "mu" in p or "nu" in p)

    tx = optax.sgd(0.1, momentum=0.9)
    params = {"w": jnp.ones((8, 8))}

    def dict_step(b, x):
        value, grads = jax.value_and_grad(lambda p: jnp.mean((x @ p["w"]) ** 2))(b["params"])
        updates, s = tx.update(grads, b["opt_state"], b["params"])
        return value, {"params": optax.apply_updates(b["params"], updates), "opt_state": s}

    g = autoplan.trace(autoplan.Workload(dict_step, ({"params": params,
                                                      "opt_state": tx.init(params)}, x)))
    assert {gi.path: gi.kind for gi in g.inputs if gi.arg == 0} == {
        "['opt_state'][0].trace['w']": "optimizer_state", "['params']['w']": "parameter"}

    def hand_step(params, momentum, x):
        grads = jax.grad(lambda p: jnp.mean((x @ p["params"]["w"]) ** 2))(params)
        momentum = jax.tree.map(lambda m, d: 0.9 * m + d, momentum, grads)
        return jax.tree.map(lambda p, m: p - 0.1 * m, params, momentum), momentum

    both = {"params": {"w": jnp.ones((8, 8))}}
    g = autoplan.trace(autoplan.Workload(hand_step, (both, {"params": {"w": jnp.zeros((8, 8))}},
                                                     x)))
    assert [gi.kind for gi in g.inputs] == ["parameter", "optimizer_state", "batch"]


def test_what_an_optimizer_state_argument_carries_beside_parameters_stays_state():
    """Only what is surely parameters becomes parameters: an NNX trainer's model has its
    ``Param`` variables as parameters, and its batch statistics and dropout keys stay state; a
    model beside an EMA copy of it (``Param`` variables under two entries, which no rule tells
    apart) leaves everything state; so does a linen ``variables`` dict, whose ``batch_stats``
    sit beside its ``params``."""
    import optax
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.lin = nnx.Linear(8, 8, rngs=rngs)
            self.bn = nnx.BatchNorm(8, rngs=rngs)
            self.do = nnx.Dropout(0.1, rngs=rngs)

        def __call__(self, x):
            return self.do(self.bn(self.lin(x)))

    class Trainer(nnx.Module):
        def __init__(self, ema: bool):
            self.model = Net(nnx.Rngs(0))
            if ema:
                self.ema = nnx.clone(self.model)
            self.optimizer = nnx.Optimizer(self.model, optax.adam(1e-3), wrt=nnx.Param)

    x = jnp.ones((16, 8))
    for ema in (False, True):
        graphdef, state = nnx.split(Trainer(ema))

        def step(state, x, graphdef=graphdef):
            t = nnx.merge(graphdef, state)
            value, g = nnx.value_and_grad(lambda net: jnp.mean(net(x) ** 2))(t.model)
            t.optimizer.update(t.model, g)
            return value, nnx.state(t)

        g = autoplan.trace(autoplan.Workload(step, (state, x)))
        params = {gi.path for gi in g.inputs if gi.kind == "parameter"}
        if ema:
            assert params == set()
        else:
            assert params == {f"['model']['{m}']['{p}'].value"
                              for m, p in (("lin", "kernel"), ("lin", "bias"), ("bn", "scale"),
                                           ("bn", "bias"))}

    import optax as ox
    tx = ox.adam(1e-3)
    variables = {"params": {"w": jnp.ones((8, 8))}, "batch_stats": {"mean": jnp.zeros(8)}}

    def linen_step(b, x):
        value, grads = jax.value_and_grad(
            lambda p: jnp.mean((x @ p["w"] - b["variables"]["batch_stats"]["mean"]) ** 2))(
            b["variables"]["params"])
        updates, s = tx.update(grads, b["opt_state"], b["variables"]["params"])
        new = {**b["variables"], "params": ox.apply_updates(b["variables"]["params"], updates)}
        return value, {"variables": new, "opt_state": s}

    bundle = {"variables": variables, "opt_state": tx.init(variables["params"])}
    g = autoplan.trace(autoplan.Workload(linen_step, (bundle, x)))
    assert all(gi.kind == "optimizer_state" for gi in g.inputs if gi.arg == 0)


def test_moments_of_a_parameter_no_layer_reads_join_no_layer():
    """A moment is matched to a layer by an ending of its path that ends one layer's parameters
    only: an unused parameter sharing a short ending (``['w']``) with a layer's keeps its
    moments out of that layer."""
    import optax

    tx = optax.adam(1e-3)
    params = {"l0": {"k": jnp.ones((8, 8))}, "l1": {"w": jnp.ones((8, 8))},
              "unused": {"w": jnp.ones((8, 8))}}

    def step(params, opt_state, x):
        def loss(p):
            with jax.named_scope("l0"):
                h = jnp.tanh(x @ p["l0"]["k"])
            with jax.named_scope("l1"):
                h = jnp.tanh(h @ p["l1"]["w"])
            return jnp.mean(h ** 2)
        value, g = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(g, opt_state, params)
        return value, optax.apply_updates(params, updates), opt_state

    g = autoplan.trace(autoplan.Workload(step, (params, tx.init(params), jnp.ones((16, 8)))))
    owned = {ly.name: ly.params for ly in group_layers(g)}
    assert not any("unused" in n for names in owned.values() for n in names), owned
    assert any("mu['l1']['w']" in n for n in owned["l1"])


def test_a_plan_file_keeps_its_carried_parameters_under_one_field():
    """A TrainState plan holds its parameters under ``.params`` beside the optimizer's state; an
    optimizer-state leaf changed to a parameter in the file is a contradiction of the plan with
    itself, and a parameter changed to optimizer state is refused against the workload (with the
    fix to make the plan again)."""
    import copy
    import json

    from autoplan.plans._plan_check import plan_contradictions

    bundled, _ = _linen_train_state()
    plan = autoplan.plan(bundled, "cpu:8", pipeline=False, baselines=False, cache=False)
    assert plan_contradictions(plan) == []
    d = copy.deepcopy(plan.to_dict())
    next(i for i in d["inputs"] if ".opt_state" in i["path"])["kind"] = "parameter"
    found = plan_contradictions(autoplan.Plan.from_dict(json.loads(json.dumps(d))))
    assert found and "kind" in found[0].field
    d = copy.deepcopy(plan.to_dict())
    next(i for i in d["inputs"] if ".params" in i["path"])["kind"] = "optimizer_state"
    edited = autoplan.Plan.from_dict(json.loads(json.dumps(d)))
    with pytest.raises(autoplan.PlanMismatchError, match="make the plan again"):
        run(edited, bundled, steps=1, compiler_options=FAST)
