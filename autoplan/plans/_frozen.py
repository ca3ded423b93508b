"""Read-only, hashable plain data: :class:`FrozenDict` and :func:`freeze`.

A :class:`~autoplan.Plan` and its records are frozen dataclasses; their mapping fields (a
plan's ``config`` and ``analysis``, the bytes and times by collective kind) hold a
:class:`FrozenDict`, and everything inside them is frozen too (nested dicts become
``FrozenDict``, lists become tuples), so a plan is immutable all the way down and hashable.

Reading works as with a dict (``plan.config["batch"]``, ``.get``, ``.items()``, ``in``,
``dict(...)``); writing raises ``TypeError``, as for any read-only mapping (``plan.to_dict()``
gives plain dicts and lists again):

    >>> from autoplan.plans._frozen import freeze
    >>> d = freeze({"batch": 8, "dims": [2, 4], "sub": {"k": 1}})
    >>> d["batch"], d["dims"], d["sub"]["k"]
    (8, (2, 4), 1)
    >>> d["batch"] = 16
    Traceback (most recent call last):
    ...
    TypeError: 'FrozenDict' object does not support item assignment
    >>> hash(d) == hash(freeze({"sub": {"k": 1}, "dims": (2, 4), "batch": 8}))
    True
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import fields
from functools import cache
from typing import Any, TypeVar

__all__ = ["FrozenDict", "freeze", "freeze_fields", "immutable_type"]

K = TypeVar("K")
V = TypeVar("V")


class FrozenDict(Mapping[K, V]):
    """An immutable mapping, hashable when its values are, that keeps insertion order.

    Equal to any mapping with the same items (a ``dict`` included), like ``dict`` itself; its
    hash does not depend on the order of the items, as equality does not.
    """

    __slots__ = ("_data", "_hash")

    def __init__(self, *args: Any, **kwargs: Any):
        object.__setattr__(self, "_data", dict(*args, **kwargs))
        object.__setattr__(self, "_hash", None)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"'FrozenDict' object attribute {name!r} is read-only")

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenDict):
            return self._data == other._data
        if isinstance(other, Mapping):
            return self._data == dict(other.items())
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(self, "_hash", hash(frozenset(self._data.items())))
        return self._hash

    def __repr__(self) -> str:
        return f"FrozenDict({self._data!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return FrozenDict, (self._data,)


def freeze(value: Any) -> Any:
    """``value`` made immutable all the way down: mappings become :class:`FrozenDict`, lists and
    tuples become tuples (a named tuple keeps its type), sets become frozensets, each of their
    items frozen too; anything else is returned as it is.

    A value that is frozen already is returned itself, not a copy; one of an
    :func:`immutable_type` (a name, a number, a plan record, a spec) without a walk.
    """
    if type(value) in _IMMUTABLE:
        return value
    if isinstance(value, Mapping):
        items = {k: freeze(v) for k, v in value.items()}
        if isinstance(value, FrozenDict) and all(items[k] is v for k, v in value.items()):
            return value
        return FrozenDict(items)
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    if isinstance(value, tuple):
        items = tuple(freeze(v) for v in value)
        if all(a is b for a, b in zip(items, value)):
            return value
        return type(value)(*items) if hasattr(value, "_fields") else items
    if isinstance(value, set):
        return frozenset(freeze(v) for v in value)
    return value


#: the types whose values are immutable all the way down: values that hold nothing else, and
#: those of :func:`immutable_type` (frozen and kept as they are, without a walk)
_IMMUTABLE: set[type] = {str, int, float, bool, complex, bytes, type(None)}

C = TypeVar("C", bound=type)


def immutable_type(cls: C) -> C:
    """Class decorator: every value of ``cls`` is immutable all the way down (a frozen dataclass
    whose ``__post_init__`` freezes its fields, a canonical tuple of names), so :func:`freeze`
    and :func:`freeze_fields` keep it as it is without walking it: a plan holds tens of
    thousands of such records and specs."""
    _IMMUTABLE.add(cls)
    return cls


@cache
def _compared_fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls) if f.compare)


def freeze_fields(record: Any) -> None:
    """Freeze, in place, every compared field of a frozen dataclass ``record`` (see
    :func:`freeze`), whatever its constructor was given: call it from ``__post_init__``.

    Fields left out of equality (``field(compare=False)``, such as a plan's in-memory pytree
    structures) are left as they are.
    """
    for name in _compared_fields(type(record)):
        v = getattr(record, name)
        t = type(v)
        if t in _IMMUTABLE or (t is tuple and all(type(x) in _IMMUTABLE for x in v)):
            continue  # the usual case (names, numbers, shapes, specs, tuples of records), checked
            # cheaply: records are many
        if isinstance(v, Mapping | list | tuple | set):
            frozen = freeze(v)
            if frozen is not v:
                object.__setattr__(record, name, frozen)
