"""A plotly figure as a light Jupyter widget: :class:`PlotView`.

plotly's own ``FigureWidget`` carries a copy of plotly.js (about 5 MB) in every widget's state,
so a page of five figures loads it five times, a saved notebook holds it five times, and the
figure the page shows is rebuilt from incremental messages that a reloaded page never sees.
:class:`PlotView` keeps the whole figure (``data`` and ``layout`` as JSON) in one synced trait,
``figure``: whatever draws it (the first view, a second cell displaying the same widget, a
reloaded page, a reopened notebook whose kernel is still running) draws the current figure.
Its front end is a few kilobytes (``_widget.js``); plotly.js is loaded once per page: the page's
own ``window.Plotly`` when one is there (JupyterLab's plotly extension sets it), else the first
view drawn asks the kernel, which sends it once as a binary message, and the page evaluates it
once for every view (a view drawn while the kernel runs another cell waits for that cell). A
view drawn from widget state saved with the notebook, without its kernel (ipywidgets marks it
disconnected), asks nothing and says that the figure needs the kernel, unless the page has
plotly.js.

Clicks on the page come back as ``{"trace", "point", "x", "y", "customdata"}`` to the callbacks
registered with :meth:`PlotView.on_click`.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

import anywidget
import plotly.graph_objects as go
import plotly.io as pio
import traitlets

__all__ = ["PlotView", "CodeView", "figure_json", "plotly_js_bytes"]

_PLOTLY_JS: bytes | None = None

_CSS = """
.autoplan-plot { width: 100%; min-width: 0; }
.autoplan-plot-note { font-size: 12px; color: #777; }
.autoplan-plot-note:empty { display: none; }
"""


def plotly_js_bytes() -> bytes:
    """plotly.js as UTF-8 bytes (read once per process)."""
    global _PLOTLY_JS
    if _PLOTLY_JS is None:
        import plotly.offline  # noqa: PLC0415

        _PLOTLY_JS = plotly.offline.get_plotlyjs().encode("utf-8")
    return _PLOTLY_JS


def figure_json(fig: go.Figure | Mapping[str, Any]) -> dict[str, Any]:
    """A figure as plain JSON data ``{"data": [...], "layout": {...}}`` (numpy arrays as lists)."""
    if isinstance(fig, go.Figure):
        out = json.loads(pio.to_json(fig, validate=False))
    else:
        out = json.loads(json.dumps(dict(fig), default=_plain))
    return {"data": out.get("data", []), "layout": out.get("layout", {})}


def _plain(x: Any) -> Any:
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"figure_json: {type(x).__name__} is not JSON data")


class PlotView(anywidget.AnyWidget):
    """A plotly figure whose whole state is one synced trait.

    Attributes:
        figure: ``{"data": [...], "layout": {...}}``; assign a new one (or call :meth:`show`)
            to redraw every view with ``Plotly.react``.
        config: plotly.js config (``displaylogo`` off and ``responsive`` on by default).
    """

    _esm = pathlib.Path(__file__).with_name("_widget.js")
    _css = _CSS
    figure = traitlets.Dict().tag(sync=True)
    config = traitlets.Dict().tag(sync=True)

    def __init__(self, figure: go.Figure | Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._click_callbacks: list[Callable[[dict[str, Any]], None]] = []
        self.on_msg(self._on_message)
        if figure is not None:
            self.show(figure)

    def show(self, fig: go.Figure | Mapping[str, Any]) -> None:
        """Draw ``fig`` in every view of this widget (one message)."""
        self.figure = figure_json(fig)

    def to_figure(self) -> go.Figure:
        """The figure shown, as a ``plotly.graph_objects.Figure``."""
        return go.Figure(self.figure, skip_invalid=True)

    @property
    def data(self) -> list[dict[str, Any]]:
        """The traces shown (JSON dicts)."""
        return list(self.figure.get("data", []))

    @property
    def figure_layout(self) -> dict[str, Any]:
        """The figure's layout shown (a JSON dict; ``layout`` is the widget's own CSS layout)."""
        return dict(self.figure.get("layout", {}))

    def on_click(self, callback: Callable[[dict[str, Any]], None]) -> None:
        """Call ``callback({"trace", "point", "x", "y", "customdata"})`` when a point is clicked
        on the page (``trace`` indexes ``data``; ``point`` is a list: ``[i]``, or ``[row, col]``
        for an image)."""
        self._click_callbacks.append(callback)

    def push_plotly(self) -> None:
        """Send plotly.js to the page (what a view's request gets; the page keeps the first copy
        it gets)."""
        self.send({"type": "plotly.js"}, buffers=[plotly_js_bytes()])

    def _on_message(self, _widget: Any, content: Mapping[str, Any], buffers: Any) -> None:
        kind = content.get("type") if isinstance(content, Mapping) else None
        if kind == "plotly.js?":
            self.push_plotly()
        elif kind == "click":
            event = {k: content.get(k) for k in ("trace", "point", "x", "y", "customdata")}
            for cb in list(self._click_callbacks):
                cb(event)

    def __repr__(self) -> str:
        lay = self.figure.get("layout", {})
        title = (lay.get("title") or {}).get("text", "") if isinstance(lay.get("title"), dict) else ""
        return f"PlotView({len(self.figure.get('data', []))} traces, {title[:60]!r})"


_CODE_ESM = """
function render({ model, el }) {
  const bar = document.createElement("div");
  bar.className = "autoplan-code-bar";
  const button = document.createElement("button");
  button.className = "autoplan-code-copy jupyter-button";
  button.textContent = "copy code";
  const note = document.createElement("span");
  note.className = "autoplan-code-note";
  bar.appendChild(button);
  bar.appendChild(note);
  const pre = document.createElement("pre");
  pre.className = "autoplan-code";
  el.appendChild(bar);
  el.appendChild(pre);
  const show = () => {
    pre.textContent = model.get("code") || "";
    note.textContent = model.get("note") || "";
  };
  const copy = async () => {
    const text = model.get("code") || "";
    try {
      await navigator.clipboard.writeText(text);
      note.textContent = "copied " + text.split("\\n").length + " lines";
    } catch (err) {
      const range = document.createRange();
      range.selectNodeContents(pre);
      const sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
      note.textContent = "selected: press Ctrl+C (or Cmd+C) to copy";
    }
  };
  button.addEventListener("click", copy);
  model.on("change:code", show);
  model.on("change:note", show);
  show();
  return () => {
    model.off("change:code", show);
    model.off("change:note", show);
    button.removeEventListener("click", copy);
  };
}
export default { render };
"""

_CODE_CSS = """
.autoplan-code { font-size: 11px; line-height: 1.3; max-height: 360px; overflow: auto;
                 background: #f7f7f7; padding: 6px 10px; margin: 4px 0; white-space: pre; }
.autoplan-code-note { margin-left: 10px; font-size: 12px; color: #555; }
"""


class CodeView(anywidget.AnyWidget):
    """Python source with a "copy code" button (the clipboard when the page may write it, else
    the text is selected for Ctrl+C).

    Attributes:
        code: the source shown.
        note: a line beside the button.
    """

    _esm = _CODE_ESM
    _css = _CODE_CSS
    code = traitlets.Unicode("").tag(sync=True)
    note = traitlets.Unicode("").tag(sync=True)

    def __repr__(self) -> str:
        return f"CodeView({len(self.code.splitlines())} lines)"
