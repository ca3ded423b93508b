"""Detecting the attached devices: ``Cluster.detect`` reads their cached profile or measures it.

:class:`DeviceDetection` holds ``detect``, which :class:`~autoplan.costs._cluster.Cluster`
inherits: the attached devices' measured profile is kept per platform, device kind and device
count in :func:`~autoplan.costs._local.cache_dir`; a cached one is read back, else the devices
are profiled (:func:`measured_cluster`, as :func:`autoplan.profile` does) and the result is
cached. The micro-benchmarks are in :mod:`autoplan.costs._profile`, the fits that make them a
profile's fields in :mod:`autoplan.costs._local`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Self, TypeVar

from autoplan._errors import ClusterError
from autoplan.costs._local import keep_profile, measured_fields, profile_cache_paths

__all__ = ["DeviceDetection", "measured_cluster"]

C = TypeVar("C")


def measured_cluster(cls: type[C], devices: Sequence[Any] | None = None, *, quick: bool = False,
                     progress: bool = True) -> C:
    """The measured cluster (of class ``cls``) of ``devices``: :func:`autoplan.profile`'s
    result, made of the micro-benchmarks' fitted fields
    (:func:`~autoplan.costs._local.measured_fields`).

    Raises:
        ClusterError: no devices, or devices of different kinds.
    """
    return cls(**measured_fields(devices, quick=quick, progress=progress))


class DeviceDetection:
    """``Cluster.detect``, which :class:`~autoplan.costs._cluster.Cluster` inherits."""

    @classmethod
    def detect(cls, devices: Sequence[Any] | None = None, *, quick: bool = False,
               progress: bool = True, refresh: bool = False) -> Self:
        """The attached devices as a measured cluster, profiled once and cached on disk.

        The profile is kept per platform, device kind and device count in
        :func:`~autoplan.costs._local.cache_dir` (``$AUTOPLAN_CACHE_DIR``, else
        ``$XDG_CACHE_HOME/autoplan``, else ``~/.cache/autoplan``); a full cached profile also
        serves ``quick=True``.

        Args:
            devices: the devices (default ``jax.devices()``).
            quick: profile with fewer sizes when nothing is cached (see :func:`autoplan.profile`).
            progress: show a progress bar while profiling.
            refresh: profile again even when a cached profile exists.

        Returns:
            The measured :class:`~autoplan.costs._cluster.Cluster`.
        """
        full, fast = profile_cache_paths(devices)
        if not refresh:
            for path in ((full, fast) if quick else (full,)):
                if os.path.isfile(path):
                    try:
                        return cls.from_json(path)
                    except ClusterError:
                        pass  # an unreadable cache entry: profile again
        cluster = measured_cluster(cls, devices, quick=quick, progress=progress)
        keep_profile(devices, quick, cluster.to_json())
        return cluster
