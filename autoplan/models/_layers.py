"""Building blocks shared by the zoo's models: scopes, initialisers, dense, norms, conv, losses.

Everything here is plain ``jax.numpy`` / ``jax.lax``; parameters are nested dicts of arrays.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

__all__ = [
    "scope",
    "KeyGen",
    "normal",
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


class KeyGen:
    """Hands out fresh PRNG keys split deterministically from one seed key."""

    def __init__(self, key: jax.Array):
        self._key = key

    def __call__(self) -> jax.Array:
        self._key, sub = jax.random.split(self._key)
        return sub


def normal(key: jax.Array, shape: Sequence[int], std: float, dtype: Any) -> jax.Array:
    """Normal(0, std^2) samples of ``shape`` in ``dtype`` (drawn in float32)."""
    return (std * jax.random.normal(key, tuple(shape), jnp.float32)).astype(dtype)


def dense_init(kg: KeyGen, din: int, dout: int, dtype: Any, std: float = 0.02, bias: bool = True) -> dict:
    """``{"kernel": [din, dout], "bias": [dout]}`` (bias zero; omitted when ``bias`` is False)."""
    p = {"kernel": normal(kg(), (din, dout), std, dtype)}
    if bias:
        p["bias"] = jnp.zeros((dout,), dtype)
    return p


def dense(p: dict, x: jax.Array) -> jax.Array:
    """``x @ kernel (+ bias)``: one dot_general contracting the last dim of ``x``."""
    y = x @ p["kernel"]
    if "bias" in p:
        y = y + p["bias"]
    return y


def norm_init(dim: int, dtype: Any) -> dict:
    """``{"scale": ones[dim], "bias": zeros[dim]}`` for layer or batch norm."""
    return {"scale": jnp.ones((dim,), dtype), "bias": jnp.zeros((dim,), dtype)}


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
    return normal(kg(), (kh, kw, cin, cout), math.sqrt(2.0 / (kh * kw * cin)), dtype)


def conv(x: jax.Array, w: jax.Array, stride: int = 1, padding: Any = "SAME") -> jax.Array:
    """2-D convolution, NHWC input, HWIO kernel, via ``jax.lax.conv_general_dilated``."""
    return jax.lax.conv_general_dilated(
        x, w, window_strides=(stride, stride), padding=padding,
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )


def max_pool(x: jax.Array, window: int, stride: int, padding: str = "SAME") -> jax.Array:
    """Max pooling over H and W of an NHWC array."""
    init = jnp.array(-jnp.inf, x.dtype)
    return jax.lax.reduce_window(x, init, jax.lax.max, (1, window, window, 1), (1, stride, stride, 1), padding)


def softmax_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy of integer ``labels`` (one-hot times log-softmax, no gather).

    Computed in float32 whatever the logits' dtype.
    """
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    onehot = jax.nn.one_hot(labels, logits.shape[-1], dtype=jnp.float32)
    return -jnp.mean(jnp.sum(onehot * logp, axis=-1))
