"""Clusters: their devices' profile, its checks, presets and file form.

A :class:`Cluster` is ``nodes x devices_per_node`` accelerators with a fast link inside a node and
a slower one between nodes.

A cluster is a *profile* of its devices, in one of two forms with the same fields:

* a **datasheet** preset (``p3.16xlarge``, ``v100-32g-100gbe``, ``dgx-h100``, ``cpu``): peak
  FLOP/s times an achievable fraction, memory bandwidth, link bandwidths and latencies;
* a **measured** profile made by :func:`autoplan.profile` on the attached devices: matmul and
  convolution throughput curves by size and dtype (:class:`ThroughputCurve`), memory bandwidth,
  the overhead of one kernel and of one executable launch (plus one per argument array), and a
  table of measured collective times per kind and mesh-axis geometry (:class:`CollectiveTable`,
  Alpa's profiling database).

This module holds the :class:`Cluster` (its fields, their checks, its presets, its CLI and file
forms) and :func:`profile`. The rest of what a cluster does lives beside it, and ``Cluster``
inherits its methods from there:

* the cost model of its devices (compute, memory and launch times, link bandwidths, the
  measured tables' lookup): :mod:`autoplan.costs._cost_model`;
* logical meshes over its devices and the collectives' costs on them (with the formulas):
  :mod:`autoplan.costs._mesh`, which ``Cluster.logical_mesh`` builds on;
* detecting the attached devices (``Cluster.detect``, its profile cache):
  :mod:`autoplan.costs._detect`.

The measured tables are in :mod:`autoplan.costs._measured`, the datasheet presets' numbers in
:mod:`autoplan.costs._presets`, the device models in :mod:`autoplan.costs._device_models`, and
the attached devices' measured profile and its cache on disk in :mod:`autoplan.costs._local`.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from autoplan._errors import ClusterError
from autoplan._io import read_input_bytes
from autoplan.costs._cost_model import CURVE_OPS, DeviceCostModel
from autoplan.costs._detect import DeviceDetection, measured_cluster
from autoplan.costs._device_models import PRECISIONS as _PRECISIONS
from autoplan.costs._local import keep_profile
from autoplan.costs._measured import CollectiveTable, ThroughputCurve
from autoplan.costs._mesh import COLLECTIVES, LogicalMesh
from autoplan.costs._mesh import logical_mesh as _logical_mesh
from autoplan.costs._presets import PRESET_FIELDS

__all__ = ["Cluster", "PRESETS", "MAX_DEVICES", "MAX_SEARCH_DEVICES", "profile", "profile_file"]

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
class Cluster(DeviceCostModel, DeviceDetection):
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
            d["nvlinks"] = tuple(tuple(_whole(x) for x in link) for link in d.get("nvlinks", ()))
            d["curves"] = tuple(
                ThroughputCurve(c["op"], c["dtype"], tuple(map(float, c["sizes"])),
                                tuple(map(float, c["seconds"])), float(c["peak"]), float(c["half"]))
                for c in d.get("curves", ()))
            d["collectives"] = tuple(
                CollectiveTable(t["kind"], tuple((_whole(s), _whole(st)) for s, st in t["group"]),
                                tuple(map(float, t["nbytes"])), tuple(map(float, t["seconds"])),
                                float(t["alpha"]), float(t["beta"]))
                for t in d.get("collectives", ()))
            return cls(**d)
        except (KeyError, TypeError, ValueError, OverflowError) as err:
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

    def logical_mesh(self, shape: Sequence[int], submesh: tuple[int, int] | None = None,
                     device_ids: Sequence[int] | None = None,
                     axis_names: Sequence[str] | None = None) -> LogicalMesh:
        """View a physical (sub)mesh of ``submesh = (hosts, devices per host)`` devices as a
        logical mesh of ``shape`` (row-major over the devices: the last axis is innermost), each
        axis with the alpha and beta of the links its groups use (:mod:`autoplan.costs._mesh`).

        Raises:
            ClusterError: the shape's size differs from the submesh's, or exceeds the cluster.
        """
        return _logical_mesh(self, shape, submesh, device_ids, axis_names)


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
        It is also kept in the cache :meth:`Cluster.detect` and ``--cluster local`` read (the
        quick or the full profile's), so they do not measure the same devices again.

    Raises:
        ClusterError: no devices, or devices of different kinds.

    Examples:
        Not run as a doctest: even the quick profile times the devices for about 30 s.

        >>> cluster = autoplan.profile(quick=True)              # doctest: +SKIP
        >>> cluster.describe_profile()                          # doctest: +SKIP
        'measured quick profile of 8 x cpu (cpu) on 2026-11-25 13:40 UTC'
    """
    cluster = measured_cluster(Cluster, devices, quick=quick, progress=progress)
    keep_profile(devices, quick, cluster.to_json())
    return cluster


def _whole(x: Any) -> int:
    """``x`` as an int when it is a whole number (a JSON ``2`` or ``2.0``); ValueError for a
    fraction, infinity, NaN, a bool or text."""
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or x != int(x):
        raise ValueError(f"expected a whole number. Got {x!r}")
    return int(x)


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


#: the datasheet presets (:mod:`autoplan.costs._presets`), one node each
PRESETS: dict[str, Cluster] = {name: Cluster(name=name, **fields)
                               for name, fields in PRESET_FIELDS.items()}
