"""Colours, number formats and small shared helpers of the plan figures.

Every colour is a pure function of an index (a device id, a stage, a class), so the same plan
always draws the same way and the same device has the same colour in every figure.
"""

from __future__ import annotations

import colorsys
import html
import math
from collections.abc import Sequence
from typing import Any

from .._errors import ArgumentError, ArgumentTypeError

__all__ = [
    "REPLICATED_COLOR",
    "PARTIAL_PATTERN",
    "UNUSED_COLOR",
    "IDLE_COLOR",
    "GREYS",
    "TEMPLATE",
    "device_color",
    "stage_color",
    "class_color",
    "tint",
    "shade",
    "fmt_bytes",
    "fmt_seconds",
    "escape",
    "legend_swatch",
    "mesh_color",
    "mesh_rgb",
    "time_unit",
    "fmt_in_unit",
    "fmt_sig",
    "axis_ticks",
    "short_list",
]

REPLICATED_COLOR = "#9e9e9e"
"""A tile held by every device of the mesh (Alpa: grey = replicated)."""
PARTIAL_PATTERN = {"shape": "/", "fgcolor": "rgba(255,255,255,0.75)", "size": 7, "solidity": 0.3}
"""Stripes over a tile held by several, but not all, devices (replicated along some mesh axes)."""
UNUSED_COLOR = "#ffffff"
"""A cluster device that no stage uses."""
IDLE_COLOR = "#eeeeee"
"""An idle gap (bubble) on a pipeline timeline."""
GREYS = frozenset({REPLICATED_COLOR, "#808080", "#7f7f7f", "#c8c8c8", "#cccccc", "#dddddd"})
TEMPLATE = "plotly_white"

# Saturated, mutually distinct, never grey: one per device for up to 24 devices.
_DEVICE_PALETTE = (
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#17becf", "#e377c2", "#bcbd22",
    "#8c564b", "#0b3d91", "#f0027f", "#66a61e", "#e6ab02", "#7570b3", "#1b9e77", "#d95f02",
    "#00bfff", "#b22222", "#6b8e23", "#ff1493", "#4b0082", "#008080", "#ffd700", "#800000",
)
_STAGE_PALETTE = (
    "#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#eeca3b", "#9d755d",
    "#ff9da6", "#3b8bc2", "#8cd17d", "#d37295",
)
_CLASS_PALETTE = (
    "#66c2a5", "#fc8d62", "#8da0cb", "#e78ac3", "#a6d854", "#ffd92f", "#e5c494", "#1b9e77",
    "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d",
)
_GOLDEN = 0.618033988749895


def _generated(i: int, offset: float) -> str:
    hue = (offset + i * _GOLDEN) % 1.0
    light = (0.42, 0.55, 0.34)[i % 3]
    r, g, b = colorsys.hls_to_rgb(hue, light, 0.75)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def check_count(value: Any, what: str, where: str, minimum: int = 0) -> None:
    """Raise :class:`ArgumentError` unless ``value`` is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ArgumentError(f"{where}: {what} should be an integer >= {minimum}. Got {value!r}. "
                            f"Fix: pass a whole number of at least {minimum}.")


def check_mesh(mesh_shape: Any, where: str) -> None:
    """Raise :class:`ArgumentError` unless ``mesh_shape`` is a sequence of positive integers."""
    if not isinstance(mesh_shape, Sequence) or isinstance(mesh_shape, str):
        raise ArgumentTypeError(f"{where}: mesh_shape should be a sequence of axis sizes. Got "
                                f"{type(mesh_shape).__name__}: {mesh_shape!r:.60}. Fix: pass e.g. (2, 4).")
    for n in mesh_shape:
        check_count(n, "each mesh_shape entry", where, 1)


def device_color(device: int) -> str:
    """The colour of cluster device ``device`` (a hex string; never grey)."""
    check_count(device, "device", "device_color")
    if device < len(_DEVICE_PALETTE):
        return _DEVICE_PALETTE[device]
    return _generated(device, 0.11)


def stage_color(stage: int) -> str:
    """The colour of pipeline stage ``stage``."""
    check_count(stage, "stage", "stage_color")
    if stage < len(_STAGE_PALETTE):
        return _STAGE_PALETTE[stage]
    return _generated(stage, 0.37)


def class_color(cls: int | None) -> str:
    """The colour of a mined layer class (``None``: no class, light grey)."""
    if cls is None:
        return "#dddddd"
    if isinstance(cls, bool) or not isinstance(cls, int):
        raise ArgumentTypeError(f"class_color: cls should be a class index or None. Got "
                                f"{type(cls).__name__}: {cls!r:.40}. Fix: pass an int.")
    if 0 <= cls < len(_CLASS_PALETTE):
        return _CLASS_PALETTE[cls]
    return _generated(abs(cls), 0.71)


def _mix(color: str, other: tuple[int, int, int], amount: float) -> str:
    c = color.lstrip("#")
    rgb = [int(c[k:k + 2], 16) for k in (0, 2, 4)]
    out = [round(v + (o - v) * amount) for v, o in zip(rgb, other)]
    return "#" + "".join(f"{v:02x}" for v in out)


def tint(color: str, amount: float = 0.45) -> str:
    """``color`` mixed with white (``amount`` in [0, 1])."""
    return _mix(color, (255, 255, 255), amount)


def shade(color: str, amount: float = 0.3) -> str:
    """``color`` mixed with black (``amount`` in [0, 1])."""
    return _mix(color, (0, 0, 0), amount)


def fmt_bytes(n: float) -> str:
    """``1536`` -> ``'1.50 KiB'``."""
    if n is None or not math.isfinite(n):
        return "n/a"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_seconds(t: float) -> str:
    """``0.0123`` -> ``'12.300 ms'``."""
    if t is None or not math.isfinite(t):
        return "n/a"
    if abs(t) >= 1:
        return f"{t:.3f} s"
    if abs(t) >= 1e-3:
        return f"{t * 1e3:.3f} ms"
    return f"{t * 1e6:.1f} us"


_MAX_HUES = 24
_MAX_LIGHTS = 6
_NO_HUE = (0.08, 0.30)  # (hue, saturation) of a tile not split over the hue axis: sepia


def _active_axes(mesh_shape: Sequence[int]) -> list[int]:
    return [a for a, n in enumerate(mesh_shape) if n > 1]


def mesh_rgb(coords: Sequence[int | None], mesh_shape: Sequence[int]) -> tuple[int, int, int]:
    """The colour of a place on the logical mesh, keyed to its coordinates.

    The first mesh axis of more than one device sets the hue (its coordinate ``c`` of ``n``: hue
    ``0.85 c / n``, at most 24 hues), the second the lightness (dark to light, at most 6
    levels); ``None`` for an axis the tile is not split over (it is replicated along it): no hue
    (a sepia tone) or the middle lightness. Every coordinate ``None``: the replicated grey.

    Args:
        coords: one coordinate (or None) per mesh axis.
        mesh_shape: the logical mesh.

    Returns:
        ``(r, g, b)`` in 0..255.
    """
    axes = _active_axes(mesh_shape)
    known = [a for a in axes if coords[a] is not None]
    if not known:
        c = REPLICATED_COLOR.lstrip("#")
        return int(c[0:2], 16), int(c[2:4], 16), int(c[4:6], 16)
    hue, sat = _NO_HUE
    light = 0.5
    if axes and coords[axes[0]] is not None:
        n = mesh_shape[axes[0]]
        bucket = coords[axes[0]] * min(n, _MAX_HUES) // n
        hue, sat = 0.85 * bucket / min(n, _MAX_HUES), 0.72
    if len(axes) > 1 and coords[axes[1]] is not None:
        n = mesh_shape[axes[1]]
        levels = min(n, _MAX_LIGHTS)
        bucket = coords[axes[1]] * levels // n
        light = 0.28 + 0.47 * bucket / max(levels - 1, 1)
    r, g, b = colorsys.hls_to_rgb(hue, light, sat)
    return round(r * 255), round(g * 255), round(b * 255)


def mesh_color(coords: Sequence[int | None], mesh_shape: Sequence[int]) -> str:
    """:func:`mesh_rgb` as a hex string."""
    check_mesh(mesh_shape, "mesh_color")
    if (not isinstance(coords, Sequence) or len(coords) != len(mesh_shape)
            or any(c is not None and (isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < n)
                   for c, n in zip(coords, mesh_shape))):
        raise ArgumentError(f"mesh_color: coords should give, per axis of mesh_shape "
                            f"{tuple(mesh_shape)}, a coordinate in range or None. Got {coords!r:.60}. "
                            "Fix: one entry per mesh axis.")
    return "#{:02x}{:02x}{:02x}".format(*mesh_rgb(coords, mesh_shape))


def time_unit(seconds: float) -> tuple[float, str]:
    """The unit to show times up to ``seconds`` in: ``(seconds per unit, name)``."""
    t = abs(seconds) if seconds is not None and math.isfinite(seconds) else 0.0
    if t >= 1:
        return 1.0, "s"
    if t >= 1e-3:
        return 1e-3, "ms"
    return 1e-6, "\u00b5s"


def fmt_in_unit(t: float, unit: tuple[float, str]) -> str:
    """``t`` seconds written in ``unit`` (from :func:`time_unit`) with 4 significant digits."""
    if t is None or not math.isfinite(t):
        return "n/a"
    return f"{t / unit[0]:.4g} {unit[1]}"


def fmt_sig(v: float, digits: int = 3) -> str:
    """``v`` with at most ``digits`` significant digits, never in exponent form or with SI
    suffixes: ``0.25``, ``12.5``, ``1000``, ``0.0417``."""
    if v is None or not math.isfinite(v):
        return "n/a"
    if v == 0:
        return "0"
    d = digits - 1 - math.floor(math.log10(abs(v)))
    r = round(v, d)
    if r and math.floor(math.log10(abs(r))) != math.floor(math.log10(abs(v))):
        d -= 1  # rounding carried into the next decade (9.996 -> 10.0)
        r = round(v, d)
    text = f"{r:.{max(d, 0)}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def axis_ticks(lo: float, hi: float, *, log: bool = False, count: int = 5) -> dict[str, Any]:
    """An axis's ticks between ``lo`` and ``hi`` (in the axis's one unit): round steps (1, 2,
    2.5 or 5 times a power of ten; on a log axis 1, 2 and 5 per decade, or decades only when
    that is too many), labelled with at most 3 significant digits. Returns the layout keys
    (``tickmode="array"``, ``tickvals``, ``ticktext``) to merge into the axis."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return {}
    lo, hi = min(lo, hi), max(lo, hi)
    vals: list[float] = []
    if log:
        lo = max(lo, 1e-12)
        hi = max(hi, lo)
        k0, k1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        for mults in ((1, 2, 5), (1,)):
            vals = [m * 10.0 ** k for k in range(k0, k1 + 1) for m in mults
                    if lo * (1 - 1e-9) <= m * 10.0 ** k <= hi * (1 + 1e-9)]
            if len(vals) <= 2 * count:
                break
        if len(vals) < 2:  # a narrow range: its ends
            vals = sorted({float(fmt_sig(lo)), float(fmt_sig(hi))})
    else:
        span = hi - lo or abs(hi) or 1.0
        raw = span / count
        mag = 10.0 ** math.floor(math.log10(raw))
        step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * (1 - 1e-9))
        k = math.ceil(lo / step - 1e-9)
        while k * step <= hi + step * 1e-9:
            vals.append(k * step)
            k += 1
    vals = [float(fmt_sig(v)) for v in vals]
    return {"tickmode": "array", "tickvals": vals, "ticktext": [fmt_sig(v) for v in vals]}


def id_span(ids: Sequence[int]) -> str:
    """A set of device or stage ids as text: ``"0-7"`` for a run, the first six and the count
    for many, ``"-"`` for none."""
    ids = sorted(ids)
    if not ids:
        return "-"
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    if len(ids) > 8:
        return f"{', '.join(map(str, ids[:6]))}, ... ({len(ids)})"
    return ", ".join(map(str, ids))


def short_list(names: Sequence[str], limit: int = 3) -> str:
    """``a, b, c`` or ``a .. z (24)`` for long lists (names in order)."""
    names = list(names)
    if len(names) <= limit:
        return ", ".join(names)
    return f"{names[0]} .. {names[-1]} ({len(names)})"


def escape(text: Any) -> str:
    """HTML-escape ``text`` for hover labels (which accept a little HTML)."""
    return html.escape(str(text), quote=False)


def legend_swatch(name: str, color: str, group: str | None = None, symbol: str = "square",
                  **meta: Any) -> dict[str, Any]:
    """A legend-only trace: a coloured square (``symbol``) with ``name`` and no data."""
    return {
        "type": "scatter", "x": [None], "y": [None], "mode": "markers", "name": name,
        "marker": {"color": color, "symbol": symbol, "size": 12,
                   "line": {"color": "#555555", "width": 1}},
        "legendgroup": group or name, "hoverinfo": "skip", "meta": {"kind": "legend", **meta},
    }
