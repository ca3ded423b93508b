"""Per-object memo: values computed from one object alone, kept as long as that object.

Search and execution derive the same things from a workload or a graph again and again (traces,
mining, per-graph tables of the ILP); :func:`memo` computes each once per object. An analysis read
from several modules is a named accessor made by :func:`per_owner` next to the analysis
(``_mine.mining_of(graph)``, ``_chain.segments_of(graph)``, ``_summary.analysis_of(graph)``),
keyed by the accessor itself, so there is one function that computes it and no string key two
modules must spell alike.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")

_SLOT = "_autoplan_memo"


def memo(owner: Any, key: Hashable, make: Callable[[], T]) -> T:
    """``make()`` once per ``owner`` object and ``key``.

    The value is stored on the owner itself (as :func:`functools.cached_property` does, so frozen
    dataclasses work too) and lives as long as it; owners without a ``__dict__`` are not cached.
    """
    store = getattr(owner, "__dict__", None)
    if store is None:
        return make()
    cache = store.setdefault(_SLOT, {})
    if key not in cache:
        cache[key] = make()
    return cache[key]


def per_owner(fn: Callable[[Any], T]) -> Callable[[Any], T]:
    """``fn(owner)`` computed once per ``owner`` (by :func:`memo`, keyed by the returned accessor
    itself: no other accessor can read or fill its value)."""

    @functools.wraps(fn)
    def accessor(owner: Any) -> T:
        return memo(owner, accessor, lambda: fn(owner))

    return accessor


def forget(owner: Any) -> None:
    """Drop everything :func:`memo` holds for ``owner`` (the next uses recompute)."""
    store = getattr(owner, "__dict__", None)
    if store is not None:
        store.pop(_SLOT, None)
