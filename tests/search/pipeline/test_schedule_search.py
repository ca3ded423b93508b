"""The pipeline search weighs interleaved 1F1B and ZB-H1 like GPipe and 1F1B: plans carry the
kind and the virtual stages (plan file, summary), ``"auto"`` is never slower than either, and the
CLI reaches them."""

from __future__ import annotations

import warnings

import pytest

import autoplan
from autoplan import models
from autoplan.plans._schedule import schedule_summary, schedule_table


@pytest.fixture(scope="module")
def searched():
    wl = models.get("gpt", size="tiny", layers=8, batch=16)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind in ("1f1b", "zb-h1", "interleaved", "auto"):
            out[kind] = autoplan.search(wl, "cpu:4", pipeline=True, schedule=kind, microbatches=4,
                                        baselines=False, level="exhaustive", workers=1)
    return out


def _table(plan):
    sch = plan.schedule
    return [[None if t is None else tuple(t) for t in row] for row in sch.table]


def test_zb_h1_plans_split_the_backward(searched):
    best = searched["zb-h1"].best
    sch = best.schedule
    assert best.is_pipeline and sch.kind == "zb-h1" and sch.virtual_stages == 1
    S, m = sch.num_stages, sch.microbatches
    assert _table(best) == [[None if t is None else tuple(t) for t in row]
                            for row in schedule_table("zb-h1", S, m)]
    kinds = [e[5] for e in sch.events]
    assert kinds.count("weight") == kinds.count("backward") == S * m
    # each W follows its B on the same mesh, and the step is the last event's end
    ends = {(e[3], e[4], e[5]): e for e in sch.events}
    for (b, s, k), e in ends.items():
        if k == "weight":
            assert e[0] >= ends[(b, s, "backward")][1] and e[2] == s
    assert best.predicted.step_time == pytest.approx(max(e[1] for e in sch.events)
                                                     - min(e[0] for e in sch.events))
    assert "each backward split into B (input gradient) and W" in best.summary()


def test_zb_h1_is_never_slower_than_1f1b_on_the_same_stages(searched):
    """The same stage times simulated as 1F1B (B and W one backward) take at least as long."""
    best = searched["zb-h1"].best
    sch = best.schedule
    S, m = sch.num_stages, sch.microbatches
    dur: dict[tuple[int, str], float] = {}
    for e in sch.events:
        dur[(e[4], e[5])] = e[1] - e[0]
    fwd = [dur[(s, "forward")] for s in range(S)]
    bwd = [dur[(s, "backward")] for s in range(S)]
    wgt = [dur[(s, "weight")] for s in range(S)]
    assert all(w > 0 for w in wgt)
    zb = schedule_summary("zb-h1", S, m, fwd, bwd, weight_times=wgt)
    one = schedule_summary("1f1b", S, m, fwd, [b + w for b, w in zip(bwd, wgt, strict=True)])
    assert zb.step_time < one.step_time
    assert zb.bubble_fraction < one.bubble_fraction


def test_interleaved_plans_put_v_chunks_on_each_mesh(searched, tmp_path):
    plans = [p for p in searched["interleaved"].plans if p.schedule.kind == "interleaved"]
    assert plans, "no layout of the tiny GPT was interleaved"
    plan = plans[0]
    sch = plan.schedule
    v, S, m, P = sch.virtual_stages, sch.num_stages, sch.microbatches, sch.num_meshes
    assert v in (2, 4) and S == P * v and m % P == 0
    assert _table(plan) == [[None if t is None else tuple(t) for t in row]
                            for row in schedule_table("interleaved", S, m, v)]
    for s in range(P, S):  # chunk s shares mesh s mod P
        assert plan.stages[s].device_ids == plan.stages[s % P].device_ids
    assert plan.num_devices == sum(st.num_devices for st in plan.stages[:P]) <= 4
    # the chunks cover the layers in order, one contiguous range each
    assert [st.layer_range for st in plan.stages] == sorted(st.layer_range for st in plan.stages)
    assert all(e[2] == e[4] % P for e in sch.events)
    assert f"on {P} meshes (interleaved, v={v}" in plan.describe()
    path = tmp_path / "plan.json"
    plan.to_json(path)
    back = autoplan.Plan.from_json(path)
    assert back == plan and back.schedule.virtual_stages == v


def test_auto_is_never_slower_than_one_kind(searched):
    auto = searched["auto"].best.predicted.step_time
    for kind in ("1f1b", "zb-h1", "interleaved"):
        assert auto <= searched[kind].best.predicted.step_time * (1 + 1e-9)
    assert searched["auto"].best.schedule.kind in ("zb-h1", "interleaved", "1f1b")


def test_the_default_schedule_is_still_1f1b(searched):
    assert all(p.schedule.kind == "1f1b" for p in searched["1f1b"].plans)


def test_bad_schedules_are_refused():
    wl = models.get("gpt", size="tiny", layers=2, batch=8)
    with pytest.raises(autoplan.SearchError, match="'zb-h1', 'auto'. Got 'zb-h2'"):
        autoplan.search(wl, "cpu:4", pipeline=True, schedule="zb-h2")


def test_cli_reaches_the_new_schedules(capsys):
    from autoplan.cli import main

    assert main(["plan", "gpt", "--size", "tiny", "--set", "layers=8", "--cluster", "cpu:4",
                 "--pipeline", "yes", "--schedule", "zb-h1", "--microbatches", "4",
                 "--level", "exhaustive", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "zb-h1, 4 mb" in out and "W (weight gradient, deferred)" in out
