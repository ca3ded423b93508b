"""Micro-batch loops inside compiled programs: gradient accumulation is one scanned program per
step; a pipeline dispatches one program per task, with accumulation, means and zeroing folded
into the tasks; the accumulated plan of the small MLP, which used to end the process in XLA's
collective rendezvous (many dispatched programs with collectives in flight on 8 emulated
devices), runs and matches; a plan with micro-batches has the same micro-batches on one device
as its second reference, where the full-batch one rounds differently at a discontinuity."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from exec_cases import graph, plan, single_device_losses, workload
from exec_plans import pipeline_plan

import autoplan
from autoplan import EquivalenceError, models
from autoplan.algorithms import schedule_order
from autoplan.exec import _run, run
from autoplan.exec._stages import executions_per_run
from autoplan.plans._plan import Schedule


def _accumulated(p, microbatches: int):
    """The same one-stage plan over several micro-batches (table generated from the kind)."""
    return dataclasses.replace(p, schedule=Schedule("1f1b", microbatches, 1))


def test_gradient_accumulation_is_one_program_per_step_and_follows_one_device(fast):
    wl, m = workload("mlp"), 4
    p = _accumulated(plan("mlp", "tp"), m)  # batch on "x", kernels on "y": collectives in the loop
    rep = run(p, wl, steps=3, compiler_options=fast)
    assert rep.mode == "accumulation" and rep.equivalence.matched
    assert rep.pipeline["dispatches"] == 1
    # every step starts from the previous one's parameters, as single-device training does
    np.testing.assert_allclose(rep.losses, single_device_losses(wl, 3), rtol=1e-5)
    # collectives inside the scan run once per micro-batch, the others once per step
    times = {t for *_x, t in rep.collectives}
    assert m in times and times <= {1, m}
    assert rep.constraints_applied == len(p.stages[0].ops) and rep.constraints_skipped == 0
    # one micro-batch's forward and backward, timed alone as separate programs, give the ideal
    tt = rep.pipeline["task_times"]
    assert {"forward[0]", "backward[0]", "update[0]"} <= set(tt)
    ideal = tt.get("prologue[0]", 0.0) + m * (tt["forward[0]"] + tt["backward[0]"]) + tt["update[0]"]
    assert rep.pipeline["ideal_time"] == pytest.approx(ideal)


def test_the_accumulated_plan_of_the_small_mlp_runs_and_matches(fast):
    w = models.get("mlp", size="small", abstract=False)
    res = autoplan.search(w, "cpu:8", microbatches=64)
    acc = [p for p in res.candidates if "accumulated" in p.describe()]
    assert acc, [p.describe() for p in res.candidates]
    p = acc[0]
    m = p.schedule.microbatches
    assert m == 64 and p.num_devices == 8
    rep = run(p, w, steps=1, compiler_options=fast, time_tasks=False)
    assert rep.mode == "accumulation" and rep.equivalence.matched
    assert rep.pipeline["dispatches"] == 1
    assert any(t == m for *_x, t in rep.collectives)  # the loop's collectives ran 64 times


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_pipeline_dispatches_one_program_per_task(schedule, fast):
    wl, S = workload("mlp"), 2
    reps = {m: run(plan("mlp", "pp", schedule, m), wl, steps=1, compiler_options=fast,
                   time_tasks=False) for m in (2, 4)}
    for m, rep in reps.items():
        assert rep.equivalence.matched
        programs = S * (2 * m + 2)   # prologue, m forwards, m backwards, update on each stage
        sends = 2 * m * (S - 1)      # activations forward, their gradients back, per micro-batch
        # plus the few per-step values one stage makes for another (Adam's bias corrections)
        assert programs + sends <= rep.pipeline["dispatches"] <= programs + sends + 2
    # each micro-batch more costs exactly its own tasks and transfers: nothing else per micro-batch
    assert reps[4].pipeline["dispatches"] - reps[2].pipeline["dispatches"] == 2 * (2 * S + 2 * (S - 1))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_three_stages_on_unequal_submeshes_match(schedule, fast):
    wl = workload("gpt")
    p = pipeline_plan(wl, graph("gpt"), schedule, microbatches=2, sizes=(4, 2, 2))
    rep = run(p, wl, steps=2, compiler_options=fast, time_tasks=False)
    assert rep.mode == "pipeline" and rep.equivalence.matched
    assert rep.losses[1] < rep.losses[0]
    assert set(rep.memory) == set(range(8))
    assert rep.pipeline["order"] == schedule_order(schedule, 3, 2)


def test_accumulators_are_float32_for_half_precision_and_laid_out_like_their_parameter():
    from autoplan.exec._run import microbatch_tracer, resolve_workload
    from autoplan.exec._stages import _acc_dtype, _Split

    assert _acc_dtype("bfloat16") == np.float32 and _acc_dtype("float16") == np.float32
    assert _acc_dtype("float32") == np.float32
    p = _accumulated(plan("mlp", "tp"), 2)
    r = resolve_workload(workload("mlp"))
    sp = _Split(p, r.fn, r.host_args, r.arg_kinds, graph("mlp"), jax.devices(), capture=True,
                microbatch_trace=microbatch_tracer(r, 2))
    params = {sp.in_info[t][1].spec for t in sp.state_inputs.values()}
    laid_out = [sp.acc_sharding[t].spec for t in sp.grad_tensors]
    assert any(spec != jax.sharding.PartitionSpec() for spec in laid_out)
    assert set(laid_out) <= params | {jax.sharding.PartitionSpec()}


def test_loop_trip_counts_are_read_from_the_compiled_module():
    def f(x):
        return jax.lax.fori_loop(0, 5, lambda i, v: v * 2.0, x)

    text = jax.jit(f).lower(1.0).compile().as_text()
    counts = executions_per_run(text)
    assert max(counts.values()) == 5 and min(counts.values()) == 1


def test_a_second_pipelined_run_of_one_workload_traces_nothing(fast, monkeypatch):
    """The stage executor takes the micro-batch trace and flat program the run keeps on its
    workload object: a second run of the same workload traces and flattens nothing again."""
    from autoplan.exec import _run
    from autoplan.tracing import _trace

    wl = workload("mlp")
    own = autoplan.Workload(wl.fn, wl.args, wl.arg_kinds, wl.name)  # (not a zoo spec)
    p = plan("mlp", "pp", "1f1b", 2)
    made = []
    real_trace, real_flatten = _trace.trace, _run.flatten
    monkeypatch.setattr(_trace, "trace", lambda *a, **k: made.append("trace") or real_trace(*a, **k))
    monkeypatch.setattr(_run, "flatten", lambda *a, **k: made.append("flat") or real_flatten(*a, **k))
    first = run(p, own, steps=1, compiler_options=fast, time_tasks=False)
    # the full step's and the micro-batch's trace and flat program, each once (the stage
    # executor's micro-batch ones are the run's)
    assert first.equivalence.matched and sorted(made) == ["flat", "flat", "trace", "trace"], made
    made.clear()
    again = run(p, own, steps=1, compiler_options=fast, time_tasks=False)
    assert again.equivalence.matched and made == []
    assert again.losses == first.losses


def _perturbing(make, loss: bool = False):
    """A reference maker whose gradients each move at one element by a hundredth of their largest
    magnitude: what one example's share does to a gradient element when a ReLU's input rounds to
    the other side of 0 in the reference alone (and with ``loss`` its loss by 1%: what a loss
    that mixes examples does over micro-batches)."""
    def wrapped(*a, **k):
        ref = make(*a, **k)

        def reference(args, run_grads):
            own_loss, grads, sub = ref(args, run_grads)
            grads = [g.reshape(-1).at[0].add(1e-2 * jnp.max(jnp.abs(g)) + 1e-4).reshape(g.shape)
                     for g in grads]
            return own_loss * (1.01 if loss else 1.0), grads, sub
        return reference
    return wrapped


@pytest.fixture
def fresh_references(monkeypatch):
    """Every reference compiled again (none taken from an earlier test's run)."""
    monkeypatch.setattr(_run, "memo", lambda owner, key, make: make())
    return monkeypatch


def test_a_full_batch_reference_off_at_a_discontinuity_gives_way_to_the_micro_batched_one(
        fast, fresh_references):
    wl, m = workload("mlp"), 4
    p = _accumulated(plan("mlp", "tp"), m)
    fresh_references.setattr(_run, "_reference", _perturbing(_run._reference))
    rep = run(p, wl, compiler_options=fast, time_tasks=False)
    msg = rep.equivalence.message
    assert rep.equivalence.matched, msg
    assert f"against the same {m} micro-batches on one device" in msg
    assert "the full-batch one-device value of grad(" in msg and "differs from the plan's by" in msg
    # both references off: the plan's numbers are not what one device computes
    fresh_references.setattr(_run, "_microbatch_reference", _perturbing(_run._microbatch_reference))
    with pytest.raises(EquivalenceError, match="differs from single-device execution"):
        run(p, wl, compiler_options=fast, time_tasks=False)


def test_a_plan_without_micro_batches_has_the_full_batch_reference_alone(fast, fresh_references):
    fresh_references.setattr(_run, "_reference", _perturbing(_run._reference))
    with pytest.raises(EquivalenceError, match="a sharding that changes the computation"):
        run(plan("mlp", "tp"), workload("mlp"), compiler_options=fast, time_tasks=False)


def test_a_loss_that_differs_keeps_the_full_batch_reference(fast, fresh_references):
    """Where the full-batch loss itself differs (what a loss that mixes examples gives over
    micro-batches, even one the batch-flow analysis did not find), the micro-batched reference,
    which would share the plan's loss, is not asked."""
    fresh_references.setattr(_run, "_reference", _perturbing(_run._reference, loss=True))
    with pytest.raises(EquivalenceError, match="differs from single-device execution"):
        run(_accumulated(plan("mlp", "tp"), 4), workload("mlp"), compiler_options=fast,
            time_tasks=False)
