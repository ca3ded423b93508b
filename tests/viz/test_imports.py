"""viz only reads plans: importing it and drawing loads neither autoplan.exec nor autoplan.search."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def test_viz_imports_neither_exec_nor_search():
    code = ("import sys, autoplan.viz\n"
            "print(sorted(m for m in sys.modules if m.startswith(('autoplan.exec', 'autoplan.search'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2], env={"JAX_PLATFORMS": "cpu",
                                                                       "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]"


# the figure and report modules; the explorer widget (the package explorer/) is checked by its
# own tests
FIGURE_MODULES = ("__init__", "_style", "_sharding", "_timeline", "_compare", "_graph_figure", "_report",
                  "_notebook")


def test_figure_modules_do_not_import_exec_or_search():
    src = Path(__file__).resolve().parents[2] / "autoplan" / "viz"
    bad = re.compile(r"^\s*(from|import)\s+(autoplan\.|\.\.)(exec|search)\b", re.M)
    for name in FIGURE_MODULES:
        assert not bad.search((src / f"{name}.py").read_text()), f"{name}.py imports exec or search"


def test_viz_and_a_report_do_not_load_plotlys_renderer_registry_until_a_renderer_is_set(tmp_path):
    # the registry imports nbformat and jsonschema's format checkers: about a second of start-up
    # that a script or ``autoplan report`` never needs; set_notebook_renderer registers
    # autoplan's renderer with it
    import autoplan
    from autoplan import models

    plan = autoplan.search(models.get("mlp", size="tiny"), "cpu:8", pipeline=False,
                           mesh_shape=(8, 1), baselines=False, cache=False).best
    plan.to_json(tmp_path / "plan.json")
    code = ("import sys, autoplan.viz\n"
            "from autoplan import Plan\n"
            "from autoplan.viz import report_html, timeline_figure\n"
            f"plan = Plan.from_json({str(tmp_path / 'plan.json')!r})\n"
            f"report_html(plan, {str(tmp_path / 'report.html')!r})\n"
            "timeline_figure(plan).to_dict()\n"
            "print(sorted(m for m in ('plotly.io._renderers', 'nbformat', 'jsonschema') "
            "if m in sys.modules))\n"
            "print(autoplan.viz.set_notebook_renderer('plotly_mimetype+autoplan_html'))\n"
            "import plotly.io as pio\n"
            "print(type(pio.renderers['autoplan_html']).__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2], env={"JAX_PLATFORMS": "cpu",
                                                                       "PATH": "/usr/bin:/bin"})
    assert out.stdout.split("\n")[:3] == ["[]", "plotly_mimetype+autoplan_html", "LightHtmlRenderer"]
    assert (tmp_path / "report.html").stat().st_size > 100_000  # (plotly.js inline)
