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
