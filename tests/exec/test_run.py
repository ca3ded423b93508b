"""Running plans: equivalence with one device for every zoo model under data- and
tensor-parallel plans, 2-stage pipelines (GPipe and 1F1B), and the refusals."""

import dataclasses
import math

import jax
import numpy as np
import pytest
from exec_cases import FAST, MODELS, graph, plan, single_device_losses, workload
from exec_plans import data_parallel_plan

from autoplan import EquivalenceError, ExecutionError, PlanMismatchError
from autoplan.algorithms import schedule_order
from autoplan.exec import RunReport, run


@pytest.mark.parametrize("kind", ["dp", "tp"])
@pytest.mark.parametrize("name", MODELS)
def test_intra_op_plan_matches_single_device(name, kind):
    p, wl = plan(name, kind), workload(name)
    rep = run(p, wl, steps=1, compiler_options=FAST)
    assert isinstance(rep, RunReport) and rep.mode == "intra-op" and rep.num_devices == 8
    eq = rep.equivalence
    assert eq.matched and eq.max_abs_diff < 1e-4 and eq.tensors > len(jax.tree.leaves(wl.args[0]))
    ref_loss = float(jax.jit(wl.fn)(*wl.args)[0])
    assert rep.losses[0] == pytest.approx(ref_loss, rel=1e-5)
    assert len(rep.step_times) == 1 and rep.step_times[0] > 0 and rep.compile_time > 0
    assert set(rep.memory) == set(range(8)) and rep.peak_memory > 0
    grad_bytes = graph(name).param_bytes
    if kind == "dp":
        # every gradient is all-reduced over the 8 devices; nothing else is sharded
        assert rep.comm_bytes["all-reduce"] >= grad_bytes
        if name in ("gpt", "mlp"):  # plus the loss's mean: a few scalar bytes
            assert rep.comm_bytes["all-reduce"] - grad_bytes <= 64
        assert rep.constraints_applied == 0
    else:
        assert rep.constraints_applied == len(p.stages[0].ops) > 0
        assert rep.constraints_skipped == 0
        if name in ("gpt", "mlp"):
            # gradients of "y"-sharded kernels are reduced over "x" only: less than data parallel
            assert 0 < rep.comm_bytes["all-reduce"] < grad_bytes
    assert rep.predicted_comm_bytes == dict(p.predicted.comm_bytes)
    assert "equivalence   : matched" in rep.summary()


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("name", ["gpt", "mlp"])
def test_pipeline_plan_matches_single_device(name, schedule):
    p, wl = plan(name, "pp", schedule), workload(name)
    rep = run(p, wl, steps=2, compiler_options=FAST)
    assert rep.mode == "pipeline" and rep.equivalence.matched
    # the executor ran the plan's own table, tick by tick
    order = [e for row in p.schedule.table for e in row if e is not None]
    assert rep.pipeline["order"] == order == schedule_order(schedule, 2, 2)
    phases = rep.pipeline["phases"]
    assert {"forward[0]", "forward[1]", "backward[0]", "backward[1]"} <= set(phases)
    assert rep.comm_bytes["send-recv"] > 0  # activations and their gradients crossed the cut
    assert set(rep.memory) == set(range(8))
    # two steps: the second starts from the first's parameters (Adam moved them)
    assert rep.losses[1] < rep.losses[0]
    assert rep.pipeline["ideal_time"] > 0
    assert set(rep.pipeline["task_times"]) == set(phases)


def test_pipeline_with_four_microbatches_and_schedule_generated_from_kind():
    wl = workload("mlp")
    p = plan("mlp", "pp", "1f1b", 4)
    p = dataclasses.replace(p, schedule=dataclasses.replace(p.schedule, table=()))
    rep = run(p, wl, steps=1, compiler_options=FAST)
    assert rep.equivalence.matched
    assert rep.pipeline["order"] == schedule_order("1f1b", 2, 4)


def test_schedule_table_breaking_a_dependency_is_refused():
    p = plan("mlp", "pp")
    rows = [e for row in p.schedule.table for e in row if e is not None]
    bad = tuple((e,) for e in sorted(rows, key=lambda e: e[2] != "backward"))  # backwards first
    p = dataclasses.replace(p, schedule=dataclasses.replace(p.schedule, table=bad))
    with pytest.raises(ExecutionError, match="schedule order"):
        run(p, workload("mlp"), check=False, compiler_options=FAST)


def test_mismatch_raises_equivalence_error_naming_the_tensor():
    with pytest.raises(EquivalenceError) as info:
        run(plan("mlp", "dp"), workload("mlp"), rtol=0.0, atol=0.0, compiler_options=FAST)
    msg = str(info.value)
    assert "differs from single-device execution" in msg and "max |diff|" in msg
    assert "rtol 0" in msg and "atol 0" in msg
    assert "[" in msg.split(" differs")[0]  # a pytree path such as new_params['layers'][0]...


def test_plan_for_another_model_is_refused():
    with pytest.raises(PlanMismatchError, match="made for model 'mlp'"):
        run(plan("mlp", "dp"), workload("gpt"), compiler_options=FAST)


def test_plan_for_another_device_count_is_refused():
    with pytest.raises(PlanMismatchError, match="8 devices but 4"):
        run(plan("mlp", "dp"), workload("mlp"), devices=jax.devices()[:4])
    four = data_parallel_plan(workload("mlp"), graph("mlp"), n=4)
    with pytest.raises(PlanMismatchError, match="4 devices but 8"):
        run(four, workload("mlp"))


def test_plan_on_four_devices_runs_on_four():
    four = data_parallel_plan(workload("mlp"), graph("mlp"), n=4)
    rep = run(four, workload("mlp"), devices=jax.devices()[4:], compiler_options=FAST)
    assert rep.equivalence.matched and set(rep.memory) == {4, 5, 6, 7}


def test_workload_as_dict_and_several_steps_follow_single_device():
    rep = run(plan("mlp", "tp"), {"model": "mlp", "size": "tiny"}, steps=3, compiler_options=FAST)
    np.testing.assert_allclose(rep.losses, single_device_losses(workload("mlp"), 3), rtol=1e-5)
    assert rep.equivalence.tensors >= 3 * 3  # losses, gradients and results of every step
    assert all(math.isfinite(t) for t in rep.step_times)


def test_plans_from_the_search_run_and_match():
    import autoplan

    if not hasattr(autoplan, "plan"):
        pytest.skip("autoplan.plan (the search) is not available")
    wl = workload("mlp")
    res = autoplan.search(wl, "cpu:8", time_limit=20)
    intra = next(p for p in res.candidates if not p.is_pipeline)
    pipe = next((p for p in res.candidates if p.is_pipeline), None)
    for p in [intra] + ([pipe] if pipe is not None else []):
        rep = run(p, wl, compiler_options=FAST)
        assert rep.equivalence.matched
        assert rep.constraints_applied == len(p.ops) and rep.constraints_skipped == 0
    if pipe is not None:  # micro-batches of one sample trace with fewer operators: still fine
        assert rep.mode == "pipeline" and rep.pipeline["order"] == [
            e for row in pipe.schedule.table for e in row if e is not None]


def test_one_device_search_gives_a_gradient_accumulation_plan_that_matches():
    # on one device the whole batch at once may not fit; the pipeline search's one-stage layout
    # accumulates gradients over micro-batches, and running it reproduces one-device numbers
    import autoplan
    from autoplan import models

    wl = models.get("gpt", size="tiny")
    res = autoplan.search(wl, "cpu:1", baselines=False)
    acc = [p for p in res.plans if len(p.stages) == 1 and p.schedule.microbatches > 1]
    assert len(acc) == 1 and "mb accumulated" in acc[0].describe()
    # its activations are one micro-batch's: less memory than the whole-batch intra-op plan
    whole = next(p for p in res.plans if p.schedule.microbatches == 1)
    assert acc[0].predicted.memory_per_device < whole.predicted.memory_per_device
    rep = run(acc[0], workload("gpt"), devices=jax.devices()[:1], steps=1, compiler_options=FAST)
    assert rep.mode == "accumulation" and rep.num_devices == 1 and rep.equivalence.matched
