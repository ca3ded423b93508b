"""GShard mixture-of-experts transformer (Lepikhin et al., 2020), sized as in Alpa's benchmark.

GPT-style pre-LN decoder layers; every ``moe_every``-th layer (the odd ones by default) replaces
its MLP by a mixture of ``experts`` feed-forward experts. Tokens are split into groups of
``group_size`` tokens (``G = B S / group_size``); each group routes its tokens top-2 (or top-1)
with expert capacity ``C = ceil(capacity_factor * top_k * group_size / experts)``:

    gate logits   [G,S,E]   = einsum("gsm,me->gse", x, wg)
    dispatch mask [G,S,E,C] (one-hot of expert and buffer slot), combine = gates * dispatch
    expert input  [E,G,C,M] = einsum("gsec,gsm->egcm", dispatch, x)
    hidden        [E,G,C,F] = gelu(einsum("egcm,emf->egcf", expert_in, wi))
    expert output [E,G,C,M] = einsum("egcf,efm->egcm", hidden, wo)
    y             [G,S,M]   = einsum("gsec,egcm->gsm", combine, expert_out)

plus GShard's load-balancing loss ``E * sum_e mean_s(probs_e) * mean_s(top1_mask_e)`` per group,
weighted by ``aux_loss_weight`` and summed over MoE layers.

Alpa's MoE (and so these sizes) uses an inner width of ``F = 8 H`` (``mlp_factor=8``) for dense
and expert MLPs, 16 heads, vocab 32000, S=1024, expert group size 2048, global batch 1024, and a
MoE every other layer. Parameter count (untied LM head; no expert biases)::

    L/2 (4H^2 + 2FH + 9H + F)  +  L/2 (4H^2 + 2EFH + 8H + HE)  +  2 V H + S H + 2H

Alpa's size names count the vocabulary matrix once; the untied head adds ``V H``.

With ``remat=True`` each layer is rematerialised (``jax.checkpoint``: its inputs, the residual
stream and the auxiliary loss so far, kept; its activations recomputed in the backward pass), as
Alpa's MoE benchmark runs.

Parameter tree: ``embed/{wte,wpe}``, ``layers[i]/{ln1, attn/{qkv,out}, ln2, mlp/{fc1,fc2}}`` for
dense layers or ``.../moe/{gate/{kernel [H,E]}, wi [E,H,F], wo [E,F,H]}`` for MoE layers,
``ln_f``, ``head/{kernel [H,V]}``. Scopes: ``embed``, ``layers_{i}`` (sub-scopes ``ln1``,
``attn``, ``ln2``, ``mlp`` or ``moe``), ``head``.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from autoplan._errors import ModelError
from autoplan.models._blocks import KeyGen, einsum, layer_norm, norm_init, remat, scope
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

__all__ = ["MODEL", "SIZES", "capacity", "is_moe_layer", "alpa_flops", "param_count"]

_MOE_DEFAULTS: dict[str, Any] = {
    "mlp_factor": 8,
    "top_k": 2,
    "capacity_factor": 1.0,
    "group_size": 2048,
    "moe_every": 2,
    "aux_loss_weight": 0.01,
}


def _moe(h: int, layers: int, experts: int) -> dict:
    return {
        "batch": 1024,
        "seq_len": 1024,
        "hidden": h,
        "layers": layers,
        "heads": 16,
        "vocab": 32000,
        "experts": experts,
        **_MOE_DEFAULTS,
    }


SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "batch": 8,
        "seq_len": 16,
        "hidden": 32,
        "layers": 2,
        "heads": 4,
        "vocab": 256,
        "experts": 4,
        **_MOE_DEFAULTS,
        "group_size": 32,
    },
    "380M": _moe(768, 8, 8),
    "690M": _moe(768, 8, 16),
    "1.3B": _moe(768, 16, 16),
    "2.4B": _moe(1024, 16, 16),
    "7.1B": _moe(1280, 16, 32),
    "10B": _moe(1536, 16, 32),
    "27B": _moe(2048, 16, 48),
    "70B": _moe(2048, 32, 64),
}


def capacity(cfg: dict) -> int:
    """Expert capacity per group: ``ceil(capacity_factor * top_k * group_size / experts)``."""
    return max(1, math.ceil(cfg["capacity_factor"] * cfg["top_k"] * cfg["group_size"] / cfg["experts"]))


def is_moe_layer(i: int, cfg: dict) -> bool:
    """Whether layer ``i`` (0-based) has a mixture of experts instead of a dense MLP."""
    every = cfg["moe_every"]
    return i % every == every - 1


def alpa_flops(cfg: dict, backward: bool = True) -> float:
    """Alpa's FLOP count of one MoE training step (``compute_moe_tflops``, no remat).

    Assumes half the layers are MoE layers (``moe_every=2``) and ``E C = top_k group_size``. It
    includes a small ``4 B S group_size`` gating term per MoE layer that is not a matmul here.
    """
    b, s, h, n, v = cfg["batch"], cfg["seq_len"], cfg["hidden"], cfg["layers"], cfg["vocab"]
    e, g, mf = cfg["experts"], cfg["group_size"], cfg["mlp_factor"]
    dense_layer = b * s * h * h * (8 + 4 * mf) + 4 * b * s * s * h
    moe_layer = (
        8 * b * s * h * h
        + 4 * b * s * s * h
        + 8 * b * s * h * h * mf
        + 2 * b * s * h * e
        + 2 * b * s * 2 * g
        + 2 * b * s * h * 2 * g * 2
    )
    total = 3 * (dense_layer + moe_layer) * n / 2 + 6 * b * s * h * v
    return total if backward else total / 3


def param_count(cfg: dict) -> int:
    """Number of parameter elements of a MoE config (see the module docstring)."""
    h, n, v, s, e = cfg["hidden"], cfg["layers"], cfg["vocab"], cfg["seq_len"], cfg["experts"]
    f = cfg["mlp_factor"] * h
    n_moe = sum(is_moe_layer(i, cfg) for i in range(n))
    attn_ln = 4 * h * h + 4 * h + 4 * h
    dense_layer = attn_ln + 2 * f * h + f + h
    moe_layer = attn_ln + 2 * e * f * h + h * e
    return (n - n_moe) * dense_layer + n_moe * moe_layer + 2 * v * h + s * h + 2 * h


def _finalize(cfg: dict) -> dict:
    # Like Alpa, a group never holds more tokens than the batch has.
    cfg = dict(cfg)
    cfg["group_size"] = min(cfg["group_size"], cfg["batch"] * cfg["seq_len"])
    return cfg


def _check(cfg: dict) -> None:
    check_heads("moe", cfg)
    if cfg["top_k"] not in (1, 2):
        raise ModelError(f"top_k of model 'moe' should be 1 or 2. Got {cfg['top_k']}. Fix: pass top_k=2.")
    if cfg["top_k"] > cfg["experts"]:
        raise ModelError(
            f"top_k of model 'moe' should be at most experts. Got top_k={cfg['top_k']}, "
            f"experts={cfg['experts']}. Fix: use more experts or top_k=1."
        )
    tokens = cfg["batch"] * cfg["seq_len"]
    if tokens % cfg["group_size"]:
        raise ModelError(
            f"group_size of model 'moe' should divide batch*seq_len={tokens}. Got group_size="
            f"{cfg['group_size']}. Fix: pick a group_size that divides {tokens} (e.g. a power of two)."
        )


def _init_params(kg: KeyGen, cfg: dict) -> dict:
    dt = jnp.dtype(cfg["dtype"])
    h, e = cfg["hidden"], cfg["experts"]
    f = cfg["mlp_factor"] * h
    layers = []
    for i in range(cfg["layers"]):
        lp = {"ln1": norm_init(kg, h, dt), "attn": attn_init(kg, h, dt), "ln2": norm_init(kg, h, dt)}
        if is_moe_layer(i, cfg):
            lp["moe"] = {
                "gate": {"kernel": kg.normal((h, e), 0.02, dt)},
                "wi": kg.normal((e, h, f), 0.02, dt),
                "wo": kg.normal((e, f, h), 0.02, dt),
            }
        else:
            lp["mlp"] = mlp_init(kg, h, f, dt)
        layers.append(lp)
    return {
        "embed": embed_init(kg, cfg, dt),
        "layers": layers,
        "ln_f": norm_init(kg, h, dt),
        "head": head_init(kg, cfg, dt),
    }


def moe_mlp(p: dict, x: jax.Array, cfg: dict) -> tuple[jax.Array, jax.Array]:
    """The GShard mixture of experts on ``x`` [B, S, H]; returns ``(y, aux_loss)``."""
    b, s, h = x.shape
    e, k, gs = cfg["experts"], cfg["top_k"], cfg["group_size"]
    c = capacity(cfg)
    xg = x.reshape(b * s // gs, gs, h)
    logits = einsum("gsm,me->gse", xg, p["gate"]["kernel"]).astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)

    # Top-1 choice, its slot in the expert's buffer, and the capacity cut.
    mask1 = jax.nn.one_hot(jnp.argmax(probs, axis=-1), e, dtype=jnp.float32)
    density = jnp.mean(mask1, axis=1)
    aux = jnp.mean(jnp.sum(jnp.mean(probs, axis=1) * density, axis=-1)) * e
    pos1 = jnp.cumsum(mask1, axis=1) - 1.0
    mask1 = mask1 * (pos1 < c)
    gate1 = jnp.sum(probs * mask1, axis=-1)
    slot1 = jnp.sum(pos1 * mask1, axis=-1).astype(jnp.int32)
    dispatch = mask1[..., None] * jax.nn.one_hot(slot1, c, dtype=jnp.float32)[:, :, None, :]
    if k == 2:
        probs2 = probs * (1.0 - jax.nn.one_hot(jnp.argmax(probs, axis=-1), e, dtype=jnp.float32))
        mask2 = jax.nn.one_hot(jnp.argmax(probs2, axis=-1), e, dtype=jnp.float32)
        pos2 = jnp.cumsum(mask2, axis=1) - 1.0 + jnp.sum(mask1, axis=1, keepdims=True)
        mask2 = mask2 * (pos2 < c)
        gate2 = jnp.sum(probs * mask2, axis=-1)
        slot2 = jnp.sum(pos2 * mask2, axis=-1).astype(jnp.int32)
        denom = jnp.maximum(gate1 + gate2, jnp.finfo(jnp.float32).eps)
        gate1, gate2 = gate1 / denom, gate2 / denom
        dispatch2 = mask2[..., None] * jax.nn.one_hot(slot2, c, dtype=jnp.float32)[:, :, None, :]
        combine = gate1[..., None, None] * dispatch + gate2[..., None, None] * dispatch2
        dispatch = dispatch + dispatch2
    else:
        combine = gate1[..., None, None] * dispatch
    dispatch = jax.lax.stop_gradient(dispatch).astype(x.dtype)
    combine = combine.astype(x.dtype)

    expert_in = einsum("gsec,gsm->egcm", dispatch, xg)
    hidden = jax.nn.gelu(einsum("egcm,emf->egcf", expert_in, p["wi"]))
    expert_out = einsum("egcf,efm->egcm", hidden, p["wo"])
    y = einsum("gsec,egcm->gsm", combine, expert_out)
    return y.reshape(b, s, h), aux


def _loss(params: dict, batch: dict, cfg: dict) -> jax.Array:
    scoped = cfg["scopes"]
    with scope("embed", scoped):
        x = embed(params["embed"], batch["input_ids"])
    def layer(lp: dict, x: jax.Array, aux_total: jax.Array) -> tuple[jax.Array, jax.Array]:
        with scope("ln1", scoped):
            y = layer_norm(lp["ln1"], x)
        with scope("attn", scoped):
            x = x + attention(lp["attn"], y, cfg["heads"])
        with scope("ln2", scoped):
            y = layer_norm(lp["ln2"], x)
        if "moe" in lp:
            with scope("moe", scoped):
                out, aux = moe_mlp(lp["moe"], y, cfg)
                return x + out, aux_total + aux
        with scope("mlp", scoped):
            return x + mlp(lp["mlp"], y), aux_total

    layer = remat(layer, cfg["remat"])  # keep only each layer's inputs, recompute in backward
    aux_total = jnp.zeros((), jnp.float32)
    for i, lp in enumerate(params["layers"]):
        with scope(f"layers_{i}", scoped):
            x, aux_total = layer(lp, x, aux_total)
    with scope("head", scoped):
        loss = lm_head_loss(params, x, batch["labels"], scoped)
        return loss + cfg["aux_loss_weight"] * aux_total


MODEL = ModelDef(
    name="moe",
    sizes=SIZES,
    init_params=_init_params,
    init_batch=token_batch,
    loss=_loss,
    check=_check,
    finalize=_finalize,
    nonneg=frozenset({"aux_loss_weight"}),
)
