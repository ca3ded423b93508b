"""Checks of the options the public functions take, shared so that one option reads alike
everywhere: each returns the value in its canonical form or raises the caller's
:class:`~autoplan.AutoplanError` subclass naming the option, the value and the fix.

* :func:`check_tolerance`: ``rtol`` and ``atol`` of the equivalence check (finite, >= 0);
* :func:`check_memory_budget`: a per-device byte count (a positive finite number, not a bool
  nor a string such as ``'1GB'``);
* :func:`check_mesh_shape`: a logical mesh as a tuple of positive integers (not ``'2x4'``);
* :func:`check_callback`: ``progress=`` and the like, None or callable;
* :func:`check_search_cluster`: a cluster the search can plan for in seconds
  (:data:`~autoplan.costs._cluster.MAX_SEARCH_DEVICES`);
* :func:`cache_max_bytes`: ``$AUTOPLAN_CACHE_MAX_BYTES``, a byte count (``0``: store nothing).
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any

from autoplan.costs._cluster import MAX_SEARCH_DEVICES

from ._errors import ArgumentError, ArgumentTypeError, AutoplanError

__all__ = ["check_tolerance", "check_memory_budget", "check_mesh_shape", "check_callback",
           "check_search_cluster", "cache_max_bytes", "CACHE_MAX_BYTES_ENV", "require_graph",
           "require_instance", "require_workload"]

#: the environment variable bounding the plan cache's folder (bytes)
CACHE_MAX_BYTES_ENV = "AUTOPLAN_CACHE_MAX_BYTES"


def _real(v: Any) -> bool:
    """A real number that is not a bool (numpy scalars included)."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool | str)


def check_tolerance(where: str, name: str, v: Any, error: type[AutoplanError] = ArgumentError,
                    example: str = "1e-5") -> float:
    """``rtol`` or ``atol``: a finite number >= 0, as a float."""
    if not _real(v) or not math.isfinite(float(v)) or float(v) < 0:
        raise error(f"{where}: {name} should be a finite number >= 0 (the equivalence check's "
                    f"tolerance, |a - b| <= atol + rtol |b|). Got {v!r}. Fix: e.g. "
                    f"{name}={example}.")
    return float(v)


def check_memory_budget(where: str, v: Any, error: type[AutoplanError] = ArgumentError
                        ) -> float | None:
    """``memory_budget``: None, or a positive finite number of bytes per device."""
    if v is None:
        return None
    if isinstance(v, str):
        raise error(f"{where}: memory_budget should be a number of bytes per device. Got the "
                    f"string {v!r}. Fix: write it in bytes, e.g. memory_budget=2**30 for 1 GiB "
                    "or 16e9 for 16 GB.")
    if not _real(v) or not math.isfinite(float(v)) or float(v) <= 0:
        why = " (True is not a byte count)" if isinstance(v, bool) else ""
        raise error(f"{where}: memory_budget should be None or a positive number of bytes per "
                    f"device{why}. Got {v!r}. Fix: e.g. memory_budget=16 * 2**30, or None for the "
                    "devices' own memory.")
    return float(v)


def check_mesh_shape(where: str, v: Any, error: type[AutoplanError] = ArgumentError
                     ) -> tuple[int, ...] | None:
    """``mesh_shape``: None, or a tuple (or list) of positive integers."""
    if v is None:
        return None
    if isinstance(v, str):
        parts = v.lower().replace("*", "x").split("x")
        hint = (f"mesh_shape=({', '.join(parts)})" if all(p.strip().isdigit() for p in parts)
                else "mesh_shape=(2, 4)")
        raise error(f"{where}: mesh_shape should be a tuple of positive integers, one per mesh "
                    f"axis. Got the string {v!r}. Fix: {hint}.")
    if (not isinstance(v, tuple | list) or not v
            or not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) and x > 0
                       for x in v)):
        raise error(f"{where}: mesh_shape should be a tuple of positive integers, one per mesh "
                    f"axis. Got {v!r}. Fix: e.g. mesh_shape=(2, 4), or None for every 2-D shape.")
    return tuple(int(x) for x in v)


def check_callback(where: str, name: str, v: Any, error: type[AutoplanError] = ArgumentTypeError,
                   signature: str = "(message, fraction)") -> Any:
    """A callback option: None or a callable."""
    if v is not None and not callable(v):
        raise error(f"{where}: {name} should be None or a function called as {name}{signature}. "
                    f"Got {type(v).__name__}: {v!r:.40}. Fix: pass a function, or leave it out.")
    return v


def check_search_cluster(where: str, cluster: Any, error: type[AutoplanError] = ArgumentError
                         ) -> None:
    """Refuse a cluster whose search would not fit the machine (more than
    :data:`~autoplan.costs._cluster.MAX_SEARCH_DEVICES` devices)."""
    n = cluster.num_devices
    if n > MAX_SEARCH_DEVICES:
        per = cluster.devices_per_node
        nodes = max(1, MAX_SEARCH_DEVICES // per)
        example = f"cpu:{MAX_SEARCH_DEVICES}" if cluster.name == "cpu" else f"{cluster.name}:{nodes}"
        raise error(f"{where}: the cluster should have at most {MAX_SEARCH_DEVICES:,} devices to "
                    "be searched (the pipeline search's tables have a column per device "
                    "count: past that, a search takes minutes and gigabytes). Got "
                    f"{cluster.spec} with {n:,} devices. Fix: search a slice of it, "
                    f"e.g. '{example}', and run the plan data-parallel over the slices, or check "
                    "the count for a typo.")


def cache_max_bytes(default: int, env: Any = None) -> int:
    """``$AUTOPLAN_CACHE_MAX_BYTES`` as a byte count (``default`` when unset or empty); ``0``
    means the plan cache stores nothing.

    Raises:
        ArgumentError: not a non-negative integer (``1e9`` and ``1_000`` are read too).
    """
    text = (os.environ if env is None else env).get(CACHE_MAX_BYTES_ENV, "")
    if not text.strip():
        return default
    try:
        v = float(text.replace("_", "")) if any(c in text for c in ".eE_") else int(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v < 0 or v != int(v):
        raise ArgumentError(f"${CACHE_MAX_BYTES_ENV} should be a whole number of bytes >= 0 "
                            f"(0: the plan cache stores nothing). Got {text!r}. Fix: e.g. "
                            f"{CACHE_MAX_BYTES_ENV}=1000000000, or unset it for the default "
                            f"{default:,}.")
    return int(v)


def require_graph(where: str, graph: Any, name: str = "graph") -> Any:
    """``graph`` itself when it is an :class:`~autoplan.OpGraph`; else ArgumentTypeError."""
    from autoplan.tracing._graph import OpGraph  # noqa: PLC0415

    if not isinstance(graph, OpGraph):
        hint = (" (a workload: trace it first)" if hasattr(graph, "fn") and hasattr(graph, "args")
                else "")
        raise ArgumentTypeError(
            f"{where}: {name} should be an autoplan.OpGraph{hint}. Got {type(graph).__name__}: "
            f"{graph!r:.40}. Fix: pass autoplan.trace(workload) (or result.graph of a search).")
    return graph


def require_instance(where: str, name: str, v: Any, cls: type, fix: str,
                     optional: bool = False) -> Any:
    """``v`` itself when it is a ``cls`` (or None, when ``optional``); else ArgumentTypeError."""
    if not (isinstance(v, cls) or (optional and v is None)):
        raise ArgumentTypeError(f"{where}: {name} should be {'None or ' if optional else ''}an "
                                f"autoplan {cls.__name__}. Got {type(v).__name__}: {v!r:.40}. "
                                f"Fix: {fix}.")
    return v


def require_workload(where: str, workload: Any) -> Any:
    """``workload`` itself when it has a step and arguments (``fn`` and ``args``); else
    ArgumentTypeError."""
    if not (hasattr(workload, "fn") and hasattr(workload, "args")):
        raise ArgumentTypeError(
            f"{where}: workload should be an autoplan.Workload (a step and its arguments) or a zoo "
            f"workload. Got {type(workload).__name__}: {workload!r:.40}. Fix: pass "
            "autoplan.Workload(train_step, (params, opt_state, batch)) or "
            "autoplan.models.get('gpt', 'tiny').")
    return workload
