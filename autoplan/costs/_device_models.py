"""Device models for the datasheet presets: per-precision peak rates and measured saturation.

A datasheet preset (:data:`autoplan.costs._cluster.PRESETS`) cannot time its devices, so it models
them: the datasheet's peak rate for each precision the device runs (``float64``, ``float32`` on
the vector units, ``tf32``, ``float16`` and ``bfloat16`` on the tensor cores, ``float8``), its
memory bandwidth, and how close to those peaks an operation of a given size gets.

**The precision of an operator.** An operator runs at the rate of its operands' dtype, with
one exception that is the platform's default: XLA runs a ``float32`` dot or convolution on the
tensor cores in TF32 where the device has them (NVIDIA Ampere and later, JAX's default matmul
precision), so a preset with ``float32_dot="tf32"`` charges those the ``tf32`` rate. A V100
has no TF32: its ``float32`` matmuls run at 15.7 TFLOP/s. A precision the device lacks falls
back to the next one it has (``float8`` to ``float16``, ``bfloat16`` on a V100 to
``float32``). Elementwise arithmetic runs on the vector units at the ``float32`` rate (it is
memory-bound in practice: the roofline's memory term decides).

**Saturation.** An operation of ``W`` FLOPs (or bytes) on a device of datasheet peak ``P`` has
an ideal time ``tau = W / P``; small operations reach a small fraction of ``P`` (the launch, the
tail of a wave of thread blocks), large ones most of it. The measured profiles of
``docs/profiles/`` (an H100 SXM5 and an H200, ``autoplan profile``, full) give the time of
matmuls, convolutions and memory-bound kernels by size; divided by those devices' datasheet
rates they are curves ``t(tau)`` of measured time against ideal time (:data:`SATURATION`, the
geometric mean of the two devices, 16-bit and 32-bit kinds apart). A preset's device runs an
operation in ``t(W / P_device)``: the same fraction of its own datasheet peak at the same ideal
time, which is the measured curve scaled to its datasheet. For large matmuls that is 0.90-0.94
of the peak, for large convolutions 0.76, for streaming kernels 0.80 of the bandwidth.

:func:`saturation_from_profiles` recomputes the table from the profile files
(``tests/test_devices.py`` checks that the table below is what they give).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from functools import cache

from autoplan.costs._fit import Curve

__all__ = ["PRECISIONS", "SATURATION", "REFERENCE_PROFILES", "precision", "saturated_time",
           "saturation_from_profiles"]

#: the precisions a preset may give a peak rate for
PRECISIONS = ("float64", "float32", "tf32", "float16", "bfloat16", "float8")

#: the operator classes with a saturation curve
OP_CLASSES = ("matmul", "conv", "memory")

#: where a precision a device lacks runs instead
_FALLBACK = {"float8": "float16", "bfloat16": "float32", "float16": "float32", "tf32": "float32",
             "float64": "float32"}

#: the profiles the saturation curves come from, with the datasheet rates of their devices:
#: NVIDIA H100 Tensor Core GPU datasheet (SXM5: TF32 494.7, BF16/FP16 989.4 TFLOP/s dense,
#: HBM3 3.35 TB/s) and NVIDIA H200 Tensor Core GPU datasheet (SXM: the same compute, HBM3e
#: 4.8 TB/s). Their float32 curves were measured at XLA's default precision, TF32.
REFERENCE_PROFILES: dict[str, dict[str, float]] = {
    "nvidia-h100-80gb-1.json": {"float32": 494.7e12, "bfloat16": 989.4e12, "float16": 989.4e12,
                                "memory": 3.35e12},
    "nvidia-h200-1.json": {"float32": 494.7e12, "bfloat16": 989.4e12, "float16": 989.4e12,
                           "memory": 4.8e12},
}

#: ``(op class, kind) -> (ideal seconds, measured seconds)``: kind ``16-bit`` (float16, bfloat16,
#: float8), ``32-bit`` (float32, tf32, float64), ``""`` for memory-bound kernels. Made by
#: :func:`saturation_from_profiles` from :data:`REFERENCE_PROFILES` (4 significant digits).
SATURATION: dict[tuple[str, str], tuple[tuple[float, ...], tuple[float, ...]]] = {
    ("memory", ""): (
        (2.935e-08, 5.411e-08, 2.158e-07, 7.837e-07, 2.82e-06, 7.515e-06, 3.006e-05),
        (1.74e-06, 1.74e-06, 1.864e-06, 2.022e-06, 3.62e-06, 1.163e-05, 3.756e-05)),
    ("matmul", "32-bit"): (
        (1.325e-10, 1.06e-09, 8.478e-09, 6.783e-08, 5.426e-07, 4.341e-06, 3.473e-05, 0.0002778,
         0.002223, 0.01778),
        (1.523e-06, 1.907e-06, 2.847e-06, 3.555e-06, 8.398e-06, 1.34e-05, 5.065e-05, 0.0003236,
         0.002429, 0.01899)),
    ("matmul", "16-bit"): (
        (6.624e-11, 5.299e-10, 4.239e-09, 3.391e-08, 2.713e-07, 2.17e-06, 1.736e-05, 0.0001389,
         0.001111, 0.00889),
        (1.237e-06, 1.501e-06, 2.729e-06, 2.954e-06, 5.463e-06, 7.107e-06, 2.397e-05, 0.0001721,
         0.00124, 0.01083)),
    ("conv", "32-bit"): (
        (2.385e-09, 9.538e-09, 3.815e-08, 1.526e-07, 6.105e-07, 2.442e-06, 9.767e-06, 3.907e-05,
         0.0001563),
        (1.428e-05, 1.428e-05, 1.428e-05, 1.428e-05, 1.431e-05, 1.449e-05, 2.861e-05, 7.435e-05,
         0.0002043)),
    ("conv", "16-bit"): (
        (1.192e-09, 4.769e-09, 1.908e-08, 7.631e-08, 3.052e-07, 1.221e-06, 4.884e-06, 1.953e-05,
         7.814e-05),
        (9.11e-06, 9.552e-06, 1.037e-05, 1.115e-05, 1.199e-05, 1.259e-05, 1.709e-05, 4.221e-05,
         0.0001025)),
}


def precision(dtype: str | None, op_class: str, float32_dot: str = "float32") -> str:
    """The precision an operator of ``op_class`` (``"matmul"``, ``"conv"``, ``"elementwise"``)
    on operands of ``dtype`` runs at, ``float32_dot`` being the platform's default for float32
    dots and convolutions (``"tf32"`` on NVIDIA Ampere and later).

    Examples:
        >>> precision("bfloat16", "matmul"), precision("float32", "matmul", "tf32")
        ('bfloat16', 'tf32')
        >>> precision("float32", "elementwise", "tf32"), precision("float8_e4m3fn", "matmul")
        ('float32', 'float8')
    """
    name = str(dtype or "float32").lower()
    if op_class == "elementwise":
        return "float32"
    if name.startswith("float8"):
        return "float8"
    if name in ("float16", "bfloat16", "float64"):
        return name
    return "tf32" if float32_dot == "tf32" and op_class in ("matmul", "conv") else "float32"


def peak_rate(rates: Mapping[str, float], prec: str) -> tuple[str, float]:
    """The precision a device with ``rates`` runs ``prec`` at (itself, else its fallback) and
    that precision's peak; ``("", 0.0)`` when the device names none of the chain."""
    p: str | None = prec
    while p is not None:
        if p in rates:
            return p, rates[p]
        p = _FALLBACK.get(p)
    return "", 0.0


@cache
def _curve(op_class: str, kind: str) -> Curve:
    taus, ts = SATURATION[(op_class, kind)]
    return Curve(taus, ts)


def saturated_time(op_class: str, prec: str, ideal: float) -> float:
    """Seconds of an operation of ``ideal`` seconds at its datasheet peak: the measured
    saturation curve of ``op_class`` (``"matmul"``, ``"conv"``, ``"memory"``) for ``prec``."""
    if ideal <= 0:
        return 0.0
    kind = "" if op_class == "memory" else (
        "16-bit" if prec in ("float16", "bfloat16", "float8") else "32-bit")
    return _curve(op_class, kind).time(ideal)


def saturation_from_profiles(directory: str | os.PathLike,
                             references: Mapping[str, Mapping[str, float]] = REFERENCE_PROFILES,
                             digits: int = 4
                             ) -> dict[tuple[str, str], tuple[tuple[float, ...], tuple[float, ...]]]:
    """:data:`SATURATION` recomputed from the measured profiles in ``directory``: each profile's
    curve in ideal time (its sizes over its device's datasheet rate), the kinds' curves of every
    profile evaluated at the first one's points and averaged geometrically, rounded to
    ``digits`` significant digits."""
    kinds = {"float32": "32-bit", "bfloat16": "16-bit", "float16": "16-bit"}
    found: dict[tuple[str, str], list[Curve]] = {}
    for name, rates in references.items():
        with open(os.path.join(os.fspath(directory), name)) as f:
            profile = json.load(f)
        for c in profile["curves"]:
            if c["op"] == "memory":
                key, peak = ("memory", ""), rates["memory"]
            elif c["op"] in OP_CLASSES and c["dtype"] in kinds:
                key, peak = (c["op"], kinds[c["dtype"]]), rates[c["dtype"]]
            else:
                continue
            found.setdefault(key, []).append(Curve([s / peak for s in c["sizes"]], c["seconds"]))
    out = {}
    for key, curves in found.items():
        taus = curves[0].xs
        ts = [math.exp(sum(math.log(c.time(x)) for c in curves) / len(curves)) for x in taus]
        out[key] = (_round(taus, digits), _round(ts, digits))
    return out


def _round(xs: Sequence[float], digits: int) -> tuple[float, ...]:
    return tuple(float(f"{x:.{digits}g}") for x in xs)
