"""A plain MLP classifier: ``layers`` ReLU dense layers of width ``hidden`` and a dense head.

Input ``x`` [B, features] -> ``layers_0`` .. ``layers_{L-1}`` (dense + ReLU) -> ``head`` (dense to
``classes`` + softmax cross-entropy against integer labels).

Parameter count: ``features H + (L-1) H^2 + L H + H classes + classes``.

With ``remat=True`` each hidden layer is rematerialised (``jax.checkpoint``: its input kept,
its activations recomputed in the backward pass).

Parameter tree: ``layers[i]/{kernel, bias}``, ``head/{kernel, bias}``. Scopes: ``layers_{i}``,
``head``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from autoplan.models._blocks import KeyGen, dense, dense_init, remat, scope, softmax_cross_entropy
from autoplan.models._build import ModelDef

__all__ = ["MODEL", "SIZES", "param_count"]

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"batch": 16, "features": 32, "hidden": 64, "layers": 3, "classes": 8},
    "small": {"batch": 256, "features": 1024, "hidden": 1024, "layers": 4, "classes": 1024},
    "large": {"batch": 1024, "features": 4096, "hidden": 8192, "layers": 8, "classes": 4096},
}


def param_count(cfg: dict) -> int:
    """Number of parameter elements of an MLP config (see the module docstring)."""
    h, n = cfg["hidden"], cfg["layers"]
    return cfg["features"] * h + (n - 1) * h * h + n * h + h * cfg["classes"] + cfg["classes"]


def _init_params(kg: KeyGen, cfg: dict) -> dict:
    dt = jnp.dtype(cfg["dtype"])
    h = cfg["hidden"]
    dims = [cfg["features"]] + [h] * cfg["layers"]
    layers = [dense_init(kg, a, b, dt, std=(2.0 / a) ** 0.5) for a, b in zip(dims[:-1], dims[1:])]
    return {"layers": layers, "head": dense_init(kg, h, cfg["classes"], dt, std=h**-0.5)}


def _loss(params: dict, batch: dict, cfg: dict) -> jax.Array:
    scoped = cfg["scopes"]
    layer = remat(lambda p, x: jax.nn.relu(dense(p, x)), cfg["remat"])
    x = batch["x"]
    for i, p in enumerate(params["layers"]):
        with scope(f"layers_{i}", scoped):
            x = layer(p, x)
    with scope("head", scoped):
        return softmax_cross_entropy(dense(params["head"], x), batch["labels"])


def _init_batch(kg: KeyGen, cfg: dict) -> dict:
    return {
        "x": kg.normal((cfg["batch"], cfg["features"]), 1.0, cfg["dtype"]),
        "labels": kg.randint((cfg["batch"],), 0, cfg["classes"]),
    }


MODEL = ModelDef(name="mlp", sizes=SIZES, init_params=_init_params, init_batch=_init_batch, loss=_loss)
