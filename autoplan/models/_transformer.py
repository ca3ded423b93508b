"""Transformer pieces shared by GPT and the GShard MoE: embedding, causal attention, MLP, LM head.

Matmuls are exactly those of Alpa's FLOP formula: per layer the QKV, output, fc1 and fc2
projections plus ``Q K^T`` and ``softmax(.) V``; the token embedding is a gather (``jnp.take``), the
loss a one-hot product, neither a matmul.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from autoplan._errors import ModelError
from autoplan.models._blocks import (
    KeyGen,
    dense,
    dense_init,
    einsum,
    layer_norm,
    norm_init,
    scope,
    softmax_cross_entropy,
)

__all__ = [
    "check_heads",
    "embed_init",
    "embed",
    "attn_init",
    "attention",
    "mlp_init",
    "mlp",
    "head_init",
    "lm_head_loss",
    "token_batch",
]


def check_heads(model: str, cfg: dict) -> None:
    """Raises :class:`ModelError` unless ``heads`` divides ``hidden``."""
    h, n = cfg["hidden"], cfg["heads"]
    if h % n:
        divisors = [d for d in range(1, min(h, 128) + 1) if h % d == 0]
        raise ModelError(
            f"heads should divide hidden for model {model!r}. Got heads={n}, hidden={h}. "
            f"Fix: pick heads from the divisors of {h} (e.g. {divisors[-6:]}) or change hidden."
        )


def embed_init(kg: KeyGen, cfg: dict, dtype: Any) -> dict:
    """Token table ``wte`` [V, H] and learned positions ``wpe`` [S, H]."""
    return {
        "wte": kg.normal((cfg["vocab"], cfg["hidden"]), 0.02, dtype),
        "wpe": kg.normal((cfg["seq_len"], cfg["hidden"]), 0.01, dtype),
    }


def embed(p: dict, input_ids: jax.Array) -> jax.Array:
    """Token lookup by ``jnp.take`` plus positional embedding: [B, S] -> [B, S, H]."""
    return jnp.take(p["wte"], input_ids, axis=0) + p["wpe"][None, : input_ids.shape[1]]


def attn_init(kg: KeyGen, hidden: int, dtype: Any) -> dict:
    """``qkv`` [H, 3H] (heads outermost in the 3H axis) and ``out`` [H, H] projections."""
    return {"qkv": dense_init(kg, hidden, 3 * hidden, dtype), "out": dense_init(kg, hidden, hidden, dtype)}


def attention(p: dict, x: jax.Array, heads: int) -> jax.Array:
    """Causal multi-head self-attention with explicit ``Q K^T`` and softmax-weighted ``V``.

    The fused QKV output is laid out ``[B, S, heads, 3, head_dim]``, so splitting the kernel's
    columns evenly splits whole heads (Megatron's layout).
    """
    b, s, h = x.shape
    dh = h // heads
    qkv = dense(p["qkv"], x).reshape(b, s, heads, 3, dh)
    q, k, v = qkv[:, :, :, 0], qkv[:, :, :, 1], qkv[:, :, :, 2]
    scores = einsum("bqnd,bknd->bnqk", q, k) * jnp.asarray(dh**-0.5, x.dtype)
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    scores = jnp.where(causal, scores, jnp.asarray(jnp.finfo(scores.dtype).min, scores.dtype))
    weights = jax.nn.softmax(scores, axis=-1)
    ctx = einsum("bnqk,bknd->bqnd", weights, v).reshape(b, s, h)
    return dense(p["out"], ctx)


def mlp_init(kg: KeyGen, hidden: int, inner: int, dtype: Any) -> dict:
    """``fc1`` [H, inner] and ``fc2`` [inner, H]."""
    return {"fc1": dense_init(kg, hidden, inner, dtype), "fc2": dense_init(kg, inner, hidden, dtype)}


def mlp(p: dict, x: jax.Array) -> jax.Array:
    """``fc2(gelu(fc1(x)))``."""
    return dense(p["fc2"], jax.nn.gelu(dense(p["fc1"], x)))


def head_init(kg: KeyGen, cfg: dict, dtype: Any) -> dict:
    """Untied LM head ``kernel`` [H, V]."""
    return {"kernel": kg.normal((cfg["hidden"], cfg["vocab"]), 0.02, dtype)}


def lm_head_loss(params: dict, x: jax.Array, labels: jax.Array, scoped: bool) -> jax.Array:
    """Final layer norm (``params["ln_f"]``), LM head and next-token cross-entropy."""
    with scope("ln_f", scoped):
        x = layer_norm(params["ln_f"], x)
    with scope("logits", scoped):
        logits = dense(params["head"], x)
    with scope("loss", scoped):
        return softmax_cross_entropy(logits, labels)


def ln_init(hidden: int, dtype: Any) -> dict:
    """Layer norm parameters."""
    return norm_init(hidden, dtype)


def token_batch(kg: KeyGen, cfg: dict) -> dict:
    """``{"input_ids": int32[B, S], "labels": int32[B, S]}``, labels the next tokens of the inputs."""
    tokens = kg.randint((cfg["batch"], cfg["seq_len"] + 1), 0, cfg["vocab"])
    return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}
