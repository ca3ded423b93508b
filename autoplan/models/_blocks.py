"""Building blocks shared by the zoo's models: scopes, initialisers, dense, norms, conv, losses.

Everything here is plain ``jax.numpy`` / ``jax.lax``; parameters are nested dicts of arrays.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "scope",
    "remat",
    "KeyGen",
    "einsum",
    "dense_init",
    "dense",
    "norm_init",
    "layer_norm",
    "batch_norm",
    "conv_init",
    "conv",
    "max_pool",
    "softmax_cross_entropy",
]


def scope(name: str, enabled: bool = True) -> contextlib.AbstractContextManager:
    """``jax.named_scope(name)`` when ``enabled``, else a no-op context (same computation)."""
    return jax.named_scope(name) if enabled else contextlib.nullcontext()


def remat(fn: Callable, enabled: bool = True) -> Callable:
    """``jax.checkpoint(fn)`` when ``enabled`` (rematerialisation: the backward pass recomputes
    ``fn``'s activations from its inputs instead of keeping them), else ``fn``."""
    return jax.checkpoint(fn) if enabled else fn


_CHUNK = 1 << 16


@functools.cache
def _chunk_fns() -> tuple[Callable, Callable, Callable]:
    """Jitted ``fold_in`` and fixed-size normal / uint32 draws, compiled once per process."""
    fold = jax.jit(jax.random.fold_in)
    normal = jax.jit(lambda k: jax.random.normal(k, (_CHUNK,), jnp.float32))
    bits = jax.jit(lambda k: jax.random.bits(k, (_CHUNK,), jnp.uint32))
    return fold, normal, bits


class KeyGen:
    """Deterministic random (and constant) initial values for parameters and batches.

    Two modes:

    - ``concrete=True``: values are numpy arrays drawn from ``jax.random`` in fixed-size chunks
      (``fold_in(fold_in(key, request), chunk)``), so one compiled sampler serves every shape and a
      tiny model initialises in milliseconds instead of compiling a sampler per parameter shape.
    - ``concrete=False``: values are ``jnp.zeros`` placeholders with the right shape and dtype, meant
      to be traced under ``jax.eval_shape`` (nothing is allocated).
    """

    def __init__(self, key: jax.Array, concrete: bool):
        self._key = key
        self._count = 0
        self.concrete = concrete

    def _stream(self, n: int, which: int) -> np.ndarray:
        fold, normal, bits = _chunk_fns()
        key = fold(self._key, self._count)
        self._count += 1
        draw = normal if which == 0 else bits
        parts = [np.asarray(draw(fold(key, j))) for j in range(max(1, -(-n // _CHUNK)))]
        return np.concatenate(parts)[:n]

    def normal(self, shape: Sequence[int], std: float, dtype: Any) -> Any:
        """Normal(0, std^2) values of ``shape`` in ``dtype``."""
        shape = tuple(int(d) for d in shape)
        if not self.concrete:
            return jnp.zeros(shape, dtype)
        x = self._stream(math.prod(shape), 0).reshape(shape) * np.float32(std)
        return x.astype(jnp.dtype(dtype))

    def randint(self, shape: Sequence[int], low: int, high: int) -> Any:
        """Integers uniform in ``[low, high)`` (int32) of ``shape``."""
        shape = tuple(int(d) for d in shape)
        if not self.concrete:
            return jnp.zeros(shape, jnp.int32)
        x = self._stream(math.prod(shape), 1).reshape(shape)
        return (low + x.astype(np.int64) % (high - low)).astype(np.int32)

    def zeros(self, shape: Sequence[int], dtype: Any) -> Any:
        """Zeros of ``shape`` in ``dtype``."""
        return (np.zeros if self.concrete else jnp.zeros)(tuple(shape), jnp.dtype(dtype))

    def ones(self, shape: Sequence[int], dtype: Any) -> Any:
        """Ones of ``shape`` in ``dtype``."""
        return (np.ones if self.concrete else jnp.ones)(tuple(shape), jnp.dtype(dtype))


def einsum(spec: str, *operands: jax.Array) -> jax.Array:
    """``jnp.einsum(spec, *operands)`` without the named scope JAX adds for a string spec.

    ``jnp.einsum`` wraps the computation in ``named_call(name=spec)``, which would put scopes such
    as ``bqnd,bknd->bnqk`` into the name stack even with ``scopes=False``; the equivalent sublist
    form of the call adds none.
    """
    inputs, output = spec.replace(" ", "").split("->")
    letters = {c: i for i, c in enumerate(sorted(set(inputs.replace(",", ""))))}
    args: list[Any] = []
    for op, sub in zip(operands, inputs.split(","), strict=True):
        args += [op, [letters[c] for c in sub]]
    args.append([letters[c] for c in output])
    return jnp.einsum(*args)


def dense_init(kg: KeyGen, din: int, dout: int, dtype: Any, std: float = 0.02, bias: bool = True) -> dict:
    """``{"kernel": [din, dout], "bias": [dout]}`` (bias zero; omitted when ``bias`` is False)."""
    p = {"kernel": kg.normal((din, dout), std, dtype)}
    if bias:
        p["bias"] = kg.zeros((dout,), dtype)
    return p


def dense(p: dict, x: jax.Array) -> jax.Array:
    """``x @ kernel (+ bias)``: one dot_general contracting the last dim of ``x``."""
    y = x @ p["kernel"]
    if "bias" in p:
        y = y + p["bias"]
    return y


def norm_init(kg: KeyGen, dim: int, dtype: Any) -> dict:
    """``{"scale": ones[dim], "bias": zeros[dim]}`` for layer or batch norm."""
    return {"scale": kg.ones((dim,), dtype), "bias": kg.zeros((dim,), dtype)}


def layer_norm(p: dict, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    """Layer normalisation over the last axis."""
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def batch_norm(p: dict, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    """Batch normalisation with the statistics of the current batch (no running averages).

    Normalises over every axis but the last (N, H, W for NHWC), as a training-mode BatchNorm does.
    """
    axes = tuple(range(x.ndim - 1))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def conv_init(kg: KeyGen, kh: int, kw: int, cin: int, cout: int, dtype: Any) -> jax.Array:
    """An HWIO kernel with He-normal scale ``sqrt(2 / (kh kw cin))``."""
    return kg.normal((kh, kw, cin, cout), math.sqrt(2.0 / (kh * kw * cin)), dtype)


def conv(x: jax.Array, w: jax.Array, stride: int = 1, padding: Any = "SAME") -> jax.Array:
    """2-D convolution, NHWC input, HWIO kernel, via ``jax.lax.conv_general_dilated``."""
    return jax.lax.conv_general_dilated(
        x,
        w,
        window_strides=(stride, stride),
        padding=padding,
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )


def max_pool(x: jax.Array, window: int, stride: int, padding: str = "SAME") -> jax.Array:
    """Max pooling over H and W of an NHWC array."""
    return jax.lax.reduce_window(
        x, -jnp.inf, jax.lax.max, (1, window, window, 1), (1, stride, stride, 1), padding
    )


def softmax_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy of integer ``labels`` (one-hot times log-softmax, no gather).

    Computed in float32 whatever the logits' dtype.
    """
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    onehot = jax.nn.one_hot(labels, logits.shape[-1], dtype=jnp.float32)
    return -jnp.mean(jnp.sum(onehot * logp, axis=-1))
