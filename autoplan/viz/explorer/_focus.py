"""The linked selection: a layer or stage selected (from the picker or a click on any view)
and highlighted in every view."""

from __future__ import annotations

import copy
import html
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autoplan._errors import ArgumentError, StateError
from autoplan.plans._plan import Plan
from autoplan.viz._sharding import sharding_figure
from autoplan.viz._style import id_span

DIM = 0.25  # opacity of what is not selected
HIGHLIGHT_LINE = "#111111"


class FocusPanel:
    """:attr:`focus`, :meth:`select_layer`, :meth:`select_stage`, :meth:`drill_down`, the
    highlighting of every view, and :meth:`on_figure_click`."""

    @property
    def focus(self) -> str:
        """The selection: ``""``, ``"layer:<name>"`` or ``"stage:<index>"``."""
        return self._focus.value

    def _refresh_focus_options(self, plan: Plan) -> None:
        old = self._focus.value
        opts: list[tuple[str, str]] = [("(no selection)", "")]
        shown: set[str] = set()
        layers_of_stage: dict[int, list[str]] = {}
        for op, name in self._state.op_layer.items():
            st = self._state.stage_of_op.get(op, 0)
            if name not in layers_of_stage.setdefault(st, []):
                layers_of_stage[st].append(name)
        for s in plan.stages:
            lo, hi = s.layer_range
            opts.append((f"stage {s.index}: layers {lo}-{hi - 1}, mesh "
                         f"{'x'.join(map(str, s.mesh_shape))}", f"stage:{s.index}"))
            names = [n for n in s.layers if n not in ("", "(root)")]
            names += [n for n in layers_of_stage.get(s.index, []) if n not in names]
            for name in names:
                if name in shown:
                    continue
                shown.add(name)
                opts.append((f"  {name} (stage {s.index})", f"layer:{name}"))
        self._quiet += 1
        try:
            self._focus.options = opts
            self._focus.value = old if old in {v for _, v in opts} else ""
        finally:
            self._quiet -= 1
        self._drill.disabled = not self._focus.value.startswith("layer:")

    def select_layer(self, name: str) -> None:
        """Select layer ``name`` of the selected plan and highlight it in every view."""
        self._set_focus(f"layer:{name}")

    def select_stage(self, index: int) -> None:
        """Select stage ``index`` of the selected plan and highlight it in every view."""
        self._set_focus(f"stage:{index}")

    def clear_selection(self) -> None:
        self._set_focus("")

    def drill_down(self, on: bool = True) -> None:
        """Show every operator of the selected layer in the sharding view (``on=False``: the
        folded overview again)."""
        self._quiet += 1
        try:
            self._drill.value = bool(on)
        finally:
            self._quiet -= 1
        with self._lock:
            self._draw_sharding()
            self._highlight(self._focus.value)

    def _set_focus(self, value: str) -> None:
        if self.plan is None:
            raise StateError("Explorer: a candidate should be selected before a layer. Got none. Fix: "
                             "ex.select(0) first.")
        allowed = {v for _, v in self._focus.options}
        if value not in allowed:
            layers = [v.split(":", 1)[1] for v in allowed if v.startswith("layer:")]
            raise ArgumentError(f"Explorer: {value!r} is not a layer or stage of the selected plan; its "
                                f"layers are {layers}. Fix: pass one of them.")
        with self._lock:
            self._quiet += 1
            try:
                self._focus.value = value
            finally:
                self._quiet -= 1
            self._after_focus(value)

    def _on_focus(self, change: Mapping[str, Any]) -> None:
        if self._quiet or self.plan is None:
            return
        with self._lock:
            self._after_focus(change["new"] or "")

    def _on_drill(self, change: Mapping[str, Any]) -> None:
        if self._quiet or self.plan is None:
            return
        self._start("view", lambda: self.drill_down(bool(change["new"])))

    def _after_focus(self, value: str) -> None:
        self._drill.disabled = not value.startswith("layer:")
        if self._drill.value:
            self._draw_sharding()
        self._highlight(value)

    def _draw_sharding(self) -> None:
        plan = self.plan
        if plan is None:
            return
        value = self._focus.value
        layer = value.split(":", 1)[1] if (self._drill.value and value.startswith("layer:")) else None
        from autoplan.viz._widget import figure_json  # noqa: PLC0415

        self._state.base["sharding"] = figure_json(sharding_figure(plan, layer=layer))

    def _selection(self, value: str) -> tuple[set[int], int | None, set[str]]:
        """The selected planned operator ids, the stage owning the selection and the layers."""
        plan = self.plan
        if not value or plan is None:
            return set(), None, set()
        kind, _, arg = value.partition(":")
        if kind == "stage":
            k = int(arg)
            ops = {o for o, s in self._state.stage_of_op.items() if s == k}
            st = next((s for s in plan.stages if s.index == k), None)
            return ops, k, set(st.layers if st else ()) | {self._state.op_layer[o] for o in ops}
        ops = {o for o, name in self._state.op_layer.items() if name == arg}
        stage = next((self._state.stage_of_op[o] for o in sorted(ops)), None)
        if stage is None:
            stage = next((s.index for s in plan.stages if arg in s.layers), None)
        return ops, stage, {arg}

    def _highlight(self, value: str) -> None:
        """Draw the selection in every view: the sharding view boxes its columns and dims the
        rest, the stage view outlines the owning stage's devices, the memory and graph views
        and the timeline dim what is not selected."""
        plan = self.plan
        if plan is None:
            return
        ops, stage, layers = self._selection(value)
        on = bool(value)
        cols, hit_cols = self._highlight_sharding(value, ops, stage, layers)
        self._highlight_stage(stage, on)
        self._highlight_memory(plan, stage, on)
        self._highlight_graph(ops, layers, on)
        self._highlight_timeline(stage, on)
        self._describe_selection(plan, value, ops, stage, cols, hit_cols)

    def _highlight_sharding(self, value: str, ops: set[int], stage: int | None, layers: set[str]
                            ) -> tuple[list[dict[str, Any]], list[int]]:
        """Box the sharding view's columns holding a selected operator (or layer, or the selected
        stage's) and dim the rest; returns the columns and the indices of those boxed."""
        on = bool(value)
        fig = copy.deepcopy(self._state.base["sharding"])
        cols = [c for c in (fig["layout"].get("meta") or {}).get("columns", [])]
        hit_cols = [k for k, c in enumerate(cols)
                    if on and (set(c["ops"]) & ops or set(c["layers"]) & layers
                               or (value.startswith("stage:") and stage in c["stages"]))]
        shapes = list(fig["layout"].get("shapes") or [])
        if on and cols:
            for k in range(len(cols)):
                if k in hit_cols:
                    shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": k + 0.01,
                                   "x1": k + 0.99, "y0": 0.0, "y1": 1.0, "name": "highlight",
                                   "line": {"color": HIGHLIGHT_LINE, "width": 2.5},
                                   "fillcolor": "rgba(0,0,0,0)"})
                else:
                    shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": k,
                                   "x1": k + 1, "y0": 0.0, "y1": 1.0, "name": "dim", "layer": "above",
                                   "line": {"width": 0}, "fillcolor": "rgba(255,255,255,0.7)"})
        _set_shapes(fig, shapes)
        self.figures["sharding"].show(fig)
        return cols, hit_cols

    def _highlight_stage(self, stage: int | None, on: bool) -> None:
        """Outline the selected stage's devices in the stage view and fade the others."""
        fig = copy.deepcopy(self._state.base["stage"])
        meta = fig["layout"].get("meta") or {}
        owner = meta.get("owner", [])
        cell = _cell_of(meta)
        devices = [d for d, s in enumerate(owner) if on and s == stage]
        img = next((t for t in fig["data"] if (t.get("meta") or {}).get("kind") == "devices"), None)
        shapes = list(fig["layout"].get("shapes") or [])
        if on and stage is not None and img is not None:
            for d, s in enumerate(owner):
                if s != stage:
                    r, c = cell(d)
                    img["z"][r][c] = [round(v + (255 - v) * (1 - DIM)) for v in img["z"][r][c]]
            for r, a, b in _row_runs([cell(d) for d in devices]):
                shapes.append({"type": "rect", "x0": a - 0.5, "x1": b + 0.5, "y0": r - 0.5,
                               "y1": r + 0.5, "name": "highlight", "layer": "above",
                               "line": {"color": HIGHLIGHT_LINE, "width": 3},
                               "fillcolor": "rgba(0,0,0,0)"})
        _set_shapes(fig, shapes)
        self.figures["stage"].show(fig)

    def _highlight_memory(self, plan: Plan, stage: int | None, on: bool) -> None:
        """Dim every memory bar but the selected stage's."""
        fig = copy.deepcopy(self._state.base["memory"])
        if on and stage is not None:
            for t in fig["data"]:
                n = len(t.get("y") or [])
                t.setdefault("marker", {})["opacity"] = [
                    1.0 if s.index == stage else DIM for s in plan.stages][:n]
        self.figures["memory"].show(fig)

    def _highlight_graph(self, ops: set[int], layers: set[str], on: bool) -> None:
        """Dim the graph view's segments holding no selected operator (nor named as a selected
        layer)."""
        fig = copy.deepcopy(self._state.base["graph"])
        for t in fig["data"]:
            m = t.get("meta") or {}
            if m.get("kind") != "layers":
                continue
            hit = [bool(on and (set(p) & ops or nm in layers))
                   for nm, p in zip(m.get("names", []), m.get("planned", []))]
            if on and any(hit):
                t.setdefault("marker", {})["opacity"] = [1.0 if h else DIM for h in hit]
        self.figures["graph"].show(fig)

    def _highlight_timeline(self, stage: int | None, on: bool) -> None:
        """Outline the selected stage's bars in the timeline and dim the others."""
        fig = copy.deepcopy(self._state.base["timeline"])
        for t in fig["data"]:
            m = t.get("meta") or {}
            if m.get("kind") == "events" and on:
                t["opacity"] = 1.0 if m.get("stage") == stage else DIM
                if m.get("stage") == stage:
                    t.setdefault("marker", {})["line"] = {"color": HIGHLIGHT_LINE, "width": 1.5}
        self.figures["timeline"].show(fig)

    def _describe_selection(self, plan: Plan, value: str, ops: set[int], stage: int | None,
                            cols: list[dict[str, Any]], hit_cols: list[int]) -> None:
        """The line under the pickers: what is selected, its columns, stage and devices (or how
        to select, with nothing selected)."""
        on = bool(value)
        if not on:
            self._focus_info.value = ("<small>click an operator in the sharding view, a device in "
                                      "the stage view, a segment of the mined subgraphs, a memory "
                                      "bar or a bar of the timeline to select its layer or stage"
                                      "</small>")
            return
        what = value.split(":", 1)[1]
        label = f"stage {what}" if value.startswith("stage:") else f"layer <code>{html.escape(what)}</code>"
        folded = ""
        if value.startswith("layer:") and hit_cols and cols:
            c = cols[hit_cols[0]]
            if len(c["layers"]) > 1:
                folded = f", one of {len(c['layers'])} layers sharded alike (one column)"
        st_devices = next((list(s.device_ids) for s in plan.stages if s.index == stage), [])
        self._focus_info.value = (
            f"<small>selected {label}: {len(ops)} planned operators in {len(hit_cols)} column"
            f"{'s' if len(hit_cols) != 1 else ''} of the sharding view{folded}; stage {stage}, "
            f"devices {id_span(st_devices)}</small>")

    # ---- clicks ------------------------------------------------------------------------------
    def _click_handler(self, name: str) -> Callable[[dict[str, Any]], None]:
        return lambda event: self.on_figure_click(name, event)

    def on_figure_click(self, figure: str, event: Mapping[str, Any]) -> None:
        """What a click on the page does (also callable with an event dict, as the page sends
        it: ``{"trace", "point", "x", "y", "customdata"}``): in the sharding view it selects the
        operator's layer and picks the tensor for a what-if pin; in the stage, memory and
        timeline views it selects the stage; in the mined subgraphs the segment's layer; in
        the comparison the plan."""
        if self.plan is None:
            return
        base = self._state.base.get(figure)
        data = (base or {}).get("data", [])
        k = event.get("trace")
        if not isinstance(k, int) or not 0 <= k < len(data):
            return
        meta = data[k].get("meta") or {}
        kind = meta.get("kind")
        point = list(event.get("point") or [0])
        cd = event.get("customdata")
        if figure == "sharding" and kind == "tensors":
            op, tensor = int(cd[0]), str(cd[1])
            layer = self._state.op_layer.get(op)
            if layer and f"layer:{layer}" in {v for _, v in self._focus.options}:
                self.select_layer(layer)
            self.set_pin_target(tensor, op=op)
        elif figure == "stage" and kind == "devices":
            meta_l = base["layout"].get("meta") or {}
            owner = meta_l.get("owner", [])
            row, col = (point + [0, 0])[:2] if len(point) >= 2 else (int(event.get("y") or 0),
                                                                     int(event.get("x") or 0))
            d = _device_at(meta_l, int(row), int(col))
            if d is not None and 0 <= d < len(owner) and owner[d] is not None:
                self.select_stage(int(owner[d]))
        elif figure == "memory" and kind == "memory":
            i = int(point[0])
            if 0 <= i < len(self.plan.stages):
                self.select_stage(self.plan.stages[i].index)
        elif figure == "timeline" and kind in ("events", "steady") and cd:
            self.select_stage(int(cd[4]))
        elif figure == "graph" and kind == "layers":
            i = int(point[0])
            names, planned = meta.get("names", []), meta.get("planned", [])
            opts = {v for _, v in self._focus.options}
            if i < len(names) and f"layer:{names[i]}" in opts:
                self.select_layer(names[i])
            elif i < len(planned):
                layer = next((self._state.op_layer[o] for o in planned[i] if o in self._state.op_layer), None)
                if layer:
                    self.select_layer(layer)
        elif figure == "compare" and kind in ("plans", "reference"):
            target = int(cd[0]) if isinstance(cd, list) and cd else meta.get("plan")
            if target is not None:
                self._start("view", lambda: self.select(int(target)))


def _set_shapes(fig: dict[str, Any], shapes: list[dict[str, Any]]) -> None:
    """A figure's layout shapes, or none (as drawn) when the list is empty."""
    if shapes:
        fig["layout"]["shapes"] = shapes
    else:
        fig["layout"].pop("shapes", None)


def _cell_of(meta: Mapping[str, Any]) -> Callable[[int], tuple[int, int]]:
    """Device id -> ``(row, column)`` of its cell in the stage view (see ``stage_figure``)."""
    per = int(meta.get("per_host", 1))
    width = int(meta.get("width", per))
    rows_per_host = int(meta.get("rows_per_host", 1))

    def cell(d: int) -> tuple[int, int]:
        h, j = divmod(d, per)
        return h * rows_per_host + j // width, j % width

    return cell


def _device_at(meta: Mapping[str, Any], row: int, col: int) -> int | None:
    """The device drawn at ``(row, col)`` of the stage view, or None."""
    per = int(meta.get("per_host", 1))
    width = int(meta.get("width", per))
    rows_per_host = int(meta.get("rows_per_host", 1))
    h, r = divmod(row, rows_per_host)
    j = r * width + col
    return h * per + j if 0 <= col < width and j < per else None


def _row_runs(cells: Sequence[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """``(row, first column, last column)`` of each run of adjacent cells on one row."""
    out: list[tuple[int, int, int]] = []
    for r, c in sorted(cells):
        if out and out[-1][0] == r and out[-1][2] == c - 1:
            out[-1] = (r, out[-1][1], c)
        else:
            out.append((r, c, c))
    return out


