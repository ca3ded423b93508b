"""The sharding spec of one tensor: :class:`Spec`.

A spec says, for each dimension of a tensor, which mesh axes split it: ``None`` for a replicated
dimension, or a tuple of mesh-axis names (``("x",)``, ``("x", "y")``, major axis first). It
carries the information of a ``jax.sharding.PartitionSpec`` in one canonical form: exactly one
entry per dimension, so ``PartitionSpec("x")`` of a matrix and ``Spec(("x",), None)`` are the
same value. Plans store specs, the search enumerates them, the executor and the figures read
them; this module is the one place that counts a spec's tiles, checks that it divides a shape,
converts it to and from a ``PartitionSpec`` and prints it.

A :class:`Spec` is a ``tuple`` (hashing, equality, indexing and pickling are the tuple's), so it
equals the plain tuple of its entries; the search keeps building plain spec tuples in its hot
loops and the functions here (:func:`tile_count`, :func:`split_error`) take either.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from autoplan._errors import ArgumentError, ArgumentTypeError
from autoplan.plans._frozen import immutable_type

__all__ = ["Spec", "tile_count", "split_error", "zero_spec", "ZERO_SHARDED"]

Entry = tuple[str, ...] | None


def _entry(e: Any) -> Entry:
    if e is None:
        return None
    if isinstance(e, str):
        return (e,)
    try:
        axes = tuple(e)
    except TypeError:
        raise ArgumentTypeError(
            f"a spec entry should be None, a mesh-axis name or a tuple of mesh-axis names. Got {e!r}. "
            "Fix: write one entry per dimension, e.g. Spec(('x',), None).") from None
    if not all(isinstance(a, str) for a in axes):
        raise ArgumentTypeError(
            f"a spec entry should hold mesh-axis names (strings). Got {e!r}. "
            "Fix: name the mesh axes, e.g. ('x', 'y').")
    return axes or None


@immutable_type
class Spec(tuple):
    """Which mesh axes split each dimension of a tensor (Alpa's ``S``/``R`` notation).

    Immutable and canonical: one entry per dimension, each ``None`` (replicated) or a tuple of
    mesh-axis names; an axis name alone, a list and an empty tuple are written in that form
    (entries that are already non-empty tuples are kept as they are). Equal specs hash equal,
    also against the plain tuple of their entries.

    Examples:
        >>> from jax.sharding import PartitionSpec as P
        >>> s = Spec("x", None)
        >>> s
        Spec(('x',), None)
        >>> s == Spec.from_pspec(P("x"), 2) == (("x",), None)
        True
        >>> print(s, Spec(("x", "y"), None, "z"), Spec(None), Spec())
        S(x)R S(x,y)RS(z) R scalar
        >>> s.to_pspec()
        P('x',)
        >>> s.pspec_text()
        "P('x', None)"
        >>> s.tiles((2, 4), ("x", "y")), s.divides((6, 3), (2, 4), ("x", "y"))
        (2, True)
        >>> Spec(None, ("x", "y")).divides((8, 4), (2, 4), ("x", "y"))
        False
    """

    __slots__ = ()

    def __new__(cls, *entries: Any) -> Spec:
        for e in entries:  # the search builds many specs already in canonical form: keep them
            if e is not None and (type(e) is not tuple or not e):
                return tuple.__new__(cls, [_entry(e) for e in entries])
        return tuple.__new__(cls, entries)

    def __getnewargs__(self) -> tuple[Entry, ...]:  # pickle/copy call Spec(*entries)
        return tuple(self)

    @classmethod
    def of(cls, entries: Iterable[Any]) -> Spec:
        """The spec with these entries (a spec tuple, a JSON list), one per dimension; a
        :class:`Spec` is returned as it is."""
        return entries if type(entries) is cls else cls(*entries)

    @classmethod
    def replicated(cls, ndim: int) -> Spec:
        """The spec that splits none of ``ndim`` dimensions."""
        return cls(*(None,) * ndim)

    @classmethod
    def from_pspec(cls, pspec: Any, ndim: int) -> Spec:
        """The spec of a ``PartitionSpec`` (or any sequence of entries) for an ``ndim``-dimensional
        tensor: missing trailing entries are ``None``.

        Raises:
            ArgumentError: more entries than dimensions.
        """
        entries = tuple(pspec)
        if len(entries) > ndim:
            raise ArgumentError(
                f"a PartitionSpec should have at most one entry per dimension ({ndim}). Got {pspec} "
                f"with {len(entries)} entries. Fix: give at most {ndim} entries.")
        return cls(*entries, *(None,) * (ndim - len(entries)))

    def to_pspec(self) -> Any:
        """The ``jax.sharding.PartitionSpec``: one-axis entries as names, trailing ``None`` dropped."""
        from jax.sharding import PartitionSpec  # noqa: PLC0415 (import autoplan loads no JAX)

        return PartitionSpec(*self._pspec_entries(trim=True))

    def _pspec_entries(self, trim: bool) -> list[Any]:
        entries: list[Any] = [e if e is None or len(e) > 1 else e[0] for e in self]
        while trim and entries and entries[-1] is None:
            entries.pop()
        return entries

    @property
    def axes(self) -> tuple[str, ...]:
        """The mesh axes the spec uses, in dimension order."""
        return tuple(a for e in self if e for a in e)

    def tiles(self, mesh_shape: Sequence[int], axis_names: Sequence[str]) -> int:
        """How many tiles the tensor is cut into: the product of the used mesh axes' sizes.

        Raises:
            ArgumentError: the spec uses an axis that is not one of ``axis_names``.
        """
        try:
            return tile_count(self, dict(zip(axis_names, mesh_shape)))
        except KeyError as err:
            raise ArgumentError(
                f"a spec's axes should be mesh axes ({', '.join(axis_names)}). Got {self!r}, which uses "
                f"{err.args[0]!r}. Fix: use the mesh's axis names.") from None

    def divides(self, shape: Sequence[int], mesh_shape: Sequence[int], axis_names: Sequence[str]) -> bool:
        """True when the spec can shard ``shape``: one entry per dimension, only mesh axes, and
        every split dimension divisible by the product of its axes' sizes."""
        return split_error(self, shape, dict(zip(axis_names, mesh_shape))) is None

    def __str__(self) -> str:
        """Alpa's notation with axis names: ``S(x)R``, ``S(x,y)``, ``R``; ``scalar`` for 0-d."""
        return "".join(["R" if not e else "S(" + ",".join(e) + ")" for e in self]) or "scalar"

    def __format__(self, format_spec: str) -> str:  # f"{spec:<10}" pads the notation
        return format(str(self), format_spec)

    def __repr__(self) -> str:
        return "Spec(" + ", ".join(map(repr, self)) + ")"

    def pspec_text(self, *, trim: bool = False) -> str:
        """The spec as ``PartitionSpec`` code, ``P('x', None)``: one entry per dimension, or with
        ``trim`` the trailing ``None`` dropped as :meth:`to_pspec` does (``P('x')``)."""
        entries = self._pspec_entries(trim)
        return "P(" + ", ".join(repr(e) if e is None or isinstance(e, str) else
                                "(" + ", ".join(map(repr, e)) + ")" for e in entries) + ")"


def tile_count(spec: Sequence[Entry] | None, sizes: Mapping[str, int]) -> int:
    """Tiles of a spec (a :class:`Spec` or a plain spec tuple) given ``{mesh axis: size}``: the
    product of the used axes' sizes (1 for ``None`` or a 0-d spec). Every axis the spec uses
    must be in ``sizes`` (a ``KeyError`` otherwise: the search calls this on specs it built)."""
    n = 1
    for e in spec or ():  # a loop, not math.prod of a generator: the search calls this very often
        if e:
            for a in e:
                n *= sizes[a]
    return n


def split_error(spec: Sequence[Entry], shape: Sequence[int], sizes: Mapping[str, int]) -> str | None:
    """Why ``spec`` cannot shard ``shape`` on a mesh with ``{axis: size}``, or None when it can:
    one entry per dimension, each axis a mesh axis used once, and each split dimension divisible
    by the product of its axes' sizes.

    Examples:
        >>> split_error((("x",), None), (6, 3), {"x": 4})
        "dimension 0 of size 6 is not divisible by 4 (axes ('x',))"
    """
    if len(spec) != len(shape):
        return f"it has {len(spec)} entries but the tensor has {len(shape)} dimensions {tuple(shape)}"
    seen: set[str] = set()
    for d, (n, e) in enumerate(zip(shape, spec)):
        if not e:
            continue
        for a in e:
            if a not in sizes:
                return f"axis {a!r} is not a mesh axis (mesh axes: {tuple(sizes)})"
            if a in seen:
                return f"axis {a!r} is used twice"
            seen.add(a)
        k = math.prod(sizes[a] for a in e)
        if n % k:
            return f"dimension {d} of size {n} is not divisible by {k} (axes {e})"
    return None


#: What each ZeRO level keeps sharded over its axes (Rajbhandari et al., SC'20), by kind of tensor
#: (``"gradient"``: the gradient accumulators): the one rule the stage executor and the memory
#: figure read.
ZERO_SHARDED: dict[int, frozenset[str]] = {
    0: frozenset(),
    1: frozenset({"optimizer_state"}),
    2: frozenset({"optimizer_state", "gradient"}),
    3: frozenset({"optimizer_state", "gradient", "parameter"}),
}


def zero_spec(spec: Sequence[Entry], shape: Sequence[int], axes: Sequence[str],
              sizes: Mapping[str, int]) -> Spec:
    """The spec of a tensor sharded by ZeRO over ``axes`` (Rajbhandari et al.): the axes its
    spec does not use already are added to the first dimension they divide, after the axes that
    split it already (``S(y)R`` over ``x, y`` becomes ``S(y,x)R``). When no dimension divides
    the extra axes' product, the spec is kept as it is.

    >>> zero_spec(Spec(None, "y"), (8, 4), ("x", "y"), {"x": 2, "y": 2})
    Spec(('x',), ('y',))
    >>> zero_spec(Spec("y"), (6,), ("x",), {"x": 4, "y": 2})
    Spec(('y',))
    """
    spec = Spec.of(spec) if not isinstance(spec, Spec) else spec
    used = set(spec.axes)
    extra = tuple(a for a in axes if a not in used and sizes[a] > 1)
    if not extra:
        return spec
    factor = math.prod(sizes[a] for a in extra)
    for d, n in enumerate(shape):
        have = spec[d] or ()
        if n % (math.prod(sizes[a] for a in have) * factor) == 0:
            return Spec(*spec[:d], have + extra, *spec[d + 1:])
    return spec
