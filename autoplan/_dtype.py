"""Bytes per element of a dtype name, without importing NumPy (the figures read plans only).

One rule for every layer: the search's memory and communication costs, the figures' tensor sizes
and the report's tables all count bytes with :func:`dtype_bytes`.

PRNG keys are values of the graph like any other. A typed key (``jax.random.key``) has the
dtype ``key<impl>``: ``key<fry>`` for the default threefry keys (two ``uint32`` words, 8 bytes),
``key<rbg>`` and ``key<urbg>`` for the RBG keys (four words, 16 bytes). :func:`is_key_dtype`
names them, and :func:`is_partitionable_key` says which ones draw the same bits however the
result is sharded.
"""

from __future__ import annotations

import re
from functools import cache

__all__ = ["dtype_bytes", "is_key_dtype", "is_partitionable_key", "KEY_BYTES"]

_NAME = re.compile(r"(?:u?int|float|bfloat|complex)(\d+)(?:_[a-z0-9]+)?")
_KEY = re.compile(r"key<([a-z0-9_]+)>")

#: bytes of one typed key, by the name its dtype shows (``key<fry>``: threefry2x32, two uint32
#: words; ``key<rbg>``/``key<urbg>``: four)
KEY_BYTES = {"fry": 8, "rbg": 16, "urbg": 16, "unsafe_rbg": 16}


@cache
def dtype_bytes(dtype: object) -> int:
    """Bytes per element of a dtype name, as ``numpy.dtype(name).itemsize`` gives it.

    Sub-byte types (``int4``, ``float4_e2m1fn``) take one byte, as JAX stores them; a typed PRNG
    key takes its key data's bytes (``key<fry>``: 8); a token, ``float0`` or a name that is not
    a dtype takes 0.

    >>> dtype_bytes("float32"), dtype_bytes("bfloat16"), dtype_bytes("float8_e4m3fn")
    (4, 2, 1)
    >>> dtype_bytes("bool"), dtype_bytes("int4"), dtype_bytes("token")
    (1, 1, 0)
    >>> dtype_bytes("key<fry>"), dtype_bytes("key<rbg>")
    (8, 16)
    """
    name = str(dtype).lower()
    if name == "bool":
        return 1
    k = _KEY.fullmatch(name)
    if k is not None:
        return KEY_BYTES.get(k.group(1), 8)
    m = _NAME.fullmatch(name)
    if m is None or name == "float0":
        return 0
    return max(1, int(m.group(1)) // 8)


def is_key_dtype(dtype: object) -> bool:
    """True for the dtype (or its name) of a typed PRNG key (``key<fry>``, ``key<rbg>``, ...).

    >>> is_key_dtype("key<fry>"), is_key_dtype("uint32")
    (True, False)
    """
    return _KEY.fullmatch(str(dtype).lower()) is not None


def is_partitionable_key(dtype: object) -> bool:
    """True for threefry keys (``key<fry>``): with ``jax_threefry_partitionable`` (JAX's default)
    each element of ``random_bits`` depends on the key and its own index only, so the bits are the
    same whether the result is computed whole or sharded. RBG keys (``key<rbg>``, ``key<urbg>``)
    make no such promise: their draws stay replicated.

    >>> is_partitionable_key("key<fry>"), is_partitionable_key("key<rbg>")
    (True, False)
    """
    k = _KEY.fullmatch(str(dtype).lower())
    return k is not None and k.group(1) == "fry"
