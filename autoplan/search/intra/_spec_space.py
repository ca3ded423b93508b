"""Sharding specs over a logical device mesh: the search's side of :class:`autoplan.plans._spec.Spec`.

A spec says, for each dimension of a tensor, which mesh axes it is split over: ``None`` for a
replicated dimension, or a tuple of mesh-axis names (``("x",)``, ``("x", "y")``); the value type
is :class:`autoplan.plans._spec.Spec`, which plans store too. In Alpa's notation, on a 2-D mesh with
axes ``(x, y)``, a matrix spec ``(("x",), None)`` is ``S^0R``, ``(None, ("y",))`` is ``RS^1`` and
``(("x", "y"), None)`` is ``S^{01}R``. This module enumerates the valid specs of a shape on a
mesh and validates user-given ones.

Conventions used throughout the search:

* a dimension is split only if its size is divisible by the product of its axes' sizes;
* each mesh axis is used at most once per tensor;
* mesh axes of size 1 are never used (splitting over them changes nothing);
* when several axes split one dimension they are listed in mesh order (major axis first), so
  ``("y", "x")`` is never enumerated (it is valid, but a permutation of ``("x", "y")``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from functools import cache, lru_cache
from typing import Any

from autoplan._dtype import dtype_bytes
from autoplan._errors import SearchError
from autoplan._options import require_instance
from autoplan.costs._mesh import LogicalMesh
from autoplan.plans._spec import Spec, split_error, tile_count

__all__ = [
    "Spec",
    "replicated",
    "axis_sizes",
    "axis_index",
    "tiles",
    "shard_shape",
    "bytes_per_device",
    "spec_is_valid",
    "check_spec",
    "enumerate_specs",
    "alpa_name",
    "checked_spec",
]


@cache
def replicated(ndim: int) -> Spec:
    """The fully replicated spec of a tensor with ``ndim`` dimensions."""
    return Spec.replicated(ndim)


def axis_sizes(mesh: LogicalMesh) -> dict[str, int]:
    """``{axis name: size}`` of a mesh."""
    return dict(zip(mesh.axis_names, mesh.shape))


def axis_index(mesh: LogicalMesh, name: str) -> int:
    """Position of the axis called ``name`` in ``mesh.axis_names``.

    Raises:
        SearchError: no such axis.
    """
    try:
        return mesh.axis_names.index(name)
    except ValueError:
        raise SearchError(f"mesh axis should be one of {mesh.axis_names}. Got {name!r}. "
                          "Fix: use the mesh's axis names.") from None


def tiles(spec: Spec, mesh: LogicalMesh) -> int:
    """Number of distinct tiles (the product of the sizes of the axes used) on ``mesh``."""
    return tile_count(spec, axis_sizes(mesh))


def shard_shape(shape: Sequence[int], spec: Spec, mesh: LogicalMesh) -> tuple[int, ...]:
    """The shape of one device's tile (dimensions divided by their axes' sizes)."""
    sizes = axis_sizes(mesh)
    return tuple(d // math.prod(sizes[a] for a in e) if e else d for d, e in zip(shape, spec))


def bytes_per_device(shape: Sequence[int], dtype: str, spec: Spec, mesh: LogicalMesh) -> float:
    """Bytes of one device's tile."""
    return math.prod(shape) * dtype_bytes(dtype) / tiles(spec, mesh)


def check_spec(spec: Spec, shape: Sequence[int], mesh: LogicalMesh) -> str | None:
    """Why ``spec`` is invalid for ``shape`` on ``mesh``, or None when it is valid."""
    return split_error(spec, shape, axis_sizes(mesh))


def spec_is_valid(spec: Spec, shape: Sequence[int], mesh: LogicalMesh) -> bool:
    """True when ``spec`` can shard ``shape`` on ``mesh`` (see :func:`check_spec`)."""
    return check_spec(spec, shape, mesh) is None


@lru_cache(maxsize=65536)
def _enumerate(shape: tuple[int, ...], names: tuple[str, ...], sizes: tuple[int, ...],
               max_dims: int | None) -> tuple[Spec, ...]:
    axes = [(n, s) for n, s in zip(names, sizes) if s > 1]
    out: list[Spec] = []
    seen = set()
    for choice in itertools.product(range(-1, len(shape)), repeat=len(axes)):
        spec: list[Any] = [None] * len(shape)
        ok = True
        for (name, _size), d in zip(axes, choice):
            if d < 0:
                continue
            spec[d] = (spec[d] or ()) + (name,)
        for d, e in enumerate(spec):
            if e and shape[d] % math.prod(sizes[names.index(a)] for a in e):
                ok = False
                break
        if not ok:
            continue
        t = Spec(*spec)
        if max_dims is not None and sum(1 for e in t if e) > max_dims:
            continue
        if t not in seen:
            seen.add(t)
            out.append(t)
    return tuple(out)


@lru_cache(maxsize=65536)
def _count_invalid(shape: tuple[int, ...], names: tuple[str, ...], sizes: tuple[int, ...]) -> int:
    axes = [s for s in sizes if s > 1]
    total = 0
    for choice in itertools.product(range(-1, len(shape)), repeat=len(axes)):
        split: dict[int, int] = {}
        for size, d in zip(axes, choice):
            if d >= 0:
                split[d] = split.get(d, 1) * size
        if any(shape[d] % n for d, n in split.items()):
            total += 1
    return total


def pruned_by_shape_check(shapes: Sequence[Sequence[int]], mesh: LogicalMesh) -> int:
    """How many axis-to-dimension assignments of these tensors' specs TAPAS's symbolic shape
    check rejects (a dimension split over mesh axes whose sizes do not divide it) before any
    strategy is costed."""
    names, sizes = tuple(mesh.axis_names), tuple(mesh.shape)
    return sum(_count_invalid(tuple(int(d) for d in sh), names, sizes) for sh in shapes if sh)


def enumerate_specs(shape: Sequence[int], mesh: LogicalMesh,
                    max_split_dims: int | None = None) -> list[Spec]:
    """Every valid spec of ``shape`` on ``mesh``, the replicated one first.

    Each mesh axis of size > 1 is either unused or assigned to one dimension; a dimension with
    several axes lists them in mesh order; a dimension is split only when divisible.

    Args:
        shape: the tensor's shape.
        mesh: the logical mesh.
        max_split_dims: at most this many dimensions split (None: no limit).

    Returns:
        The specs (:class:`~autoplan.plans._spec.Spec`, one entry per dimension).

    Examples:
        >>> from autoplan import Cluster
        >>> mesh = Cluster.preset("p3.16xlarge").logical_mesh((2, 4))
        >>> [alpa_name(s, mesh) for s in enumerate_specs((8, 8), mesh)]
        ['RR', 'S^1R', 'RS^1', 'S^0R', 'S^01R', 'S^0S^1', 'RS^0', 'S^1S^0', 'RS^01']
    """
    require_instance("enumerate_specs", "mesh", mesh, LogicalMesh, "pass cluster.logical_mesh((2, 4))")
    return list(_enumerate(tuple(int(d) for d in shape), tuple(mesh.axis_names),
                           tuple(mesh.shape), max_split_dims))


def alpa_name(spec: Spec, mesh: LogicalMesh) -> str:
    """Alpa's notation: ``R`` per replicated dimension, ``S^i`` per dimension split on mesh axis
    ``i`` (``S^01`` over axes 0 and 1), e.g. ``S^0R``; ``scalar`` for a 0-d tensor."""
    if not spec:
        return "scalar"
    parts = []
    for e in spec:
        if not e:
            parts.append("R")
        else:
            parts.append("S^" + "".join(str(mesh.axis_names.index(a)) for a in e))
    return "".join(parts)


def checked_spec(pspec: Any, shape: Sequence[int], mesh: LogicalMesh | None = None) -> Spec:
    """A ``PartitionSpec`` (or a spec tuple) as the :class:`~autoplan.plans._spec.Spec` of ``shape``,
    validated on ``mesh``: the form pins and fixed specs take in the search.

    Raises:
        SearchError: more entries than dimensions, or (with ``mesh``) an invalid spec.
    """
    entries = tuple(pspec)
    if len(entries) > len(shape):
        raise SearchError(f"PartitionSpec {pspec} has {len(entries)} entries but the tensor has "
                          f"{len(shape)} dimensions {tuple(shape)}. Fix: give at most one entry per "
                          "dimension.")
    spec = Spec.from_pspec(entries, len(shape))
    if mesh is not None:
        why = check_spec(spec, shape, mesh)
        if why:
            raise SearchError(f"PartitionSpec {pspec} is invalid for shape {tuple(shape)} on mesh "
                              f"{dict(zip(mesh.axis_names, mesh.shape))}: {why}. Fix: split only "
                              "divisible dimensions, each mesh axis at most once.")
    return spec
