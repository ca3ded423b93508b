"""Clusters, logical meshes and the cost model's device profile.

A :class:`Cluster` is ``nodes x devices_per_node`` accelerators with a fast link inside a node and
a slower one between nodes. A :class:`LogicalMesh` views a (sub)mesh of it as an n-D grid whose
axes each have an alpha (latency, s) and beta (s per byte): an axis whose devices sit inside one
node uses the fast link; an axis that crosses nodes uses the node's network link, shared by the
parallel groups of that node.

A cluster is a *profile* of its devices, in one of two forms with the same fields:

* a **datasheet** preset (``p3.16xlarge``, ``v100-32g-100gbe``, ``dgx-h100``, ``cpu``): peak
  FLOP/s times an achievable fraction, memory bandwidth, link bandwidths and latencies;
* a **measured** profile made by :func:`autoplan.profile` on the attached devices: matmul and
  convolution throughput curves by size and dtype (:class:`ThroughputCurve`), memory bandwidth,
  the overhead of one kernel and of one executable launch (plus one per argument array), and a
  table of measured collective times per kind and mesh-axis geometry (:class:`CollectiveTable`,
  Alpa's profiling database).

Compute: an operator's time per device is a roofline plus overhead,
``t = max(F / R(F, dtype), Q / BW) + o``, where ``F`` is its FLOPs per device, ``R`` the
achievable FLOP/s for an operation of that size (the measured curve, or ``peak x efficiency``), ``Q``
the bytes it moves to and from memory per device, ``BW`` the memory bandwidth and ``o`` the
per-kernel overhead (see :mod:`autoplan.search.intra._strategies` for which operators are kernels
under XLA's fusion).

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

This module holds the :class:`Cluster` (its fields, their checks and its file form) with its
cost model, and :class:`LogicalMesh`. The measured tables are in :mod:`autoplan.costs._measured`,
the datasheet presets' numbers in :mod:`autoplan.costs._presets`, and the attached devices'
measured profile and its cache on disk in :mod:`autoplan.costs._local`.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from autoplan._errors import ClusterError
from autoplan._io import read_input_bytes
from autoplan._memo import memo
from autoplan.costs._device_models import PRECISIONS as _PRECISIONS
from autoplan.costs._device_models import peak_rate as _peak_rate
from autoplan.costs._device_models import precision as _precision
from autoplan.costs._device_models import saturated_time as _saturated_time
from autoplan.costs._local import cache_dir, measured_fields, profile_cache_paths, store_profile
from autoplan.costs._measured import CollectiveTable, ThroughputCurve, canonical_group
from autoplan.costs._presets import PRESET_FIELDS

__all__ = ["Cluster", "LogicalMesh", "CollectiveTable", "ThroughputCurve", "COLLECTIVES",
           "PRESETS", "COMBINE_THRESHOLD", "MAX_DEVICES", "MAX_SEARCH_DEVICES", "cache_dir",
           "profile"]

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")
_FACTOR = {"all-gather": lambda n: (n - 1) / n, "all-reduce": lambda n: 2 * (n - 1) / n,
           "reduce-scatter": lambda n: (n - 1) / n, "all-to-all": lambda n: (n - 1) / n,
           "send-recv": lambda n: 1.0}
#: operations with a measured throughput curve
CURVE_OPS = ("matmul", "conv", "memory")
#: bytes up to which XLA combines independent collectives into one (its combiners' default
#: threshold, 30 MiB)
COMBINE_THRESHOLD = 30 * 2**20

#: the most devices a cluster may have (``Cluster``, ``Cluster.parse``, the presets and the plan
#: file's checker all refuse more): 2^20, far beyond any machine built, so that a typo such as
#: ``cpu:99999999999999999999`` is an error at once instead of a search that never ends
MAX_DEVICES = 2**20
#: the most devices a search plans for: the pipeline search's stage DP keeps tables with one
#: column per device count (Alpa's ``F(s, k, d)``), so its time and memory grow with the devices:
#: 65,536 devices (p3.16xlarge:8192) took 5 s and 0.6 GB for the tiny MLP on 2 cores, while
#: p3.16xlarge:100000 (800,000 devices) searched for minutes without a word
MAX_SEARCH_DEVICES = 2**16


# ---------------------------------------------------------------------------------------------
# the cluster
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cluster:
    """A homogeneous cluster of ``nodes x devices_per_node`` devices, with their profile.

    Attributes:
        name: preset or user name (``"local"`` for a measured profile of the attached devices).
        nodes: number of hosts.
        devices_per_node: accelerators per host.
        device_memory: bytes of memory per device.
        peak_flops: peak FLOP/s per device (for the training dtype of a preset; the best measured
            rate for a profile).
        intra_bandwidth: bytes/s per device on the link inside a node (NVLink).
        inter_bandwidth: bytes/s of one node's network link (shared by its devices).
        intra_latency: seconds of latency per collective inside a node.
        inter_latency: seconds of latency per collective across nodes.
        compute_efficiency: a derating of the compute rates where no measured curve applies
            (1.0: the device model as it is; a datasheet preset's achievable fractions come from
            its saturation curves, see ``saturation``).
        gamma: TAPAS's overlap discount for gradient communication in backward, in (0, 1].
        epsilon: TAPAS's per-collective efficiency multipliers, in (0, 1] (``(kind, value)`` pairs).
        device_kind: a description of the device.
        memory_bandwidth: bytes/s per device between the device and its memory (0: no memory
            term in the roofline).
        op_overhead: seconds of fixed cost per kernel.
        launch_overhead: seconds to launch one executable (a training step), plus
            ``arg_overhead`` per argument array.
        curves: measured matmul and convolution throughput (:class:`ThroughputCurve`).
        collectives: measured collective times (:class:`CollectiveTable`).
        profiled: when the profile was measured (ISO 8601, UTC); empty for a datasheet preset.
        platform: the JAX platform the profile was measured on (``cpu``, ``gpu``, ``tpu``).
        quick: the profile was measured with ``quick=True`` (fewer sizes).
        peak_rates: a datasheet device model's peak FLOP/s per precision (``(precision, rate)``
            pairs over :data:`autoplan.costs._device_models.PRECISIONS`); an operator runs at the rate of
            its dtype (see :mod:`autoplan.costs._device_models`). Empty: every dtype at ``peak_flops``.
        float32_dot: the platform's default precision for float32 dots and convolutions:
            ``"tf32"`` where XLA runs them on TF32 tensor cores (NVIDIA Ampere and later), else
            ``"float32"``.
        saturation: ``"gpu"`` to charge operations the achievable fraction of their peak that
            the saturation curves measured on real GPUs give at their size
            (:data:`autoplan.costs._device_models.SATURATION`); empty for a flat rate.
        sources: where each datasheet number comes from (``(field, source)`` pairs).
        nvlinks: the links between the devices of a node where they are not all equally
            connected, ``(device a, device b, links)`` per linked pair (local ids); empty where
            every device reaches every other at ``intra_bandwidth`` (an NVSwitch). See
            :meth:`group_bandwidth`.
        link_bandwidth: bytes/s of one of those links, per direction.
        pcie_bandwidth: bytes/s per direction of a device's PCIe link, the path between devices
            of a group that has no link to the others.
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
    compute_efficiency: float = 1.0
    gamma: float = 1.0
    epsilon: tuple[tuple[str, float], ...] = ()
    device_kind: str = "accelerator"
    memory_bandwidth: float = 0.0
    op_overhead: float = 0.0
    launch_overhead: float = 0.0
    arg_overhead: float = 0.0
    curves: tuple[ThroughputCurve, ...] = ()
    collectives: tuple[CollectiveTable, ...] = ()
    profiled: str = ""
    platform: str = ""
    quick: bool = False
    peak_rates: tuple[tuple[str, float], ...] = ()
    float32_dot: str = "float32"
    saturation: str = ""
    sources: tuple[tuple[str, str], ...] = ()
    nvlinks: tuple[tuple[int, int, int], ...] = ()
    link_bandwidth: float = 0.0
    pcie_bandwidth: float = 0.0

    def __post_init__(self):
        for attr in ("name", "device_kind", "profiled", "platform"):
            v = getattr(self, attr)
            if not isinstance(v, str):
                raise ClusterError(f"Cluster: {attr} should be a string. Got {v!r}. Fix: re-run "
                                   "autoplan.profile(), or use a preset.")
        if not isinstance(self.quick, bool):
            raise ClusterError(f"Cluster: quick should be True or False. Got {self.quick!r}. Fix: "
                               "re-run autoplan.profile(), or use a preset.")
        for attr in ("nodes", "devices_per_node"):
            v = getattr(self, attr)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ClusterError(f"Cluster: {attr} should be a positive integer. Got {v!r}. "
                                   f"Fix: pass {attr}=1 or more.")
        if self.nodes * self.devices_per_node > MAX_DEVICES:
            raise ClusterError(
                f"Cluster: nodes x devices_per_node should be at most {MAX_DEVICES:,} devices "
                f"(autoplan's cap, far beyond any machine built). Got {self.nodes:,} x "
                f"{self.devices_per_node:,} = {self.nodes * self.devices_per_node:,}. Fix: check "
                "the node or device count (a digit too many?), e.g. 'p3.16xlarge:8' or 'cpu:8'.")
        for attr in ("device_memory", "peak_flops", "intra_bandwidth", "inter_bandwidth"):
            v = getattr(self, attr)
            if not (isinstance(v, int | float) and v > 0 and math.isfinite(v)):
                raise ClusterError(f"Cluster: {attr} should be a positive number. Got {v!r}. "
                                   f"Fix: give {attr} in base units (bytes, FLOP/s, bytes/s).")
        for attr in ("memory_bandwidth", "op_overhead", "launch_overhead", "arg_overhead",
                     "intra_latency", "inter_latency", "link_bandwidth", "pcie_bandwidth"):
            v = getattr(self, attr)
            if not (isinstance(v, int | float) and v >= 0 and math.isfinite(v)):
                raise ClusterError(f"Cluster: {attr} should be a non-negative number. Got {v!r}. "
                                   "Fix: give it in base units (seconds, bytes/s), 0 for none.")
        for attr in ("gamma", "compute_efficiency"):
            v = getattr(self, attr)
            if not (0 < v <= 1):
                raise ClusterError(f"Cluster: {attr} should be in (0, 1]. Got {v!r}.")
        for kind, v in self.epsilon:
            if kind not in COLLECTIVES or not (0 < v <= 1):
                raise ClusterError(f"Cluster: epsilon should map a collective in {COLLECTIVES} to "
                                   f"a value in (0, 1]. Got {kind!r}: {v!r}.")
        for prec, v in self.peak_rates:
            if prec not in _PRECISIONS or not (isinstance(v, int | float) and v > 0
                                               and math.isfinite(v)):
                raise ClusterError(f"Cluster: peak_rates should map a precision in {_PRECISIONS} "
                                   f"to a positive FLOP/s. Got {prec!r}: {v!r}.")
        if self.float32_dot not in ("float32", "tf32"):
            raise ClusterError(f"Cluster: float32_dot should be 'float32' or 'tf32'. Got "
                               f"{self.float32_dot!r}. Fix: 'tf32' where XLA runs float32 dots "
                               "on TF32 tensor cores (NVIDIA Ampere and later).")
        for link in self.nvlinks:
            # (a view of the node's first devices keeps the node's links; those to devices
            # beyond it never join a group)
            if (len(link) != 3 or not all(isinstance(x, int) and x >= 0 for x in link)
                    or link[0] == link[1]):
                raise ClusterError(f"Cluster: nvlinks should be (device a, device b, links) of "
                                   f"two devices of a node. Got {link!r}.")
        if self.nvlinks and self.link_bandwidth <= 0:
            raise ClusterError("Cluster: nvlinks need a link_bandwidth (bytes/s per link and "
                               "direction).")
        if self.saturation not in ("", "gpu"):
            raise ClusterError(f"Cluster: saturation should be '' or 'gpu'. Got "
                               f"{self.saturation!r}.")
        for c in self.curves:
            if c.op not in CURVE_OPS or len(c.sizes) != len(c.seconds):
                raise ClusterError(f"Cluster: a throughput curve should be for one of {CURVE_OPS} "
                                   f"with one time per size. Got op {c.op!r}, {len(c.sizes)} sizes "
                                   f"and {len(c.seconds)} times. Fix: re-run autoplan.profile().")
        for t in self.collectives:
            if t.kind not in COLLECTIVES or len(t.nbytes) != len(t.seconds):
                raise ClusterError(f"Cluster: a collective table should be for one of "
                                   f"{COLLECTIVES} with one time per size. Got kind {t.kind!r}, "
                                   f"{len(t.nbytes)} sizes and {len(t.seconds)} times. Fix: "
                                   "re-run autoplan.profile().")

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, nodes: int = 1, **overrides: Any) -> Cluster:
        """A named preset (see ``PRESETS``) with ``nodes`` hosts, e.g. ``Cluster.preset("p3.16xlarge", 8)``.

        Raises:
            ClusterError: unknown name or non-positive node count.
        """
        if name not in PRESETS:
            raise ClusterError(f"Cluster.preset: unknown preset {name!r}. Known presets: "
                               f"{', '.join(sorted(PRESETS))}. Fix: use one of them, a profile "
                               "file (cluster.json from 'autoplan profile'), 'local', or build "
                               "Cluster(...) directly.")
        if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes <= 0:
            raise ClusterError(f"Cluster.preset: nodes should be a positive integer. Got {nodes!r}. "
                               f"Fix: e.g. Cluster.preset({name!r}, nodes=2).")
        return replace(PRESETS[name], nodes=nodes, **overrides)

    @classmethod
    def parse(cls, spec: str | os.PathLike | Cluster) -> Cluster:
        """A cluster from its CLI form.

        Accepted forms: a :class:`Cluster` (returned as is); ``"name"`` or ``"name:nodes"`` of a
        preset (``"p3.16xlarge:8"``; ``"cpu:N"`` is one host of N emulated CPU devices); the path
        of a profile file (``cluster.json`` written by ``autoplan profile -o`` or
        :meth:`to_json`), optionally with ``:nodes``; ``"local"`` for :meth:`detect` (the attached
        devices, profiled once and cached).

        Raises:
            ClusterError: an unknown name, a bad node count, or an unreadable profile file.
        """
        if isinstance(spec, Cluster):
            return spec
        if isinstance(spec, os.PathLike):
            spec = os.fspath(spec)
        if not isinstance(spec, str):
            raise ClusterError(f"cluster: expected 'name' or 'name:nodes' (e.g. 'p3.16xlarge:8') or a "
                               f"cluster.json path. Got {spec!r}. Fix: write the preset name, a colon, "
                               "and a node count, or the path of a profile.")
        if spec == "local":
            return cls.detect()
        # a preset's form wins over a file of the same name ('./cpu:8' reads the file)
        if (not _JSON_SPEC.fullmatch(spec) and spec.partition(":")[0] in PRESETS
                and os.path.lexists(spec)):
            warnings.warn(f"cluster: {spec!r} names a preset, and a file of that name is in the "
                          f"current folder; the preset is used. Fix: write './{spec}' to read the "
                          "file as a cluster profile, or rename it.", stacklevel=2)
        found = profile_file(spec)
        if found is not None:
            cluster = cls.from_json(found[0])
            if found[1] is not None:
                cluster = cluster.with_nodes(_node_count(found[1], spec))
            return cluster
        if not re.fullmatch(r"[A-Za-z0-9._-]+(:[^:]*)?", spec):
            raise ClusterError(f"cluster: expected 'name' or 'name:nodes' (e.g. 'p3.16xlarge:8') or a "
                               f"cluster.json path. Got {spec!r}. Fix: write the preset name, a colon, "
                               "and a node count, or the path of a profile.")
        name, colon, count = spec.partition(":")
        if not colon:
            return cls.preset(name)
        n = _node_count(count, spec)
        if name == "cpu":
            return cls.preset("cpu", 1, devices_per_node=n)
        return cls.preset(name, n)

    @classmethod
    def detect(cls, devices: Sequence[Any] | None = None, *, quick: bool = False,
               progress: bool = True, refresh: bool = False) -> Cluster:
        """The attached devices as a measured cluster, profiled once and cached on disk.

        The profile is kept per platform, device kind and device count in :func:`cache_dir`
        (``$AUTOPLAN_CACHE_DIR``, else ``$XDG_CACHE_HOME/autoplan``, else
        ``~/.cache/autoplan``); a full cached profile also serves ``quick=True``.

        Args:
            devices: the devices (default ``jax.devices()``).
            quick: profile with fewer sizes when nothing is cached (see :func:`autoplan.profile`).
            progress: show a progress bar while profiling.
            refresh: profile again even when a cached profile exists.

        Returns:
            The measured :class:`Cluster`.
        """
        full, fast = profile_cache_paths(devices)
        if not refresh:
            for path in ((full, fast) if quick else (full,)):
                if os.path.isfile(path):
                    try:
                        return cls.from_json(path)
                    except ClusterError:
                        pass  # an unreadable cache entry: profile again
        cluster = profile(devices, quick=quick, progress=progress)
        store_profile(fast if quick else full, cluster.to_json())
        return cluster

    def with_nodes(self, nodes: int) -> Cluster:
        return replace(self, nodes=nodes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["epsilon"] = [list(x) for x in self.epsilon]
        d["peak_rates"] = [list(x) for x in self.peak_rates]
        d["sources"] = [list(x) for x in self.sources]
        d["nvlinks"] = [list(x) for x in self.nvlinks]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Cluster:
        """The cluster of :meth:`to_dict` (older dicts without the profile fields work too).

        Raises:
            ClusterError: the dict is not a cluster.
        """
        if not isinstance(d, Mapping):
            raise ClusterError(f"Cluster.from_dict: expected a dict of Cluster fields. Got "
                               f"{type(d).__name__}. Fix: pass what Cluster.to_dict() returns.")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ClusterError(f"Cluster.from_dict: unknown field(s) {unknown}. Known: "
                               f"{sorted(known)}. Fix: pass what Cluster.to_dict() returns.")
        try:
            d = dict(d)
            d["epsilon"] = tuple(tuple(x) for x in d.get("epsilon", ()))
            d["peak_rates"] = tuple((str(k), float(v)) for k, v in d.get("peak_rates", ()))
            d["sources"] = tuple((str(k), str(v)) for k, v in d.get("sources", ()))
            d["nvlinks"] = tuple(tuple(int(x) for x in link) for link in d.get("nvlinks", ()))
            d["curves"] = tuple(
                ThroughputCurve(c["op"], c["dtype"], tuple(map(float, c["sizes"])),
                                tuple(map(float, c["seconds"])), float(c["peak"]), float(c["half"]))
                for c in d.get("curves", ()))
            d["collectives"] = tuple(
                CollectiveTable(t["kind"], tuple((int(s), int(st)) for s, st in t["group"]),
                                tuple(map(float, t["nbytes"])), tuple(map(float, t["seconds"])),
                                float(t["alpha"]), float(t["beta"]))
                for t in d.get("collectives", ()))
            return cls(**d)
        except (KeyError, TypeError, ValueError) as err:
            raise ClusterError(f"Cluster.from_dict: malformed cluster ({type(err).__name__}: "
                               f"{err}). Fix: pass what Cluster.to_dict() returns, or re-run "
                               "autoplan.profile().") from err

    def to_json(self, path: str | os.PathLike | None = None, indent: int | None = 1) -> str:
        """The cluster as JSON text, also written to ``path`` when given (atomically: an
        interrupted or failed write leaves the old file as it was).

        Raises:
            OutputError: ``path`` cannot be written.
        """
        text = json.dumps({"schema": "autoplan.cluster", **self.to_dict()}, indent=indent)
        if path is not None:
            from autoplan._io import atomic_write_text  # noqa: PLC0415

            atomic_write_text(path, text)
        return text

    @classmethod
    def from_json(cls, text_or_path: str | os.PathLike) -> Cluster:
        """Read a cluster from JSON text or a file (``autoplan profile -o cluster.json``).

        Raises:
            ClusterError: unreadable file, invalid JSON, or not a cluster.
        """
        text = os.fspath(text_or_path)
        if not text.lstrip().startswith("{"):
            try:  # (a pipe or device is refused, as is a file too large to be a cluster)
                text = read_input_bytes(text, what="cluster file").decode("utf-8-sig")
            except (OSError, ValueError) as err:
                raise ClusterError(f"Cluster.from_json: cannot read cluster file {text!r}: "
                                   f"{getattr(err, 'strerror', None) or err}. Fix: check the path, or write one with "
                                   "'autoplan profile -o cluster.json'.") from err
        try:
            d = json.loads(text)
        except json.JSONDecodeError as err:
            raise ClusterError(f"Cluster.from_json: not valid JSON ({err}). Got {text[:60]!r}. "
                               "Fix: pass a file written by 'autoplan profile -o'.") from err
        if isinstance(d, dict) and d.get("schema", "autoplan.cluster") == "autoplan.cluster":
            d.pop("schema", None)
            return cls.from_dict(d)
        raise ClusterError(f"Cluster.from_json: not an autoplan cluster. Got {text[:60]!r}. Fix: "
                           "pass a file written by 'autoplan profile -o' or Cluster.to_json.")

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

    @property
    def is_measured(self) -> bool:
        """True for a profile measured on devices (:func:`autoplan.profile`)."""
        return bool(self.profiled)

    def describe_profile(self) -> str:
        """What the costs come from: a datasheet preset, or a measured profile and when.

        Examples:
            >>> Cluster.preset("p3.16xlarge").describe_profile()
            'datasheet preset p3.16xlarge (V100-SXM2-16GB)'
        """
        if not self.is_measured:
            return f"datasheet preset {self.name} ({self.device_kind})"
        when = self.profiled.replace("T", " ")[:16]
        kind = " quick" if self.quick else ""
        return (f"measured{kind} profile of {self.devices_per_node} x {self.device_kind} "
                f"({self.platform}) on {when} UTC")

    def summary(self) -> str:
        """A readable table of the profile (what ``autoplan profile`` prints)."""
        lines = [f"cluster {self.spec}: {self.describe_profile()}",
                 f"  devices          : {self.nodes} x {self.devices_per_node} x {self.device_kind}, "
                 f"{self.device_memory / 2**30:.1f} GiB each",
                 f"  peak             : {_rate(self.peak_flops)} ({self.training_precision}, the "
                 "MFU's reference)" if self.peak_rates else
                 f"  peak             : {_rate(self.peak_flops)} x {self.compute_efficiency:g} "
                 "achievable (where no curve applies)",
                 f"  memory bandwidth : {self.memory_bandwidth / 1e9:.2f} GB/s per device",
                 f"  overheads        : launch {self.launch_overhead * 1e6:.0f} us + "
                 f"{self.arg_overhead * 1e6:.1f} us per argument, kernel "
                 f"{self.op_overhead * 1e6:.1f} us",
                 f"  links            : in a node {self.intra_bandwidth / 1e9:.2f} GB/s, "
                 f"{self.intra_latency * 1e6:.1f} us; between nodes "
                 f"{self.inter_bandwidth / 1e9:.2f} GB/s, {self.inter_latency * 1e6:.1f} us"]
        if self.peak_rates:
            rates = ", ".join(f"{p} {_rate(v)}" for p, v in self.peak_rates)
            lines.append(f"  peak by precision: {rates}; float32 dots as {self.float32_dot}"
                         + ("; achievable fractions from the measured GPU saturation curves"
                            if self.saturation else ""))
        lines += [f"  source of {k:<8}: {v}" for k, v in self.sources]
        for c in self.curves:
            if c.op == "memory":
                pts = ", ".join(f"{w / t / 1e9:.2f} GB/s at {w / 1024:.0f} KiB"
                                for w, t in zip(c.sizes, c.seconds) if t > 0)
                lines.append(f"  memory by kernel size: {pts}")
                continue
            pts = ", ".join(f"{_rate(f / t)} at {f / 1e6:.3g} MFLOP"
                            for f, t in zip(c.sizes, c.seconds) if t > 0)
            lines.append(f"  {c.op:<6} {c.dtype:<9}: {pts} (fit: {_rate(c.peak)}, half of it at "
                         f"{c.half / 1e6:.3g} MFLOP)")
        for t in self.collectives:
            size, stride = t.group[0] if t.group else (1, 1)
            rate = f"{t.nbytes[-1] / t.seconds[-1] / 1e9:6.2f} GB/s" if t.seconds else "-"
            lines.append(f"  {t.kind:<15}: {size} devices, stride {stride}: latency "
                         f"{t.alpha * 1e6:7.1f} us, {rate} at {int(t.nbytes[-1])} B "
                         f"({len(t.nbytes)} sizes measured)")
        return "\n".join(lines)

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
        index = memo(self, "curves", lambda: {(c.op, c.dtype): c for c in self.curves})
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
        curve = memo(self, "memory_curve",
                     lambda: next((c for c in self.curves if c.op == "memory"), None))
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
        index = memo(self, "collective_tables", lambda: _table_index(self.collectives))
        hit = index["exact"].get((kind, group))
        if hit is not None:
            return hit
        n = math.prod(s for s, _ in group)
        same = index["by_size"].get((kind, n))
        if not same:
            return None
        stride = group[0][1] if group else 1
        return min(same, key=lambda t: (abs(math.log(t.group[0][1] / stride)), t.group))

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
        ids = tuple(device_ids) if device_ids is not None else tuple(range(n))
        alphas, betas, crosses = [], [], []
        inner = 1  # devices spanned by the axes inside this one
        for size in reversed(shape):
            span = inner * size
            cross = hosts > 1 and span > per and size > 1
            if cross:
                # parallel groups on one node share its network link
                groups_per_node = min(inner, per)
                bw = self.inter_bandwidth / groups_per_node
                alpha = self.inter_latency
                beta = 1.0 / bw
            else:
                # the axis's groups run at once; the slowest (least-linked) decides
                bw = self.intra_bandwidth if size <= 1 or not self.nvlinks else min(
                    self.group_bandwidth([ids[p + k * inner] for k in range(size)])
                    for p in range(n) if (p // inner) % size == 0)
                alpha, beta = self.intra_latency, 1.0 / bw
                table = self.collective_table("all-gather", ((size, inner),)) if size > 1 else None
                if table is not None:  # the measured link: all-gather's fit per byte moved
                    alpha, beta = table.alpha, table.beta / _FACTOR["all-gather"](size)
            alphas.append(alpha)
            betas.append(beta)
            crosses.append(cross)
            inner = span
        names = tuple(axis_names) if axis_names else default_axis_names(len(shape))
        return LogicalMesh(shape=shape, alpha=tuple(reversed(alphas)), beta=tuple(reversed(betas)),
                           axis_names=names, device_ids=ids, cluster=self, submesh=(hosts, per),
                           crosses=tuple(reversed(crosses)))


def _rate(flops: float) -> str:
    return f"{flops / 1e9:.1f} GFLOP/s" if flops < 1e12 else f"{flops / 1e12:.1f} TFLOP/s"


def profile(devices: Sequence[Any] | None = None, *, quick: bool = False,
            progress: bool = True) -> Cluster:
    """Profile the attached devices: a measured :class:`Cluster` named ``local``.

    Runs the micro-benchmarks of :mod:`autoplan.costs._profile` on every device at once (the way a plan
    runs): matmul and convolution throughput by size for each dtype the platform runs, memory
    bandwidth, launch and kernel overheads, and all-reduce, all-gather, reduce-scatter,
    all-to-all and send/recv over every mesh-axis geometry of the search's 2-D meshes over a
    sweep of message sizes; then fits the curves and tables.

    Args:
        devices: the devices (default ``jax.devices()``).
        quick: fewer sizes (well under a minute on 8 emulated CPU devices; the full profile takes
            a few minutes).
        progress: show a progress bar on stderr.

    Returns:
        One node of ``len(devices)`` devices with the measured profile; save it with
        :meth:`Cluster.to_json` and pass it, or the file's path, wherever a cluster is taken.

    Raises:
        ClusterError: no devices, or devices of different kinds.

    Examples:
        Not run as a doctest: even the quick profile times the devices for about 30 s.

        >>> cluster = autoplan.profile(quick=True)              # doctest: +SKIP
        >>> cluster.describe_profile()                          # doctest: +SKIP
        'measured quick profile of 8 x cpu (cpu) on 2026-11-25 13:40 UTC'
    """
    return Cluster(**measured_fields(devices, quick=quick, progress=progress))


#: a profile file's spec: ``x.json`` or ``x.json:N``
_JSON_SPEC = re.compile(r"(.+\.json)(?::([^:]*))?")


def profile_file(spec: str) -> tuple[str, str | None] | None:
    """The profile file a ``--cluster`` spec names, as :meth:`Cluster.parse` reads it: ``(path,
    the text after ':' or None)`` for ``x.json``, ``x.json:N``, or an existing file that is not
    a preset's name; None for a preset's form, ``"local"`` and anything else."""
    if spec == "local":
        return None
    m = _JSON_SPEC.fullmatch(spec)
    if m:
        return m.group(1), m.group(2)
    if spec.partition(":")[0] not in PRESETS and os.path.exists(spec) and not os.path.isdir(spec):
        return spec, None
    return None


def _node_count(count: str, spec: str) -> int:
    """The count after the ':' of a cluster spec (devices for ``cpu:N``, else nodes)."""
    if not re.fullmatch(r"\d+", count) or int(count) <= 0:
        name = spec.rpartition(":")[0]
        what, example = ("device count", "cpu:8") if name == "cpu" else ("node count", f"{name}:2")
        raise ClusterError(f"cluster: the part after ':' should be a positive {what}. Got "
                           f"{count!r} in {spec!r}. Fix: e.g. '{example}'.")
    return int(count)


def _table_index(tables: Sequence[CollectiveTable]) -> dict[str, dict]:
    exact: dict[tuple, CollectiveTable] = {}
    by_size: dict[tuple, list[CollectiveTable]] = {}
    for t in tables:
        exact[(t.kind, t.group)] = t
        by_size.setdefault((t.kind, t.size), []).append(t)
    return {"exact": exact, "by_size": by_size}


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
    cluster: Cluster = field(repr=False, compare=False)
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


def send_recv_time(cluster: Cluster, nbytes: float, cross_node: bool) -> float:
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


#: the datasheet presets (:mod:`autoplan.costs._presets`), one node each
PRESETS: dict[str, Cluster] = {name: Cluster(name=name, **fields)
                               for name, fields in PRESET_FIELDS.items()}
