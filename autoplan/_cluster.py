"""Clusters, logical meshes and the collective cost model.

A :class:`Cluster` is ``nodes x devices_per_node`` accelerators with a fast link inside a node and
a slower one between nodes. A :class:`LogicalMesh` views a (sub)mesh of it as an n-D grid whose
axes each have an alpha (latency, s) and beta (s per byte): an axis whose devices sit inside one
node uses the fast link; an axis that crosses nodes uses the node's network link, shared by the
parallel groups of that node.

Collective times on one mesh axis of ``n`` devices and ``B`` bytes (Alpa's alpha-beta model):

* all-gather:      ``alpha + beta . (n-1)/n . B``   (B = the gathered size)
* all-reduce:      ``alpha + beta . 2(n-1)/n . B``
* reduce-scatter:  ``alpha + beta . (n-1)/n . B``   (B = the size before scattering)
* all-to-all:      ``alpha + beta . (n-1)/n^2 . B``
* send/recv:       ``alpha + beta . B``

On several axes a collective runs hierarchically, innermost axis first (the bytes shrink by each
axis's size where the collective scatters). TAPAS's refinements are parameters of the cluster:
``epsilon[kind]`` multiplies a collective's transfer term (its efficiency relative to the ring
bound, in (0, 1]), and ``gamma`` in (0, 1] discounts gradient communication issued during the
backward pass, which overlaps with backward compute: ``T = alpha + beta.(N_fwd + gamma.N_bwd).eps``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ._errors import ClusterError

__all__ = ["Cluster", "LogicalMesh", "COLLECTIVES", "PRESETS"]

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")
_FACTOR = {"all-gather": lambda n: (n - 1) / n, "all-reduce": lambda n: 2 * (n - 1) / n,
           "reduce-scatter": lambda n: (n - 1) / n, "all-to-all": lambda n: (n - 1) / n / n,
           "send-recv": lambda n: 1.0}

GiB = 1024**3


@dataclass(frozen=True)
class Cluster:
    """A homogeneous cluster of ``nodes x devices_per_node`` devices.

    Attributes:
        name: preset or user name.
        nodes: number of hosts.
        devices_per_node: accelerators per host.
        device_memory: bytes of memory per device.
        peak_flops: peak FLOP/s per device (for the training dtype).
        intra_bandwidth: bytes/s per device on the link inside a node (NVLink).
        inter_bandwidth: bytes/s of one node's network link (shared by its devices).
        intra_latency: seconds of latency per collective inside a node.
        inter_latency: seconds of latency per collective across nodes.
        compute_efficiency: achievable fraction of ``peak_flops`` for large matmuls.
        gamma: TAPAS's overlap discount for gradient communication in backward, in (0, 1].
        epsilon: TAPAS's per-collective efficiency multipliers, in (0, 1] (``(kind, value)`` pairs).
        device_kind: a description of the device.
    """

    name: str
    nodes: int
    devices_per_node: int
    device_memory: float
    peak_flops: float
    intra_bandwidth: float
    inter_bandwidth: float
    intra_latency: float = 5e-6
    inter_latency: float = 2e-5
    compute_efficiency: float = 0.5
    gamma: float = 1.0
    epsilon: tuple[tuple[str, float], ...] = ()
    device_kind: str = "accelerator"

    def __post_init__(self):
        for attr in ("nodes", "devices_per_node"):
            v = getattr(self, attr)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ClusterError(f"Cluster: {attr} should be a positive integer. Got {v!r}. "
                                   f"Fix: pass {attr}=1 or more.")
        for attr in ("device_memory", "peak_flops", "intra_bandwidth", "inter_bandwidth"):
            v = getattr(self, attr)
            if not (isinstance(v, int | float) and v > 0 and math.isfinite(v)):
                raise ClusterError(f"Cluster: {attr} should be a positive number. Got {v!r}. "
                                   f"Fix: give {attr} in base units (bytes, FLOP/s, bytes/s).")
        for attr in ("gamma", "compute_efficiency"):
            v = getattr(self, attr)
            if not (0 < v <= 1):
                raise ClusterError(f"Cluster: {attr} should be in (0, 1]. Got {v!r}.")
        for kind, v in self.epsilon:
            if kind not in COLLECTIVES or not (0 < v <= 1):
                raise ClusterError(f"Cluster: epsilon should map a collective in {COLLECTIVES} to "
                                   f"a value in (0, 1]. Got {kind!r}: {v!r}.")

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, nodes: int = 1, **overrides: Any) -> Cluster:
        """A named preset (see ``PRESETS``) with ``nodes`` hosts, e.g. ``Cluster.preset("p3.16xlarge", 8)``.

        Raises:
            ClusterError: unknown name or non-positive node count.
        """
        if name not in PRESETS:
            raise ClusterError(f"Cluster.preset: unknown preset {name!r}. Known presets: "
                               f"{', '.join(sorted(PRESETS))}. Fix: use one of them or build "
                               "Cluster(...) directly.")
        if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes <= 0:
            raise ClusterError(f"Cluster.preset: nodes should be a positive integer. Got {nodes!r}. "
                               f"Fix: e.g. Cluster.preset({name!r}, nodes=2).")
        base = PRESETS[name]
        fields = {**asdict(base), "nodes": nodes, **overrides}
        fields["epsilon"] = tuple(tuple(x) for x in fields["epsilon"])
        return cls(**fields)

    @classmethod
    def parse(cls, spec: str | Cluster) -> Cluster:
        """Parse the CLI form ``"name"`` or ``"name:nodes"`` (``"p3.16xlarge:8"``); a
        ``"cpu:N"`` spec means one host of N emulated CPU devices."""
        if isinstance(spec, Cluster):
            return spec
        if not isinstance(spec, str) or not re.fullmatch(r"[A-Za-z0-9._-]+(:[^:]*)?", spec):
            raise ClusterError(f"cluster: expected 'name' or 'name:nodes' (e.g. 'p3.16xlarge:8'). "
                               f"Got {spec!r}. Fix: write the preset name, a colon, and a node count.")
        name, colon, count = spec.partition(":")
        if not colon:
            return cls.preset(name)
        if not re.fullmatch(r"\d+", count) or int(count) <= 0:
            what, example = ("device count", "cpu:8") if name == "cpu" else ("node count", f"{name}:2")
            raise ClusterError(f"cluster: the part after ':' should be a positive {what}. Got "
                               f"{count!r} in {spec!r}. Fix: e.g. '{example}'.")
        if name == "cpu":
            return cls.preset("cpu", 1, devices_per_node=int(count))
        return cls.preset(name, int(count))

    def with_nodes(self, nodes: int) -> Cluster:
        return replace(self, nodes=nodes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["epsilon"] = [list(x) for x in self.epsilon]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cluster:
        d = dict(d)
        d["epsilon"] = tuple(tuple(x) for x in d.get("epsilon", ()))
        return cls(**d)

    # ---- derived -----------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def spec(self) -> str:
        """The ``name:nodes`` form."""
        if self.name == "cpu":
            return f"cpu:{self.devices_per_node}"
        return f"{self.name}:{self.nodes}"

    def eps(self, kind: str) -> float:
        return dict(self.epsilon).get(kind, 1.0)

    def compute_time(self, flops: float, devices: int = 1) -> float:
        """Seconds to run ``flops`` spread evenly over ``devices`` at the achievable rate."""
        return flops / (devices * self.peak_flops * self.compute_efficiency)

    def logical_mesh(self, shape: Sequence[int], submesh: tuple[int, int] | None = None,
                     device_ids: Sequence[int] | None = None,
                     axis_names: Sequence[str] | None = None) -> LogicalMesh:
        """View a physical (sub)mesh of ``submesh = (hosts, devices per host)`` devices as a
        logical mesh of ``shape`` (row-major over the devices: the last axis is innermost).

        Raises:
            ClusterError: the shape's size differs from the submesh's, or exceeds the cluster.
        """
        shape = tuple(int(s) for s in shape)
        if not shape or any(s <= 0 for s in shape):
            raise ClusterError(f"logical_mesh: shape should be positive integers. Got {shape!r}.")
        n = math.prod(shape)
        if submesh is None:
            if n > self.num_devices:
                raise ClusterError(f"logical_mesh: mesh shape {shape} needs {n} devices but the "
                                   f"cluster {self.spec} has {self.num_devices}. Fix: use a shape "
                                   f"whose product is at most {self.num_devices}.")
            hosts = max(1, math.ceil(n / self.devices_per_node))
            per = n if hosts == 1 else self.devices_per_node
            submesh = (hosts, per)
        hosts, per = submesh
        if hosts * per != n:
            raise ClusterError(f"logical_mesh: shape {shape} has {n} devices but submesh {submesh} "
                               f"has {hosts * per}. Fix: choose a shape whose product is {hosts * per}.")
        if hosts > self.nodes or per > self.devices_per_node:
            raise ClusterError(f"logical_mesh: submesh {submesh} does not fit cluster {self.spec} "
                               f"({self.nodes} x {self.devices_per_node}).")
        alphas, betas = [], []
        inner = 1  # devices spanned by the axes inside this one
        for size in reversed(shape):
            span = inner * size
            crosses = hosts > 1 and span > per and size > 1
            if crosses:
                # parallel groups on one node share its network link
                groups_per_node = min(inner, per)
                bw = self.inter_bandwidth / groups_per_node
                alphas.append(self.inter_latency)
            else:
                bw = self.intra_bandwidth
                alphas.append(self.intra_latency)
            betas.append(1.0 / bw)
            inner = span
        names = tuple(axis_names) if axis_names else default_axis_names(len(shape))
        ids = tuple(device_ids) if device_ids is not None else tuple(range(n))
        return LogicalMesh(shape=shape, alpha=tuple(reversed(alphas)), beta=tuple(reversed(betas)),
                           axis_names=names, device_ids=ids, cluster=self, submesh=(hosts, per))


def default_axis_names(ndim: int) -> tuple[str, ...]:
    return ("x", "y", "z", "w")[:ndim] if ndim <= 4 else tuple(f"a{i}" for i in range(ndim))


@dataclass(frozen=True)
class LogicalMesh:
    """A logical device mesh with an alpha-beta cost per axis.

    Attributes:
        shape: devices along each axis.
        alpha: latency (s) per axis.
        beta: seconds per byte per axis.
        axis_names: names for ``jax.sharding.Mesh``.
        device_ids: cluster device ids, row-major.
        cluster: the cluster it belongs to.
        submesh: the physical (hosts, devices per host) it occupies.
    """

    shape: tuple[int, ...]
    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    axis_names: tuple[str, ...]
    device_ids: tuple[int, ...]
    cluster: Cluster = field(repr=False, compare=False)
    submesh: tuple[int, int] = (1, 1)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def axis_size(self, axes: Sequence[int]) -> int:
        return math.prod(self.shape[a] for a in axes)

    def collective_time(self, kind: str, nbytes: float, axes: Sequence[int],
                        backward: bool = False) -> float:
        """Seconds for a collective of ``kind`` over mesh ``axes`` moving ``nbytes``.

        Args:
            kind: one of ``COLLECTIVES``.
            nbytes: B in the formulas of this module's docstring.
            axes: mesh axes the collective runs over (hierarchically, innermost first).
            backward: gradient communication in the backward pass (discounted by ``gamma``).
        """
        if kind not in _FACTOR:
            raise ClusterError(f"collective_time: kind should be one of {COLLECTIVES}. Got {kind!r}.")
        axes = sorted({a for a in axes if self.shape[a] > 1}, reverse=True)
        if not axes or nbytes <= 0:
            return 0.0
        eps = self.cluster.eps(kind)
        scale = (self.cluster.gamma if backward else 1.0) * eps
        total = 0.0
        b = float(nbytes)
        for a in axes:
            n = self.shape[a]
            total += self.alpha[a] + self.beta[a] * _FACTOR[kind](n) * b * scale
            if kind in ("all-reduce", "reduce-scatter"):
                b /= n  # the next (outer) axis reduces the already scattered part
        return total

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


def send_recv_time(cluster: Cluster, nbytes: float, cross_node: bool) -> float:
    """Point-to-point transfer time between two devices (send/recv)."""
    if nbytes <= 0:
        return 0.0
    if cross_node:
        return cluster.inter_latency + nbytes / cluster.inter_bandwidth
    return cluster.intra_latency + nbytes / cluster.intra_bandwidth


PRESETS: dict[str, Cluster] = {
    # AWS p3.16xlarge (Alpa's testbed): 8 x V100 16 GB, NVLink, 25 Gbps between nodes.
    "p3.16xlarge": Cluster("p3.16xlarge", 1, 8, 16 * GiB, 125e12, 150e9, 25e9 / 8,
                           intra_latency=5e-6, inter_latency=3e-5, compute_efficiency=0.5,
                           device_kind="V100-SXM2-16GB"),
    # TAPAS / TePDist testbed: 8 x V100 32 GB, NVLink, 100 Gbps between nodes.
    "v100-32g-100gbe": Cluster("v100-32g-100gbe", 1, 8, 32 * GiB, 125e12, 150e9, 100e9 / 8,
                               intra_latency=5e-6, inter_latency=2e-5, compute_efficiency=0.5,
                               device_kind="V100-SXM2-32GB"),
    # NVIDIA DGX H100: 8 x H100 80 GB, NVLink 450 GB/s per direction, 8 x 400 Gbps InfiniBand.
    "dgx-h100": Cluster("dgx-h100", 1, 8, 80e9, 989e12, 450e9, 8 * 400e9 / 8,
                        intra_latency=3e-6, inter_latency=1e-5, compute_efficiency=0.6,
                        device_kind="H100-SXM5-80GB"),
    # Emulated CPU devices (jax_num_cpu_devices): one host, shared memory.
    "cpu": Cluster("cpu", 1, 8, 2 * GiB, 5e10, 5e9, 5e9, intra_latency=2e-5,
                   inter_latency=2e-5, compute_efficiency=1.0, device_kind="cpu"),
}
