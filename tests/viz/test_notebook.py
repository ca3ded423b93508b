"""Under a real ipykernel, ``set_notebook_renderer`` makes figures survive nbconvert's HTML export."""

from __future__ import annotations

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
nbconvert = pytest.importorskip("nbconvert")
pytest.importorskip("ipykernel")


def run(cells, tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    html, _ = nbconvert.HTMLExporter().from_notebook_node(nb)
    return nb, html


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Your element with mimetype")
def test_figures_survive_nbconvert(pipeline_plan, tmp_path):
    path = tmp_path / "plan.json"
    pipeline_plan.to_json(str(path))
    nb, html = run([
        "from autoplan._plan import Plan\nfrom autoplan.viz import set_notebook_renderer, timeline_figure\n"
        f"plan = Plan.from_json({str(path)!r})",
        "timeline_figure(plan).show()",  # plotly's default under ipykernel
        "print(set_notebook_renderer())",
        "timeline_figure(plan).show()",
    ], tmp_path)
    # plotly's default renderer gives only its mimetype, which nbconvert's HTML drops
    assert [set(o.get("data", {})) for o in nb.cells[1].outputs] == [{"application/vnd.plotly.v1+json"}]
    assert nb.cells[2].outputs[0]["text"].strip() == "plotly_mimetype+notebook"
    data = [o["data"] for o in nb.cells[3].outputs if "data" in o]
    assert any("Plotly.newPlot" in d.get("text/html", "") for d in data)
    # only the figure shown after set_notebook_renderer survives, with plotly.js embedded (offline)
    assert html.count("Plotly.newPlot") == 1
    big = [o for c in nb.cells for o in c.outputs if len(o.get("data", {}).get("text/html", "")) > 10**6]
    assert len(big) == 1
    assert "Pipeline timeline" in html
