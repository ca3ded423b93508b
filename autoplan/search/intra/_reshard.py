"""Resharding cost: converting a tensor from one sharding spec to another (Alpa's rules).

For each mesh axis used by the source spec:

* kept on the same dimension (the destination's axis list on that dimension starts with the
  source's): nothing to do;
* moved to another dimension: an **all-to-all**, when the axes leaving a dimension land together,
  in the same order, after what the other dimension keeps (``S(x)R -> RS(x)``;
  ``S(xy)R -> RS(xy)`` is one all-to-all over both axes);
* otherwise (not used by the destination, used in another position of the same dimension, or
  split from the axes it left with, as ``S(xy)R -> S(y)R``... ``RS(xy) -> S(y)R``): an
  **all-gather**; all gathered axes go in one all-gather over their combined group.

This is what XLA's SPMD partitioner compiles (its all-to-all handles one dimension's sharding
moving whole to another dimension; any other change gathers what leaves and slices locally), so
the predicted collectives are the compiled ones (``benchmarks/comm_validation.py``).

Axes the destination uses but the source does not are a **free slice** (each device keeps a part of
what it holds). The conversion slices first (so later collectives move fewer bytes), then runs the
all-to-alls, then the all-gather.

Bytes ``B`` passed to :meth:`LogicalMesh.collective_time` are as in that method's formulas: the
gathered size for an all-gather, each device's buffer for an all-to-all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

from autoplan._dtype import dtype_bytes
from autoplan._memo import BoundedCache, per_owner
from autoplan.costs._mesh import LogicalMesh
from autoplan.plans._plan import Comm
from autoplan.plans._spec import Spec

__all__ = ["reshard", "reshard_time"]

_CACHE_MAX = 1 << 20
_CACHE: BoundedCache[tuple, tuple[float, tuple[Comm, ...]]] = BoundedCache(_CACHE_MAX)


_MESH_IDS: dict[tuple, int] = {}


@per_owner
def mesh_id(mesh: LogicalMesh) -> int:
    """A small integer naming what a mesh's costs depend on (its shape, axis names, alpha, beta,
    which axes cross hosts, and cluster; equal meshes share it), kept on the mesh: a cheap part
    of cache keys."""
    return _MESH_IDS.setdefault(
        (mesh.shape, mesh.axis_names, mesh.alpha, mesh.beta, mesh.crosses, mesh.cluster),
        len(_MESH_IDS))


_TIMES: BoundedCache[tuple, float] = BoundedCache(_CACHE_MAX)


def collective_time(mesh: LogicalMesh, kind: str, nbytes: float, axes: tuple[int, ...],
                    backward: bool = False, latency: bool = True, mid: int | None = None
                    ) -> float:
    """``mesh.collective_time(kind, nbytes, axes, backward, latency=latency)``, once per mesh
    (:func:`mesh_id`, ``mid`` when the caller has it) and arguments: costing strategies and
    resharding asks for the same collectives again and again (a tensor's bytes over the same
    axes, for every spec that gathers them)."""
    key = (mesh_id(mesh) if mid is None else mid, kind, nbytes, axes, backward, latency)
    t = _TIMES.get(key)
    if t is None:
        t = _TIMES.put(key, mesh.collective_time(kind, nbytes, axes, backward, latency=latency))
    return t


def reshard(src: Spec, dst: Spec, shape: Sequence[int], dtype: str | int, mesh: LogicalMesh,
            backward: bool = False) -> tuple[float, tuple[Comm, ...]]:
    """Time and collectives to convert a tensor from spec ``src`` to spec ``dst``.

    Args:
        src: the spec the tensor has.
        dst: the spec required.
        shape: the tensor's global shape.
        dtype: its dtype name, or bytes per element.
        mesh: the logical mesh.
        backward: the collectives are gradient communication in backward (discounted by the
            cluster's gamma).

    Returns:
        ``(seconds, comms)``: 0 and ``()`` when ``dst`` only slices ``src`` further.

    Examples:
        >>> from autoplan import Cluster
        >>> mesh = Cluster.preset("p3.16xlarge").logical_mesh((2, 4))
        >>> t, comms = reshard((("y",), None), (None, None), (1024, 1024), "float32", mesh)
        >>> [(c.kind, c.axes, c.bytes) for c in comms]
        [('all-gather', ('y',), 4194304.0)]
        >>> reshard((None, None), (("x",), ("y",)), (1024, 1024), "float32", mesh)[0]
        0.0
    """
    if src == dst:
        return 0.0, ()
    itemsize = dtype if isinstance(dtype, int) else dtype_bytes(dtype)
    return reshard_on(mesh_id(mesh), src, dst, tuple(shape), itemsize, mesh, backward)


def reshard_on(mid: int, src: Spec, dst: Spec, shape: tuple[int, ...], itemsize: int,
               mesh: LogicalMesh, backward: bool = False) -> tuple[float, tuple[Comm, ...]]:
    """:func:`reshard` of two different specs, given the mesh's :func:`mesh_id` ``mid``, the
    shape as a tuple and the bytes per element (for callers that reshard many tensors on one
    mesh)."""
    key = (mid, src, dst, shape, itemsize, backward)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    return _CACHE.put(key, _reshard(src, dst, shape, itemsize, mesh, backward, mid))


def reshard_time(src: Spec, dst: Spec, shape: Sequence[int], dtype: str | int,
                 mesh: LogicalMesh, backward: bool = False) -> float:
    """Only the time of :func:`reshard`."""
    return reshard(src, dst, shape, dtype, mesh, backward)[0]


def _reshard(src: Spec, dst: Spec, shape: tuple[int, ...], itemsize: int, mesh: LogicalMesh,
             backward: bool, mid: int) -> tuple[float, tuple[Comm, ...]]:
    tiles, steps = _conversion(src, dst, mesh.axis_names, mesh.shape)
    if not steps:
        return 0.0, ()
    # slice first: the axes only the destination uses cut what every device holds
    cur = math.prod(shape) * itemsize / tiles
    comms: list[Comm] = []
    time = 0.0
    for kind, axes, idx, gathered in steps:
        b = cur if kind == "all-to-all" else cur * gathered
        t = collective_time(mesh, kind, b, idx, backward, mid=mid)
        comms.append(Comm(kind, b, axes, t, "reshard"))
        time += t
    return time, tuple(comms)


@lru_cache(maxsize=1 << 16)
def _conversion(src: Spec, dst: Spec, names: tuple[str, ...], sizes: tuple[int, ...]
                ) -> tuple[int, tuple[tuple[str, tuple[str, ...], tuple[int, ...], int], ...]]:
    """The collectives converting ``src`` to ``dst`` on a mesh of these axis names and sizes,
    whatever the tensor: ``(tiles, steps)``, each device holding ``1 / tiles`` of the tensor
    after the free slice, then each step ``(kind, axes, their positions, the product of their
    sizes)``: the all-to-alls, then the all-gather (empty when nothing leaves a dimension)."""
    size = dict(zip(names, sizes))
    src_e = [tuple(a for a in (e or ()) if size[a] > 1) for e in src]
    dst_e = [tuple(a for a in (e or ()) if size[a] > 1) for e in dst]
    kept_len = []
    for s_e, d_e in zip(src_e, dst_e):
        k = 0
        while k < len(s_e) and k < len(d_e) and s_e[k] == d_e[k]:
            k += 1
        kept_len.append(k)
    rest = [s_e[k:] for s_e, k in zip(src_e, kept_len)]
    if not any(rest):
        return 1, ()
    src_axes = {a for e in src_e for a in e}
    added = [a for e in dst_e for a in e if a not in src_axes]
    # a dimension's leaving axes move by one all-to-all when they land together, in order, after
    # what another dimension keeps; any other leaving axis is gathered
    steps: list[tuple[str, tuple[str, ...], tuple[int, ...], int]] = []
    gathers: list[str] = []
    for d, r in enumerate(rest):
        if not r:
            continue
        target = [d2 for d2, d_e in enumerate(dst_e)
                  if d2 != d and d_e == src_e[d2][:kept_len[d2]] + r]
        if target:
            steps.append(("all-to-all", r, tuple(names.index(a) for a in r),
                          math.prod(size[a] for a in r)))
        else:
            gathers.extend(r)
    if gathers:
        axes = tuple(sorted(gathers, key=names.index))
        steps.append(("all-gather", axes, tuple(names.index(a) for a in axes),
                      math.prod(size[a] for a in axes)))
    tiles = math.prod(size[a] for a in src_axes) * math.prod(size[a] for a in added)
    return tiles, tuple(steps)
