"""Executing plans: JAX shardings on the devices at hand, a pipeline executor, and a
multi-process launcher through ``jax.distributed``.

* :func:`run` runs a :class:`~autoplan.Plan` in this process and checks it against
  single-device execution (:class:`RunReport`).
* :func:`launch` runs it in worker processes joined by ``jax.distributed`` on the devices
  attached (:class:`LaunchHandle`, :class:`LaunchResult`; :func:`detect_devices` says what is
  attached, :func:`cluster_command` writes the ``srun``/``mpirun`` line for a cluster).
* :func:`collectives` lists the collectives of compiled HLO text.

This package only reads plans; it does not import :mod:`autoplan.viz`.
"""

from autoplan.exec._hlo import Collective as Collective
from autoplan.exec._hlo import MemoryStats as MemoryStats
from autoplan.exec._hlo import collectives as collectives
from autoplan.exec._hlo import comm_bytes as comm_bytes
from autoplan.exec._interpret import FlatProgram as FlatProgram
from autoplan.exec._interpret import flatten as flatten
from autoplan.exec._launch import LaunchHandle as LaunchHandle
from autoplan.exec._launch import LaunchResult as LaunchResult
from autoplan.exec._launch import describe_workload as describe_workload
from autoplan.exec._launch import launch as launch
from autoplan.exec._layout import cluster_command as cluster_command
from autoplan.exec._probe import DeviceInfo as DeviceInfo
from autoplan.exec._probe import detect_devices as detect_devices
from autoplan.exec._run import EquivalenceResult as EquivalenceResult
from autoplan.exec._run import RunReport as RunReport
from autoplan.exec._run import check_equivalence as check_equivalence
from autoplan.exec._run import run as run

__all__ = [
    "run",
    "RunReport",
    "EquivalenceResult",
    "check_equivalence",
    "launch",
    "LaunchHandle",
    "LaunchResult",
    "describe_workload",
    "detect_devices",
    "DeviceInfo",
    "cluster_command",
    "collectives",
    "comm_bytes",
    "Collective",
    "MemoryStats",
    "flatten",
    "FlatProgram",
]

_MOVED = {"schedule_table", "schedule_order"}


def __getattr__(name: str):
    """``autoplan.exec.schedule_table`` and ``schedule_order`` still work for one release, with a
    :class:`DeprecationWarning`: the schedules live in one module, public as
    ``autoplan.algorithms.schedule_table`` and ``autoplan.algorithms.schedule_order``."""
    if name in _MOVED:
        import warnings  # noqa: PLC0415

        from autoplan.plans import _schedule  # noqa: PLC0415

        warnings.warn(f"autoplan.exec.{name} is deprecated; use autoplan.algorithms.{name} (the same "
                      "function).", DeprecationWarning, stacklevel=2)
        return getattr(_schedule, name)
    raise AttributeError(f"module 'autoplan.exec' has no attribute {name!r}")
