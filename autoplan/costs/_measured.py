"""Measured tables of a device profile: collective times per device-group geometry
(:class:`CollectiveTable`, Alpa's profiling database) and operation throughput by size
(:class:`ThroughputCurve`), each fitted from raw measurements. A measured
:class:`~autoplan.costs._cluster.Cluster` holds them; its cost model reads them (see
:mod:`autoplan.costs._mesh` for the collectives' formulas).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from autoplan.costs._fit import fit_line
from autoplan.costs._fit import interpolate as _interpolate
from autoplan.costs._fit import running_max as _running_max

__all__ = ["CollectiveTable", "ThroughputCurve", "canonical_group"]


@dataclass(frozen=True)
class CollectiveTable:
    """Measured times of one collective kind on one device-group geometry.

    Attributes:
        kind: one of :data:`~autoplan.costs._mesh.COLLECTIVES`.
        group: the group's geometry as ``((size, stride), ...)`` in device order, innermost
            first: ``((4, 1),)`` is 4 neighbouring devices, ``((2, 4),)`` devices 4 apart. Every
            group of the mesh axis runs at once when it is measured, as in a plan.
        nbytes: message sizes measured (``B`` of the formulas above), increasing.
        seconds: the measured time of each size (made non-decreasing).
        alpha: fitted latency (s); ``beta`` fitted seconds per byte of ``B``.
    """

    kind: str
    group: tuple[tuple[int, int], ...]
    nbytes: tuple[float, ...]
    seconds: tuple[float, ...]
    alpha: float
    beta: float

    @property
    def size(self) -> int:
        """Devices in one group."""
        return math.prod(s for s, _ in self.group)

    def time(self, nbytes: float) -> float:
        """Seconds for a collective of ``nbytes`` (``B``) on this group."""
        if nbytes <= 0:
            return 0.0
        return _interpolate(self.nbytes, self.seconds, self.alpha, self.beta, float(nbytes))

    @classmethod
    def from_measurements(cls, kind: str, group: Sequence[Sequence[int]], nbytes: Sequence[float],
                          seconds: Sequence[float]) -> CollectiveTable:
        """A table from raw measurements: sorted by size, made non-decreasing, fitted."""
        pts = sorted(zip(map(float, nbytes), map(float, seconds)))
        xs = tuple(x for x, _ in pts)
        ts = tuple(_running_max(t for _, t in pts))
        a, b = fit_line(xs, ts)
        return cls(kind, tuple((int(s), int(d)) for s, d in group), xs, ts, a, b)


@dataclass(frozen=True)
class ThroughputCurve:
    """Measured throughput of one operation by size: the achievable fraction of peak.

    Attributes:
        op: ``"matmul"`` or ``"conv"`` (sizes in FLOPs per device), or ``"memory"`` (sizes in
            bytes a kernel reads and writes per device: the bandwidth a kernel of that size
            sees, higher for small ones that stay in caches).
        dtype: the operands' dtype name.
        sizes: the work of one operation per device, increasing.
        seconds: measured seconds per operation (all devices running one each at once, without
            the per-kernel overhead ``Cluster.op_overhead``), non-decreasing.
        peak: fitted asymptotic rate per device (FLOP/s, or bytes/s); ``half``: fitted size at
            which half of it is reached (the fit is ``t(W) = (W + half) / peak``).
    """

    op: str
    dtype: str
    sizes: tuple[float, ...]
    seconds: tuple[float, ...]
    peak: float
    half: float

    def time(self, work: float) -> float:
        """Seconds per device for an operation of ``work`` (FLOPs or bytes) per device."""
        if work <= 0:
            return 0.0
        if self.peak <= 0:
            return _interpolate(self.sizes, self.seconds, 0.0, 0.0, float(work))
        return _interpolate(self.sizes, self.seconds, self.half / self.peak, 1.0 / self.peak,
                            float(work))

    def efficiency(self, work: float, peak: float) -> float:
        """The achieved fraction of ``peak`` at this size."""
        t = self.time(work)
        return work / (t * peak) if t > 0 and peak > 0 else 0.0

    @classmethod
    def from_measurements(cls, op: str, dtype: str, sizes: Sequence[float],
                          seconds: Sequence[float]) -> ThroughputCurve:
        """A curve from raw measurements: sorted, made non-decreasing, fitted."""
        pts = sorted(zip(map(float, sizes), map(float, seconds)))
        xs = tuple(x for x, _ in pts)
        ts = tuple(_running_max(t for _, t in pts))
        a, b = fit_line(xs, ts)
        peak = 1.0 / b if b > 0 else (xs[-1] / ts[-1] if ts and ts[-1] > 0 else 0.0)
        return cls(op, dtype, xs, ts, peak, a * peak)


def canonical_group(sizes: Sequence[int], strides: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """The geometry of a device group spanned by mesh axes of ``sizes`` and ``strides`` (in
    devices): innermost first, with an axis merged into the next inner one when together they are
    one run of devices (``(2, 4)`` and ``(4, 1)`` are the 8 devices ``((8, 1),)``).

    Examples:
        >>> canonical_group([2, 4], [4, 1])
        ((8, 1),)
        >>> canonical_group([2], [4])
        ((2, 4),)
    """
    dims = sorted((int(st), int(sz)) for sz, st in zip(sizes, strides) if sz > 1)
    out: list[tuple[int, int]] = []
    for st, sz in dims:
        if out and out[-1][0] * out[-1][1] == st:
            out[-1] = (out[-1][0] * sz, out[-1][1])
        else:
            out.append((sz, st))
    return tuple(out)
