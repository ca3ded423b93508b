"""autoplan.search's public surface: the folding analysis plans carry, the partial result shown
before the pipeline search, an OpGraph's batch, and statistics merged over meshes."""

from __future__ import annotations

import autoplan
from autoplan import Plan, models


def test_every_plan_carries_the_folding_analysis_and_its_search():
    wl = models.get("gpt", "tiny", layers=3)
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
        assert set(planned) >= {o.op for o in res.plans[0].ops}
        if p.label == "autoplan" and not p.is_pipeline:
            mesh = "x".join(map(str, p.mesh_shape))
            assert a["ilps"] == res.stats["ilps_by_mesh"][mesh] >= 1
            assert a["level"] == res.stats["level_used"][mesh]
        elif p.label.startswith("baseline"):
            assert a["ilps"] is None
    assert Plan.from_json(res.best.to_json()) == res.best


def test_a_graph_searched_alone_has_its_batch():
    g = autoplan.trace(models.get("mlp", "tiny"))
    res = autoplan.search(g, "cpu:8", pipeline=False, baselines=False)
    batch = {g.tensors[gi.tensor].shape[0] for gi in g.inputs if gi.kind == "batch"}.pop()
    assert res.best.config["batch"] == batch
    assert res.best.predicted.throughput == batch / res.best.predicted.step_time


def test_statistics_merge_over_meshes_that_report_none():
    # on 64 devices some meshes report no ILP lower bound: merged, not added to None
    res = autoplan.search(models.get("gpt", "tiny"), "cpu:64", pipeline=False, baselines=False)
    assert len(res.stats["level_used"]) >= 4 and res.plans
