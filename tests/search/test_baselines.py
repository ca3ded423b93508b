"""The baselines of Alpa's comparisons (autoplan.search._baselines): ZeRO-2 and ZeRO-3, Megatron's
TP x PP x DP grid, inter-operator only; and the micro-batch counts the pipeline search tries."""

from __future__ import annotations

import warnings

import pytest
from jax.sharding import PartitionSpec as P

import autoplan
from autoplan import models
from autoplan.search._baselines import inter_op_baseline, megatron_pipeline_baseline, solve_baseline
from autoplan.search.intra._pins import zero_pins
from autoplan.search.pipeline._pipeline import microbatch_counts, pipeline_search


def test_zero_pins_partition_the_optimizer_state_and_for_stage_3_the_parameters():
    g = autoplan.trace(models.get("gpt", "tiny"))
    z2, z3 = zero_pins(g, 4, 2), zero_pins(g, 4, 3)
    kinds = set()
    for gi in g.inputs:
        shape = g.tensors[gi.tensor].shape
        split = any(n % 4 == 0 for n in shape)
        kinds.add(gi.kind)
        if gi.kind == "batch":
            assert z2[gi.tensor] == z3[gi.tensor] == P("x")
        elif gi.kind == "optimizer_state":
            assert ("x" in tuple(z2[gi.tensor])) == split == ("x" in tuple(z3[gi.tensor]))
        elif gi.kind == "parameter":
            assert z2[gi.tensor] == P()
            assert ("x" in tuple(z3[gi.tensor])) == split
    assert {"batch", "parameter", "optimizer_state"} <= kinds
    with pytest.raises(autoplan.AutoplanError, match="stage"):
        zero_pins(g, 4, 1)


def test_zero_baselines_hold_less_memory_than_data_parallelism():
    g = autoplan.trace(models.get("gpt", "tiny", layers=2))
    cl = autoplan.Cluster.preset("p3.16xlarge")
    mem = {label: solve_baseline(g, cl, f"baseline: {label}").predicted.memory_per_device
           for label in ("data parallel", "ZeRO-2", "ZeRO-3")}
    assert mem["ZeRO-3"] < mem["ZeRO-2"] < mem["data parallel"]


@pytest.fixture(scope="module")
def tiny_gpt():
    return models.get("gpt", size="tiny", layers=4, batch=16)


def test_megatron_grid_searches_tp_pp_and_dp(tiny_gpt):
    cl = autoplan.Cluster.preset("p3.16xlarge", nodes=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = pipeline_search(tiny_gpt, cl, megatron="grid", max_candidates=16,
                              microbatches=4, workers=1)
        fixed = megatron_pipeline_baseline(tiny_gpt, cl, workers=1, grid=False)
        best = megatron_pipeline_baseline(tiny_gpt, cl, workers=1)
    stages = {len(p.stages) for p in res.plans}
    assert {1, 2} < stages  # one stage, one per node, and more stages than nodes
    for p in res.plans:
        sizes = [s.layer_range[1] - s.layer_range[0] for s in p.stages]
        assert max(sizes) - min(sizes) <= 1  # equal layer counts
        assert len({(s.submesh_shape, s.mesh_shape) for s in p.stages}) == 1
        assert p.stages[0].mesh_shape[-1] in (1, 2, 4, 8)  # tensor parallelism inside a node
        assert sum(s.submesh_shape[0] * s.submesh_shape[1] for s in p.stages) == 16
    assert best is not None and best.label == "baseline: Megatron TP x PP"
    # without the grid: one stage per node, tensor parallelism over its 8 devices
    assert [(s.submesh_shape, s.mesh_shape) for s in fixed.stages] == [((1, 8), (1, 8))] * 2
    assert best.predicted.step_time <= fixed.predicted.step_time * (1 + 1e-9)
    # the baseline is the grid's best (its micro-batches searched too)
    assert best.predicted.step_time <= min(p.predicted.step_time for p in res.plans) * (1 + 1e-9)


def test_the_megatron_baseline_is_kept_for_a_search_at_another_budget(monkeypatch):
    """The Megatron TP x PP baseline reads no memory budget: a second search of the same
    workload at a budget gets the first one's (no search of its own), the same plan field by
    field; another schedule, or another workload object, searches its own."""
    from autoplan.search import _baselines

    made = []
    real = _baselines.megatron_pipeline_baseline
    monkeypatch.setattr(_baselines, "megatron_pipeline_baseline",
                        lambda *a, **k: made.append(k["schedule"]) or real(*a, **k))
    wl = models.get("gpt", "tiny", layers=2, batch=16)
    cl = autoplan.Cluster.preset("p3.16xlarge", nodes=2)

    def megatron(res):
        return [p.to_dict() for p in res.plans if p.label == "baseline: Megatron TP x PP"]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = autoplan.search(wl, cl, cache=False, workers=1, pipeline=True)
        least = min(p.predicted.memory_per_device for p in first.plans)
        again = autoplan.search(wl, cl, cache=False, workers=1, pipeline=True,
                               memory_budget=2 * least)
        assert made == ["1f1b"]
        assert megatron(first) and megatron(again) == megatron(first)
        autoplan.search(wl, cl, cache=False, workers=1, pipeline=True, memory_budget=2 * least,
                        schedule="gpipe")
        assert made == ["1f1b", "gpipe"]
        autoplan.search(models.get("gpt", "tiny", layers=2, batch=16), cl, cache=False,
                        workers=1, pipeline=True)
    assert made == ["1f1b", "gpipe", "1f1b"]


def test_inter_op_only_puts_each_stage_on_one_device(tiny_gpt):
    cl = autoplan.Cluster.preset("p3.16xlarge", devices_per_node=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = inter_op_baseline(tiny_gpt, cl, workers=1)
    assert p is not None and p.label == "baseline: inter-op only"
    assert len(p.stages) == 4 and {s.submesh_shape for s in p.stages} == {(1, 1)}
    # more devices than layers: no such baseline
    assert inter_op_baseline(models.get("gpt", "tiny", layers=1), autoplan.Cluster.preset(
        "p3.16xlarge", 2), workers=1) is None


def test_microbatch_counts_are_the_batchs_divisors_in_the_window():
    assert 24 in microbatch_counts(1536, 128)
    assert microbatch_counts(1024, 128) == [16, 32, 64, 128, 256, 512, 1024]  # as before
    assert microbatch_counts(9, 1) == [1, 3]
    assert microbatch_counts(12, 4, 2) == [2, 3, 4, 6]
    for batch, default in ((1536, 128), (1000, 8), (97, 1)):
        got = microbatch_counts(batch, default)
        assert all(batch % b == 0 and default / 8 <= b <= default * 8 for b in got)
        assert got == [b for b in range(1, batch + 1) if batch % b == 0
                       and default / 8 <= b <= default * 8]


def test_a_batch_of_nine_tries_three_micro_batches():
    wl = models.get("gpt", size="tiny", layers=2, batch=9)
    cl = autoplan.Cluster.preset("p3.16xlarge", devices_per_node=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = pipeline_search(wl, cl, workers=1)
    # no power of two divides 9: 3 by default, 1 and 9 screened in the second round
    assert res.stats["microbatches_default"] == 3
    assert set(res.stats["microbatch_candidates"]) == {1, 3, 9}
    assert res.stats["microbatch_candidates"][3] is not None
