"""GPT: a decoder-only, pre-LN transformer with learned positions and an untied LM head.

Sizes follow Alpa's GPT benchmark (S=1024, V=51200, global batch 1024; GPT-3 175B uses S=2048)
plus GPT-3 125M. Matmul FLOPs of one training step equal Alpa's formula exactly::

    (24 + 48) B S H^2 L (1 + S / (6 H)) + 6 B S H V

Parameter count (untied head, biases on every projection)::

    L (12 H^2 + 13 H) + 2 H + 2 V H + S H

Alpa names sizes counting the vocabulary matrix once (a tied head); the untied head adds ``V H``
more, which matters only for the small sizes (125M has 164M elements, 350M 407M).

Parameter tree::

    embed/{wte [V,H], wpe [S,H]}
    layers[i]/{ln1, attn/{qkv [H,3H], out [H,H]}, ln2, mlp/{fc1 [H,4H], fc2 [4H,H]}}
    ln_f/{scale, bias}
    head/{kernel [H,V]}

With ``remat=True`` each block is rematerialised (``jax.checkpoint``: its input kept, its
activations recomputed in the backward pass), as Alpa's GPT benchmark runs.

Named scopes: ``embed``, ``layers_{i}`` (sub-scopes ``ln1``, ``attn``, ``ln2``, ``mlp``), ``head``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from autoplan.models._blocks import KeyGen, layer_norm, norm_init, remat, scope
from autoplan.models._build import ModelDef
from autoplan.models._transformer import (
    attention,
    attn_init,
    check_heads,
    embed,
    embed_init,
    head_init,
    lm_head_loss,
    mlp,
    mlp_init,
    token_batch,
)

__all__ = ["MODEL", "SIZES", "alpa_flops", "param_count"]


def _gpt(h: int, layers: int, heads: int, seq_len: int = 1024, batch: int = 1024) -> dict:
    return {"batch": batch, "seq_len": seq_len, "hidden": h, "layers": layers, "heads": heads, "vocab": 51200}


SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"batch": 8, "seq_len": 16, "hidden": 32, "layers": 2, "heads": 4, "vocab": 256},
    "125M": _gpt(768, 12, 12),
    "350M": _gpt(1024, 24, 16),
    "760M": _gpt(1536, 24, 16),
    "1.3B": _gpt(2048, 24, 32),
    "2.6B": _gpt(2560, 32, 32),
    "6.7B": _gpt(4096, 32, 32),
    "15B": _gpt(5120, 48, 40),
    "39B": _gpt(8192, 48, 64),
    "76B": _gpt(10240, 60, 80),
    "175B": _gpt(12288, 96, 96, seq_len=2048),
}


def alpa_flops(cfg: dict, backward: bool = True) -> float:
    """Alpa's matmul FLOPs of one step: ``(24 + 48) B S H^2 L (1 + S/(6H)) + 6 B S H V``.

    Args:
        cfg: a GPT config.
        backward: count forward and backward (else forward only: a third of it).
    """
    b, s, h, n, v = cfg["batch"], cfg["seq_len"], cfg["hidden"], cfg["layers"], cfg["vocab"]
    total = 72 * b * s * h * h * n * (1 + s / (6 * h)) + 6 * b * s * h * v
    return total if backward else total / 3


def param_count(cfg: dict) -> int:
    """Number of parameter elements of a GPT config (see the module docstring)."""
    h, n, v, s = cfg["hidden"], cfg["layers"], cfg["vocab"], cfg["seq_len"]
    return n * (12 * h * h + 13 * h) + 2 * h + 2 * v * h + s * h


def _init_params(kg: KeyGen, cfg: dict) -> dict:
    dt = jnp.dtype(cfg["dtype"])
    h = cfg["hidden"]
    layers = [
        {
            "ln1": norm_init(kg, h, dt),
            "attn": attn_init(kg, h, dt),
            "ln2": norm_init(kg, h, dt),
            "mlp": mlp_init(kg, h, 4 * h, dt),
        }
        for _ in range(cfg["layers"])
    ]
    return {
        "embed": embed_init(kg, cfg, dt),
        "layers": layers,
        "ln_f": norm_init(kg, h, dt),
        "head": head_init(kg, cfg, dt),
    }


def block(p: dict, x: jax.Array, heads: int, scoped: bool) -> jax.Array:
    """One pre-LN transformer block: ``x + attn(ln1(x))`` then ``x + mlp(ln2(x))``."""
    with scope("ln1", scoped):
        y = layer_norm(p["ln1"], x)
    with scope("attn", scoped):
        x = x + attention(p["attn"], y, heads)
    with scope("ln2", scoped):
        y = layer_norm(p["ln2"], x)
    with scope("mlp", scoped):
        x = x + mlp(p["mlp"], y)
    return x


def _loss(params: dict, batch: dict, cfg: dict) -> jax.Array:
    scoped = cfg["scopes"]
    with scope("embed", scoped):
        x = embed(params["embed"], batch["input_ids"])
    def layer(lp: dict, x: jax.Array) -> jax.Array:
        return block(lp, x, cfg["heads"], scoped)

    layer = remat(layer, cfg["remat"])  # keep only each layer's input, recompute in backward
    for i, lp in enumerate(params["layers"]):
        with scope(f"layers_{i}", scoped):
            x = layer(lp, x)
    with scope("head", scoped):
        return lm_head_loss(params, x, batch["labels"], scoped)


MODEL = ModelDef(
    name="gpt",
    sizes=SIZES,
    init_params=_init_params,
    init_batch=token_batch,
    loss=_loss,
    check=lambda cfg: check_heads("gpt", cfg),
)
