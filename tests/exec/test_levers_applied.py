"""The stage executor applies a plan's memory levers: the backward runs rematerialised layers'
forward operators again (the forward hands it less), and ZeRO keeps the optimizer state,
gradient accumulators or parameters sharded over the stage's ZeRO axes; the numbers stay those
of one device."""

from __future__ import annotations

import dataclasses
import warnings

import jax
import numpy as np
import pytest
from exec_cases import workload
from exec_plans import data_parallel_plan, pipeline_plan

import autoplan
from autoplan import models
from autoplan.algorithms import pipeline_search
from autoplan.exec import run
from autoplan.exec._levers import recompute
from autoplan.plans._plan import Schedule
from autoplan.plans._spec import Spec, zero_spec


def quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


def without_levers(plan):
    return plan.with_(stages=tuple(dataclasses.replace(s, zero=0, zero_axes=(), remat_layers=())
                                   for s in plan.stages))


def with_levers(plan, zero, remat_every=1):
    """Every stage at ZeRO level ``zero`` over all its mesh axes, and every ``remat_every``-th
    of its layers rematerialised (none for 0)."""
    stages = []
    for s in plan.stages:
        remat = s.layers[::remat_every] if remat_every else ()
        stages.append(dataclasses.replace(s, zero=zero, zero_axes=tuple(s.axis_names) if zero else (),
                                          remat_layers=tuple(remat)))
    return plan.with_(stages=tuple(stages))


def specs_of(tree):
    return [leaf.sharding.spec for leaf in jax.tree_util.tree_leaves(tree)]


def zero_split(tree, axes, sizes):
    """Per leaf, whether ZeRO over ``axes`` splits it (its replicated spec gains an axis)."""
    return [zero_spec(Spec.replicated(np.ndim(x)), np.shape(x), axes, sizes)
            != Spec.replicated(np.ndim(x)) for x in jax.tree_util.tree_leaves(tree)]


@pytest.fixture(scope="module")
def searched():
    """GPT tiny on cpu:8 under half the least memory the plans without levers need: the best
    plan rematerialises layers and shards its optimizer state (ZeRO-1)."""
    wl = models.get("gpt", "tiny", layers=4, batch=32)
    cl = autoplan.Cluster.parse("cpu:8")
    least = min(p.predicted.memory_per_device
                for p in quiet(pipeline_search, wl, cl, microbatches=4).plans)
    best = quiet(pipeline_search, wl, cl, microbatches=4, memory_budget=0.5 * least).plans[0]
    assert any(s.remat_layers for s in best.stages) and any(s.zero for s in best.stages)
    return best


def test_a_searched_plan_runs_its_levers_and_matches_one_device(searched, fast):
    wl = models.get("gpt", "tiny", layers=4, batch=32, abstract=False)
    rep = quiet(run, searched, wl, steps=2, compiler_options=fast)
    plain = quiet(run, without_levers(searched), wl, steps=2, compiler_options=fast)
    assert rep.equivalence.matched and plain.equivalence.matched
    np.testing.assert_allclose(rep.losses, plain.losses, rtol=1e-6)
    # what the executor applied is what the plan holds, and the summary says it
    levers = rep.pipeline["levers"]
    assert set(levers) == {s.index for s in searched.stages if s.levers}
    for s in searched.stages:
        if s.levers:
            lv = levers[s.index]
            assert (lv["zero"], lv["zero_axes"], lv["remat_layers"]) == (
                s.zero, tuple(s.zero_axes), tuple(s.remat_layers))
            assert (lv["recomputed"] > 0) == bool(s.remat_layers)
            assert f"stage {s.index} levers: " in rep.summary()
    assert plain.pipeline["levers"] == {} and "levers:" not in plain.summary()
    # rematerialisation: each stage's forward hands its backward far less per micro-batch
    for s in searched.stages:
        held, before = rep.pipeline["held_bytes"][s.index], plain.pipeline["held_bytes"][s.index]
        if s.remat_layers:
            assert held < before / 4, (s.index, held, before)
        else:
            assert held == before
    # more operators in the backward tasks: the recomputed forward
    for s in searched.stages:
        if s.remat_layers:
            assert rep.pipeline["phases"][f"backward[{s.index}]"] > plain.pipeline["phases"][
                f"backward[{s.index}]"]
    # ZeRO-1: the optimizer state leaves the step sharded over the stage's ZeRO axes
    opt = rep.outputs[2]
    assert specs_of(opt) != specs_of(plain.outputs[2])
    assert max(m.argument for m in rep.memory.values()) < max(m.argument
                                                              for m in plain.memory.values())


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_zero_levels_and_remat_on_gradient_accumulation(zero, fast):
    """One stage over 2 micro-batches (one scanned program): the recomputation is kept apart
    from the forward by an optimization barrier; ZeRO shards what its level says."""
    wl = workload("mlp")
    base = dataclasses.replace(data_parallel_plan(wl), schedule=Schedule("1f1b", 2, 1))
    plan = with_levers(base, zero)
    rep = run(plan, wl, steps=2, compiler_options=fast)
    assert rep.mode == "accumulation" and rep.equivalence.matched
    assert rep.pipeline["levers"][0]["recomputed"] > 0
    params, opt = rep.outputs[1], rep.outputs[2]
    sizes = {"x": 8}
    split = [spec != jax.sharding.PartitionSpec() for spec in specs_of(params)]
    assert split == (zero_split(params, ("x",), sizes) if zero == 3 else [False] * len(split))
    assert any(spec != jax.sharding.PartitionSpec() for spec in specs_of(opt))


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_pipeline_with_zero_3_and_remat_matches(schedule, fast):
    """ZeRO-3 and every other layer rematerialised on a hand-made two-stage pipeline; ZB-H1's
    weight tasks recompute what they read too."""
    wl = workload("gpt")
    base = pipeline_plan(wl, schedule=schedule, microbatches=2)
    plan = with_levers(base, 3, remat_every=2)
    rep = run(plan, wl, steps=2, compiler_options=fast)
    plain = run(base, wl, steps=2, compiler_options=fast)
    assert rep.equivalence.matched
    np.testing.assert_allclose(rep.losses, plain.losses, rtol=1e-6)
    assert all(lv["recomputed"] > 0 for lv in rep.pipeline["levers"].values())
    for s in plan.stages:
        assert rep.pipeline["held_bytes"][s.index] < plain.pipeline["held_bytes"][s.index]


def test_recompute_reruns_a_layer_from_its_inputs_before_the_first_reader():
    """Two rematerialised layers a -> b: the reader of b's values gets b's operators again,
    from b's input (a value of layer a, which is read from the forward, not recomputed)."""
    from autoplan.exec._interpret import FlatOp

    a1 = FlatOp(0, "sin", (100,), (1,))
    a2 = FlatOp(1, "cos", (1,), (2,))
    b1 = FlatOp(2, "exp", (2,), (3,))
    b2 = FlatOp(3, "tanh", (3,), (4,))
    r1 = FlatOp(10, "mul", (4, 200), (5,))
    r2 = FlatOp(11, "mul", (3, 5), (6,))
    made = {1: a1, 2: a2, 3: b1, 4: b2}
    layer_of = {0: "a", 1: "a", 2: "b", 3: "b"}
    rc = recompute([r1, r2], lambda op: True, made, layer_of)
    assert [op.id for op in rc.ops] == [2, 3, 10, 11]
    assert rc.barriers == {0: (2,)} and rc.recomputed == 2


@pytest.mark.parametrize("levers,field", [
    (dict(zero=1, zero_axes=("q",)), "stages[0].zero_axes[0]"),
    (dict(zero=5, zero_axes=("x",)), "stages[0].zero"),
    (dict(zero=2), "stages[0].zero_axes"),
    (dict(remat_layers=("nope",)), "stages[0].remat_layers[0]"),
])
def test_a_plan_object_with_levers_that_contradict_it_is_refused_by_name(levers, field, fast):
    """A plan built in Python (not read from a file) whose levers name an axis its mesh lacks,
    a level past 3, no axes for a level, or a layer the stage does not hold: run refuses it
    with the field, as the plan file's reader does, before any work."""
    wl = workload("mlp")
    base = data_parallel_plan(wl)
    plan = base.with_(stages=(dataclasses.replace(base.stages[0], **levers),))
    with pytest.raises(autoplan.PlanFileError) as err:
        run(plan, wl, steps=1, compiler_options=fast)
    assert err.value.field == field and "Got" in str(err.value) and "Fix:" in str(err.value)
