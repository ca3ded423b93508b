"""Notebook display: a plotly renderer that keeps saved notebooks small and exports readable.

plotly's ``"notebook"`` renderer embeds plotly.js (about 4.8 MB) in the first figure's output, so
every saved notebook with a figure weighs 5 MB. :func:`set_notebook_renderer` picks
``"plotly_mimetype+autoplan_html"`` instead under JupyterLab:

* ``plotly_mimetype``: the figure as JSON, drawn by JupyterLab's plotly extension, which loads
  plotly.js once per page from the server (nothing of it is saved in the notebook);
* ``autoplan_html``: a ``text/html`` copy for readers without that extension (``nbconvert``'s
  HTML, GitHub): a ``<div>`` drawn with the page's ``window.Plotly`` when the page has it (a lab
  page, an export that includes plotly.js), else a line saying where the interactive figure is.

For an exported notebook whose figures must draw offline anywhere, pass
``set_notebook_renderer("plotly_mimetype+notebook")`` (plotly.js embedded once, 5 MB), or write
a self-contained report with :func:`autoplan.viz.report_html`.
"""

from __future__ import annotations

import html
import json
import os
import uuid
from typing import Any

import plotly.io as pio
from plotly.io._base_renderers import MimetypeRenderer

from .._errors import ArgumentError

__all__ = ["set_notebook_renderer", "notebook_renderer_name", "register_renderer",
           "LightHtmlRenderer"]


class LightHtmlRenderer(MimetypeRenderer):
    """A ``text/html`` copy of a figure without plotly.js: drawn by the page's ``window.Plotly``
    when there is one, else replaced by a one-line note (no script is fetched from anywhere)."""

    def to_mimebundle(self, fig_dict: dict[str, Any]) -> dict[str, str]:
        div = f"autoplan-{uuid.uuid4().hex[:12]}"
        title = ((fig_dict.get("layout") or {}).get("title") or {})
        text = title.get("text", "") if isinstance(title, dict) else ""
        fig = json.dumps({"data": fig_dict.get("data", []), "layout": fig_dict.get("layout", {})},
                         default=_plain).replace("</", "<\\/")
        note = json.dumps(f"{html.unescape(text.split('<br>')[0])[:120]}: open the notebook in "
                          "JupyterLab (or export it with plotly.js) to see this figure"
                          ).replace("</", "<\\/")
        body = (f"<div id='{div}' class='autoplan-figure'></div><script type='text/javascript'>"
                f"(function(){{var el=document.getElementById('{div}');if(!el)return;"
                f"if(window.Plotly){{var f={fig};window.Plotly.newPlot(el,f.data,f.layout,"
                "{displaylogo:false,responsive:true});}"
                f"else{{el.textContent={note};el.style.color='#777';}}}})();</script>")
        return {"text/html": body}


def _plain(x: Any) -> Any:
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"{type(x).__name__} is not JSON data")


def register_renderer() -> None:
    """Register :class:`LightHtmlRenderer` with plotly as ``"autoplan_html"`` (once).

    Done when a renderer is set (:func:`set_notebook_renderer`) rather than when ``autoplan.viz``
    is imported: plotly's renderer registry imports ``nbformat``, whose schema validation
    (``jsonschema`` with its format checkers) costs about a second of start-up that a script,
    the report command or a test process making figures never needs."""
    if "autoplan_html" not in pio.renderers:
        pio.renderers["autoplan_html"] = LightHtmlRenderer()


def _in_ipykernel() -> bool:
    try:
        from IPython import get_ipython  # noqa: PLC0415
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__module__.startswith("ipykernel.")


def notebook_renderer_name() -> str | None:
    """The renderer :func:`set_notebook_renderer` would pick here, or ``None`` outside ipykernel.

    ``"plotly_mimetype+autoplan_html"`` under JupyterLab and Jupyter (see the module
    docstring); VS Code gets ``"vscode+notebook"`` and Colab ``"colab"`` (their own ways of
    loading plotly.js).
    """
    if not _in_ipykernel():
        return None
    if "COLAB_NOTEBOOK_ID" in os.environ or "COLAB_RELEASE_TAG" in os.environ:
        return "colab"
    if "VSCODE_PID" in os.environ:
        return "vscode+notebook"
    return "plotly_mimetype+autoplan_html"


def set_notebook_renderer(renderer: str | None = None) -> str:
    """Set plotly's default renderer so figures show live and notebooks stay small.

    Args:
        renderer: a plotly renderer name to use instead of the one picked for this kernel
            (see :func:`notebook_renderer_name`); ``"plotly_mimetype+notebook"`` embeds plotly.js
            for exports that must draw offline.

    Returns:
        The default renderer now in effect (unchanged outside ipykernel when ``renderer`` is
        not given).

    Raises:
        ValueError: ``renderer`` is not a plotly renderer name.
    """
    register_renderer()
    name = renderer or notebook_renderer_name()
    if name is not None:
        try:
            pio.renderers.default = name
        except ValueError as err:
            raise ArgumentError(f"set_notebook_renderer: renderer should be one of plotly's renderers "
                                f"({', '.join(sorted(pio.renderers))}), optionally joined with '+'. "
                                f"Got {name!r}. Fix: pass one of them, or None.") from err
    return pio.renderers.default
