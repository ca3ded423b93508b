"""``autoplan.search``: honest errors and warnings, options it refuses rather than ignores, the
folding analysis plans carry, the partial result shown before the pipeline search, an OpGraph's
batch, and statistics merged over meshes."""

from __future__ import annotations

import warnings

import pytest

import autoplan
from autoplan import InfeasiblePlanError, SearchError
from autoplan.algorithms import BatchSplitWarning, PlanDoesNotFitWarning
from autoplan.exec import run
from autoplan.models import get
from autoplan.search.intra._intra import intra_op_search


@pytest.mark.parametrize("pipeline", ["auto", True, False])
def test_a_memory_budget_nothing_fits_is_infeasible(pipeline):
    with pytest.raises(InfeasiblePlanError) as info:
        autoplan.search(get("mlp", "tiny"), "cpu:8", memory_budget=1.0, pipeline=pipeline)
    err = info.value
    assert err.least_memory is not None and err.least_memory > 1.0
    assert "least" in str(err) and "Fix:" in str(err)


def test_no_plan_that_fits_warns_with_the_least_memory():
    with pytest.warns(PlanDoesNotFitWarning) as record:
        res = autoplan.search(get("gpt", "175B", layers=1), "cpu:8", pipeline=False)
    assert res.best.predicted.memory_per_device > res.best.cluster.device_memory
    text = str(record[0].message)
    least = min(p.predicted.memory_per_device for p in res.plans)
    assert f"the least any candidate needs is {least / 2**30:,.3f} GiB" in text
    assert "of a cpu device of cpu:8" in text and "Fix:" in text


def test_a_plan_that_fits_and_a_batch_that_splits_warn_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanDoesNotFitWarning)
        warnings.simplefilter("error", BatchSplitWarning)
        autoplan.search(get("mlp", "tiny"), "cpu:8", pipeline=False, level="exhaustive")


def test_a_batch_that_cannot_be_split_warns():
    with pytest.warns(BatchSplitWarning, match="the batch of 6 does not divide over the 8 devices") as w:
        res = autoplan.search(get("mlp", "tiny", batch=6), "cpu:8", pipeline=False)
    assert all(not i.spec[0] for i in res.best.inputs if i.kind == "batch")
    assert "multiple of 8 (e.g. 8)" in str(w[0].message)


@pytest.mark.parametrize("kwargs, words", [
    ({"pipeline": True, "mesh_shape": (2, 4)}, ["mesh_shape=(2, 4)", "pipeline=True"]),
    ({"pipeline": False, "microbatches": 4}, ["microbatches=4 sets pipeline plans"]),
    ({"pipeline": False, "schedule": "gpipe"}, ["schedule='gpipe'"]),
    ({"pipeline": False, "num_layers": 2, "stage_algorithm": "ilp"},
     ["num_layers=2, stage_algorithm='ilp' set pipeline plans", "drop them"]),
    ({"pipeline": False, "submesh_hosts": "pow2"}, ["submesh_hosts='pow2'"]),
])
def test_options_the_mode_would_ignore_are_refused(kwargs, words):
    with pytest.raises(SearchError) as info:
        autoplan.search(get("mlp", "tiny"), "cpu:8", **kwargs)
    for w in words:
        assert w in str(info.value)


def test_a_three_axis_mesh_needs_no_axis_names():
    wl = get("mlp", "tiny")
    plan = autoplan.plan(wl, "cpu:8", pipeline=False, mesh_shape=(2, 2, 2), level="exhaustive",
                         baselines=False)
    assert plan.mesh_shape == (2, 2, 2) and plan.axis_names == ("x", "y", "z")
    assert run(plan, wl.concrete(), steps=1, check=True).equivalence.matched
    with pytest.raises(SearchError) as info:
        intra_op_search(autoplan.trace(wl), autoplan.Cluster.parse("cpu:8"), (2, 2, 2),
                        mesh_axis_names=("x", "y"))
    assert "mesh_axis_names=('x', 'y', 'z')" in str(info.value)


def test_every_plan_carries_the_folding_analysis_and_its_search():
    wl = get("gpt", "tiny", layers=3)
    seen = []
    res = autoplan.search(wl, "cpu:8", partial=seen.append)
    assert len(seen) == 1 and seen[0].stats["partial"] is True
    part = seen[0]
    assert part.plans and not any(p.is_pipeline for p in part.plans)
    assert all(p.analysis is not None for p in part.plans)
    assert any(p.is_pipeline for p in res.plans)
    for p in res.plans:
        a = p.analysis
        assert [s["name"] for s in a["layers"]] == ["embed", "layers_0", "layers_1", "layers_2", "head"]
        assert a["classes"] == 3 and a["fold_ratio"] > 1 and a["operators"] == len(res.graph)
        planned = sorted(o for s in a["layers"] for o in s["planned"])
        intra = next(q for q in res.plans if not q.is_pipeline)  # (ids of the full-batch graph)
        assert set(planned) >= {o.op for o in intra.ops
                                if o.primitive in ("dot_general", "conv_general_dilated")}
        if p.label == "autoplan" and not p.is_pipeline:
            mesh = "x".join(map(str, p.mesh_shape))
            assert a["ilps"] == res.stats["ilps_by_mesh"][mesh] >= 1
            assert a["level"] == res.stats["level_used"][mesh]
        elif p.label.startswith("baseline"):
            assert a["ilps"] is None
    assert autoplan.Plan.from_json(res.best.to_json()) == res.best


def test_a_graph_searched_alone_has_its_batch():
    g = autoplan.trace(get("mlp", "tiny"))
    res = autoplan.search(g, "cpu:8", pipeline=False, baselines=False)
    batch = {g.tensors[gi.tensor].shape[0] for gi in g.inputs if gi.kind == "batch"}.pop()
    assert res.best.config["batch"] == batch
    assert res.best.predicted.throughput == batch / res.best.predicted.step_time


def test_statistics_merge_over_meshes_that_report_none():
    # on 64 devices some meshes report no ILP lower bound: merged, not added to None
    res = autoplan.search(get("gpt", "tiny"), "cpu:64", pipeline=False, baselines=False)
    assert len(res.stats["level_used"]) >= 4 and res.plans
