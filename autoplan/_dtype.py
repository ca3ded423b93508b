"""Bytes per element of a dtype name, without importing NumPy (the figures read plans only).

One rule for every layer: the search's memory and communication costs, the figures' tensor sizes
and the report's tables all count bytes with :func:`dtype_bytes`.
"""

from __future__ import annotations

import re
from functools import cache

__all__ = ["dtype_bytes"]

_NAME = re.compile(r"(?:u?int|float|bfloat|complex)(\d+)(?:_[a-z0-9]+)?")


@cache
def dtype_bytes(dtype: object) -> int:
    """Bytes per element of a dtype name, as ``numpy.dtype(name).itemsize`` gives it.

    Sub-byte types (``int4``, ``float4_e2m1fn``) take one byte, as JAX stores them; a token,
    ``float0`` or a name that is not a dtype takes 0.

    >>> dtype_bytes("float32"), dtype_bytes("bfloat16"), dtype_bytes("float8_e4m3fn")
    (4, 2, 1)
    >>> dtype_bytes("bool"), dtype_bytes("int4"), dtype_bytes("token")
    (1, 1, 0)
    """
    name = str(dtype).lower()
    if name == "bool":
        return 1
    m = _NAME.fullmatch(name)
    if m is None or name == "float0":
        return 0
    return max(1, int(m.group(1)) // 8)
