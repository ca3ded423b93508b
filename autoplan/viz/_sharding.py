"""The operator-sharding figure, after Alpa's Wide-ResNet figure (Zheng et al., OSDI 2022, Fig. 12),
made to read at scale.

**Overview** (``sharding_figure(plan)``). One column per *layer class*: consecutive or not, the
layers whose operators are sharded identically (same operators, shapes and specs, on logical
meshes of the same shape: a pipeline's stages alike too) share a column, labelled with their
names and count (``layers_0 .. layers_23 (x24)``) and, in a pipeline, their stages;
a GPT of 96 layers draws as embedding, one block column and the head. The rows are the kinds of
operator a layer holds (``attn.qkv``, ``mlp.fc1``, ``conv2`` ...), so the same operator of
different layer classes lines up. A cell shows the operator's tensors side by side (input(s),
weight, output), each a block whose size tells its bytes (side ~ 0.3 + 0.7 x its place between
the smallest and largest tensor on a log scale: a 118 MB kernel looks bigger than a bias), cut
into one tile per shard, with its split written on it in Alpa's notation (``S(x)R``).

**Drill-down** (``sharding_figure(plan, layer="layers_3")``). One column per operator of one
layer (forward, backward and update operators alike), the same blocks, larger.

**Colour is keyed to mesh coordinates**, not one colour per device (which clashes past 8
devices): the first mesh axis of more than one device is the hue, the second the lightness
(:func:`~autoplan.viz._style.mesh_color`); a tile replicated along an axis lacks that
component (no hue: sepia; no lightness: middle), a tile held by every device is grey, and a
tile held by several devices is striped. A key at the right draws the mesh itself in these
colours. A tile is held by the devices whose mesh coordinates it records.

Tile geometry. A tensor of rank 2 with spec ``(s0, s1)`` on a mesh is cut into
``splits(s0) x splits(s1)`` tiles, where ``splits(s) = prod(mesh size of each axis in s)``. The
device with mesh coordinates ``c`` (device id = row-major index in the mesh) holds tile
``(r, q)`` with ``r`` the mixed-radix number of ``c`` on the axes of ``s0`` (first axis most
significant) and ``q`` likewise on ``s1``. Tensors of rank > 2 are folded into two display
dimensions: dims ``0 .. n-2`` form the rows (their split indices combined row-major) and the last
dim the columns; a rank-1 tensor is one row, a scalar one tile. More than 16 tiles along a
display dimension are drawn as 16 bands.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import plotly.graph_objects as go

from autoplan.plans._plan import OpSharding, Plan, Stage, TensorSharding, require_plan
from autoplan.plans._planfile import parse_keystr
from autoplan.plans._spec import Spec

from .._dtype import dtype_bytes
from .._errors import ArgumentError
from .._names import split_input_name, unit_name
from ._style import (
    PARTIAL_PATTERN,
    REPLICATED_COLOR,
    TEMPLATE,
    check_mesh,
    escape,
    fmt_bytes,
    id_span,
    mesh_color,
    mesh_rgb,
    short_list,
)

__all__ = ["tile_devices", "tile_grid", "tile_color", "sharding_figure", "op_layers",
           "sharding_columns", "block_tiles", "Tile", "Column", "MAX_BANDS"]

_ROLE_RANK = {"input": 0, "weight": 1, "output": 2}
_GENERIC_LEAVES = {"kernel", "w", "weight", "bias", "b", "scale", "embedding", "value"}
_GENERIC_LAYERS = {"", "(root)"}
#: the most tiles drawn along a display dimension (more are drawn as this many bands)
MAX_BANDS = 16
_KEY_DOMAIN = (0.89, 1.0)


def _check(shape: Sequence[int], spec: Sequence[Any], mesh_shape: Sequence[int],
           axis_names: Sequence[str]) -> None:
    if len(mesh_shape) != len(axis_names):
        raise ArgumentError(f"tile_devices: axis_names should name each of the {len(mesh_shape)} mesh "
                            f"axes of mesh_shape {tuple(mesh_shape)}. Got {tuple(axis_names)}. "
                            "Fix: one name per mesh axis.")
    if len(spec) != len(shape):
        raise ArgumentError(f"tile_devices: spec should have one entry per dimension of shape "
                            f"{tuple(shape)} ({len(shape)} entries). Got {tuple(spec)!r}. Fix: pad "
                            "the spec with None for replicated dimensions.")
    seen: set[str] = set()
    for e in spec:
        for a in e or ():
            if a not in axis_names:
                raise ArgumentError(f"tile_devices: spec {tuple(spec)!r} names mesh axis {a!r} but the "
                                    f"mesh axes are {tuple(axis_names)}. Fix: use the plan's axis names.")
            if a in seen:
                raise ArgumentError(f"tile_devices: spec {tuple(spec)!r} uses mesh axis {a!r} twice; a "
                                    "mesh axis can split at most one dimension.")
            seen.add(a)


def tile_grid(shape: Sequence[int], spec: Sequence[Any], mesh_shape: Sequence[int],
              axis_names: Sequence[str]) -> tuple[int, int]:
    """The number of display tiles (rows, columns) of a tensor, with ranks > 2 folded.

    Args:
        shape: the tensor's global shape.
        spec: one entry per dimension: ``None`` or a tuple of mesh-axis names.
        mesh_shape: the logical mesh.
        axis_names: the mesh's axis names.

    Returns:
        ``(rows, cols)``: dims ``0 .. n-2`` give the rows, the last dim the columns.

    Raises:
        ArgumentError: the spec does not fit the shape or names unknown mesh axes.
    """
    _check(shape, spec, mesh_shape, axis_names)
    size = dict(zip(axis_names, mesh_shape))
    splits = [math.prod(size[a] for a in (e or ())) for e in spec]
    if not splits:
        return 1, 1
    return math.prod(splits[:-1]), splits[-1]


def tile_devices(shape: Sequence[int], spec: Sequence[Any], mesh_shape: Sequence[int],
                 axis_names: Sequence[str]) -> list[list[tuple[int, ...]]]:
    """Which devices hold each display tile of a sharded tensor.

    Args:
        shape: the tensor's global shape.
        spec: one entry per dimension: ``None`` or a tuple of mesh-axis names.
        mesh_shape: the logical mesh.
        axis_names: the mesh's axis names.

    Returns:
        ``tiles[r][c]``: the sorted ids of the devices holding tile ``(r, c)``; a device id is the
        row-major index of the device in the mesh. Ranks > 2 are folded as :func:`tile_grid` says.

    Raises:
        ArgumentError: the spec does not fit the shape or names unknown mesh axes.

    Examples:
        >>> tile_devices((8, 8), (None, ("y",)), (2, 2), ("x", "y"))
        [[(0, 2), (1, 3)]]
        >>> tile_devices((8, 8), (("x",), ("y",)), (2, 2), ("x", "y"))
        [[(0,), (1,)], [(2,), (3,)]]
    """
    rows, cols = tile_grid(shape, spec, mesh_shape, axis_names)
    pos = {a: k for k, a in enumerate(axis_names)}
    size = dict(zip(axis_names, mesh_shape))
    splits = [math.prod(size[a] for a in (e or ())) for e in spec]
    tiles: list[list[list[int]]] = [[[] for _ in range(cols)] for _ in range(rows)]
    n = math.prod(mesh_shape)
    for dev in range(n):
        coords = _coords(dev, mesh_shape)
        idx = []
        for e in spec:
            i = 0
            for a in e or ():
                i = i * size[a] + coords[pos[a]]
            idx.append(i)
        if not idx:
            r, c = 0, 0
        else:
            r = 0
            for i, s in zip(idx[:-1], splits[:-1]):
                r = r * s + i
            c = idx[-1]
        tiles[r][c].append(dev)
    return [[tuple(t) for t in row] for row in tiles]


def _coords(dev: int, mesh_shape: Sequence[int]) -> list[int]:
    coords, rest = [], dev
    for s in reversed(mesh_shape):
        rest, c = divmod(rest, s)
        coords.append(c)
    coords.reverse()
    return coords


def _shared_coords(devices: Sequence[int], mesh_shape: Sequence[int]) -> list[int | None]:
    """Per mesh axis, the coordinate every device of ``devices`` has (None where they differ)."""
    cs = [_coords(d, mesh_shape) for d in devices]
    return [cs[0][a] if all(c[a] == cs[0][a] for c in cs) else None for a in range(len(mesh_shape))]


def tile_color(devices: Sequence[int], mesh_shape: Sequence[int]) -> str:
    """A tile's colour from the mesh coordinates its devices share (see
    :func:`~autoplan.viz._style.mesh_color`): :data:`REPLICATED_COLOR` (grey) when every
    device of a mesh of several holds it.

    Args:
        devices: the mesh-local ids (row-major) of the devices holding the tile.
        mesh_shape: the logical mesh.
    """
    check_mesh(mesh_shape, "tile_color")
    size = math.prod(mesh_shape)
    if (not isinstance(devices, Sequence) or not devices
            or any(isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < size for d in devices)):
        raise ArgumentError(f"tile_color: devices should be a non-empty list of mesh-local device "
                            f"ids in [0, {size}). Got {devices!r:.60}. Fix: pass the ids from "
                            "tile_devices.")
    if len(devices) >= size > 1:
        return REPLICATED_COLOR
    return mesh_color(_shared_coords(devices, mesh_shape), mesh_shape)


# ---- which layer an operator is shown in ----------------------------------------------------
def op_layers(plan: Plan) -> dict[int, str]:
    """The layer each planned operator is shown in: its recorded layer (the search's layers, named
    alike in every view), or, in a plan of an older version that records none (``"(root)"``),
    the layer named from the parameter it reads as the search names one
    (:func:`autoplan._names.unit_name`: ``params[0]`` for ``params[0]['w']``), else the layer of
    the operator before it (``input`` before the first)."""
    plan = require_plan(plan, "op_layers")
    out: dict[int, str] = {}
    prev = None
    for op in sorted((o for s in plan.stages for o in s.ops), key=lambda o: o.op):
        name = op.layer if op.layer not in _GENERIC_LAYERS else None
        if name is None:
            w = next((t for t in op.tensors if t.role == "weight"), None)
            name = unit_name([split_input_name(w.name)]) if w is not None else None
        if name is None:
            name = prev or "input"
        out[op.op] = name
        prev = name
    return out


def _kind(op: OpSharding, layer: str, seen: dict[str, int]) -> str:
    """The operator's kind within its layer (``attn.qkv``, ``conv2``, ``attn dot #1``)."""
    parts = [p for p in (op.scope or "").split("/") if p]
    own = layer.split("/")  # a layer's scope path ("Mixer/MixerBlock_0"); the rest is its kind
    at = next((i for i in range(len(parts) - len(own) + 1) if parts[i:i + len(own)] == own), None)
    rel = "/".join(parts[at + len(own):] if at is not None else parts)
    w = next((t for t in op.tensors if t.role == "weight"), None)
    if w is not None:
        keys = [k for k in parse_keystr(w.name[w.name.find("["):]) or () if isinstance(k, str)]
        while keys and keys[-1] in _GENERIC_LEAVES:
            keys.pop()
        tail = keys[-1] if keys else ""
        last = rel.rsplit("/", 1)[-1] if rel else ""
        if tail and tail != last and tail != layer:
            return f"{rel}.{tail}" if rel else tail
        if rel:
            return rel
    short = {"dot_general": "dot", "conv_general_dilated": "conv"}.get(op.primitive, op.primitive)
    if rel:
        key = f"{rel} {short}"
    else:  # a layer named by one word names its operators' kind ("embed", "head"); in a
        # numbered layer ("layers_3", "dense0", "params[2]") the kind is the primitive's, so the
        # same kind lines up in every repeated layer and no row names a path the model lacks
        key = layer if layer and not re.search(r"[\d\[\]./+]", layer) else short
    k = seen.get(key, 0)
    seen[key] = k + 1
    return f"{key} #{k}" if k or op.role != "forward" else key


@dataclass
class Column:
    """One column of the overview: a class of identically sharded layers (or, drilled down,
    one operator).

    Attributes:
        layers: the layers it stands for, in model order.
        stage: the stage holding its first layer (whose mesh the tiles are drawn on).
        cells: ``(kind, op)`` of its representative (first) layer, in operator order.
        ops: every planned operator id of every layer it stands for.
        stages: the indices of the stages holding its layers.
    """

    layers: list[str]
    stage: Stage
    cells: list[tuple[str, OpSharding]]
    ops: list[int] = field(default_factory=list)
    stages: list[int] = field(default_factory=list)

    @property
    def label(self) -> str:
        if len(self.layers) == 1:
            return self.layers[0]
        return f"{short_list(self.layers, 2)}"


def _forward_ops(plan: Plan) -> tuple[list[tuple[Stage, OpSharding]], bool]:
    all_ops = [(s, o) for s in plan.stages for o in s.ops]
    fwd = [(s, o) for s, o in all_ops if o.role == "forward"]
    return (fwd, True) if fwd else (all_ops, False)


def _signature(stage: Stage, cells: list[tuple[str, OpSharding]]) -> tuple:
    return (stage.mesh_shape, stage.axis_names, tuple((k, o.primitive, o.strategy,
                                tuple((t.role, t.shape, t.dtype, t.spec) for t in o.tensors))
                               for k, o in cells))


def sharding_columns(plan: Plan, layer: str | None = None) -> tuple[list[Column], bool]:
    """The figure's columns: layer classes (identically sharded layers folded), or with
    ``layer`` every operator of that layer.

    Returns:
        ``(columns, forward_only)``.

    Raises:
        ArgumentError: ``layer`` is not a layer of the plan.
    """
    names = op_layers(plan)
    if layer is not None:
        ops = [(s, o) for s in plan.stages for o in s.ops if names[o.op] == layer]
        if not ops:
            known = list(dict.fromkeys(names.values()))
            raise ArgumentError(f"sharding_figure: layer should be one of the plan's layers "
                                f"({short_list(known, 6)}). Got {layer!r}.")
        seen: dict[str, int] = {}
        cols = []
        for s, o in sorted(ops, key=lambda so: so[1].op):
            kind = _kind(o, layer, seen)
            if o.role != "forward":
                kind = f"{kind} ({o.role})"
            cols.append(Column([layer], s, [(kind, o)], [o.op], [s.index]))
        return cols, False
    ops, forward_only = _forward_ops(plan)
    per_layer: dict[str, list[tuple[Stage, OpSharding]]] = {}
    for s, o in sorted(ops, key=lambda so: so[1].op):
        per_layer.setdefault(names[o.op], []).append((s, o))
    columns: list[Column] = []
    by_sig: dict[tuple, Column] = {}
    for name, members in per_layer.items():
        seen = {}
        cells = [(_kind(o, name, seen), o) for _, o in members]
        sig = _signature(members[0][0], cells)
        col = by_sig.get(sig)
        if col is None:
            col = by_sig[sig] = Column([name], members[0][0], cells)
            columns.append(col)
        else:
            col.layers.append(name)
        col.ops.extend(o.op for _, o in members)
        for s, _ in members:
            if s.index not in col.stages:
                col.stages.append(s.index)
    return columns, forward_only


def _size_band(nbytes: float, lo: float, hi: float) -> float:
    """A block's side in [0.3, 1]: its bytes' place between ``lo`` and ``hi`` on a log scale."""
    lo = max(lo, 1.0)  # a tensor of no bytes (an empty dimension, a token) sets no lower end
    if hi <= lo or nbytes <= 0:
        return 1.0
    return 0.3 + 0.7 * (math.log(max(nbytes, lo)) - math.log(lo)) / (math.log(hi) - math.log(lo))


def _bands(n: int) -> list[tuple[int, int]]:
    """Display bands ``[a, b)`` of ``n`` tiles: one per tile, or :data:`MAX_BANDS` even bands."""
    if n <= MAX_BANDS:
        return [(i, i + 1) for i in range(n)]
    return [(n * i // MAX_BANDS, n * (i + 1) // MAX_BANDS) for i in range(MAX_BANDS)]


class _Canvas:
    """Tile polygons grouped by fill (one trace per colour and pattern), text and hover points."""

    def __init__(self) -> None:
        self.fills: dict[tuple[str, bool], tuple[list[float | None], list[float | None]]] = {}
        self.text: tuple[list[float], list[float], list[str]] = ([], [], [])
        self.hover: list[tuple[float, float, str, list[Any]]] = []
        self.kinds: set[str] = set()

    def rect(self, x0: float, x1: float, y0: float, y1: float, color: str, striped: bool) -> None:
        x0, x1, y0, y1 = (round(v, 4) for v in (x0, x1, y0, y1))
        xs, ys = self.fills.setdefault((color, striped), ([], []))
        xs.extend((x0, x1, x1, x0, x0, None))
        ys.extend((y0, y0, y1, y1, y0, None))

    def traces(self) -> list[dict[str, Any]]:
        out = []
        for (color, striped), (xs, ys) in sorted(self.fills.items()):
            tr = {"type": "scatter", "x": xs, "y": ys, "mode": "lines", "fill": "toself",
                  "fillcolor": color, "line": {"color": "white", "width": 0.6},
                  "hoverinfo": "skip", "showlegend": False, "connectgaps": False,
                  "meta": {"kind": "tiles", "color": color, "striped": striped}}
            if striped:
                tr["fillpattern"] = {**PARTIAL_PATTERN, "bgcolor": color}
            out.append(tr)
        tx, ty, tt = self.text
        if tt:
            out.append({"type": "scatter", "x": tx, "y": ty, "text": tt, "mode": "text",
                        "textfont": {"size": 9, "color": "#111111"}, "hoverinfo": "skip",
                        "showlegend": False, "meta": {"kind": "spec_text"}})
        if self.hover:
            out.append({
                "type": "scatter", "mode": "markers", "x": [h[0] for h in self.hover],
                "y": [h[1] for h in self.hover], "hovertext": [h[2] for h in self.hover],
                "hoverinfo": "text", "customdata": [h[3] for h in self.hover],
                "marker": {"size": 18, "color": "rgba(0,0,0,0)", "symbol": "square"},
                "showlegend": False, "name": "tensors",
                "meta": {"kind": "tensors",
                         "fields": ["op", "tensor", "role", "column", "row", "width", "height"]}})
        return out


@dataclass(frozen=True)
class Tile:
    """One drawn tile (or band of tiles) of a tensor block.

    Attributes:
        row, col: its place in the drawn grid of ``rows x cols``.
        rows, cols: the drawn grid (at most :data:`MAX_BANDS` per dimension).
        devices: the mesh-local ids (row-major) of the devices holding it (its first tile's,
            for a band).
        color: its colour (:func:`tile_color`); ``striped`` when several but not all devices of
            the mesh hold it.
    """

    row: int
    col: int
    rows: int
    cols: int
    devices: tuple[int, ...]
    color: str
    striped: bool


#: the width the sharding figure is laid out for (the explorer's and the report's pages)
FIGURE_WIDTH_PX = 900
#: the width of one character of a tile's split label (9 px font) and the label's height
LABEL_CHAR_PX, LABEL_HEIGHT_PX = 5.0, 11.0


def label_fits(text: str, width_px: float, height_px: float) -> bool:
    """Whether a split label fits in a block's slot of ``width_px`` x ``height_px`` pixels
    without reaching its neighbours' (a label that does not is left off: dense views stay
    readable, the hover still names the split)."""
    return width_px >= LABEL_CHAR_PX * len(text) + 2 and height_px >= LABEL_HEIGHT_PX


def block_tiles(t: TensorSharding, stage: Stage) -> list[Tile]:
    """The tiles a tensor block is drawn with, in row-major order (see the module docstring)."""
    grid = tile_devices(t.shape, t.spec, stage.mesh_shape, stage.axis_names)
    mesh_size = math.prod(stage.mesh_shape)
    rb, cb = _bands(len(grid)), _bands(len(grid[0]))
    out = []
    for i, (ra, _) in enumerate(rb):
        for j, (ca, _) in enumerate(cb):
            devs = grid[ra][ca]
            out.append(Tile(i, j, len(rb), len(cb), tuple(devs), tile_color(devs, stage.mesh_shape),
                            1 < len(devs) < mesh_size))
    return out


def _draw_tensor(cv: _Canvas, t: TensorSharding, op: OpSharding, stage: Stage, cx: float,
                 cy: float, w: float, h: float, col: int, row: int, layers: Sequence[str],
                 write_spec: bool, stored: Any = None) -> None:
    rows, cols = tile_grid(t.shape, t.spec, stage.mesh_shape, stage.axis_names)
    per_device = math.prod(t.shape) * dtype_bytes(t.dtype) / t.tiles(stage.mesh_shape, stage.axis_names)
    x0, y0 = cx - w / 2, cy - h / 2
    tiles = block_tiles(t, stage)
    for tile in tiles:
        cv.kinds.add("replicated" if tile.color == REPLICATED_COLOR else
                     ("partial" if tile.striped else "one"))
        cv.rect(x0 + w * tile.col / tile.cols, x0 + w * (tile.col + 1) / tile.cols,
                y0 + h * (tile.rows - tile.row - 1) / tile.rows, y0 + h * (tile.rows - tile.row) / tile.rows,
                tile.color, tile.striped)
    rb, cb = tiles[0].rows, tiles[0].cols
    if write_spec:
        cv.text[0].append(cx)
        cv.text[1].append(cy)
        cv.text[2].append(str(t.spec))
    cluster = [stage.device_ids[d] if d < len(stage.device_ids) else d for d in tiles[0].devices]
    folded = f"; dims 0..{len(t.shape) - 2} folded into rows" if len(t.shape) > 2 else ""
    banded = "" if (rows <= MAX_BANDS and cols <= MAX_BANDS) else f"; drawn as {rb}x{cb} bands"
    where = f" of {short_list(layers, 3)}" if len(layers) > 1 else f" of {escape(layers[0])}"
    text = (f"<b>{escape(t.name)}</b>: {t.role} of op {op.op} {escape(op.primitive)}{where}"
            f"<br>shape {'x'.join(map(str, t.shape)) or 'scalar'} {escape(t.dtype)}, "
            f"{fmt_bytes(math.prod(t.shape) * dtype_bytes(t.dtype))}"
            f"<br>spec {t.spec.pspec_text()} = {t.spec}: {rows}x{cols} tiles{folded}{banded}"
            f"<br>bytes per device {fmt_bytes(per_device)}"
            f"<br>tile (0, 0) held by device{'s' if len(cluster) > 1 else ''} {id_span(cluster)}"
            f"<br>strategy {escape(op.strategy)}")
    if stored is not None and Spec.of(stored) != t.spec:
        stored = Spec.of(stored)
        text += (f"<br><i>stored as {stored.pspec_text()} = {stored}: resharded before "
                 "this operator</i>")
    if op.comm:
        text += "<br>" + ", ".join(f"{c.kind} over {','.join(c.axes)}" for c in op.comm)
    cv.hover.append((cx, cy, text, [op.op, t.name, t.role, col, row, round(w, 6), round(h, 6)]))



def _mesh_key(stage: Stage) -> list[dict[str, Any]]:
    """The stage's logical mesh drawn in the tile colours (an RGB image), with hover text."""
    shape = list(stage.mesh_shape)
    if len(shape) == 1:
        shape = [shape[0], 1]
    n0, n1 = shape[0], math.prod(shape[1:])
    z, text = [], []
    for i in range(n0):
        row, trow = [], []
        for j in range(n1):
            d = i * n1 + j
            coords = _coords(d, stage.mesh_shape)
            row.append(list(mesh_rgb(coords, stage.mesh_shape)))
            dev = stage.device_ids[d] if d < len(stage.device_ids) else d
            trow.append(f"device {dev}: " + ", ".join(f"{a}={c}" for a, c in
                                                      zip(stage.axis_names, coords)))
        z.append(row)
        text.append(trow)
    return [{"type": "image", "z": z, "xaxis": "x2", "yaxis": "y2", "hovertext": text,
             "hoverinfo": "text", "name": "mesh key", "meta": {"kind": "mesh_key"}}]


def sharding_figure(plan: Plan, layer: str | None = None, max_columns: int = 40) -> go.Figure:
    """How each heavy operator's tensors are split over the devices, folded by layer class.

    See the module docstring for the overview (one column per class of identically sharded
    layers, one row per kind of operator), the drill-down into one layer, the tile geometry
    and the colours. Hovering a block shows the tensor's name, shape, bytes, PartitionSpec,
    bytes per device, the devices of its first tile and the operator's strategy; its point
    carries ``customdata = [op, tensor, role, column, row, width, height]`` (the trace with
    ``meta.kind == "tensors"``, at the block's centre; clicking it selects the operator or
    input). The tiles are filled polygons, one trace per colour (``meta.kind == "tiles"``).

    Args:
        plan: the plan to draw.
        layer: a layer name to drill into (every operator of that layer), or None.
        max_columns: the most columns drawn (evenly spaced along the model beyond it).

    Returns:
        A ``plotly.graph_objects.Figure``; ``layout.meta`` holds ``{"kind": "sharding",
        "columns": [{"layers", "ops", "stage", "stages", "label"}], "rows": [...]}``.

    Raises:
        ArgumentError: ``max_columns`` is not positive, ``layer`` names no layer of the plan, or a
            tensor's spec does not fit its mesh.
    """
    plan = require_plan(plan, "sharding_figure")
    if not isinstance(max_columns, int) or max_columns < 1:
        raise ArgumentError(f"sharding_figure: max_columns should be a positive integer. Got "
                            f"{max_columns!r}.")
    columns, forward_only = sharding_columns(plan, layer)
    shown = [columns[i] for i in _subsample(len(columns), max_columns)]
    rows: list[str] = []
    for c in shown:
        for kind, _ in c.cells:
            if kind not in rows:
                rows.append(kind)
    row_of = {k: i for i, k in enumerate(rows)}
    if layer is not None:  # drilled down: one operator per column, all in one row
        rows = ["input | weight | output"]
        row_of = {kind: 0 for c in shown for kind, _ in c.cells}
    sizes = [math.prod(t.shape) * dtype_bytes(t.dtype) for c in shown for _, o in c.cells
             for t in o.tensors]
    lo, hi = min(sizes, default=1.0), max(sizes, default=1.0)
    slots = max((len(o.tensors) for c in shown for _, o in c.cells), default=3)
    cv = _Canvas()
    height = max(320, 150 + 62 * len(rows)) if layer is None else 420
    # pixels per x unit (a column) and per y unit (a row) of the figure as the explorer and the
    # report draw it: a split is written on a block only where it fits (hover shows it always)
    px = (FIGURE_WIDTH_PX * (_KEY_DOMAIN[0] - 0.03) / max(len(shown), 1),
          (height - 165) / max(len(rows), 1))
    stored = {i.name: i.spec for i in plan.inputs}
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for ci, col in enumerate(shown):
        if ci and plan.is_pipeline and col.stages != shown[ci - 1].stages:
            shapes.append({"type": "line", "x0": ci, "x1": ci, "yref": "paper", "y0": 0, "y1": 1,
                           "line": {"color": "#999999", "width": 1, "dash": "dot"}})
        for kind, op in col.cells:
            r = row_of[kind]
            tensors = sorted(op.tensors, key=lambda t: _ROLE_RANK.get(t.role, 3))
            slot_w = 0.92 / max(slots, 1)
            for k, t in enumerate(tensors):
                side = _size_band(math.prod(t.shape) * dtype_bytes(t.dtype), lo, hi)
                cx = ci + 0.04 + slot_w * (k + 0.5)
                # a label no wider than its slot (the space between its neighbours' centres)
                write = label_fits(str(t.spec), slot_w * px[0], 0.84 * px[1])
                _draw_tensor(cv, t, op, col.stage, cx, r + 0.5, slot_w * 0.9 * side, 0.84 * side,
                             ci, r, col.layers, write, stored.get(t.name))
    key_stage = plan.stages[0]
    traces = cv.traces() + _mesh_key(key_stage)
    ticktext = _column_ticks(plan, shown, layer)
    mesh_txt = " | ".join(dict.fromkeys("x".join(map(str, s.mesh_shape)) + " (" + ", ".join(s.axis_names) + ")"
                                        for s in plan.stages))
    title = _sharding_title(plan, layer, columns, shown, forward_only, mesh_txt)
    layout = {
        "template": TEMPLATE,
        "title": {"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 14}},
        "xaxis": {"domain": [0.0, _KEY_DOMAIN[0] - 0.03],
                  "tickvals": [c + 0.5 for c in range(len(shown))], "ticktext": ticktext,
                  "tickangle": 0 if len(shown) <= 10 else -45, "tickfont": {"size": 10},
                  "range": [-0.05, max(len(shown), 1) + 0.05], "showgrid": False,
                  "zeroline": False},
        "yaxis": {"tickvals": [r + 0.5 for r in range(len(rows))],
                  "ticktext": [escape(r) for r in rows], "range": [len(rows) + 0.02, -0.02],
                  "showgrid": False, "zeroline": False, "automargin": True},
        "xaxis2": {"domain": list(_KEY_DOMAIN), "anchor": "y2", "showgrid": False,
                   "zeroline": False, "title": {"text": f"mesh key<br>{escape(mesh_txt.split(' | ')[0])}",
                                                "font": {"size": 10}},
                   "showticklabels": False},
        "yaxis2": {"domain": [0.45, 1.0], "anchor": "x2", "showgrid": False, "zeroline": False,
                   "showticklabels": False, "scaleanchor": "x2", "autorange": "reversed"},
        "shapes": shapes, "annotations": annotations, "height": round(height),
        "margin": {"t": 95, "b": 70, "l": 20, "r": 20}, "hovermode": "closest", "showlegend": False,
        "meta": {"kind": "sharding", "layer": layer,
                 "columns": [{"layers": c.layers, "ops": c.ops, "stage": c.stage.index,
                              "stages": c.stages, "label": c.label} for c in shown],
                 "rows": rows},
    }
    return go.Figure(data=traces, layout=layout)


def _column_ticks(plan: Plan, shown: list, layer: str | None) -> list[str]:
    """Each column's tick: its operator (drilled into a layer), or its layers (``xN`` where
    several share it), and with a pipeline its stage or stages."""
    ticktext = []
    for col in shown:
        if layer is not None:
            text = escape(col.cells[0][0])
        elif len(col.layers) > 1:
            text = f"{escape(short_list(col.layers, 2))}<br><b>x{len(col.layers)}</b>"
        else:
            text = escape(col.layers[0])
        if plan.is_pipeline:
            st = col.stages
            text += "<br>" + (f"stage {st[0]}" if len(st) == 1 else
                              f"stages {id_span(st)}")
        ticktext.append(text)
    return ticktext


def _sharding_title(plan: Plan, layer: str | None, columns: list, shown: list,
                    forward_only: bool, mesh_txt: str) -> str:
    """The title: what is drawn (layers and columns, or one layer's operators) and on which
    mesh, with notes on the colours, folded columns and columns left out."""
    key_stage = plan.stages[0]
    n_layers = sum(len(c.layers) for c in columns)
    n_ops = sum(len(c.ops) for c in columns)
    if layer is not None:
        head = (f"Operator sharding of {escape(plan.model)} [{escape(plan.label)}], layer "
                f"{escape(layer)}: {len(columns)} operators on mesh {mesh_txt}")
    else:
        head = (f"Operator sharding of {escape(plan.model)} [{escape(plan.label)}] on mesh "
                f"{mesh_txt}: {n_layers} layers in {len(columns)} column"
                f"{'s' if len(columns) != 1 else ''}, {n_ops} {'forward ' if forward_only else ''}ops")
    axes = [f"{a} ({n})" for a, n in zip(key_stage.axis_names, key_stage.mesh_shape) if n > 1]
    colour = ("colour = mesh coordinates: " + (f"hue {axes[0]}" if axes else "")
              + (f", lightness {axes[1]}" if len(axes) > 1 else "")
              + "; grey = replicated on all; stripes = several devices; block size ~ bytes (log)")
    notes = [colour]
    folded = [c for c in columns if len(c.layers) > 1]
    if folded and layer is None:
        notes.insert(0, "identically sharded layers share a column")
    if len(shown) < len(columns):
        notes.insert(0, f"{len(shown)} of {len(columns)} columns shown, evenly spaced")
    if not columns:
        head = f"Operator sharding of {escape(plan.model)}: the plan records no operator shardings"
        notes = []
    return head + ("<br><sup>" + "; ".join(notes) + "</sup>" if notes else "")


def _subsample(n: int, k: int) -> list[int]:
    if n <= k:
        return list(range(n))
    if k <= 1:
        return [0]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})
