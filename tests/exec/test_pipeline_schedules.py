"""Searched interleaved 1F1B and ZB-H1 plans run on 8 CPU devices and compute what one device
computes (fp32, the equivalence check's tight tolerances): ZB-H1 runs each stage's backward as
two programs, B then W, and interleaved runs two chunks on each mesh."""

from __future__ import annotations

import warnings

import pytest

import autoplan
from autoplan import models
from autoplan.exec import run


def _searched(kind: str, layers: int):
    wl = models.get("gpt", size="tiny", layers=layers, batch=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = autoplan.search(wl, "cpu:8", pipeline=True, schedule=kind, microbatches=4,
                              baselines=False, level="exhaustive", workers=1)
    plans = [p for p in res.plans if p.schedule.kind == kind]
    assert plans, f"no {kind} plan among {[p.describe() for p in res.plans]}"
    return wl, plans[0]


def test_zb_h1_runs_b_then_w_and_matches_single_device(fast):
    wl, plan = _searched("zb-h1", 3)
    S = len(plan.stages)
    rep = run(plan, wl.concrete(), steps=2, check=True, compiler_options=fast)
    assert rep.mode == "pipeline" and rep.equivalence.matched, rep.equivalence.message
    assert rep.equivalence.rtol <= 1e-5
    phases = rep.pipeline["phases"]
    # every stage computes weight gradients in its W program; every stage but the first hands
    # an input gradient back from its B program
    assert all(phases.get(f"weight[{s}]", 0) > 0 for s in range(S))
    assert all(phases.get(f"backward[{s}]", 0) > 0 for s in range(1, S))
    order = rep.pipeline["order"]
    assert sum(k == "weight" for _, _, k in order) == S * plan.schedule.microbatches
    for mb, s, kind in order:
        if kind == "weight":
            assert order.index((mb, s, "backward")) < order.index((mb, s, "weight"))


def test_interleaved_runs_chunks_on_shared_meshes_and_matches_single_device(fast):
    wl, plan = _searched("interleaved", 8)
    sch = plan.schedule
    P, v = sch.num_meshes, sch.virtual_stages
    assert v > 1 and len(plan.stages) == P * v
    rep = run(plan, wl.concrete(), steps=1, check=True, compiler_options=fast)
    assert rep.mode == "pipeline" and rep.equivalence.matched, rep.equivalence.message
    assert rep.num_devices == 8
    # every chunk ran its forward and backward
    assert all(rep.pipeline["phases"].get(f"forward[{s}]", 0) > 0 for s in range(P * v))


def test_a_weight_pass_before_its_input_gradient_is_refused():
    from autoplan.plans._schedule import order_from_table

    wl, plan = _searched("zb-h1", 3)
    table = [list(row) for row in plan.schedule.table]
    flat = [(t, j) for t_, row in enumerate(table) for j, t in enumerate(row) if t is not None]
    w = next(t for t, _ in flat if t[2] == "weight")
    b = (w[0], w[1], "backward")
    swapped = [[{w: b, b: w}.get(t, t) if t is not None else None for t in row] for row in table]
    with pytest.raises(autoplan.ExecutionError, match="runs the weight of micro-batch"):
        order_from_table(swapped, len(plan.stages), plan.schedule.microbatches)
