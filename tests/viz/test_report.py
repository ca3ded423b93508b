"""The static HTML report: self-contained, offline, complete."""

from __future__ import annotations

import re

import plotly.io as pio
import plotly.offline

from autoplan.viz import report_html, set_notebook_renderer
from autoplan.viz._notebook import notebook_renderer_name

from .test_graph import layers


def test_report_is_self_contained_and_complete(intra_plan, compare_plans, tmp_path):
    path = tmp_path / "report.html"
    plans = [intra_plan] + compare_plans[1:]
    text = report_html(plans, path=str(path), graph={"layers": layers(), "fold_ratio": 3.0})
    assert path.read_text(encoding="utf-8") == text
    js = plotly.offline.get_plotlyjs()
    assert text.count(js) == 1  # plotly.js embedded once
    scripts = re.findall(r"<script\b[^>]*>", text, flags=re.I)
    assert scripts and not any("src" in s.lower() for s in scripts)
    rest = text.replace(js, "")
    assert "http" not in rest.lower() and "cdn" not in rest.lower()
    # compare, sharding, stages, memory, mined subgraphs, timeline
    assert rest.count("Plotly.newPlot") == 6
    for i in intra_plan.inputs:
        if i.kind == "parameter":
            assert i.name.replace("'", "&#x27;") in text
    assert "P(None, &#x27;y&#x27;)" in text  # fc1's PartitionSpec
    assert "intra-op on mesh 2x4" in text  # the summary
    assert "data-parallel" in text  # the compared plans
    assert "Mined subgraphs" in text and "Memory per device" in text
    assert "<h2>Code</h2>" in text and "shardings_for" in text and "copy code" in text


def test_report_single_pipeline_plan(pipeline_plan, tmp_path):
    text = report_html(pipeline_plan, title="pipe <test>")
    assert "<title>pipe &lt;test&gt;</title>" in text
    assert text.count("Plotly.newPlot") == 4  # sharding, stages, memory, timeline
    assert "layer11" in text
    assert "Mined subgraphs" not in text  # a hand-made plan carries no folding analysis


def test_set_notebook_renderer_outside_kernel_keeps_default():
    before = pio.renderers.default
    assert notebook_renderer_name() is None
    assert set_notebook_renderer() == before
    try:
        assert set_notebook_renderer("plotly_mimetype+notebook") == "plotly_mimetype+notebook"
    finally:
        pio.renderers.default = before


def test_report_of_a_search_has_every_plan_and_the_mined_subgraphs(tmp_path):
    import autoplan
    from autoplan import Plan, models

    result = autoplan.search(models.get("mlp", "tiny"), "cpu:8", pipeline=False)
    text = report_html(result)
    assert text.count("<tr class=") == len(result.plans)  # every candidate's row
    for k, p in enumerate(result.plans):
        assert f"<td class='num'>{k}</td>" in text and p.describe() in text
    assert "Plans compared" in text and "Mined subgraphs" in text
    # equivalent plans (8x1 and 1x8 here) are marked as such
    assert "equivalent" in text
    # from the plan file alone: the mined subgraphs are still there
    path = tmp_path / "plan.json"
    result.best.to_json(str(path))
    text = report_html(Plan.from_json(str(path)))
    assert "Mined subgraphs" in text and "fold ratio" in text
