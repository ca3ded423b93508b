"""The benchmark's synthetic GPT plan builds every figure (small sizes; no timing asserted)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from autoplan._plan import Plan
from autoplan.viz import compare_figure, graph_figure, sharding_figure, stage_figure, timeline_figure


def load_benchmark():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "viz.py"
    spec = importlib.util.spec_from_file_location("autoplan_benchmark_viz", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_synthetic_gpt_plan_figures():
    bench = load_benchmark()
    plan = bench.gpt_plan(layers=8, stages=4, microbatches=6, hidden=256, seq=64, batch=2)
    assert Plan.from_json(plan.to_json()) == plan
    assert len(plan.ops) == 8 * 6
    assert len(plan.schedule.events) == 4 * 6 * 2
    fig = sharding_figure(plan, max_ops=12)
    assert len({t.meta["op"] for t in fig.data if t.meta and t.meta.get("kind") == "tile"}) == 12
    assert "12 of 48 ops shown" in fig.layout.title.text
    assert len([t for t in timeline_figure(plan).data if t.meta.get("kind") == "events"]) == 8
    assert stage_figure(plan).layout.title.text.count("4 stages on 32 of 32 devices") == 1
    compare_figure(bench.variants(plan), highlight=0)
    graph_figure(bench.gpt_layers(8))
