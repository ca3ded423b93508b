"""The operator-sharding figure, after Alpa's Wide-ResNet figure (Zheng et al., OSDI 2022, Fig. 12).

Each heavy operator along the model is a column; its tensors (input, weight, output) are blocks
cut into tiles, one tile per distinct shard. A tile held by exactly one device has that device's
colour; a tile held by every device of the mesh (replicated) is grey, as in Alpa's figure; a tile
held by several but not all devices (split over some mesh axes, replicated over the others) has
the colour of its lowest device id, striped, so the tiles of a tensor split 4 ways on a 2x4 mesh
show 4 colours rather than 4 identical greys.

Tile geometry. A tensor of rank 2 with spec ``(s0, s1)`` on a mesh is cut into
``splits(s0) x splits(s1)`` tiles, where ``splits(s) = prod(mesh size of each axis in s)``. The
device with mesh coordinates ``c`` (device id = row-major index in the mesh) holds tile
``(r, q)`` with ``r`` the mixed-radix number of ``c`` on the axes of ``s0`` (first axis most
significant) and ``q`` likewise on ``s1``. Tensors of rank > 2 are folded into two display
dimensions: dims ``0 .. n-2`` form the rows (their split indices combined row-major) and the last
dim the columns; a rank-1 tensor is one row, a scalar one tile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from .._plan import OpSharding, Plan, Stage, TensorSharding, spec_str
from ._style import (
    PARTIAL_PATTERN,
    REPLICATED_COLOR,
    TEMPLATE,
    device_color,
    dtype_bytes,
    escape,
    fmt_bytes,
    legend_swatch,
    pspec_text,
)

__all__ = ["tile_devices", "tile_grid", "tile_color", "sharding_figure"]

_ROLE_RANK = {"input": 0, "weight": 1, "output": 2}


def _check(shape: Sequence[int], spec: Sequence[Any], mesh_shape: Sequence[int],
           axis_names: Sequence[str]) -> None:
    if len(mesh_shape) != len(axis_names):
        raise ValueError(f"tile_devices: axis_names should name each of the {len(mesh_shape)} mesh "
                         f"axes of mesh_shape {tuple(mesh_shape)}. Got {tuple(axis_names)}.")
    if len(spec) != len(shape):
        raise ValueError(f"tile_devices: spec should have one entry per dimension of shape "
                         f"{tuple(shape)} ({len(shape)} entries). Got {tuple(spec)!r}. Fix: pad "
                         "the spec with None for replicated dimensions.")
    seen: set[str] = set()
    for e in spec:
        for a in e or ():
            if a not in axis_names:
                raise ValueError(f"tile_devices: spec {tuple(spec)!r} names mesh axis {a!r} but the "
                                 f"mesh axes are {tuple(axis_names)}. Fix: use the plan's axis names.")
            if a in seen:
                raise ValueError(f"tile_devices: spec {tuple(spec)!r} uses mesh axis {a!r} twice; a "
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
        ValueError: the spec does not fit the shape or names unknown mesh axes.
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
        ValueError: the spec does not fit the shape or names unknown mesh axes.

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
        coords, rest = [], dev
        for s in reversed(mesh_shape):
            rest, c = divmod(rest, s)
            coords.append(c)
        coords.reverse()
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


def tile_color(devices: Sequence[int], mesh_size: int) -> str:
    """A tile's colour: :data:`REPLICATED_COLOR` (grey) when all ``mesh_size`` devices of the mesh
    hold it (and more than one), else the colour of the lowest device id holding it (the figure
    stripes it when that is more than one device)."""
    if len(devices) >= mesh_size > 1:
        return REPLICATED_COLOR
    return device_color(min(devices))


def _forward_ops(plan: Plan) -> tuple[list[tuple[Stage, OpSharding]], bool]:
    all_ops = [(s, o) for s in plan.stages for o in s.ops]
    fwd = [(s, o) for s, o in all_ops if o.role == "forward"]
    return (fwd, True) if fwd else (all_ops, False)


def _subsample(n: int, k: int) -> list[int]:
    if n <= k:
        return list(range(n))
    if k <= 1:
        return [0]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def _op_label(op: OpSharding) -> str:
    tail = op.scope.rstrip("/").rsplit("/", 1)[-1] if op.scope else ""
    if op.layer and tail and tail != op.layer:
        return f"{op.layer}/{tail}"
    return op.layer or tail or f"op {op.op}"


def _span(ids: Sequence[int]) -> str:
    ids = list(ids)
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    return ", ".join(map(str, ids))


def sharding_figure(plan: Plan, max_ops: int = 48) -> go.Figure:
    """Alpa-style view of how each heavy operator's tensors are split over the devices.

    One column per forward operator (in model order; evenly subsampled when there are more than
    ``max_ops``); in each column the operator's tensors as blocks, inputs at the bottom, weights
    in the middle, outputs on top. Each block is cut into tiles (see :func:`tile_devices`); a tile
    held by one device has that device's colour (:func:`device_color` of its cluster device id);
    a tile held by all devices of the mesh is grey (replicated); a tile held by several but not
    all has the colour of its lowest cluster device id and a stripe pattern (see
    :func:`tile_color`). Hovering a tile shows the tensor's name, shape, PartitionSpec, bytes per
    device and the devices holding the tile.

    Every tile is its own trace with ``meta = {"kind": "tile", "op", "column", "tensor",
    "role", "row", "col", "devices" (mesh-local ids), "cluster_devices", "stage",
    "replicated", "striped"}``.

    Args:
        plan: the plan to draw.
        max_ops: the most operators drawn.

    Returns:
        A ``plotly.graph_objects.Figure``.

    Raises:
        ValueError: ``max_ops`` is not positive, or a tensor's spec does not fit its mesh.
    """
    if not isinstance(max_ops, int) or max_ops < 1:
        raise ValueError(f"sharding_figure: max_ops should be a positive integer. Got {max_ops!r}.")
    ops, forward_only = _forward_ops(plan)
    picked = _subsample(len(ops), max_ops)
    traces: list[dict[str, Any]] = []
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    used_devices: set[int] = set()
    used_kinds: set[str] = set()
    n_slots = 1
    folded = False
    ticktext = []
    prev_stage = None
    for col, k in enumerate(picked):
        stage, op = ops[k]
        ticktext.append(escape(_op_label(op)))
        if prev_stage is not None and stage.index != prev_stage and plan.is_pipeline:
            shapes.append({"type": "line", "x0": col - 0.05, "x1": col - 0.05, "yref": "paper",
                           "y0": 0, "y1": 1, "line": {"color": "#444444", "width": 1.5, "dash": "dot"}})
        if plan.is_pipeline and stage.index != prev_stage:
            annotations.append({"x": col + 0.05, "y": 1.0, "yref": "paper", "xanchor": "left",
                                "yanchor": "bottom", "showarrow": False,
                                "text": f"stage {stage.index}", "font": {"size": 11}})
        prev_stage = stage.index
        mesh_size = math.prod(stage.mesh_shape)
        tensors = sorted(op.tensors, key=lambda t: _ROLE_RANK.get(t.role, 3))
        n_slots = max(n_slots, len(tensors))
        for slot, t in enumerate(tensors):
            folded = folded or len(t.shape) > 2
            traces.extend(_tensor_tiles(t, op, stage, col, slot, mesh_size, used_devices, used_kinds))
    legend = [legend_swatch(f"device {d}", device_color(d), group="devices", device=d)
              for d in sorted(used_devices)]
    if "replicated" in used_kinds:
        legend.append(legend_swatch("replicated on all devices", REPLICATED_COLOR, group="grey"))
    if "partial" in used_kinds:
        legend.append(legend_swatch("striped: on several devices, coloured by the lowest id",
                                    "#666666", group="striped", symbol="square-x-open"))
    mesh_txt = " | ".join(sorted({"x".join(map(str, s.mesh_shape)) + " (" + ", ".join(s.axis_names) + ")"
                                  for s in plan.stages}))
    head = (f"Operator sharding of {escape(plan.model)} [{escape(plan.label)}] on mesh {mesh_txt}: "
            f"{len(picked)} {'forward ' if forward_only else ''}ops")
    notes = ["colour = device holding a tile (striped: several devices, colour of the lowest id), "
             "grey = replicated on all"]
    if len(picked) < len(ops):
        notes.insert(0, f"{len(picked)} of {len(ops)} ops shown, evenly spaced along the model")
    if folded:
        notes.append("rank>2 tensors: dims 0..n-2 folded into rows, last dim = columns")
    if not ops:
        head = f"Operator sharding of {escape(plan.model)}: the plan records no operator shardings"
        notes = []
    role_names = ["input", "weight", "output"] + [f"tensor {i}" for i in range(3, n_slots)]
    layout = {
        "template": TEMPLATE,
        "title": {"text": head + ("<br><sup>" + "; ".join(notes) + "</sup>" if notes else ""),
                  "x": 0.01, "xanchor": "left"},
        "xaxis": {"tickvals": [c + 0.5 for c in range(len(picked))], "ticktext": ticktext,
                  "tickangle": -60, "tickfont": {"size": 9}, "range": [-0.2, max(len(picked), 1) + 0.1],
                  "showgrid": False, "zeroline": False, "title": {"text": "operator (model order)"}},
        "yaxis": {"tickvals": [s + 0.5 for s in range(n_slots)], "ticktext": role_names[:n_slots],
                  "range": [-0.05, n_slots + 0.05], "showgrid": False, "zeroline": False},
        "shapes": shapes, "annotations": annotations,
        "height": 260 + 110 * n_slots, "margin": {"t": 110, "b": 120, "l": 70, "r": 20},
        "legend": {"title": {"text": "held by"}}, "hovermode": "closest",
    }
    return go.Figure(data=traces + legend, layout=layout)


def _tensor_tiles(t: TensorSharding, op: OpSharding, stage: Stage, col: int, slot: int,
                  mesh_size: int, used_devices: set[int], used_kinds: set[str]) -> list[dict[str, Any]]:
    grid = tile_devices(t.shape, t.spec, stage.mesh_shape, stage.axis_names)
    rows, cols = len(grid), len(grid[0])
    shards = math.prod(s for s, a in zip(stage.mesh_shape, stage.axis_names)
                       if any(a in (e or ()) for e in t.spec))
    per_device = math.prod(t.shape) * dtype_bytes(t.dtype) / shards
    head = (f"<b>{escape(t.name)}</b> ({t.role} of op {op.op} {escape(op.primitive)}, "
            f"{escape(op.layer)})<br>shape {'x'.join(map(str, t.shape)) or 'scalar'} {escape(t.dtype)}"
            f"<br>spec {pspec_text(t.spec)} = {spec_str(t.spec)}<br>bytes per device "
            f"{fmt_bytes(per_device)}<br>strategy {escape(op.strategy)}")
    x0, x1 = col + 0.1, col + 0.9
    y0, y1 = slot + 0.08, slot + 0.92
    w, h = (x1 - x0) / cols, (y1 - y0) / rows
    out = []
    for r, row in enumerate(grid):
        for c, devs in enumerate(row):
            cluster = [stage.device_ids[d] if d < len(stage.device_ids) else d for d in devs]
            color = tile_color(cluster, mesh_size)
            if color == REPLICATED_COLOR:
                used_kinds.add("replicated")
            else:
                used_devices.add(min(cluster))
                if len(devs) > 1:
                    used_kinds.add("partial")
            a, b = x0 + c * w, x0 + (c + 1) * w
            top, bot = y1 - r * h, y1 - (r + 1) * h
            text = (f"{head}<br>tile ({r}, {c}) of {rows}x{cols} held by "
                    f"{'device' if len(devs) == 1 else f'{len(devs)} devices'} {_span(cluster)}")
            out.append({
                "type": "scatter", "x": [a, b, b, a, a], "y": [bot, bot, top, top, bot],
                "mode": "lines", "fill": "toself", "fillcolor": color,
                "line": {"color": "white", "width": 1}, "hoveron": "fills", "hoverinfo": "text",
                "text": text, "showlegend": False, "name": t.name,
                "meta": {"kind": "tile", "op": op.op, "column": col, "tensor": t.name,
                         "role": t.role, "row": r, "col": c, "devices": list(devs),
                         "cluster_devices": cluster, "stage": stage.index,
                         "replicated": color == REPLICATED_COLOR,
                         "striped": 1 < len(devs) and color != REPLICATED_COLOR},
            })
            if 1 < len(devs) and color != REPLICATED_COLOR:
                out[-1]["fillpattern"] = {**PARTIAL_PATTERN, "bgcolor": color}
    return out
