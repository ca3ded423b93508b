"""A small U-Net (Ronneberger et al., 2015) trained as a per-pixel regressor (mean squared error).

Encoder level ``i`` (``c_i = channels * 2^i``): two 3x3 convs + ReLU, kept as the skip, then a
2x2 max pool. ``mid`` at ``c_levels``: two 3x3 convs. Decoder step ``j`` (deepest first, level
``i = levels-1-j``): 2x nearest upsampling, a 3x3 "up" conv to ``c_i``, concatenation with the
encoder's skip of level ``i`` along channels, two 3x3 convs. ``head``: a 1x1 conv to
``out_channels``. The skips make the layer graph a DAG, not a chain. Convs have biases; no norms.

Parameter count: ``sum_i [9 cin_i c_i + 9 c_i^2 + 2 c_i]`` (encoder and mid) ``+ sum_i [9 c_{i+1} c_i
+ 9 (2 c_i) c_i + 9 c_i^2 + 3 c_i]`` (decoder) ``+ c_0 out + out``: 33K (tiny), 8.6M (small),
34.5M (base: the classic channels-64, 4-level layout, with 3x3 up-convolutions).

With ``remat=True`` each level's convolutions are rematerialised (``jax.checkpoint``: the
level's inputs and skip kept, its activations recomputed in the backward pass).

Parameter tree: ``enc[i]/{conv1, conv2}``, ``mid/{conv1, conv2}``, ``dec[j]/{up, conv1, conv2}``,
``head`` (each ``{"kernel": HWIO, "bias"}``). Scopes: ``enc_{i}``, ``mid``, ``dec_{j}``, ``head``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from autoplan._errors import ModelError
from autoplan.models._blocks import KeyGen, conv, conv_init, max_pool, remat, scope
from autoplan.models._build import ModelDef

__all__ = ["MODEL", "SIZES", "param_count"]

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"batch": 8, "image": 16, "in_channels": 3, "out_channels": 3, "channels": 8, "levels": 2},
    "small": {"batch": 16, "image": 128, "in_channels": 3, "out_channels": 3, "channels": 32, "levels": 4},
    "base": {"batch": 32, "image": 256, "in_channels": 3, "out_channels": 3, "channels": 64, "levels": 4},
}


def param_count(cfg: dict) -> int:
    """Number of parameter elements of a U-Net config (see the module docstring)."""
    w = [cfg["channels"] * 2**i for i in range(cfg["levels"] + 1)]
    total, cin = 0, cfg["in_channels"]
    for c in w:
        total += 9 * cin * c + 9 * c * c + 2 * c
        cin = c
    for i in range(cfg["levels"]):
        total += 9 * w[i + 1] * w[i] + 18 * w[i] * w[i] + 9 * w[i] * w[i] + 3 * w[i]
    return total + w[0] * cfg["out_channels"] + cfg["out_channels"]


def _check(cfg: dict) -> None:
    step = 2 ** cfg["levels"]
    if cfg["image"] % step:
        raise ModelError(
            f"image of model 'unet' should be a multiple of 2**levels={step}. Got image={cfg['image']}. "
            f"Fix: pass image={max(step, cfg['image'] // step * step)} or fewer levels."
        )


def _conv_p(kg: KeyGen, k: int, cin: int, cout: int, dt: Any) -> dict:
    return {"kernel": conv_init(kg, k, k, cin, cout, dt), "bias": kg.zeros((cout,), dt)}


def _conv(p: dict, x: jax.Array) -> jax.Array:
    return conv(x, p["kernel"]) + p["bias"]


def _init_params(kg: KeyGen, cfg: dict) -> dict:
    dt = jnp.dtype(cfg["dtype"])
    widths = [cfg["channels"] * 2**i for i in range(cfg["levels"] + 1)]
    enc, cin = [], cfg["in_channels"]
    for c in widths[:-1]:
        enc.append({"conv1": _conv_p(kg, 3, cin, c, dt), "conv2": _conv_p(kg, 3, c, c, dt)})
        cin = c
    mid = {"conv1": _conv_p(kg, 3, cin, widths[-1], dt), "conv2": _conv_p(kg, 3, widths[-1], widths[-1], dt)}
    dec = []
    for i in reversed(range(cfg["levels"])):
        c = widths[i]
        dec.append(
            {
                "up": _conv_p(kg, 3, widths[i + 1], c, dt),
                "conv1": _conv_p(kg, 3, 2 * c, c, dt),
                "conv2": _conv_p(kg, 3, c, c, dt),
            }
        )
    head = _conv_p(kg, 1, widths[0], cfg["out_channels"], dt)
    return {"enc": enc, "mid": mid, "dec": dec, "head": head}


def _double(p: dict, x: jax.Array) -> jax.Array:
    return jax.nn.relu(_conv(p["conv2"], jax.nn.relu(_conv(p["conv1"], x))))


def _up(p: dict, x: jax.Array, skip: jax.Array) -> jax.Array:
    x = jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)
    x = jax.nn.relu(_conv(p["up"], x))
    return _double(p, jnp.concatenate([x, skip], axis=-1))


def _loss(params: dict, batch: dict, cfg: dict) -> jax.Array:
    scoped = cfg["scopes"]
    double, up = remat(_double, cfg["remat"]), remat(_up, cfg["remat"])
    x = batch["images"]
    skips = []
    for i, p in enumerate(params["enc"]):
        with scope(f"enc_{i}", scoped):
            x = double(p, x)
            skips.append(x)
            x = max_pool(x, 2, 2, "VALID")
    with scope("mid", scoped):
        x = double(params["mid"], x)
    for j, p in enumerate(params["dec"]):
        with scope(f"dec_{j}", scoped):
            x = up(p, x, skips[-1 - j])
    with scope("head", scoped):
        out = _conv(params["head"], x)
        return jnp.mean(jnp.square(out.astype(jnp.float32) - batch["targets"].astype(jnp.float32)))


def _init_batch(kg: KeyGen, cfg: dict) -> dict:
    b, s = cfg["batch"], cfg["image"]
    return {
        "images": kg.normal((b, s, s, cfg["in_channels"]), 1.0, cfg["dtype"]),
        "targets": kg.normal((b, s, s, cfg["out_channels"]), 1.0, cfg["dtype"]),
    }


MODEL = ModelDef(
    name="unet", sizes=SIZES, init_params=_init_params, init_batch=_init_batch, loss=_loss, check=_check
)
