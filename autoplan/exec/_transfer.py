"""Moving values between disjoint submeshes, in one process or across processes.

Within one process a value moves with ``jax.device_put``. When a submesh holds devices of other
processes, JAX's CPU backend cannot ``device_put`` (it refuses cross-host transfers), so the value
moves with a collective that every process holding a device of either submesh calls, in the same
order: a jitted ``shard_map`` over the union of the two submeshes (source devices first) in which
``ceil(|dst| / |src|)`` rounds of ``lax.ppermute`` send source device ``i``'s replicated copy to
destination devices ``i``, ``i + |src|``, ``i + 2 |src|``, ... Each destination receives exactly
once and selects what it received (nothing is added), so every bit arrives unchanged: NaN
payloads, signed zeros, integers and booleans (sent as bytes). The same collective works on GPUs
(NCCL), where ``device_put`` across processes would work too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = ["transfer", "move", "replicated_on"]

_UNION_CACHE: dict[Any, Any] = {}
_ZEROS: dict[Any, jax.Array] = {}
_REPLICATE: dict[Any, Any] = {}


def _union_program(src: Mesh, dst: Mesh, dtypes: tuple[Any, ...]) -> tuple[Mesh, Any]:
    """A jitted ``shard_map`` over the devices of ``src`` then ``dst``: ``ceil(|dst| / |src|)``
    ``ppermute`` rounds send source device ``i``'s copy to destination devices ``i``,
    ``i + |src|``, ... (each destination receives exactly once; the value is selected, not added,
    so every bit arrives unchanged)."""
    key = (tuple(d.id for d in src.devices.flat), tuple(d.id for d in dst.devices.flat), dtypes)
    if key in _UNION_CACHE:
        return _UNION_CACHE[key]
    A, B = list(src.devices.flat), list(dst.devices.flat)
    nA, nB = len(A), len(B)
    umesh = Mesh(np.array(A + B, dtype=object), ("union",))
    rounds = [[(i, nA + r * nA + i) for i in range(nA) if r * nA + i < nB]
              for r in range(-(-nB // nA))]
    round_of = np.full(nA + nB, -1, np.int32)
    for r, pairs in enumerate(rounds):
        for _, d in pairs:
            round_of[d] = r

    def body(*xs):
        which = jnp.asarray(round_of)[jax.lax.axis_index("union")]
        outs = []
        for x in xs:
            y = x
            for r, pairs in enumerate(rounds):
                y = jnp.where(which == r, jax.lax.ppermute(x, "union", pairs), y)
            outs.append(y)
        return outs

    spec = tuple(PartitionSpec() for _ in dtypes)
    fn = jax.jit(jax.shard_map(body, mesh=umesh, in_specs=spec, out_specs=list(spec),
                               check_vma=False))
    _UNION_CACHE[key] = (umesh, fn)
    return umesh, fn


def _zeros_on(shape: tuple[int, ...], dtype: Any, device: Any) -> jax.Array:
    key = (shape, np.dtype(dtype).str, device.id)
    if key not in _ZEROS:
        _ZEROS[key] = jax.device_put(np.zeros(shape, dtype), device)
    return _ZEROS[key]


def replicated_on(x: jax.Array, mesh: Mesh) -> jax.Array:
    """``x`` replicated on its submesh (an all-gather there when it is split)."""
    if x.sharding.is_fully_replicated:
        return x
    key = tuple(d.id for d in mesh.devices.flat)
    if key not in _REPLICATE:
        _REPLICATE[key] = jax.jit(lambda v: v, out_shardings=NamedSharding(mesh, PartitionSpec()))
    return _REPLICATE[key](x)


def transfer(values: Sequence[jax.Array | None], src: Mesh, dst: Mesh,
             avals: Sequence[tuple[tuple[int, ...], Any]], collective: bool | None = None
             ) -> list[jax.Array] | None:
    """Move values from submesh ``src`` to submesh ``dst`` (disjoint), arriving replicated there.

    With every device of both submeshes in this process the values move with
    ``jax.device_put``. Otherwise the move is a collective over the union of the two submeshes
    (see :func:`_union_program`) that every process holding a device of either must call, in the
    same order: processes holding source devices pass the values (None elsewhere).

    Args:
        values: arrays on ``src`` (gathered there first when they are split), or None where
            this process holds no source device.
        src, dst: the two submeshes.
        avals: ``(shape, dtype)`` of each value (known on every process).
        collective: force the collective (True) or ``device_put`` (False); default: the
            collective exactly when a device of either submesh belongs to another process.

    Returns:
        The values on ``dst``, or None when this process holds none of its devices.
    """
    return move(values, src, dst, avals, collective)[0]


def move(values: Sequence[jax.Array | None], src: Mesh, dst: Mesh,
          avals: Sequence[tuple[tuple[int, ...], Any]], collective: bool | None = None
          ) -> tuple[list[jax.Array] | None, list[jax.Array]]:
    """:func:`transfer`, also returning the collective's own results (to wait on it)."""
    local = {d.id for d in jax.local_devices()}
    A, B = list(src.devices.flat), list(dst.devices.flat)
    if collective is None:
        collective = not all(d.id in local for d in A + B)
    if not collective:
        return list(jax.device_put(list(values), NamedSharding(dst, PartitionSpec()))), []
    holds_src = any(d.id in local for d in A)
    holds_dst = any(d.id in local for d in B)
    if not (holds_src or holds_dst):
        return None, []
    kinds = tuple(np.dtype(dt) for _, dt in avals)
    wire = tuple(np.dtype(np.uint8) if k == np.bool_ else k for k in kinds)
    umesh, fn = _union_program(src, dst, tuple(k.str for k in wire))
    ins = []
    for k, ((shape, _), dt) in enumerate(zip(avals, wire)):
        by_dev: dict[int, Any] = {}
        if holds_src:
            v = replicated_on(values[k], src)
            if kinds[k] == np.bool_:
                v = v.astype(np.uint8)
            by_dev = {sh.device.id: sh.data for sh in v.addressable_shards}
        bufs = [by_dev[d.id] if d.id in by_dev else _zeros_on(tuple(shape), dt, d)
                for d in A + B if d.id in local]
        ins.append(jax.make_array_from_single_device_arrays(
            tuple(shape), NamedSharding(umesh, PartitionSpec()), bufs))
    outs = fn(*ins)
    if not holds_dst:
        return None, list(outs)
    moved = []
    for k, o in enumerate(outs):
        by_dev = {sh.device.id: sh.data for sh in o.addressable_shards}
        arr = jax.make_array_from_single_device_arrays(
            tuple(avals[k][0]), NamedSharding(dst, PartitionSpec()),
            [by_dev[d.id] for d in B if d.id in local])
        moved.append(arr.astype(np.bool_) if kinds[k] == np.bool_ else arr)
    return moved, list(outs)
