"""Fitting and interpolating measured times: shared by the profiler (:mod:`autoplan.costs._profile`)
and the cluster's tables (:mod:`autoplan.costs._measured`)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

__all__ = ["fit_line", "interpolate", "running_max", "Curve"]


def interpolate(xs: Sequence[float], ts: Sequence[float], a: float, b: float, x: float) -> float:
    """``t(x)`` from measured points ``(xs, ts)`` (increasing ``xs``, non-decreasing ``ts``):
    piecewise linear between them; outside, the fit ``a + b x`` scaled to meet the nearest
    measured point (so the curve is continuous and non-decreasing)."""
    if not xs:
        return a + b * x
    if x <= xs[0] or x >= xs[-1]:
        below = x <= xs[0]
        k = 0 if below else -1
        fit_k = a + b * xs[k]
        ratio = x / xs[k] if fit_k <= 0 else (a + b * x) / fit_k
        # (clamped at the measured point: rounding never makes the curve step down there)
        return ts[k] * (min(1.0, ratio) if below else max(1.0, ratio))
    i = bisect.bisect_right(xs, x)
    x0, x1, t0, t1 = xs[i - 1], xs[i], ts[i - 1], ts[i]
    return t0 + (t1 - t0) * (x - x0) / (x1 - x0)


def fit_line(xs: Sequence[float], ts: Sequence[float]) -> tuple[float, float]:
    """Non-negative ``(a, b)`` minimising the relative error of ``a + b x`` against ``ts``
    (weights ``1/t``: small and large sizes count alike).

    Examples:
        >>> a, b = fit_line([1.0, 2.0, 4.0], [3.0, 5.0, 9.0])
        >>> round(a, 6), round(b, 6)
        (1.0, 2.0)
    """
    pts = [(float(x), float(t)) for x, t in zip(xs, ts) if t > 0]
    if not pts:
        return 0.0, 0.0
    if len(pts) == 1:
        x, t = pts[0]
        return 0.0, t / x if x > 0 else 0.0
    # weighted least squares of [1, x] . (a, b) = t with weights 1/t
    s11 = s1x = sxx = s1t = sxt = 0.0
    for x, t in pts:
        w = 1.0 / (t * t)
        s11 += w
        s1x += w * x
        sxx += w * x * x
        s1t += w * t
        sxt += w * x * t
    det = s11 * sxx - s1x * s1x
    a = (s1t * sxx - s1x * sxt) / det if det > 0 else 0.0
    b = (s11 * sxt - s1x * s1t) / det if det > 0 else 0.0
    if a < 0:  # refit through the origin
        a, b = 0.0, sxt / sxx if sxx > 0 else 0.0
    elif b < 0:  # a constant
        a, b = s1t / s11, 0.0
    return a, b


def running_max(values: Iterable[float]) -> list[float]:
    """The running maximum: measured times made non-decreasing in size."""
    out: list[float] = []
    for v in values:
        out.append(max(v, out[-1]) if out else v)
    return out


class Curve:
    """Measured ``(size, seconds)`` points made non-decreasing and fitted: :meth:`time`
    interpolates them (see :func:`interpolate`)."""

    def __init__(self, sizes: Sequence[float], seconds: Sequence[float]):
        pts = sorted(zip(map(float, sizes), map(float, seconds)))
        self.xs = [x for x, _ in pts]
        self.ts = running_max(t for _, t in pts)
        self.a, self.b = fit_line(self.xs, self.ts)

    def time(self, x: float) -> float:
        """Seconds at size ``x`` (0 for ``x <= 0``)."""
        return interpolate(self.xs, self.ts, self.a, self.b, float(x)) if x > 0 else 0.0
