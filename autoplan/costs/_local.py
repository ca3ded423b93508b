"""The attached devices' measured profile: its fields from the micro-benchmarks, and its cache.

:func:`measured_fields` runs :func:`autoplan.costs._profile.measure` and fits what it measured
into the fields of a measured :class:`~autoplan.costs._cluster.Cluster` (what
:func:`autoplan.profile` returns). :func:`profile_cache_paths` and :func:`store_profile` keep
such a profile on disk per platform, device kind and device count, in :func:`cache_dir`, where
``Cluster.detect`` reads it back.
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Sequence
from typing import Any

from autoplan._io import atomic_write_bytes, usable_cache_dir
from autoplan._io import cache_dir as _cache_folder
from autoplan.costs._measured import CollectiveTable, ThroughputCurve

__all__ = ["cache_dir", "utc_now", "measured_fields", "profile_cache_paths", "store_profile",
           "keep_profile"]


def cache_dir() -> str:
    """Where measured profiles are cached: autoplan's cache folder (:func:`autoplan._io.cache_dir`,
    the plan cache's too), as a string."""
    return str(_cache_folder())


def utc_now() -> str:
    """The current time as ISO 8601 (UTC, seconds)."""
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0, tzinfo=None).isoformat()


def profile_cache_paths(devices: Sequence[Any] | None = None) -> tuple[str, str]:
    """The files a full and a quick profile of ``devices`` (default ``jax.devices()``) are
    cached in: ``<cache_dir>/<key>.json`` and ``<key>-quick.json``, the key naming the platform,
    device kind, device count and jaxlib version."""
    from autoplan.costs._profile import cache_key  # noqa: PLC0415  (imports JAX)

    key = cache_key(devices)
    base = cache_dir()
    return os.path.join(base, f"{key}.json"), os.path.join(base, f"{key}-quick.json")


def keep_profile(devices: Sequence[Any] | None, quick: bool, text: str) -> None:
    """Keep a measured profile's JSON ``text`` of ``devices`` in the cache that
    ``Cluster.detect`` (and ``--cluster local``) read: the quick or the full profile's file."""
    full, fast = profile_cache_paths(devices)
    store_profile(fast if quick else full, text)


def store_profile(path: str, text: str) -> None:
    """Write a profile's JSON ``text`` to its cache file ``path`` (atomically, mode 0600), when
    its folder is private to this user (made 0700 when autoplan creates it)."""
    if usable_cache_dir(create=True):  # (the profiles' folder: cache_dir, as paths are made)
        atomic_write_bytes(path, text.encode(), mode=0o600)


def measured_fields(devices: Sequence[Any] | None = None, *, quick: bool = False,
                    progress: bool = True) -> dict[str, Any]:
    """The fields of the measured cluster of ``devices`` (see :func:`autoplan.profile`): one
    node named ``local``, with the fitted throughput curves and collective tables.

    Raises:
        ClusterError: no devices, or devices of different kinds.
    """
    from autoplan.costs._profile import measure  # noqa: PLC0415  (imports JAX)

    m = measure(devices, quick=quick, progress=progress)
    curves = tuple(ThroughputCurve.from_measurements(op, dt, f, t) for op, dt, f, t in m.curves)
    tables = tuple(CollectiveTable.from_measurements(k, (g,), b, t) for k, g, b, t in m.collectives)
    # the best sustained rate: the matmul curves' fitted asymptotes (a single noisy point never
    # sets it)
    peak = max((c.peak for c in curves if c.op == "matmul" and c.peak > 0), default=1e9)
    lat, bw = 1e-5, 1e10
    ring = next((t for t in tables if t.kind == "all-gather" and t.group == ((m.num_devices, 1),)),
                None)
    if ring is not None and ring.beta > 0:
        lat, bw = ring.alpha, (m.num_devices - 1) / m.num_devices / ring.beta
    return dict(
        name="local", nodes=1, devices_per_node=m.num_devices, device_memory=m.device_memory,
        peak_flops=peak, intra_bandwidth=bw, inter_bandwidth=bw, intra_latency=lat,
        inter_latency=lat, compute_efficiency=1.0, device_kind=m.device_kind,
        memory_bandwidth=m.memory_bandwidth, op_overhead=m.op_overhead,
        launch_overhead=m.launch_overhead, arg_overhead=m.arg_overhead, curves=curves,
        collectives=tables, profiled=utc_now(), platform=m.platform, quick=quick)
