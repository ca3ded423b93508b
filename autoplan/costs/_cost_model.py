"""The cost model of a cluster's devices: compute, memory and launch times, link bandwidths.

:class:`DeviceCostModel` holds the methods :class:`~autoplan.costs._cluster.Cluster` inherits
to time work on one of its devices; they read the cluster's fields (its datasheet numbers or its
measured profile).

Compute: an operator's time per device is a roofline plus overhead,
``t = max(F / R(F, dtype), Q / BW) + o``, where ``F`` is its FLOPs per device, ``R`` the
achievable FLOP/s for an operation of that size (the measured curve, or ``peak x efficiency``), ``Q``
the bytes it moves to and from memory per device, ``BW`` the memory bandwidth and ``o`` the
per-kernel overhead (see :mod:`autoplan.search.intra._strategies` for which operators are kernels
under XLA's fusion).

The collectives' costs, on the axes of a logical mesh, are in :mod:`autoplan.costs._mesh`; they
look up the measured tables through :meth:`DeviceCostModel.collective_table`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from autoplan._memo import per_owner
from autoplan.costs._device_models import peak_rate as _peak_rate
from autoplan.costs._device_models import precision as _precision
from autoplan.costs._device_models import saturated_time as _saturated_time
from autoplan.costs._measured import CollectiveTable, ThroughputCurve

__all__ = ["DeviceCostModel", "CURVE_OPS"]

#: operations with a measured throughput curve
CURVE_OPS = ("matmul", "conv", "memory")


def _table_index(tables: Sequence[CollectiveTable]) -> dict[str, dict]:
    exact: dict[tuple, CollectiveTable] = {}
    by_size: dict[tuple, list[CollectiveTable]] = {}
    for t in tables:
        exact[(t.kind, t.group)] = t
        by_size.setdefault((t.kind, t.size), []).append(t)
    return {"exact": exact, "by_size": by_size}


@per_owner
def _curve_index(model: DeviceCostModel) -> dict[tuple[str, str], ThroughputCurve]:
    """``{(op, dtype): curve}`` of a cost model's measured curves, once per cost model."""
    return {(c.op, c.dtype): c for c in model.curves}


@per_owner
def _memory_curve(model: DeviceCostModel) -> ThroughputCurve | None:
    """A cost model's measured memory-bandwidth curve (None: not measured), once per cost model."""
    return next((c for c in model.curves if c.op == "memory"), None)


@per_owner
def _collective_index(model: DeviceCostModel) -> dict[str, dict]:
    """:func:`_table_index` of a cost model's collective tables, once per cost model."""
    return _table_index(model.collectives)


class DeviceCostModel:
    """The cost model of a cluster's devices, as the methods
    :class:`~autoplan.costs._cluster.Cluster` inherits: they read its fields (``peak_flops``,
    ``peak_rates``, ``curves``, ``collectives``, the bandwidths and overheads)."""

    def eps(self, kind: str) -> float:
        return dict(self.epsilon).get(kind, 1.0)

    def compute_time(self, flops: float, devices: int = 1, dtype: str | None = None) -> float:
        """Seconds to run ``flops`` spread evenly over ``devices`` at the peak achievable rate:
        of a device model, as one large matmul in ``dtype`` (default: the precision of
        ``peak_flops``); else ``peak_flops x compute_efficiency``."""
        if not self.peak_rates or flops <= 0:
            return flops / (devices * self.peak_flops * self.compute_efficiency)
        return self.flop_time("matmul", flops / devices, dtype or self.training_precision)

    @property
    def training_precision(self) -> str:
        """The precision whose peak ``peak_flops`` is (a device model's fastest 16-bit rate,
        else float32)."""
        rates = dict(self.peak_rates)
        return next((p for p in ("bfloat16", "float16", "tf32", "float32") if
                     rates.get(p) == self.peak_flops), "float32")

    def peak(self, op_class: str, dtype: str | None) -> tuple[str, float]:
        """The precision an operator of ``op_class`` (``"matmul"``, ``"conv"``,
        ``"elementwise"``) on ``dtype`` operands runs at on this device, and its peak FLOP/s
        (``peak_flops`` for every dtype without a device model).

        Examples:
            >>> from autoplan import Cluster
            >>> Cluster.preset("p3.16xlarge").peak("matmul", "float32")
            ('float32', 15700000000000.0)
            >>> Cluster.preset("dgx-h100").peak("matmul", "float32")
            ('tf32', 494700000000000.0)
        """
        if not self.peak_rates:
            return str(dtype or "float32"), self.peak_flops
        prec, rate = _peak_rate(dict(self.peak_rates),
                                _precision(dtype, op_class, self.float32_dot))
        return prec, (rate or self.peak_flops)

    def curve(self, op: str, dtype: str) -> ThroughputCurve | None:
        """The measured curve of ``op`` in ``dtype`` (else in float32, else of matmul)."""
        index = _curve_index(self)
        for key in ((op, dtype), (op, "float32"), ("matmul", dtype), ("matmul", "float32")):
            c = index.get(key)
            if c is not None:
                return c
        return None

    def flop_time(self, op: str, flops: float, dtype: str | None = None) -> float:
        """Seconds per device for one operation of ``flops`` FLOPs per device: the measured
        curve of ``op`` (``"matmul"`` or ``"conv"``) and ``dtype``; else the device model's
        peak for the precision ``op`` runs ``dtype`` at (:meth:`peak`), at the achievable
        fraction its saturation curve gives at that size (``"elementwise"``: the vector rate,
        no curve).

        Examples:
            >>> from autoplan import Cluster
            >>> v100 = Cluster.preset("p3.16xlarge")
            >>> round(1e12 / v100.flop_time("matmul", 1e12, "float16") / 1e12, 1)  # TFLOP/s
            102.7
            >>> round(1e12 / v100.flop_time("matmul", 1e12, "float32") / 1e12, 1)
            14.7
        """
        if flops <= 0:
            return 0.0
        c = self.curve(op, dtype or "float32") if self.curves and op in CURVE_OPS else None
        if c is not None:
            return c.time(flops)
        if self.curves and op == "elementwise":  # a measured profile: its best rate, as before
            return flops / (self.peak_flops * self.compute_efficiency)
        prec, rate = self.peak(op, dtype)
        ideal = flops / (rate * self.compute_efficiency)
        if self.saturation and op in ("matmul", "conv"):
            return _saturated_time(op, prec, ideal)
        return ideal

    def memory_time(self, nbytes: float) -> float:
        """Seconds per device for a kernel to move ``nbytes`` to and from memory: the measured
        bandwidth curve by kernel size when profiled (small kernels stay in caches), else
        ``nbytes / memory_bandwidth`` at the fraction the device model's saturation curve gives
        for a kernel of that size (0 without a bandwidth)."""
        if nbytes <= 0:
            return 0.0
        curve = _memory_curve(self)
        if curve is not None:
            return curve.time(nbytes)
        if self.memory_bandwidth <= 0:
            return 0.0
        ideal = nbytes / self.memory_bandwidth
        return _saturated_time("memory", "", ideal) if self.saturation else ideal

    def group_bandwidth(self, devices: Sequence[int]) -> float:
        """Bytes/s per device, per direction, of a collective among ``devices`` of one node.

        Where the node's devices are not all equally connected (:attr:`nvlinks`), a collective
        among some of them runs over the links between those devices only: NCCL builds its rings
        over the NVLinks inside the group, each link carrying ``link_bandwidth`` per direction,
        so a device sends at most ``link_bandwidth`` times its links to the other members, and
        the group runs at the rate of its least-connected member (the rings need every member).
        That is a bound NCCL's rings reach where the group's links split into rings through all
        its members (the whole DGX-1 node, its 4-GPU halves, a linked pair). A group with a
        member linked to none of the others goes over PCIe (``pcie_bandwidth``). Never above
        ``intra_bandwidth``; without :attr:`nvlinks`, ``intra_bandwidth`` for every group.

        Examples:
            >>> from autoplan import Cluster
            >>> v100 = Cluster.preset("p3.16xlarge")
            >>> [v100.group_bandwidth(g) / 1e9 for g in ((0, 1), (0, 3), (0, 1, 2, 3), range(8))]
            [25.0, 50.0, 100.0, 150.0]
            >>> v100.group_bandwidth((0, 2, 4, 6)) / 1e9, v100.group_bandwidth((0, 5)) / 1e9
            (50.0, 16.0)
        """
        if not self.nvlinks:
            return self.intra_bandwidth
        local = {d % self.devices_per_node for d in devices}
        if len(local) <= 1:
            return self.intra_bandwidth
        degree = dict.fromkeys(local, 0)
        for a, b, n in self.nvlinks:
            if a in local and b in local:
                degree[a] += n
                degree[b] += n
        least = min(degree.values())
        if least == 0:
            return min(self.pcie_bandwidth or self.intra_bandwidth, self.intra_bandwidth)
        return min(self.link_bandwidth * least, self.intra_bandwidth)

    def step_overhead(self, num_args: int) -> float:
        """Seconds to launch one executable with ``num_args`` argument arrays."""
        return self.launch_overhead + self.arg_overhead * num_args

    def collective_table(self, kind: str, group: tuple[tuple[int, int], ...]
                         ) -> CollectiveTable | None:
        """The measured table of ``kind`` for a device-group geometry: the exact geometry, else
        the one of the same group size with the nearest stride (None without tables)."""
        if not self.collectives:
            return None
        index = _collective_index(self)
        hit = index["exact"].get((kind, group))
        if hit is not None:
            return hit
        n = math.prod(s for s, _ in group)
        same = index["by_size"].get((kind, n))
        if not same:
            return None
        stride = group[0][1] if group else 1
        return min(same, key=lambda t: (abs(math.log(t.group[0][1] / stride)), t.group))
