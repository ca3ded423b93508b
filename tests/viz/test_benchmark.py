"""The benchmark's synthetic GPT plans build every figure (small sizes; no timing asserted)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from autoplan.plans._plan import Plan
from autoplan.viz import (
    compare_figure,
    graph_figure,
    memory_figure,
    sharding_figure,
    stage_figure,
    timeline_figure,
)


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
    fig = sharding_figure(plan)
    # the 8 layers are sharded alike on meshes of one shape: one column for all 4 stages
    assert [len(c["layers"]) for c in fig.layout.meta["columns"]] == [8]
    assert fig.layout.meta["columns"][0]["stages"] == [0, 1, 2, 3]
    assert len([t for t in timeline_figure(plan).data if t.meta.get("kind") == "events"]) == 8
    assert stage_figure(plan).layout.title.text.count("4 stages on 32 of 32 devices") == 1
    memory = memory_figure(plan)
    assert memory.layout.meta["kind"] == "memory"
    assert {t.meta["part"] for t in memory.data} >= {"parameters", "optimizer_state", "batch"}
    assert all(len(t.x) == 4 for t in memory.data)  # one bar per stage
    variants = bench.variants(plan)
    compare = compare_figure(variants, highlight=0)
    assert compare.layout.meta["highlight"] == 0
    assert sorted(i for g in compare.layout.meta["groups"] for i in g) == list(range(len(variants)))
    layers = next(t for t in graph_figure(bench.gpt_layers(8)).data if t.meta["kind"] == "layers")
    assert layers.meta["names"] == ["embed", *[f"layer{i}" for i in range(8)], "head"]
    assert layers.meta["classes"][1:9] == [0] * 8  # the 8 blocks are one mined class
    big = bench.gpt_plan(layers=8, stages=2, microbatches=4, hidden=256, seq=64, batch=2,
                         hosts_per_stage=2)
    assert big.num_devices == 32 and big.stages[0].mesh_shape == (2, 8)
    assert sharding_figure(big).layout.meta["columns"][0]["stages"] == [0, 1]
