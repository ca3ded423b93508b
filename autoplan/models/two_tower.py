"""A two-tower retrieval model with in-batch softmax (Yi et al., RecSys 2019, without the correction).

User tower: a user-id embedding (``users`` x ``embed_dim``) and ``user_fields`` categorical
features looked up in one hashed table (``buckets`` x ``embed_dim``), concatenated and fed through
ReLU dense layers of widths ``user_hidden`` and a linear projection to ``tower_dim``. Item tower:
an MLP of different widths (``item_hidden``) over ``item_features`` dense features, projected to
``tower_dim``. Scores ``u @ v^T`` [B, B]; the loss is softmax cross-entropy with each user's own
item (the diagonal) as the label, the other items of the batch as negatives.

Parameter count: ``(users + buckets) D + sum of dense layers (din dout + dout)`` with the user
tower's first input ``(1 + user_fields) D`` and the item tower's ``item_features``.

With ``remat=True`` each hidden tower layer is rematerialised (``jax.checkpoint``).

Parameter tree: ``user/{embed/{ids [users,D], features [buckets,D]}, layers[i]/{kernel, bias}}``,
``item/{layers[i]/{kernel, bias}}`` (the last layer of each tower is the projection). Scopes:
``user_embed``, ``user_layers_{i}``, ``item_layers_{i}``, ``head`` (scores and loss).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from autoplan.models._blocks import KeyGen, dense, dense_init, remat, scope, softmax_cross_entropy
from autoplan.models._build import ModelDef

__all__ = ["MODEL", "SIZES", "param_count"]

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "batch": 16,
        "users": 128,
        "user_fields": 4,
        "buckets": 128,
        "embed_dim": 16,
        "user_hidden": (64, 32),
        "item_features": 24,
        "item_hidden": (48, 48, 32),
        "tower_dim": 16,
    },
    "small": {
        "batch": 1024,
        "users": 100_000,
        "user_fields": 8,
        "buckets": 100_000,
        "embed_dim": 32,
        "user_hidden": (512, 256),
        "item_features": 128,
        "item_hidden": (1024, 512, 256),
        "tower_dim": 128,
    },
    "base": {
        "batch": 4096,
        "users": 1_000_000,
        "user_fields": 16,
        "buckets": 1_000_000,
        "embed_dim": 64,
        "user_hidden": (1024, 512),
        "item_features": 256,
        "item_hidden": (2048, 1024, 512),
        "tower_dim": 256,
    },
    "large": {
        "batch": 8192,
        "users": 10_000_000,
        "user_fields": 16,
        "buckets": 10_000_000,
        "embed_dim": 128,
        "user_hidden": (2048, 1024),
        "item_features": 512,
        "item_hidden": (4096, 2048, 1024),
        "tower_dim": 512,
    },
}


def _widths(din: int, hidden: tuple[int, ...], dout: int) -> list[tuple[int, int]]:
    dims = [din, *hidden, dout]
    return list(zip(dims[:-1], dims[1:]))


def param_count(cfg: dict) -> int:
    """Number of parameter elements of a two-tower config (see the module docstring)."""
    d = cfg["embed_dim"]
    total = (cfg["users"] + cfg["buckets"]) * d
    for din, hidden in (
        ((1 + cfg["user_fields"]) * d, cfg["user_hidden"]),
        (cfg["item_features"], cfg["item_hidden"]),
    ):
        total += sum(a * b + b for a, b in _widths(din, hidden, cfg["tower_dim"]))
    return total


def _init_params(kg: KeyGen, cfg: dict) -> dict:
    dt = jnp.dtype(cfg["dtype"])
    d = cfg["embed_dim"]
    user_in = (1 + cfg["user_fields"]) * d
    user = {
        "embed": {
            "ids": kg.normal((cfg["users"], d), 0.05, dt),
            "features": kg.normal((cfg["buckets"], d), 0.05, dt),
        },
        "layers": [
            dense_init(kg, a, b, dt, std=a**-0.5)
            for a, b in _widths(user_in, cfg["user_hidden"], cfg["tower_dim"])
        ],
    }
    item = {
        "layers": [
            dense_init(kg, a, b, dt, std=a**-0.5)
            for a, b in _widths(cfg["item_features"], cfg["item_hidden"], cfg["tower_dim"])
        ]
    }
    return {"user": user, "item": item}


def _hidden(p: dict, x: jax.Array) -> jax.Array:
    return jax.nn.relu(dense(p, x))


def _tower(layers: list, x: jax.Array, prefix: str, scoped: bool, rematerialise: bool) -> jax.Array:
    hidden = remat(_hidden, rematerialise)
    for i, p in enumerate(layers):
        with scope(f"{prefix}_{i}", scoped):
            x = hidden(p, x) if i < len(layers) - 1 else dense(p, x)
    return x


def _loss(params: dict, batch: dict, cfg: dict) -> jax.Array:
    scoped = cfg["scopes"]
    up = params["user"]
    with scope("user_embed", scoped):
        ids = jnp.take(up["embed"]["ids"], batch["user_ids"], axis=0)
        feats = jnp.take(up["embed"]["features"], batch["user_features"], axis=0)
        u = jnp.concatenate([ids, feats.reshape(feats.shape[0], -1)], axis=-1)
    u = _tower(up["layers"], u, "user_layers", scoped, cfg["remat"])
    v = _tower(params["item"]["layers"], batch["item_features"], "item_layers", scoped, cfg["remat"])
    with scope("head", scoped):
        scores = u @ v.T
        return softmax_cross_entropy(scores, jnp.arange(scores.shape[0]))


def _init_batch(kg: KeyGen, cfg: dict) -> dict:
    b = cfg["batch"]
    return {
        "user_ids": kg.randint((b,), 0, cfg["users"]),
        "user_features": kg.randint((b, cfg["user_fields"]), 0, cfg["buckets"]),
        "item_features": kg.normal((b, cfg["item_features"]), 1.0, cfg["dtype"]),
    }


MODEL = ModelDef(name="two_tower", sizes=SIZES, init_params=_init_params, init_batch=_init_batch, loss=_loss)
