"""Per-object memo: values computed from one object alone, kept as long as that object.

Search and execution derive the same things from a workload or a graph again and again (traces,
mining, per-graph tables of the ILP); :func:`memo` computes each once per object. Each value has
one accessor, the function that computes it, next to the analysis it belongs to
(``_mine.mining_of(graph)``, ``_chain.segments_of(graph)``, ``_summary.analysis_of(graph)``);
modules that need the value call that accessor.

Keys: a value's key names its accessor, never a string two modules must spell alike:

- a value of the owner alone is keyed by the accessor itself: :func:`per_owner` makes
  ``fn(owner)`` such an accessor;
- a value that also depends on arguments is keyed by ``(accessor, *args)``:
  :func:`per_owner_and_args` makes ``fn(owner, *args)`` such an accessor (``args`` hashable);
- an accessor whose arguments are not hashable themselves (pins in a dict, a mesh read by its
  shape), or whose owner is not its first argument (a run caches on its workload), calls
  :func:`memo` with the same key itself: ``memo(owner, (accessor, *hashable_args), make)``, its
  own function object first.

Values that many owners share (a strategy of one operator on any mesh of one cost identity, a
resharding time) are kept process-wide instead, in a :class:`BoundedCache`: a dict emptied when
it grows past its limit, so a long session's memory stays bounded.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

_SLOT = "_autoplan_memo"


class _Values(dict):
    """An owner's memoised values. They belong to this process: a pickled owner (a mesh or a
    subgraph sent to a worker, a plan written to the plan cache) arrives without them and
    computes them again where it lands. Some are process-local by nature
    (:func:`~autoplan.search.intra._reshard.mesh_id` numbers meshes in the order one process
    meets them: a number carried into another process would name another mesh there), and the
    others are derived, so carrying them only makes the pickle larger and imports their
    modules in the reader."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Values, ())


def memo(owner: Any, key: Hashable, make: Callable[[], T]) -> T:
    """``make()`` once per ``owner`` object and ``key``.

    The value is stored on the owner itself (as :func:`functools.cached_property` does, so frozen
    dataclasses work too) and lives as long as it, in this process (a pickled owner arrives
    without its values); owners without a ``__dict__`` are not cached.
    """
    store = getattr(owner, "__dict__", None)
    if store is None:
        return make()
    cache = store.get(_SLOT)
    if cache is None:
        cache = store[_SLOT] = _Values()
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


def per_owner_and_args(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn(owner, *args)`` computed once per ``owner`` object and ``args`` (by :func:`memo`,
    keyed by ``(accessor, *args)`` with the returned accessor first: ``args`` must be hashable,
    and different arguments are computed apart)."""

    @functools.wraps(fn)
    def accessor(owner: Any, *args: Hashable) -> T:
        return memo(owner, (accessor, *args), lambda: fn(owner, *args))

    return accessor


def forget(owner: Any) -> None:
    """Drop everything :func:`memo` holds for ``owner`` (the next uses recompute)."""
    store = getattr(owner, "__dict__", None)
    if store is not None:
        store.pop(_SLOT, None)


class BoundedCache(dict[K, V]):
    """A process-wide cache: a dict read with ``get`` or ``[]``, written with :meth:`put`, which
    empties it first once it holds more than ``limit`` entries."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def put(self, key: K, value: V) -> V:
        """Store ``value`` under ``key`` (emptying the cache first when it is over its limit);
        returns ``value``."""
        if len(self) > self.limit:
            self.clear()
        self[key] = value
        return value
