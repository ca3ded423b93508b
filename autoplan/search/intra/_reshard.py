"""Resharding cost: converting a tensor from one sharding spec to another (Alpa's rules).

For each mesh axis used by the source spec:

* kept on the same dimension (the destination's axis list on that dimension starts with the
  source's): nothing to do;
* moved to another dimension: an **all-to-all** over that axis;
* not used by the destination (or used in another position of the same dimension): an
  **all-gather** over that axis.

Axes the destination uses but the source does not are a **free slice** (each device keeps a part of
what it holds). The conversion slices first (so later collectives move fewer bytes), then runs the
all-to-alls, then the all-gathers in the cheapest order.

Bytes ``B`` passed to :meth:`LogicalMesh.collective_time` are the size of the tensor within one
collective group (the gathered size for an all-gather, the group's whole tensor for an
all-to-all), as in that method's formulas.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from autoplan._cluster import LogicalMesh
from autoplan._graph import dtype_bytes
from autoplan._memo import memo
from autoplan._plan import Comm

__all__ = ["reshard", "reshard_time"]

Spec = tuple

_CACHE: dict[tuple, tuple[float, tuple[Comm, ...]]] = {}
_CACHE_MAX = 1 << 20


_MESH_IDS: dict[tuple, int] = {}


def mesh_id(mesh: LogicalMesh) -> int:
    """A small integer naming what a mesh's costs depend on (its shape, axis names, alpha, beta
    and cluster; equal meshes share it), kept on the mesh: a cheap part of cache keys."""
    return memo(mesh, "mesh_id", lambda: _MESH_IDS.setdefault(
        (mesh.shape, mesh.axis_names, mesh.alpha, mesh.beta, mesh.cluster), len(_MESH_IDS)))


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
    key = (mesh_id(mesh), src, dst, tuple(shape), itemsize, backward)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    out = _reshard(src, dst, tuple(shape), itemsize, mesh, backward)
    if len(_CACHE) > _CACHE_MAX:
        _CACHE.clear()
    _CACHE[key] = out
    return out


def reshard_time(src: Spec, dst: Spec, shape: Sequence[int], dtype: str | int,
                 mesh: LogicalMesh, backward: bool = False) -> float:
    """Only the time of :func:`reshard`."""
    return reshard(src, dst, shape, dtype, mesh, backward)[0]


def _reshard(src: Spec, dst: Spec, shape: tuple[int, ...], itemsize: int, mesh: LogicalMesh,
             backward: bool) -> tuple[float, tuple[Comm, ...]]:
    names = mesh.axis_names
    size = dict(zip(names, mesh.shape))
    src_dim: dict[str, int] = {}
    dst_dim: dict[str, int] = {}
    for d, e in enumerate(src):
        for a in e or ():
            src_dim[a] = d
    for d, e in enumerate(dst):
        for a in e or ():
            dst_dim[a] = d
    kept: set[str] = set()
    for s_e, d_e in zip(src, dst):
        s_e, d_e = s_e or (), d_e or ()
        k = 0
        while k < len(s_e) and k < len(d_e) and s_e[k] == d_e[k]:
            k += 1
        kept.update(s_e[:k])
    leaving = [a for a in src_dim if a not in kept and size[a] > 1]
    moves = [a for a in leaving if a in dst_dim and dst_dim[a] != src_dim[a]]
    gathers = [a for a in leaving if a not in moves]
    added = [a for a in dst_dim if a not in src_dim and size[a] > 1]
    if not leaving:
        return 0.0, ()
    total_bytes = math.prod(shape) * itemsize
    tiles = math.prod(size[a] for a in src_dim)
    # slice first: axes only the destination uses cut what every device holds
    tiles *= math.prod(size[a] for a in added)
    cur = total_bytes / tiles
    comms: list[Comm] = []
    time = 0.0
    for a in moves:
        n = size[a]
        b = cur * n
        t = mesh.collective_time("all-to-all", b, [names.index(a)], backward)
        comms.append(Comm("all-to-all", b, (a,), t, "reshard"))
        time += t
    if gathers:
        best: tuple[float, list[Comm]] | None = None
        for order in itertools.permutations(gathers):
            c = cur
            tt = 0.0
            cc: list[Comm] = []
            for a in order:
                n = size[a]
                c *= n
                t = mesh.collective_time("all-gather", c, [names.index(a)], backward)
                cc.append(Comm("all-gather", c, (a,), t, "reshard"))
                tt += t
            if best is None or tt < best[0] - 1e-18:
                best = (tt, cc)
        assert best is not None
        time += best[0]
        comms.extend(best[1])
    return time, tuple(comms)
