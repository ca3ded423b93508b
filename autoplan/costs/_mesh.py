"""Logical meshes and the collective cost model.

A :class:`LogicalMesh` views a (sub)mesh of a :class:`~autoplan.costs._cluster.Cluster` as an n-D
grid whose axes each have an alpha (latency, s) and beta (s per byte): an axis whose devices sit
inside one node uses the fast link; an axis that crosses nodes uses the node's network link,
shared by the parallel groups of that node (:func:`logical_mesh`, what
``Cluster.logical_mesh`` returns).

Collective times on one mesh axis of ``n`` devices and ``B`` bytes. Datasheet form (Alpa's
alpha-beta model):

* all-gather:      ``alpha + beta . (n-1)/n . B``   (B = the gathered size)
* all-reduce:      ``alpha + beta . 2(n-1)/n . B``  (B = the buffer reduced)
* reduce-scatter:  ``alpha + beta . (n-1)/n . B``   (B = the size before scattering)
* all-to-all:      ``alpha + beta . (n-1)/n . B``   (B = each device's buffer)
* send/recv:       ``alpha + beta . B``

Measured form: the time interpolated in the table of the collective's kind and group geometry
(piecewise linear between measured sizes); outside the measured sizes the fitted
``alpha_k + beta_k . B`` of that table, scaled to meet the nearest measured point. On several
axes a collective whose device group was measured as one group (the two axes of a ``2 x 4`` mesh
form the 8-device group) is looked up as that group; otherwise it runs hierarchically, innermost
axis first, as in Alpa (an all-reduce's or reduce-scatter's bytes shrink by each axis's size; an
all-gather's inner axes gather the parts the outer ones then gather whole).

TAPAS's refinements are parameters of the cluster: ``epsilon[kind]`` multiplies a collective's
transfer term (its efficiency relative to the ring bound, in (0, 1]), and ``gamma`` in (0, 1]
discounts gradient communication issued during the backward pass, which overlaps with backward
compute: ``T = alpha + beta.(N_fwd + gamma.N_bwd).eps``.

XLA combines independent collectives of one kind over the same devices into one (its
all-reduce, all-gather and reduce-scatter combiners): the gradient all-reduces of a data-parallel
step run as one all-reduce of every gradient. :meth:`LogicalMesh.collective_time` with
``latency=False`` gives the transfer part of a collective that is combined with others; the
latency is charged once per combined group (:data:`COMBINE_THRESHOLD` bytes each).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autoplan._errors import ClusterError
from autoplan.costs._cost_model import DeviceCostModel
from autoplan.costs._measured import canonical_group

__all__ = ["LogicalMesh", "COLLECTIVES", "COMBINE_THRESHOLD", "default_axis_names",
           "logical_mesh", "send_recv_time"]

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")
_FACTOR = {"all-gather": lambda n: (n - 1) / n, "all-reduce": lambda n: 2 * (n - 1) / n,
           "reduce-scatter": lambda n: (n - 1) / n, "all-to-all": lambda n: (n - 1) / n,
           "send-recv": lambda n: 1.0}
#: bytes up to which XLA combines independent collectives into one (its combiners' default
#: threshold, 30 MiB)
COMBINE_THRESHOLD = 30 * 2**20


def default_axis_names(ndim: int) -> tuple[str, ...]:
    return ("x", "y", "z", "w")[:ndim] if ndim <= 4 else tuple(f"a{i}" for i in range(ndim))


@dataclass(frozen=True)
class LogicalMesh:
    """A logical device mesh with a cost per axis.

    Attributes:
        shape: devices along each axis.
        alpha: latency (s) per axis.
        beta: seconds per byte per axis (of the link; a collective's factor comes on top).
        axis_names: names for ``jax.sharding.Mesh``.
        device_ids: cluster device ids, row-major.
        cluster: the cluster it belongs to.
        submesh: the physical (hosts, devices per host) it occupies.
        crosses: per axis, whether its groups span several hosts.
    """

    shape: tuple[int, ...]
    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    axis_names: tuple[str, ...]
    device_ids: tuple[int, ...]
    cluster: DeviceCostModel = field(repr=False, compare=False)
    submesh: tuple[int, int] = (1, 1)
    crosses: tuple[bool, ...] = ()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def axis_size(self, axes: Sequence[int]) -> int:
        return math.prod(self.shape[a] for a in axes)

    def group(self, axes: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """The device-group geometry spanned by mesh ``axes`` (see :func:`canonical_group`)."""
        strides = [math.prod(self.shape[a + 1:]) for a in axes]
        return canonical_group([self.shape[a] for a in axes], strides)

    def collective_time(self, kind: str, nbytes: float, axes: Sequence[int],
                        backward: bool = False, latency: bool = True) -> float:
        """Seconds for a collective of ``kind`` over mesh ``axes`` moving ``nbytes``.

        Args:
            kind: one of ``COLLECTIVES``.
            nbytes: B in the formulas of this module's docstring.
            axes: mesh axes the collective runs over.
            backward: gradient communication in the backward pass (discounted by ``gamma``).
            latency: include the collective's latency; ``False`` gives the transfer part alone,
                for a collective XLA combines with others (the combined group pays the latency
                once).
        """
        if kind not in _FACTOR:
            raise ClusterError(f"collective_time: kind should be one of {COLLECTIVES}. Got {kind!r}.")
        axes = sorted({a for a in axes if self.shape[a] > 1}, reverse=True)
        if not axes or nbytes <= 0:
            return 0.0
        cluster = self.cluster
        scale = (cluster.gamma if backward else 1.0) * cluster.eps(kind)
        measured = cluster.collectives and not any(self.crosses[a] for a in axes
                                                   if a < len(self.crosses))
        if measured:
            group = self.group(axes)
            table = cluster.collective_table(kind, group)
            if table is not None and (len(axes) == 1 or table.group == group):
                t = table.time(nbytes)
                lat = min(table.alpha, t)
                return (lat if latency else 0.0) + (t - lat) * scale
        total = 0.0
        b = float(nbytes)
        if kind == "all-gather":  # innermost first: the inner axes gather the smaller parts
            b /= math.prod(self.shape[a] for a in axes[1:])
        for k, a in enumerate(axes):
            n = self.shape[a]
            table = cluster.collective_table(kind, self.group([a])) if measured else None
            if table is not None:
                t = table.time(b)
                lat = min(table.alpha, t)
                total += (lat if latency else 0.0) + (t - lat) * scale
            else:
                total += (self.alpha[a] if latency else 0.0) + self.beta[a] * _FACTOR[kind](n) * b * scale
            if kind in ("all-reduce", "reduce-scatter"):
                b /= n  # the next (outer) axis reduces the already scattered part
            elif kind == "all-gather" and k + 1 < len(axes):
                b *= self.shape[axes[k + 1]]
        return total

    def latency(self, kind: str, axes: Sequence[int]) -> float:
        """The latency of a collective of ``kind`` over ``axes`` (what a combined group of
        collectives pays once): the fitted alpha of its measured table, else the axes' alphas."""
        axes = sorted({a for a in axes if self.shape[a] > 1}, reverse=True)
        if not axes:
            return 0.0
        cluster = self.cluster
        if cluster.collectives and not any(self.crosses[a] for a in axes if a < len(self.crosses)):
            group = self.group(axes)
            table = cluster.collective_table(kind, group)
            if table is not None and (len(axes) == 1 or table.group == group):
                return table.alpha
            tables = [cluster.collective_table(kind, self.group([a])) for a in axes]
            return sum(t.alpha if t is not None else self.alpha[a] for t, a in zip(tables, axes))
        return sum(self.alpha[a] for a in axes)

    def all_reduce(self, nbytes: float, axes: Sequence[int], backward: bool = False) -> float:
        return self.collective_time("all-reduce", nbytes, axes, backward)

    def all_gather(self, nbytes: float, axes: Sequence[int], backward: bool = False) -> float:
        return self.collective_time("all-gather", nbytes, axes, backward)

    def reduce_scatter(self, nbytes: float, axes: Sequence[int], backward: bool = False) -> float:
        return self.collective_time("reduce-scatter", nbytes, axes, backward)

    def all_to_all(self, nbytes: float, axes: Sequence[int], backward: bool = False) -> float:
        return self.collective_time("all-to-all", nbytes, axes, backward)

    def compute_time(self, flops: float) -> float:
        """Seconds for ``flops`` of work done by each device of this mesh."""
        return self.cluster.compute_time(flops, 1)

    def to_dict(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "axis_names": list(self.axis_names),
                "alpha": list(self.alpha), "beta": list(self.beta),
                "device_ids": list(self.device_ids), "submesh": list(self.submesh)}


def send_recv_time(cluster: DeviceCostModel, nbytes: float, cross_node: bool) -> float:
    """Point-to-point transfer time between two devices (send/recv): the measured send/recv
    (``ppermute``) table of the whole host's ring when profiled, else the link's alpha-beta."""
    if nbytes <= 0:
        return 0.0
    if cross_node:
        return cluster.inter_latency + nbytes / cluster.inter_bandwidth
    table = cluster.collective_table("send-recv", ((cluster.devices_per_node, 1),))
    if table is not None:
        return table.time(nbytes)
    return cluster.intra_latency + nbytes / cluster.intra_bandwidth


def logical_mesh(cluster: DeviceCostModel, shape: Sequence[int],
                 submesh: tuple[int, int] | None = None,
                 device_ids: Sequence[int] | None = None,
                 axis_names: Sequence[str] | None = None) -> LogicalMesh:
    """The logical mesh of ``shape`` over a (sub)mesh of ``cluster``: what
    :meth:`Cluster.logical_mesh <autoplan.costs._cluster.Cluster.logical_mesh>` returns (see
    there), each axis's alpha and beta from the links its groups use."""
    shape = tuple(int(s) for s in shape)
    if not shape or any(s <= 0 for s in shape):
        raise ClusterError(f"logical_mesh: shape should be positive integers. Got {shape!r}.")
    n = math.prod(shape)
    if submesh is None:
        if n > cluster.num_devices:
            raise ClusterError(f"logical_mesh: mesh shape {shape} needs {n} devices but the "
                               f"cluster {cluster.spec} has {cluster.num_devices}. Fix: use a shape "
                               f"whose product is at most {cluster.num_devices}.")
        hosts = max(1, math.ceil(n / cluster.devices_per_node))
        per = n if hosts == 1 else cluster.devices_per_node
        submesh = (hosts, per)
    hosts, per = submesh
    if hosts * per != n:
        raise ClusterError(f"logical_mesh: shape {shape} has {n} devices but submesh {submesh} "
                           f"has {hosts * per}. Fix: choose a shape whose product is {hosts * per}.")
    if hosts > cluster.nodes or per > cluster.devices_per_node:
        raise ClusterError(f"logical_mesh: submesh {submesh} does not fit cluster {cluster.spec} "
                           f"({cluster.nodes} x {cluster.devices_per_node}).")
    ids = tuple(device_ids) if device_ids is not None else tuple(range(n))
    alphas, betas, crosses = [], [], []
    inner = 1  # devices spanned by the axes inside this one
    for size in reversed(shape):
        span = inner * size
        cross = hosts > 1 and span > per and size > 1
        if cross:
            # parallel groups on one node share its network link
            groups_per_node = min(inner, per)
            bw = cluster.inter_bandwidth / groups_per_node
            alpha = cluster.inter_latency
            beta = 1.0 / bw
        else:
            # the axis's groups run at once; the slowest (least-linked) decides
            bw = cluster.intra_bandwidth if size <= 1 or not cluster.nvlinks else min(
                cluster.group_bandwidth([ids[p + k * inner] for k in range(size)])
                for p in range(n) if (p // inner) % size == 0)
            alpha, beta = cluster.intra_latency, 1.0 / bw
            table = cluster.collective_table("all-gather", ((size, inner),)) if size > 1 else None
            if table is not None:  # the measured link: all-gather's fit per byte moved
                alpha, beta = table.alpha, table.beta / _FACTOR["all-gather"](size)
        alphas.append(alpha)
        betas.append(beta)
        crosses.append(cross)
        inner = span
    names = tuple(axis_names) if axis_names else default_axis_names(len(shape))
    return LogicalMesh(shape=shape, alpha=tuple(reversed(alphas)), beta=tuple(reversed(betas)),
                       axis_names=names, device_ids=ids, cluster=cluster, submesh=(hosts, per),
                       crosses=tuple(reversed(crosses)))
