"""Wide-ResNet as in Alpa's benchmark: a bottleneck ResNet whose 3x3 convs are ``width`` times wider.

Stem: 7x7/2 conv (``channels`` filters), batch norm, ReLU, 3x3/2 max pool. Then four stages of
bottleneck blocks (stage ``i`` has ``F = channels * 2^i``; the first block of stages 1-3 has
stride 2)::

    1x1 conv -> F, BN, ReLU; 3x3 conv -> F*width, BN, ReLU; 1x1 conv -> 4F, BN;
    + shortcut (1x1 conv -> 4F and BN where the shape changes); ReLU

then global average pooling and a dense classifier (``classes`` outputs, softmax cross-entropy).
Batch norm normalises with the current batch's statistics (training mode, no running averages),
as Alpa's model does. Convolutions are ``jax.lax.conv_general_dilated`` in NHWC/HWIO, no biases.

Depths: 14 ([1,1,1,1] blocks), 26 ([2,2,2,2]), 50 ([3,4,6,3]), 101 ([3,4,23,3]), 152 ([3,8,36,3]).
Parameter count (``C`` = channels, ``W`` = width, ``cin`` = a block's input channels)::

    stem 49*3*C + 2C
    + sum over blocks  cin*F + 9*W*F^2 + 4*W*F^2 + 2F + 2WF + 8F   (+ cin*4F + 8F with a projection)
    + head 4*F_last*classes + classes

which gives 255M, 1.0B, 2.0B, 4.0B, 6.7B and 12.6B for Alpa's 250M ... 13B configurations.

With ``remat=True`` each bottleneck block is rematerialised (``jax.checkpoint``: its input kept,
its activations recomputed in the backward pass).

Parameter tree: ``stem/{conv/{kernel}, norm}``, ``blocks[i]/{conv1, norm1, conv2, norm2, conv3,
norm3[, proj, proj_norm]}`` (each conv ``{"kernel": HWIO}``, each norm ``{scale, bias}``),
``head/{kernel [4F, classes], bias}``. Scopes: ``stem``, ``blocks_{i}``, ``head``.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from autoplan._errors import ModelError
from autoplan.models._blocks import (
    KeyGen,
    batch_norm,
    conv,
    conv_init,
    dense,
    dense_init,
    max_pool,
    norm_init,
    remat,
    scope,
    softmax_cross_entropy,
)
from autoplan.models._build import ModelDef

__all__ = ["MODEL", "SIZES", "STAGES", "param_count", "block_layout"]

STAGES: dict[int, tuple[int, ...]] = {
    14: (1, 1, 1, 1),
    26: (2, 2, 2, 2),
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
}


def _wrn(depth: int, channels: int, width: int) -> dict:
    return {
        "batch": 1536,
        "image": 224,
        "channels": channels,
        "width": width,
        "depth": depth,
        "classes": 1000,
    }


SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"batch": 8, "image": 32, "channels": 8, "width": 2, "depth": 14, "classes": 16},
    "250M": _wrn(50, 160, 2),
    "500M": _wrn(50, 224, 2),
    "1B": _wrn(50, 320, 2),
    "2B": _wrn(50, 448, 2),
    "4B": _wrn(50, 640, 2),
    "6.8B": _wrn(50, 320, 16),
    "13B": _wrn(101, 320, 16),
}


def block_layout(cfg: dict) -> list[tuple[int, int, int]]:
    """``(in_channels, filters F, stride)`` of every bottleneck block in order."""
    out = []
    cin = cfg["channels"]
    for i, n in enumerate(STAGES[cfg["depth"]]):
        f = cfg["channels"] * 2**i
        for j in range(n):
            out.append((cin, f, 2 if i > 0 and j == 0 else 1))
            cin = 4 * f
    return out


def param_count(cfg: dict) -> int:
    """Number of parameter elements of a Wide-ResNet config (see the module docstring)."""
    c, w = cfg["channels"], cfg["width"]
    total = 49 * 3 * c + 2 * c
    for cin, f, _ in block_layout(cfg):
        total += cin * f + 9 * w * f * f + 4 * w * f * f + 2 * f + 2 * w * f + 8 * f
        if cin != 4 * f:
            total += cin * 4 * f + 8 * f
    last = 4 * cfg["channels"] * 2 ** (len(STAGES[cfg["depth"]]) - 1)
    return total + last * cfg["classes"] + cfg["classes"]


def _check(cfg: dict) -> None:
    if cfg["depth"] not in STAGES:
        raise ModelError(
            f"depth of model 'wide_resnet' should be one of {sorted(STAGES)}. Got {cfg['depth']}. "
            f"Fix: pass depth=50 (or 14/26 for quick tests)."
        )
    if cfg["image"] % 32:
        raise ModelError(
            f"image of model 'wide_resnet' should be a multiple of 32 (five stride-2 steps). "
            f"Got {cfg['image']}. Fix: pass image=224 or image=32."
        )


def _init_params(kg: KeyGen, cfg: dict) -> dict:
    dt = jnp.dtype(cfg["dtype"])
    c, w = cfg["channels"], cfg["width"]
    params: dict[str, Any] = {
        "stem": {"conv": {"kernel": conv_init(kg, 7, 7, 3, c, dt)}, "norm": norm_init(kg, c, dt)}
    }
    blocks = []
    for cin, f, _ in block_layout(cfg):
        bp = {
            "conv1": {"kernel": conv_init(kg, 1, 1, cin, f, dt)},
            "norm1": norm_init(kg, f, dt),
            "conv2": {"kernel": conv_init(kg, 3, 3, f, f * w, dt)},
            "norm2": norm_init(kg, f * w, dt),
            "conv3": {"kernel": conv_init(kg, 1, 1, f * w, 4 * f, dt)},
            "norm3": norm_init(kg, 4 * f, dt),
        }
        if cin != 4 * f:
            bp["proj"] = {"kernel": conv_init(kg, 1, 1, cin, 4 * f, dt)}
            bp["proj_norm"] = norm_init(kg, 4 * f, dt)
        blocks.append(bp)
    params["blocks"] = blocks
    last = block_layout(cfg)[-1][1] * 4
    params["head"] = dense_init(kg, last, cfg["classes"], dt, std=last**-0.5)
    return params


def _block(p: dict, x: jax.Array, stride: int, scoped: bool) -> jax.Array:
    with scope("conv1", scoped):
        y = jax.nn.relu(batch_norm(p["norm1"], conv(x, p["conv1"]["kernel"])))
    with scope("conv2", scoped):
        y = jax.nn.relu(batch_norm(p["norm2"], conv(y, p["conv2"]["kernel"], stride)))
    with scope("conv3", scoped):
        y = batch_norm(p["norm3"], conv(y, p["conv3"]["kernel"]))
    if "proj" in p:
        with scope("proj", scoped):
            x = batch_norm(p["proj_norm"], conv(x, p["proj"]["kernel"], stride))
    return jax.nn.relu(x + y)


def _loss(params: dict, batch: dict, cfg: dict) -> jax.Array:
    scoped = cfg["scopes"]
    with scope("stem", scoped):
        x = conv(batch["images"], params["stem"]["conv"]["kernel"], 2, ((3, 3), (3, 3)))
        x = jax.nn.relu(batch_norm(params["stem"]["norm"], x))
        x = max_pool(x, 3, 2)
    for i, ((_, _, stride), bp) in enumerate(zip(block_layout(cfg), params["blocks"])):
        block = remat(functools.partial(_block, stride=stride, scoped=scoped), cfg["remat"])
        with scope(f"blocks_{i}", scoped):
            x = block(bp, x)
    with scope("head", scoped):
        logits = dense(params["head"], jnp.mean(x, axis=(1, 2)))
        return softmax_cross_entropy(logits, batch["labels"])


def _init_batch(kg: KeyGen, cfg: dict) -> dict:
    b, s = cfg["batch"], cfg["image"]
    return {
        "images": kg.normal((b, s, s, 3), 1.0, cfg["dtype"]),
        "labels": kg.randint((b,), 0, cfg["classes"]),
    }


MODEL = ModelDef(
    name="wide_resnet",
    sizes=SIZES,
    init_params=_init_params,
    init_batch=_init_batch,
    loss=_loss,
    check=_check,
)
