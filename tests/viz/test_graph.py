"""The layer graph: boxes coloured by class, segments, critical nodes, fold ratio."""

from __future__ import annotations

import pytest

from autoplan.viz import class_color, graph_figure


def layers(n=8):
    out = [{"name": "embed", "flops": 1e9, "ops": 3, "class": None}]
    out += [{"name": f"block{i}", "flops": 4e12, "ops": 40, "class": 0 if i % 2 == 0 else 1}
            for i in range(n)]
    out.append({"name": "head", "flops": 2e11, "ops": 5, "class": 2})
    return out


def test_boxes_coloured_by_class():
    lay = layers()
    fig = graph_figure(lay, segments=[1, 5, 9], critical=[1, "block4"], fold_ratio=4.0)
    bars = next(t for t in fig.data if t.meta and t.meta.get("kind") == "layers")
    assert len(bars.x) == len(lay)
    colors = list(bars.marker.color)
    for i, a in enumerate(lay):
        assert colors[i] == class_color(a["class"])
        for j, b in enumerate(lay):
            if a["class"] is not None and b["class"] is not None:
                assert (colors[i] == colors[j]) == (a["class"] == b["class"])
    assert [c[0] for c in bars.customdata] == [a["name"] for a in lay]
    crit = next(t for t in fig.data if t.meta and t.meta.get("kind") == "critical")
    assert list(crit.x) == [1, 5]
    assert [s.x0 for s in fig.layout.shapes] == [0.5, 4.5, 8.5]
    assert "fold ratio 4x" in fig.layout.title.text
    assert "4 segments" in fig.layout.title.text


def test_classes_override_edges_and_errors():
    lay = layers(4)
    fig = graph_figure({"layers": lay, "edges": [(0, 1), (1, 3), ("block0", "head")]},
                       classes={"embed": 5}, segments=[(0, 3), (3, 6)], title="GPT")
    bars = next(t for t in fig.data if t.meta and t.meta.get("kind") == "layers")
    assert bars.marker.color[0] == class_color(5)
    edges = next(t for t in fig.data if t.meta and t.meta.get("kind") == "edges")
    assert edges.meta["count"] == 2  # (0, 1) is adjacent: implied by the order
    assert fig.layout.title.text.startswith("GPT")
    assert [s.x0 for s in fig.layout.shapes] == [2.5]
    with pytest.raises(ValueError, match="critical"):
        graph_figure(lay, critical=["nope"])
    with pytest.raises(ValueError, match="one entry per layer"):
        graph_figure(lay, classes=[0])


# ---- from a search: the folding analysis the plans carry ---------------------------------------
@pytest.fixture(scope="module")
def gpt_result():
    import autoplan
    from autoplan import models

    return autoplan.search(models.get("gpt", "tiny", layers=4), "cpu:8", pipeline=False,
                           mesh_shape=(2, 4), baselines=False)


@pytest.fixture(scope="module")
def wide_resnet_result():
    import autoplan
    from autoplan import models

    wl = models.get("wide_resnet", "tiny", depth=50, channels=8, image=32, batch=8)
    # (folded: the subject is the folding analysis, which every level carries; the exhaustive ILP
    # that level="auto" picks for this graph takes 30 s more)
    return autoplan.search(wl, "cpu:8", pipeline=False, mesh_shape=(2, 4), baselines=False,
                           level="folded")


def layer_bars(fig):
    return next(t for t in fig.data if t.meta and t.meta.get("kind") == "layers")


def test_gpt_repeated_layers_are_one_class(gpt_result):
    fig = graph_figure(gpt_result)
    bars = layer_bars(fig)
    names = list(bars.meta["names"])
    assert names == ["embed", "layers_0", "layers_1", "layers_2", "layers_3", "head"]
    cls = list(bars.meta["classes"])
    assert len({cls[k] for k in range(1, 5)}) == 1  # the four blocks: one class
    assert len(set(cls)) == 3 and cls[0] != cls[1] != cls[5]
    assert len({bars.marker.color[k] for k in range(1, 5)}) == 1
    title = fig.layout.title.text
    a = gpt_result.best.analysis
    assert title.startswith("Mined subgraphs of gpt: 6 segments in 3 classes")
    assert f"fold ratio {a['fold_ratio']:.3g}x" in title
    assert f"{a['ilps']} ILP" in title and a["ilps"] >= 1
    # each block's planned operators are recorded (the explorer links them to the other views)
    planned = list(bars.meta["planned"])
    ops = {o.op for o in gpt_result.best.ops}
    assert all(set(p) <= ops for p in planned) and all(planned[k] for k in range(1, 6))
    crit = next(t for t in fig.data if t.meta and t.meta.get("kind") == "critical")
    assert list(crit.meta["layers"]) == list(a["critical"])


def test_wide_resnet_has_several_classes_of_repeated_blocks(wide_resnet_result):
    a = wide_resnet_result.best.analysis
    blocks = [s["class"] for s in a["layers"] if s["name"].startswith("blocks_")]
    counts = sorted((blocks.count(c) for c in set(blocks)), reverse=True)
    assert counts == [5, 3, 2, 2, 1, 1, 1, 1]  # 3, 4, 6, 3 blocks: the first of each stage differs
    fig = graph_figure(wide_resnet_result.best)
    legend = [t.name for t in fig.data if t.meta and t.meta.get("kind") == "legend"]
    assert "class" in legend[0] and any("(5 layers)" in n for n in legend)


def test_a_plan_file_keeps_what_the_figure_needs(gpt_result, tmp_path):
    from autoplan import Plan

    path = tmp_path / "plan.json"
    gpt_result.best.to_json(str(path))
    back = Plan.from_json(str(path))
    assert back.analysis == gpt_result.best.analysis
    assert graph_figure(back).to_plotly_json() == graph_figure(gpt_result.best).to_plotly_json()
    # a plan file an older autoplan wrote has no analysis: a clear error, not an empty figure
    old = back.with_(analysis=None)
    assert Plan.from_json(old.to_json()).analysis is None
    with pytest.raises(ValueError, match="carries no folding analysis"):
        graph_figure(old)


def test_the_plans_carry_the_results_folding_record(gpt_result):
    """One record: the search result's analysis is what every plan carries (with its search's
    ILPs and level), and the plain form reads back into the same record."""
    from autoplan._analysis import FoldingAnalysis

    rec = gpt_result.analysis
    assert isinstance(rec, FoldingAnalysis) and rec.ilps is None
    for p in gpt_result.plans:
        a = p.analysis
        assert FoldingAnalysis.from_dict(a) == rec.with_search(a["ilps"], a["level"])
        assert p.with_(analysis=rec.with_search(a["ilps"], a["level"]).to_dict()) == p
    # the figure draws the record as it draws the plan (the plan adds its model and ILPs)
    fig = graph_figure(rec)
    bars = next(t for t in fig.data if t.meta and t.meta.get("kind") == "layers")
    assert list(bars.meta["names"]) == [s.name for s in rec.segments]
    assert list(bars.meta["classes"]) == [s.cls for s in rec.segments]
    with pytest.raises(ValueError, match="should be a dict with a list of 'layers'"):
        FoldingAnalysis.from_dict({"layers": "embed"})
