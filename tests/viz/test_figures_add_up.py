"""Figures that add up and axes that read: for a pipeline plan, a gradient-accumulation plan and
an intra-operator plan of tiny GPT on ``cpu:8``, every breakdown sums to what it explains (the
comparison's "where the step time goes" bars to each plan's predicted step time, its difference
panel to the difference, each memory bar to its stage's memory, each timeline row's events and
idle gaps to the step), and every numeric axis carries its own ticks in one unit with at most 3
significant digits; the launch figure's step-time axis is log with its own ticks, and the
prediction's label sits at its line."""

from __future__ import annotations

import math
import re
import warnings

import pytest

import autoplan
from autoplan.viz import compare_figure, memory_figure, timeline_figure
from autoplan.viz._compare import cost_parts
from autoplan.viz._explorer import Explorer, LaunchRecord
from autoplan.viz._style import fmt_in_unit, fmt_sig
from autoplan.viz._timeline import memory_breakdown
from autoplan.viz._widget import figure_json

UNITS = ("s", "ms", "\u00b5s", "B", "KiB", "MiB", "GiB")


@pytest.fixture(scope="module")
def result():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return autoplan.search(autoplan.models.get("gpt", "tiny"), "cpu:8")


def kinds(result):
    plans = result.plans
    return {
        "pipeline": next(p for p in plans if p.is_pipeline),
        "accumulation": next(p for p in plans if not p.is_pipeline and p.schedule.microbatches > 1),
        "intra": next(p for p in plans if not p.is_pipeline and p.schedule.microbatches == 1),
    }


def significant(text: str) -> int:
    digits = text.lstrip("-\u2212").replace(".", "").lstrip("0")
    if "." not in text:
        digits = digits.rstrip("0")
    return len(digits)


def check_numeric_axis(axis: dict, where: str, unit: bool = True, scale: float = 1.0) -> None:
    """Its own ticks (not synced to another axis), plain numbers of at most 3 significant digits
    (of the axis's unit; ``scale``: axis values per unit) inside its range, at most 10 of them,
    and its one unit in its title."""
    assert axis.get("tickmode") == "array", (where, axis.get("tickmode"))
    vals, texts = axis["tickvals"], axis["ticktext"]
    assert 2 <= len(vals) <= 10 and len(vals) == len(texts), (where, texts)
    for v, t in zip(vals, texts):
        assert re.fullmatch(r"-?\d+(\.\d+)?", t), (where, t)
        assert significant(t) <= 3 and float(t) * scale == pytest.approx(v), (where, t, v)
    rng = axis.get("range")
    if rng is not None:
        lo, hi = sorted(rng)
        if axis.get("type") == "log":
            lo, hi = 10 ** lo, 10 ** hi
        assert all(lo - 1e-9 * abs(hi) <= v <= hi * (1 + 1e-9) + 1e-12 for v in vals), (where, rng, vals)
    if unit:
        title = axis["title"]["text"]
        found = {u for u in UNITS if re.search(rf"\({re.escape(u)}[,)]", title)}
        assert len(found) == 1, (where, title)


def test_fmt_sig_keeps_three_significant_digits():
    assert [fmt_sig(v) for v in (14.28319, 0.7726124, 0.0417923, 9.996, 1000, 0.25, 0)] == [
        "14.3", "0.773", "0.0418", "10", "1000", "0.25", "0"]


@pytest.mark.parametrize("kind", ["pipeline", "accumulation", "intra"])
def test_the_comparison_adds_up_and_reads(result, kind):
    plans = result.plans
    plan = kinds(result)[kind]
    index = plans.index(plan)
    other = next(k for k, p in enumerate(plans) if p.is_pipeline != plan.is_pipeline)
    fig = figure_json(compare_figure(plans, highlight=index, reference=other))
    unit = {"s": 1.0, "ms": 1e-3, "\u00b5s": 1e-6}[fig["layout"]["meta"]["unit"]]
    bars = [t for t in fig["data"] if (t.get("meta") or {}).get("kind") == "breakdown"]
    for k, i in enumerate(bars[0]["meta"]["plans"]):
        p = plans[i]
        parts = {t["meta"]["component"]: t["meta"]["seconds"][k] for t in bars}
        # every part of cost_parts drawn, and they add up to the predicted step time
        want = cost_parts(p)
        assert parts == pytest.approx({n: want.get(n, 0.0) for n in parts})
        assert not [n for n, v in want.items() if v and n not in parts]
        assert sum(parts.values()) == pytest.approx(p.predicted.step_time)
        # the bars reach the step time (the diamond) and no higher
        assert max(t["base"][k] + t["y"][k] for t in bars) * unit == pytest.approx(p.predicted.step_time)
        if p.is_pipeline:  # the bubble is the busiest stage's wait, not the stages' mean
            assert parts["bubble"] == pytest.approx(p.predicted.step_time - max(
                sum(e[1] - e[0] for e in p.schedule.events if e[2] == m)
                for m in {e[2] for e in p.schedule.events}))
    diff = next(t for t in fig["data"] if (t.get("meta") or {}).get("kind") == "difference")
    seconds = diff["meta"]["seconds"]
    assert sum(seconds[:-1]) == pytest.approx(seconds[-1], abs=1e-12)
    assert seconds[-1] == pytest.approx(plan.predicted.step_time - plans[other].predicted.step_time)
    lay = fig["layout"]
    check_numeric_axis(lay["xaxis"], "compare (a) step time")
    bunit = re.search(r"\((\w+)\)", lay["yaxis"]["title"]["text"]).group(1)
    check_numeric_axis(lay["yaxis"], "compare (a) memory",
                       scale={"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[bunit])
    check_numeric_axis(lay["yaxis2"], "compare (b) time per step")
    check_numeric_axis(lay["xaxis3"], "compare (c) difference", unit=False)
    assert re.match(r"time \((ms|\u00b5s|s)\)", lay["xaxis3"]["title"]["text"])
    assert not [k for k, a in lay.items() if k.startswith(("xaxis", "yaxis")) and a.get("tickmode") == "sync"]


@pytest.mark.parametrize("kind", ["pipeline", "accumulation", "intra"])
def test_the_timeline_and_memory_add_up_and_read(result, kind):
    plan = kinds(result)[kind]
    tl = figure_json(timeline_figure(plan))
    scale = {"s": 1.0, "ms": 1e-3, "\u00b5s": 1e-6}[tl["layout"]["meta"]["unit"]]
    rows: dict[int, float] = {}
    for t in tl["data"]:
        if (t.get("meta") or {}).get("kind") in ("events", "idle", "steady"):
            for y, x in zip(t["y"], t["x"]):
                rows[y] = rows.get(y, 0.0) + x
    end = max(e[1] for e in plan.schedule.events) if plan.schedule.events else None
    if end is not None:  # each mesh's work and idle gaps fill the step
        assert end == pytest.approx(plan.predicted.step_time, rel=1e-6)
        for y, total in rows.items():
            assert total * scale == pytest.approx(end, rel=1e-6), y
    check_numeric_axis(tl["layout"]["xaxis"], "timeline")
    if plan.is_pipeline:  # the title's wait is the comparison's bubble
        wait = fmt_in_unit(cost_parts(plan)["bubble"], (scale, tl["layout"]["meta"]["unit"]))
        assert f"the busiest mesh waits {wait}" in tl["layout"]["title"]["text"]
    for button in (tl["layout"].get("updatemenus") or [{}])[0].get("buttons", []):
        view = {k.split(".", 1)[1]: v for k, v in button["args"][0].items()}
        check_numeric_axis({**tl["layout"]["xaxis"], **view}, f"timeline {button['label']}")
    mem = figure_json(memory_figure(plan))
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[mem["layout"]["meta"]["unit"]]
    parts = [t for t in mem["data"] if (t.get("meta") or {}).get("kind") == "memory"]
    for k, row in enumerate(memory_breakdown(plan)):
        assert sum(t["y"][k] for t in parts) * scale == pytest.approx(row["total"])
        stage = plan.stages[k]
        assert row["total"] >= (stage.memory if plan.is_pipeline else plan.predicted.memory_per_device)
    check_numeric_axis(mem["layout"]["yaxis"], "memory")


def test_the_launch_figure_reads(result):
    plan = kinds(result)["pipeline"]
    ex = Explorer(model="gpt", size="tiny", cluster="cpu:8", autostart=False)
    rec = LaunchRecord(plan=plan, spec={}, num_processes=2, devices_per_process=4, steps=5)
    # emulated devices: seconds per step against a prediction below a millisecond
    for step, (loss, t) in enumerate([(4.2, 14.28319), (4.0, 0.7726124), (3.9, 0.0417923),
                                      (3.7, 0.05), (3.6, 0.045)]):
        rec.events.append({"event": "step", "process": 0, "step": step, "loss": loss, "step_time": t})
    fig = ex._launch_figure(rec)
    lay = fig["layout"]
    check_numeric_axis(lay["yaxis2"], "launch step time")
    assert lay["yaxis2"]["type"] == "log" and lay["yaxis2"]["tickmode"] != "sync"
    check_numeric_axis(lay["yaxis"], "launch loss", unit=False)
    check_numeric_axis(lay["xaxis"], "launch step", unit=False)
    assert all(float(v).is_integer() for v in lay["xaxis"]["tickvals"])
    # every tick of the log axis is a value of the axis's unit that the data spans
    unit = lay["meta"]["unit"]
    assert lay["yaxis2"]["title"]["text"] == f"step time ({unit}, log)"
    line = next(t for t in fig["data"] if t["meta"]["kind"] == "predicted")
    note = next(a for a in lay["annotations"] if a["text"].startswith("predicted"))
    assert note["yref"] == "y2" and note["y"] == pytest.approx(math.log10(line["y"][0]))
    assert note["x"] == line["x"][-1]
