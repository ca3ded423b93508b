"""Under a real ipykernel, ``set_notebook_renderer`` keeps plotly.js out of the notebook and leaves
an HTML copy of each figure that nbconvert's export keeps."""

from __future__ import annotations

import importlib.util

import pytest

# (found, not imported: they take seconds to import, paid by every pytest worker that collects
# this module, while one runs it)
_MISSING = [m for m in ("nbformat", "nbclient", "nbconvert", "ipykernel")
            if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"not installed: {_MISSING}")


def run(cells, tmp_path):
    import nbclient  # noqa: PLC0415
    import nbconvert  # noqa: PLC0415
    import nbformat  # noqa: PLC0415

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    html, _ = nbconvert.HTMLExporter().from_notebook_node(nb)
    return nb, html


@pytest.mark.filterwarnings("ignore:Your element with mimetype")
def test_figures_stay_small_and_survive_nbconvert(pipeline_plan, tmp_path):
    path = tmp_path / "plan.json"
    pipeline_plan.to_json(str(path))
    nb, html = run([
        "from autoplan.plans._plan import Plan\nfrom autoplan.viz import set_notebook_renderer, timeline_figure\n"
        f"plan = Plan.from_json({str(path)!r})",
        "timeline_figure(plan).show()",  # plotly's default under ipykernel
        "print(set_notebook_renderer())",
        "timeline_figure(plan).show()",
        "set_notebook_renderer('plotly_mimetype+notebook')\ntimeline_figure(plan).show()",
    ], tmp_path)
    # plotly's default renderer gives only its mimetype, which nbconvert's HTML drops
    assert [set(o.get("data", {})) for o in nb.cells[1].outputs] == [{"application/vnd.plotly.v1+json"}]
    assert nb.cells[2].outputs[0]["text"].strip() == "plotly_mimetype+autoplan_html"
    data = [o["data"] for o in nb.cells[3].outputs if "data" in o]
    assert {"application/vnd.plotly.v1+json", "text/html"} <= set(data[0])
    light = data[0]["text/html"]
    # an HTML copy drawn with the page's plotly.js, a note without one; no plotly.js in it
    assert "window.Plotly.newPlot" in light and "open the notebook in JupyterLab" in light
    assert len(light) < 100_000 and "http" not in light
    # plotly.js (5 MB) is in the notebook only when asked for
    big = [k for k, c in enumerate(nb.cells) for o in c.outputs
           if len(o.get("data", {}).get("text/html", "")) > 10**6]
    assert big == [4]
    assert "Pipeline timeline" in html
