"""Users' own models, planned and run as the zoo's are: a Flax NNX transformer, a Flax linen
MLP-Mixer with ``nn.remat`` blocks, an Equinox CNN, a plain-JAX CNN with a ``lax.scan`` over
residual blocks and an MLP with ``lax.cond`` clipping and a ``while_loop`` (``user_steps.py``),
each trained with an optax optimizer.

For each: the default search (pipeline included, no extra options) gives pipeline candidates;
the best plan and a 2-stage plan run matched against single-device execution; the best plan is
never predicted slower than a baseline, and the folded search is within 1% of the exhaustive
ILP's; and the plan's exported shardings work in the user's own ``jax.jit`` and ``jax.device_put``, in the user's own
pytree types.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import user_steps
from jax.sharding import NamedSharding, PartitionSpec

import autoplan
from autoplan import PlanMismatchError
from autoplan.exec import run

FAST = {"xla_backend_optimization_level": 0}


def _search(wl, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return autoplan.search(wl, "cpu:8", **kw)


@pytest.fixture(scope="module")
def searched():
    """One default search per model (shared by the tests below)."""
    cache = {}

    def get(name):
        if name not in cache:
            wl = user_steps.MAKERS[name]()
            cache[name] = (wl, _search(wl))
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(user_steps.MAKERS))
def test_default_search_has_pipeline_candidates_and_plans_run_matched(searched, name):
    wl, res = searched(name)
    assert res.stats["level"] == "auto"
    assert set(res.stats["level_used"]) == {"8x1", "4x2", "2x4", "1x8"}
    two = [p for p in res.plans if len(p.stages) == 2]
    assert two, res.table()
    for plan in (res.best, two[0]):
        report = run(plan, wl, steps=1, compiler_options=FAST)
        assert report.equivalence.matched, report.equivalence.message


@pytest.mark.parametrize("name", list(user_steps.MAKERS))
def test_best_is_never_above_a_baseline_or_the_exhaustive_search(searched, name):
    """The searched candidates alone (baselines left out of the ranking) are never predicted
    slower than a baseline, and the folded search (forced, so that it does fold: these graphs
    are small enough for ``level="auto"`` to run the exhaustive ILP) is within 1% of the
    exhaustive ILP."""
    wl, res = searched(name)
    assert res.best is res.plans[0]
    assert res.baselines and res.candidates
    best_candidate = min(p.predicted.step_time for p in res.candidates)
    assert best_candidate <= min(p.predicted.step_time for p in res.baselines)
    _assert_folded_close_to_exhaustive(wl)


def _assert_folded_close_to_exhaustive(wl):
    folded = _search(wl, level="folded", pipeline=False, baselines=False)
    assert set(folded.stats["level_used"].values()) == {"folded"}
    exhaustive = _search(wl, level="exhaustive", pipeline=False, baselines=False)
    assert set(exhaustive.stats["level_used"].values()) == {"exhaustive"}
    assert folded.best.predicted.step_time <= exhaustive.best.predicted.step_time * 1.01


@pytest.mark.parametrize("name", list(user_steps.MAKERS))
def test_exported_shardings_work_in_the_users_own_jit(searched, name):
    wl, res = searched(name)
    plan = next(p for p in res.plans if not p.is_pipeline and p.schedule.microbatches == 1)
    mesh = plan.mesh()
    shardings = plan.named_shardings()
    is_sharding = lambda x: isinstance(x, NamedSharding)  # noqa: E731
    # the user's exact tree structure: nnx.State, Equinox modules (None stays None), optax states
    assert jax.tree.structure(shardings, is_leaf=is_sharding) == jax.tree.structure(wl.args)
    assert jax.tree.structure(plan.partition_specs(like=wl.args),
                              is_leaf=lambda x: isinstance(x, PartitionSpec)) == \
        jax.tree.structure(wl.args)
    args = jax.device_put(wl.args, shardings)
    step = jax.jit(wl.fn, in_shardings=shardings,
                   out_shardings=(NamedSharding(mesh, PartitionSpec()), shardings[0], shardings[1]))
    # (compiled with XLA's fastest CPU settings, to keep the suite fast)
    loss, new_params, new_opt_state = step.lower(*args).compile(FAST)(*args)
    ref_loss, ref_params, _ = jax.jit(wl.fn).lower(*wl.args).compile(FAST)(*wl.args)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    # (Adam's first step is about lr . sign(g): where a gradient is near zero, rounding flips
    # its sign and moves the parameter by up to 2 lr, lr <= 1e-2 here)
    for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(ref_params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-2)
    assert jax.tree.structure(new_opt_state) == jax.tree.structure(wl.args[1])
    # a plan read back from its file knows which arguments it cannot rebuild by path alone
    again = autoplan.Plan.from_json(plan.to_json())
    assert again == plan and again.arg_types == plan.arg_types
    assert jax.tree.structure(again.named_shardings(like=wl), is_leaf=is_sharding) == \
        jax.tree.structure(wl.args)
    if any(again.arg_types):
        with pytest.raises(PlanMismatchError, match="like="):
            again.partition_specs()


def test_equinox_none_leaves_stay_empty_subtrees(searched):
    wl, res = searched("equinox_cnn")
    assert wl.args[0].head.bias is None  # eqx.partition left None for the bias-free head
    for plan in (res.best, *res.plans[:3]):
        specs = plan.partition_specs()
        assert specs[0].head.bias is None
        assert isinstance(plan.named_shardings(plan.mesh())[0].head.weight, NamedSharding)
    assert "None" in res.best.arg_types[0]


def test_unscoped_mlp_gets_a_two_stage_plan_that_runs_matched():
    """A plain-JAX 6-layer MLP (a Python loop, no named scopes): its layers come from mining,
    named from the parameters they read, and the pipeline search offers 2-stage plans the
    executor runs, each stage running the forward operators of its own layers."""
    from autoplan.exec._stages import (  # noqa: PLC0415
        _layer_of,
        _microbatch_abstract,
        _unit_starts,
    )
    from autoplan.search.fold._layers import op_layer_names  # noqa: PLC0415

    wl = user_steps.make_unscoped_mlp()
    g = autoplan.trace(wl)
    assert not any(g.layer_names)
    layers = autoplan.algorithms.group_layers(g)
    assert [ly.name for ly in layers] == [f"params[{k}]" for k in range(6)]
    res = _search(wl, pipeline=True, baselines=False)
    two = [p for p in res.plans if len(p.stages) == 2]
    assert two
    # the executor finds each forward operator's layer from the plan's operators: the layer the
    # search put it in (in the micro-batch trace the plan's ids are of), and so its stage
    plan = two[0]
    batch = [i for i, k in enumerate(wl.arg_kinds) if k == "batch"]
    mb = autoplan.trace(wl.fn, *_microbatch_abstract(wl.args, batch, plan.schedule.microbatches),
                        arg_kinds=wl.arg_kinds)
    layer_stage = {n: s for s, st in enumerate(plan.stages) for n in st.layers}
    starts = _unit_starts(plan, mb, layer_stage)
    names = op_layer_names(mb)
    fwd = [op for op in mb.ops if op.role == "forward"]
    assert [_layer_of(op, None, layer_stage, starts) for op in fwd] == [names[op.id] for op in fwd]
    report = run(two[0], wl, steps=1, compiler_options=FAST)
    assert report.mode == "pipeline" and report.equivalence.matched


@pytest.mark.parametrize("model", ["gpt", "mlp", "moe", "wide_resnet", "unet", "two_tower"])
def test_zoo_best_is_never_above_a_baseline_or_the_exhaustive_search(model):
    wl = autoplan.models.get(model, size="tiny")
    res = _search(wl, pipeline=False)
    best_candidate = min(p.predicted.step_time for p in res.candidates)
    assert best_candidate <= min(p.predicted.step_time for p in res.baselines)
    _assert_folded_close_to_exhaustive(wl)


def test_a_baseline_predicted_faster_is_the_best_plan_labelled_as_such(searched):
    """Whatever produced it, the plan predicted fastest is ``best``: a baseline too (here made
    faster than every candidate), unless it exceeds the memory budget."""
    import dataclasses

    from autoplan.search._api import _rank_and_pick

    _, res = searched("control_flow_mlp")
    dp = next(p for p in res.baselines if p.label == "baseline: data parallel")
    fastest = res.plans[0].predicted.step_time
    faster = dp.with_(predicted=dataclasses.replace(dp.predicted, step_time=fastest / 2))
    plans = [faster if p is dp else p for p in res.plans]
    ranked, i = _rank_and_pick(plans, None)
    assert i == 0 and ranked[0].label == "baseline: data parallel"
    budget = max(p.predicted.memory_per_device for p in res.candidates)
    heavy = faster.with_(predicted=dataclasses.replace(faster.predicted,
                                                       memory_per_device=2 * budget + 1))
    ranked, i = _rank_and_pick([heavy if p is faster else p for p in plans], budget)
    assert ranked[i].label != "baseline: data parallel"
    assert ranked[i].predicted.memory_per_device <= budget
    with pytest.raises(autoplan.InfeasiblePlanError, match="least any plan needs"):
        _rank_and_pick(plans, 1.0)
    assert res.stats["best_label"] == res.best.label
    assert res.table().splitlines()[1].startswith("*")


def test_workload_infers_argument_kinds_and_batch():
    wl = user_steps.make_nnx_transformer()
    assert wl.arg_kinds == ("parameter", "optimizer_state", "batch")
    assert wl.config == {"batch": 16}

    def step(w, x):  # names and positions
        return (x @ w).sum()

    w, x = jnp.ones((4, 2)), jnp.ones((8, 4))
    assert autoplan.Workload(step, (w, x)).arg_kinds == ("parameter", "batch")

    def swapped(batch, params):
        return (batch @ params).sum()

    assert autoplan.Workload(swapped, (x, w)).arg_kinds == ("batch", "parameter")
    opt = user_steps.optax.adam(1e-3).init(w)

    def update(a, b, c):  # an optax state is the optimizer state whatever its name
        return a

    assert autoplan.Workload(update, (opt, w, x)).arg_kinds == \
        ("optimizer_state", "parameter", "batch")
    g = autoplan.trace(step, w, x)
    assert [gi.kind for gi in g.inputs] == ["parameter", "batch"]


def test_workload_errors_name_the_value_and_the_fix():
    with pytest.raises(autoplan.ModelError, match="should be the training step"):
        autoplan.Workload(42, ())
    with pytest.raises(autoplan.ModelError, match="should be a tuple"):
        autoplan.Workload(lambda x: x, {"x": jnp.ones(3)})
    with pytest.raises(autoplan.ModelError, match="str at args"):
        autoplan.Workload(lambda x: x, ("text",))
    with pytest.raises(autoplan.ModelError, match="arg_kinds should give one of"):
        autoplan.Workload(lambda x: x, (jnp.ones(3),), arg_kinds=("weights",))
    abstract = autoplan.Workload(lambda w, x: (x @ w).sum(),
                                 (jax.ShapeDtypeStruct((4, 2), jnp.float32),
                                  jax.ShapeDtypeStruct((8, 4), jnp.float32)))
    with pytest.raises(autoplan.ModelError, match="no init"):
        abstract.concrete()
    with pytest.raises(autoplan.SearchError, match=r"Workload\(train_step, \(params"):
        autoplan.search(lambda params, batch: 0.0, "cpu:8")


def test_abstract_workload_with_init_plans_and_runs():
    def train_step(params, batch):
        loss, g = jax.value_and_grad(lambda p: jnp.mean(jnp.tanh(batch @ p) ** 2))(params)
        return loss, params - 0.1 * g

    def init(seed):
        k1, k2 = jax.random.split(jax.random.key(seed))
        return jax.random.normal(k1, (16, 16)), jax.random.normal(k2, (32, 16))

    wl = autoplan.Workload(train_step, jax.eval_shape(lambda: init(0)), init=init)
    assert wl.abstract and not wl.concrete(1).abstract
    plan = _search(wl, pipeline=False).best
    assert run(plan, wl, steps=1, compiler_options=FAST).equivalence.matched
