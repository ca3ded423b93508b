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
    assert rest.count("Plotly.newPlot") == 5  # sharding, stages, timeline, compare, graph
    for i in intra_plan.inputs:
        if i.kind == "parameter":
            assert i.name.replace("'", "&#x27;") in text
    assert "P(None, &#x27;y&#x27;)" in text  # fc1's PartitionSpec
    assert "intra-op on mesh 2x4" in text  # the summary
    assert "data-parallel" in text  # the compared plans


def test_report_single_pipeline_plan(pipeline_plan, tmp_path):
    text = report_html(pipeline_plan, title="pipe <test>")
    assert "<title>pipe &lt;test&gt;</title>" in text
    assert text.count("Plotly.newPlot") == 3
    assert "layer11" in text


def test_set_notebook_renderer_outside_kernel_keeps_default():
    before = pio.renderers.default
    assert notebook_renderer_name() is None
    assert set_notebook_renderer() == before
    try:
        assert set_notebook_renderer("plotly_mimetype+notebook") == "plotly_mimetype+notebook"
    finally:
        pio.renderers.default = before
