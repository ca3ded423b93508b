"""Alpa's inter-operator pass: slice L layers into pipeline stages and the cluster into submeshes.

Given the latency ``t_intra[i, j, k, c]`` of one micro-batch through layers ``i..j`` on submesh
``k`` with logical-mesh configuration ``c`` (from the intra-op pass or a cost model), choose the
stages, one submesh each, so that the submeshes cover the whole ``N x M`` cluster and the 1F1B
pipeline latency (Alpa Eq. 2)

.. math::

    T = \\sum_{s=1}^{S} t_s + (B - 1) \\max_s t_s

is minimal. A training step also runs work once per step: each stage synchronises its
gradients across its data-parallel devices and updates its parameters after its last
micro-batch's backward. The first stage finishes its last backward last (in GPipe and 1F1B alike),
so its per-step work ``u_1`` ends the step unless a later stage's outlasts the backward still to
run before it; with ``step_cost`` the DP minimises

.. math::

    T = \\sum_{s=1}^{S} t_s + (B - 1) \\max_s t_s + u_1,

exact whenever ``u_s <= u_1 + (backward time of the stages before s)``; the pipeline search
simulates its best few layouts to rank them (:mod:`autoplan.plans._schedule`). The
module is pure: numpy in, a frozen dataclass out.

References:
    Zheng et al., "Alpa: Automating Inter- and Intra-Operator Parallelism for Distributed Deep
    Learning", OSDI 2022, Section 5 (Eq. 2-5, Algorithm 1).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np

from autoplan._errors import InfeasiblePlanError, SearchError

__all__ = ["range_sums", "MadeOnce", "MadeWhereRead",
    "StageAssignment",
    "StageDPResult",
    "submesh_shapes",
    "stage_dp",
    "place_submeshes",
]


# --------------------------------------------------------------------------------------------
# Submesh shapes and their placement
# --------------------------------------------------------------------------------------------


def _is_pow2(x: int) -> bool:
    return x >= 1 and (x & (x - 1)) == 0


def _check_cluster(num_hosts: object, devices_per_host: object) -> None:
    for name, val in (("num_hosts", num_hosts), ("devices_per_host", devices_per_host)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 1:
            raise SearchError(
                f"{name} should be a positive integer. Got {val!r}. Fix: pass the cluster shape as "
                "(hosts, devices per host), e.g. num_hosts=2, devices_per_host=8."
            )


def submesh_shapes(num_hosts: int, devices_per_host: int, hosts: str = "all"
                   ) -> list[tuple[int, int]]:
    """Alpa's candidate submesh shapes for an ``N x M`` cluster.

    One-host shapes ``(1, 1), (1, 2), (1, 4), ..., (1, M)`` followed by the multi-host shapes
    ``(2, M), (3, M), ..., (N, M)`` (Alpa Algorithm 1, line 7).

    The one-host shapes are the powers of two that divide ``M``, plus ``M`` itself. When ``M`` is
    a power of two (every real GPU host) this is exactly Alpa's list. For other ``M`` (say 6)
    Alpa would also list ``(1, 4)``; it is left out here because two 4-device stages cannot share
    6-device hosts, so a plan chosen by counting devices could not be placed. With sizes that
    all divide ``M`` and divide each other, any multiset whose device count is ``N * M`` can be
    placed (see :func:`place_submeshes`), which keeps :func:`stage_dp` exact.

    Args:
        num_hosts: ``N``, the number of hosts.
        devices_per_host: ``M``, the devices in each host.
        hosts: ``"all"`` (Alpa: every ``(n, M)``, ``2 <= n <= N``) or ``"pow2"`` (``n`` a power of
            two, plus ``N``): a smaller space for large clusters, where Alpa's set grows with
            ``N`` and every shape costs one ILP per layer kind and logical mesh. Any ``N`` is
            still covered (whole hosts always place).

    Returns:
        The shapes ``(hosts, devices per host)`` in increasing device count.
    """
    _check_cluster(num_hosts, devices_per_host)
    if hosts not in ("all", "pow2"):
        raise SearchError(f"submesh hosts: expected 'all' or 'pow2'. Got {hosts!r}. Fix: 'all' "
                          "is Alpa's set; 'pow2' keeps multi-host shapes of 2, 4, 8, ... hosts.")
    n_hosts, m = int(num_hosts), int(devices_per_host)
    shapes: list[tuple[int, int]] = []
    p = 1
    while p < m:
        if m % p == 0:
            shapes.append((1, p))
        p *= 2
    shapes.append((1, m))
    if hosts == "all":
        shapes.extend((n, m) for n in range(2, n_hosts + 1))
    else:
        shapes.extend((n, m) for n in range(2, n_hosts + 1) if _is_pow2(n) or n == n_hosts)
    return shapes


def _check_shape(shape: object, num_hosts: int, devices_per_host: int, what: str) -> tuple[int, int]:
    ok = (
        isinstance(shape, (tuple, list))
        and len(shape) == 2
        and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in shape)
    )
    if ok:
        n, m = int(shape[0]), int(shape[1])
        whole_hosts = m == devices_per_host and 1 <= n <= num_hosts
        one_host = n == 1 and 1 <= m <= devices_per_host and _is_pow2(m) and devices_per_host % m == 0
        if whole_hosts or one_host:
            return n, m
    raise SearchError(
        f"{what} should be a submesh shape (n, {devices_per_host}) with 1 <= n <= {num_hosts}, or "
        f"(1, m) with m a power of two dividing {devices_per_host}. Got {shape!r}. Fix: use "
        f"submesh_shapes({num_hosts}, {devices_per_host})."
    )


def place_submeshes(
    shapes: Sequence[tuple[int, int]], num_hosts: int, devices_per_host: int
) -> list[list[int]]:
    """Give each stage's submesh concrete device ids, without overlap, covering the cluster.

    Device ``l`` of host ``h`` has id ``h * M + l``. Whole-host shapes ``(n, M)`` take ``n``
    consecutive free hosts (largest first). The one-host shapes ``(1, m)`` are then packed into the
    remaining hosts largest first, each into the first host with room (first-fit decreasing).
    Because every ``m`` is a power of two dividing ``M``, when a shape of size ``m`` is placed the
    free space of every host is a multiple of ``m`` (everything placed before it is a multiple of
    ``m``); so if the total device count is ``N * M`` some host always has room and each
    allocation is aligned to its size. This is the argument behind Alpa's claim that its shapes
    always cover the cluster.

    Args:
        shapes: one ``(n, m)`` per stage, in stage order.
        num_hosts: ``N``.
        devices_per_host: ``M``.

    Returns:
        For each stage, in the order of ``shapes``, its sorted device ids.

    Raises:
        SearchError: a shape is not of Alpa's kinds, or the shapes do not use exactly ``N * M``
            devices, or they cannot be placed.
    """
    _check_cluster(num_hosts, devices_per_host)
    n_hosts, m_dev = int(num_hosts), int(devices_per_host)
    checked = [_check_shape(s, n_hosts, m_dev, f"shapes[{i}]") for i, s in enumerate(shapes)]
    total = sum(n * m for n, m in checked)
    if total != n_hosts * m_dev:
        raise SearchError(
            f"the submeshes should use exactly the cluster's {n_hosts} x {m_dev} = {n_hosts * m_dev} "
            f"devices. Got shapes {list(shapes)!r} using {total}. Fix: choose shapes whose device "
            "counts add up to the cluster size (stage_dp always does)."
        )
    out: list[list[int]] = [[] for _ in checked]
    next_host = 0
    whole = sorted(
        (i for i, (n, m) in enumerate(checked) if m == m_dev), key=lambda i: (-checked[i][0], i)
    )
    for i in whole:
        n = checked[i][0]
        if next_host + n > n_hosts:  # pragma: no cover - excluded by the device count above
            raise SearchError(f"cannot place shape {checked[i]} on {n_hosts} hosts: out of hosts.")
        out[i] = [h * m_dev + d for h in range(next_host, next_host + n) for d in range(m_dev)]
        next_host += n
    free = {h: 0 for h in range(next_host, n_hosts)}  # host -> first free local device
    small = sorted(
        (i for i, (n, m) in enumerate(checked) if m != m_dev), key=lambda i: (-checked[i][1], i)
    )
    for i in small:
        m = checked[i][1]
        host = next((h for h, used in free.items() if m_dev - used >= m), None)
        if host is None:
            raise SearchError(
                f"cannot place submesh {checked[i]} of stage {i}: no host has {m} free devices. "
                f"Got shapes {list(shapes)!r}. Fix: use shapes from submesh_shapes({n_hosts}, {m_dev})."
            )
        start = free[host]
        out[i] = [host * m_dev + d for d in range(start, start + m)]
        free[host] = start + m
    return out


# --------------------------------------------------------------------------------------------
# The stage DP
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageAssignment:
    """One pipeline stage of a :class:`StageDPResult`.

    Attributes:
        start: first layer of the stage.
        end: one past its last layer (the stage runs layers ``start .. end - 1``).
        submesh: its submesh shape ``(hosts, devices per host)``.
        submesh_index: index ``k`` of that shape in the ``submeshes`` given to :func:`stage_dp`.
        config_index: the logical-mesh configuration ``c`` chosen (cheapest that fits memory;
            for the first stage with ``step_cost``, the cheapest ``t + u`` of those that fit).
        cost: ``t_intra[start, end - 1, submesh_index, config_index]`` (one micro-batch).
        step_cost: ``step_cost[start, end - 1, submesh_index, config_index]`` (once per step; 0
            without ``step_cost``). The DP charges the first stage's.
    """

    start: int
    end: int
    submesh: tuple[int, int]
    submesh_index: int
    config_index: int
    cost: float
    step_cost: float = 0.0


@dataclass(frozen=True)
class StageDPResult:
    """The optimum of :func:`stage_dp`.

    Attributes:
        stages: the stages in pipeline order (first layers first).
        t_max: the latency of the slowest stage.
        total_latency: ``sum(stage.cost) + (B - 1) * t_max + stages[0].step_cost`` (Alpa Eq. 2
            plus the first stage's per-step work).
        evaluated_t_max: how many ``t_max`` values the DP was run for.
        alternatives: the distinct plans the search met (each the optimum for some ``t_max``),
            as ``(total_latency, stages)``, best first (the optimum among them), at most
            ``max_alternatives``: candidates to rank by a finer model (a schedule simulation).
    """

    stages: tuple[StageAssignment, ...]
    t_max: float
    total_latency: float
    evaluated_t_max: int
    alternatives: tuple[tuple[float, tuple[StageAssignment, ...]], ...] = ()


def _as_cost_array(name: str, arr: object, shape: tuple[int, ...] | None) -> np.ndarray:
    try:
        a = np.asarray(arr, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise SearchError(
            f"{name} should be a float array of shape (L, L, K, C). Got {type(arr).__name__}. "
            "Fix: pass a numpy array."
        ) from err
    if a.ndim != 4 or a.shape[0] != a.shape[1] or a.shape[0] < 1 or a.shape[3] < 1:
        raise SearchError(
            f"{name} should have shape (L, L, K, C) with L, C >= 1. Got shape {a.shape}. "
            "Fix: index it as [first layer, last layer, submesh, logical config]."
        )
    if shape is not None and a.shape != shape:
        raise SearchError(
            f"{name} should have the shape of t_intra {shape}. Got {a.shape}. "
            "Fix: give one value per (first layer, last layer, submesh, config)."
        )
    if np.isnan(a).any():
        raise SearchError(f"{name} should contain no NaN. Got {int(np.isnan(a).sum())} NaN entries. "
                          "Fix: use np.inf for impossible choices.")
    return a


class _Positions:
    """Per position from the pipeline's end, the configs that fit and the cheapest one's latency
    (:class:`_Prepared`'s ``best_latency``, ``cfg`` and ``first_t``), made once for the stage-DP
    runs of one set of cost arrays: runs for other stage counts read fewer or more positions of
    the same tables.

    A config fits at position ``p`` when ``param_mem + (p + 1) * act_mem <= device_memory``;
    with ``act_mem >= 0`` that holds for the positions before the config's first misfit (the
    float sum grows with ``p``), so each config's count of fitting positions is found by the
    same test (a guess by division it confirms, else a bisection), and a position's tables are
    the previous one's with only the entries recomputed where some config stops fitting (the
    same minimum and first argmin over the same configs). Arrays with a negative or NaN
    ``act_mem`` are tested at every position.
    """

    def __init__(self, t_intra, param_mem, act_mem, device_memory):
        L = t_intra.shape[0]
        lower = np.tril(np.ones((L, L), dtype=bool), k=-1)
        self.base = np.where(lower[:, :, None, None], np.inf, t_intra)
        self.device_memory = device_memory
        if device_memory is not None:
            self.pm = np.zeros_like(self.base) if param_mem is None else param_mem
            self.am = np.zeros_like(self.base) if act_mem is None else act_mem
        self.best: list[np.ndarray] = []
        self.cfg: list[np.ndarray] = []
        self.first: list[np.ndarray] = []
        self._count: np.ndarray | None = None  # per entry, its fitting positions (up to _cap)
        self._cap = 0
        self._drops: dict[int, np.ndarray] = {}  # position -> flat (i, j, k) entries to redo
        self._stacked: tuple | None = None  # (positions, best, cfg, first) stacked

    def _fits(self, p: int) -> np.ndarray | None:
        if self.device_memory is None:
            return None
        return self.pm + (p + 1) * self.am <= self.device_memory

    def _counts(self, n_pos: int) -> bool:
        """Each entry's number of fitting positions among ``0 .. n_pos - 1`` (the positions
        where entries stop fitting indexed); False where the test is not monotone."""
        if self._count is not None and self._cap >= n_pos:
            return True
        if not (self.am >= 0).all():
            return False
        fin = np.flatnonzero(np.isfinite(self.base))  # (the others never change a minimum)
        pm, am = self.pm.reshape(-1)[fin], self.am.reshape(-1)[fin]
        dm = self.device_memory
        # a first guess by division, kept where the test itself confirms it (the entry fits at
        # the guess's last position and not at the next); the others by bisection
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.where(am > 0, np.floor((dm - pm) / am), np.where(pm <= dm, n_pos, 0))
        guess = np.clip(np.where(np.isnan(x), 0, x), 0, n_pos).astype(np.int64)
        sure = (((guess == 0) | (pm + guess * am <= dm))
                & ((guess == n_pos) | ~(pm + (guess + 1) * am <= dm)))
        lo = np.where(sure, guess, 0)  # fits at every position < lo
        hi = np.where(sure, guess, n_pos)  # misfits at every position >= hi
        while True:
            open_ = np.flatnonzero(lo < hi)
            if open_.size == 0:
                break
            mid = (lo[open_] + hi[open_]) // 2
            ok = pm[open_] + (mid + 1) * am[open_] <= dm  # (as _fits)
            lo[open_[ok]] = mid[ok] + 1
            hi[open_[~ok]] = mid[~ok]
        count = np.zeros(self.base.size, dtype=np.int64)
        count[fin] = lo
        self._count, self._cap = count.reshape(self.base.shape), n_pos
        # where a finite entry stops fitting within the range, its (i, j, k) changes there
        # (each position's distinct entries, ascending: one sort of position * cells + entry)
        drop = (lo < n_pos) & (lo >= 1)
        n_cells = self.base.size // self.base.shape[3]
        at, cells = np.divmod(np.unique(lo[drop] * n_cells + fin[drop] // self.base.shape[3]),
                              n_cells)
        bounds = np.flatnonzero(np.diff(at)) + 1
        self._drops = {int(g[0]): c for g, c in
                       zip(np.split(at, bounds), np.split(cells, bounds)) if g.size}
        return True

    def upto(self, n_pos: int, first: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(best_latency, cfg, first_t)`` of positions ``0 .. n_pos - 1`` (``first_t`` None
        without ``first``)."""
        base = self.base
        if len(self.best) < n_pos and self.device_memory is not None and self._counts(n_pos):
            self._extend(n_pos)
        for p in range(len(self.best), n_pos):
            fits = self._fits(p)
            t = base if fits is None else np.where(fits, base, np.inf)
            self.best.append(t.min(axis=3))
            self.cfg.append(t.argmin(axis=3))
            self.first.append(base[0] if fits is None else np.where(fits[0], base[0], np.inf))
        if self._stacked is None or self._stacked[0] < n_pos:  # (read only: views of the most)
            self._stacked = (n_pos, np.stack(self.best[:n_pos]), np.stack(self.cfg[:n_pos]),
                             np.stack(self.first[:n_pos]))
        _, best, cfg, first_t = self._stacked
        return best[:n_pos], cfg[:n_pos], first_t[:n_pos] if first else None

    def values(self, n_pos: int, first: bool) -> np.ndarray | None:
        """The distinct finite latencies of positions ``0 .. n_pos - 1`` (with ``first``, and of
        the first stage's configs): position 0's and those of the entries recomputed at each
        later one (the others repeat the position before); None where the tables were not made
        from the fitting counts."""
        if self._count is None or len(self.best) < n_pos:
            return None
        parts = [self.best[0][np.isfinite(self.best[0])]]
        for p in range(1, n_pos):
            cells = self._drops.get(p)
            if cells is not None:
                v = self.best[p].reshape(-1)[cells]
                parts.append(v[np.isfinite(v)])
        if first:  # a position's first-stage entries are position 0's that still fit
            parts.append(self.first[0][np.isfinite(self.first[0])])
        return np.unique(np.concatenate(parts))

    def _extend(self, n_pos: int) -> None:
        """Positions ``len(best) .. n_pos - 1`` from the fitting counts: position 0 in full, each
        later one from the one before with its dropped entries recomputed, written into the
        stacked tables :meth:`upto` returns (each position's list entry a view of them)."""
        base, count = self.base, self._count
        C = base.shape[3]
        flat_base = base.reshape(-1, C)
        flat_count = count.reshape(-1, C)
        start = len(self.best)
        best = np.empty((n_pos,) + base.shape[:3])
        cfg = np.empty((n_pos,) + base.shape[:3], dtype=np.intp)
        first = np.empty((n_pos,) + base.shape[1:])
        if start:  # (the positions made before, copied once)
            best[:start], cfg[:start], first[:start] = self.best, self.cfg, self.first
        for p in range(start, n_pos):
            if p == 0:
                t = np.where(count > 0, base, np.inf)
                t.min(axis=3, out=best[0])
                t.argmin(axis=3, out=cfg[0])
            else:
                best[p], cfg[p] = best[p - 1], cfg[p - 1]
                cells = self._drops.get(p)
                if cells is not None:
                    t = np.where(flat_count[cells] > p, flat_base[cells], np.inf)
                    best[p].reshape(-1)[cells] = t.min(axis=1)
                    cfg[p].reshape(-1)[cells] = t.argmin(axis=1)
            first[p] = np.where(count[0] > p, base[0], np.inf)
        self.best, self.cfg, self.first = list(best), list(cfg), list(first)
        self._stacked = (n_pos, best, cfg, first)


class _Prepared:
    """Config-reduced, position-dependent stage costs in band form.

    ``best_latency[p, i, j, k]`` is the cheapest config's latency for layers ``i..j`` on submesh
    ``k`` when the stage sits ``p + 1``-th from the pipeline's end (``inf`` where no config fits
    the memory). Positions ``>= n_pos`` cost the same as ``n_pos`` (in-flight micro-batches are capped
    by ``B``; and ``S <= s_cap``). ``P`` is the first position from which costs no longer change.

    With ``step`` (the per-step cost of every stage), the first stage (the one starting at layer
    0) keeps every config: ``first_t[p, j, k, c]`` its latency where it fits at position ``p``
    (``inf`` elsewhere) and ``first_v`` that latency plus its per-step cost; the DP picks its
    config by ``t + u`` among those within ``t_max``.
    """

    def __init__(self, t_intra, param_mem, act_mem, device_memory, microbatches, s_cap, step=None,
                 positions: _Positions | None = None):
        L = t_intra.shape[0]
        n_pos = 1 if device_memory is None else min(microbatches, s_cap)
        positions = positions or _Positions(t_intra, param_mem, act_mem, device_memory)
        best_latency, cfg, first_t = positions.upto(n_pos, step is not None)
        self.first_t = self.first_v = None
        if step is not None:
            self.first_t = first_t  # (n_pos, L, K, C)
            self.first_v = self.first_t + step[0][None]
        P = best_latency.shape[0]
        while P > 1 and np.array_equal(best_latency[P - 2], best_latency[P - 1]) and (
                self.first_t is None or np.array_equal(self.first_t[P - 2], self.first_t[P - 1])):
            P -= 1
        self.best_latency, self.cfg, self.P = best_latency, cfg, P
        self.n_pos = best_latency.shape[0]
        # band form: tb[p, k, w, q] = best_latency[p, k, k + w, q]
        kk = np.arange(L)[:, None]
        jj = kk + np.arange(L)[None, :]
        valid = jj < L
        tb = best_latency[:P][:, kk, np.minimum(jj, L - 1), :]
        tb[:, ~valid, :] = np.inf
        self.tb = tb
        self.min_by_width = tb.min(axis=(0, 1, 3))  # cheapest stage of each width
        if self.first_t is not None:
            self.min_by_width = np.minimum(self.min_by_width, self.first_t[:P].min(axis=(0, 2, 3)))
        self._finite: dict[int, tuple[np.ndarray, ...]] = {}  # see finite_stages
        self.candidates = positions.values(self.n_pos, self.first_t is not None)
        if self.candidates is None:
            finite = best_latency[np.isfinite(best_latency)]
            if self.first_t is not None:
                finite = np.concatenate([finite, self.first_t[np.isfinite(self.first_t)]])
            self.candidates = np.unique(finite)

    def finite_stages(self, Pn: int, t_max: float) -> tuple[np.ndarray, ...]:
        """The finite stages of positions ``0 .. Pn - 1`` within ``t_max``: ``(p, k, row,
        cost)`` of each, in the order of ``np.nonzero`` over ``tb[:Pn]`` (by position, then
        ``k``, ``w``, ``q``), ``row`` its rest's row ``(k + w + 1) * K + q`` in a shifted table.

        The finite entries are found once per ``Pn`` and only filtered by ``t_max`` in each DP
        run: a stage within ``t_max`` is narrower than the widths the run keeps (every stage of
        a wider one costs more, :attr:`min_by_width`), so the entries the run's own ``tb``
        (sliced to its widths, inf past ``t_max``) has finite are exactly these, in its order."""
        got = self._finite.get(Pn)
        if got is None:
            K = self.tb.shape[3]
            pp, kk, ww, qq = np.nonzero(np.isfinite(self.tb[:Pn]))
            got = self._finite[Pn] = (pp, kk, (kk + ww + 1) * K + qq, self.tb[:Pn][pp, kk, ww, qq])
        pp, kk, row, cost = got
        keep = np.flatnonzero(cost <= t_max)
        return pp.take(keep), kk.take(keep), row.take(keep), cost.take(keep)


def _choice(tbk: np.ndarray, X: np.ndarray, k: int, d: int, sizes: np.ndarray, W: int, L: int) -> int:
    """Recover the DP's choice ``q * W + w`` at state ``(k, d)`` from the next table ``X``.

    Recomputes the same sums the vectorised min took, so the argmin reproduces the minimum.
    """
    rows = np.minimum(k + 1 + np.arange(W), L)  # (W,)
    cols = d - sizes  # (K,)
    nxt = np.where((cols >= 0)[None, :] & (k + 1 + np.arange(W) <= L)[:, None],
                   X[rows[:, None], np.maximum(cols, 0)[None, :]], np.inf)  # (W, K)
    vals = tbk + nxt
    w, q = np.unravel_index(int(np.argmin(vals)), vals.shape)
    return int(q) * W + int(w)


def _first_stages(prep: _Prepared, pos: np.ndarray, nxts: Sequence[np.ndarray], t_max: float,
                  sizes: np.ndarray, D: int, W: int) -> list[tuple[float, tuple | None]]:
    """Per plan end, the first stage (layers ``0 .. w``) at position ``pos[i]`` (non-decreasing)
    with its config chosen by ``t + u`` among those within ``t_max``, followed by
    ``nxts[i][w + 1, D - size]``: ``(value, (w, q, c))``, or ``(inf, None)`` where none is
    finite. All in one array, each end's first minimum taken in ``(w, q, c)`` order."""
    if len(nxts) == 0:
        return []
    L = prep.best_latency.shape[1]
    top = int(pos[-1]) + 1  # (the positions read)
    ft = prep.first_t[:top, :W]  # (top, W, K, C)
    fv = np.where(ft <= t_max, prep.first_v[:top, :W], np.inf)[pos]  # (S, W, K, C)
    cols = D - sizes  # (K,)
    rows = np.arange(1, W + 1)
    nxt = np.stack(nxts)  # (S, L + 1, D + 1)
    follow = np.where((cols >= 0)[None, :] & (rows <= L)[:, None],
                      nxt[:, np.minimum(rows, L)[:, None], np.maximum(cols, 0)[None, :]],
                      np.inf)  # (S, W, K)
    vals = (fv + follow[..., None]).reshape(len(nxts), -1)
    out: list[tuple[float, tuple | None]] = []
    for i, a in enumerate(vals.argmin(axis=1)):
        v = vals[i, a]
        if not np.isfinite(v):
            out.append((math.inf, None))
            continue
        w, q, c = np.unravel_index(int(a), fv.shape[1:])
        out.append((float(v), (int(w), int(q), int(c))))
    return out


class _MergedTail(NamedTuple):
    """The self-referential table of the positions from ``P`` on (any number of further stages):
    ``H[k, d]`` the best cost of layers ``k ..`` on ``d`` devices, ``argH[k, d]`` its first
    stage's choice ``q * W + w``, and ``flag[k, d]`` whether ``H`` beats the exact tail there."""

    H: np.ndarray
    argH: np.ndarray
    flag: np.ndarray


def _dp(prep: _Prepared, t_max: float, sizes: np.ndarray, D: int, n_exact: int,
        merged_tail: bool, min_stages: int = 1):
    """One run of Alpa's Eq. 3 for a fixed ``t_max``, over ``D`` devices (the cluster's ``N M``:
    the columns ``d = 0 .. D`` of the tables ``F(s, k, d)``).

    ``F(s)`` is computed for ``s <= n_exact`` stages; with ``merged_tail`` the positions from
    ``P`` on, whose costs no longer change, share one self-referential table ``H(k, d)`` (any
    number of further stages), so plans of more than ``n_exact`` stages are found too.

    Returns ``(F, stages)`` with ``stages`` a list of ``(start, end, q, c)`` in pipeline order
    (``c`` None where the config is the position's cheapest, ``prep.cfg``), or ``(inf, None)``.
    """
    ok_w = np.nonzero(prep.min_by_width <= t_max)[0]
    if ok_w.size == 0:
        return math.inf, None
    W = int(ok_w[-1]) + 1
    # (P, L, W, K): the stage costs of the widths kept, masked past t_max only where read (the
    # batched tables read the finite stages within it, the merged tail its last position, the
    # plan's recovery its own rows)
    tb = prep.tb[:, :, :W, :]
    if D <= BATCHED_TABLE_DEVICES:
        F = _exact_tables(tb, prep.P, sizes, D, n_exact, True,
                          prep.finite_stages(max(1, min(n_exact, prep.P)), t_max))
    else:
        F = _exact_tables(_within(tb, t_max), prep.P, sizes, D, n_exact, False)
    merged = (_merged_table(_within(tb[prep.P - 1], t_max), F[n_exact], sizes, D)
              if merged_tail else None)
    best, where, first = _best_stage_count(prep, t_max, F, merged, sizes, D, W, min_stages)
    if where is None:
        return np.inf, None
    return float(best), _stages(prep.P, tb, t_max, F, merged, where, first, sizes, D)


def _within(tb: np.ndarray, t_max: float) -> np.ndarray:
    """Stage costs ``tb`` with those above ``t_max`` infinite."""
    return np.where(tb <= t_max, tb, np.inf)


#: clusters of at most this many devices build the stage DP's tables with all the candidates of
#: a table at once (:func:`_batched_tables`: a few array operations per table, each over every
#: column some candidate reaches); larger ones run by run of consecutive layers
#: (:func:`_span_tables`: array operations on only the columns each submesh reaches). Measured on
#: the stage-DP runs of GPT 39B on 64 V100s: 20% less time batched; of GPT-3 175B on 1,024
#: H100s, whose tables are sparse and 1,025 columns wide: 2.1x more time batched.
BATCHED_TABLE_DEVICES = 64

#: the candidate entries (a stage's cost plus its rest's) :func:`_batched_tables` sums in one
#: array at most
BATCHED_TABLE_CHUNK = 1 << 20


def _exact_tables(tb: np.ndarray, P: int, sizes: np.ndarray, D: int, n_exact: int,
                  batched: bool | None = None, finite: tuple[np.ndarray, ...] | None = None
                  ) -> list[np.ndarray]:
    """``F(s, k, d)`` for ``s = 0 .. n_exact`` stages: the best cost of layers ``k ..`` in ``s``
    stages on exactly ``d`` devices, from the stage costs ``tb`` (band form, inf past ``t_max``):

    ``F(s, k, d) = min over w, q of tb[p, k, w, q] + F(s - 1, k + w + 1, d - size_q)``

    with ``p = min(s, P) - 1``, taken over the finite terms only: each candidate is one
    addition, so the minimum over the finite ones, in any order, is the value over all of them
    (an infinite term never wins). ``batched``: :func:`_batched_tables` or :func:`_span_tables`
    (the same tables; default by :data:`BATCHED_TABLE_DEVICES`); ``finite``: the batched
    tables' finite stages when the caller has them (:meth:`_Prepared.finite_stages`: ``tb`` is
    then read for its shape alone, and may be the costs before masking)."""
    if batched is None:
        batched = D <= BATCHED_TABLE_DEVICES
    if batched:
        return _batched_tables(tb, P, sizes, D, n_exact, finite)
    return _span_tables(tb, P, sizes, D, n_exact)


def _batched_tables(tb: np.ndarray, P: int, sizes: np.ndarray, D: int, n_exact: int,
                    finite: tuple[np.ndarray, ...] | None = None) -> list[np.ndarray]:
    """:func:`_exact_tables` with all of one table's candidates in a few array operations: the
    finite stages ``k, w, q`` of every position found once, those whose rest has a finite entry
    added to their rest's row, and reduced by ``k``, on the columns some candidate reaches."""
    L, W, K = tb.shape[1], tb.shape[2], tb.shape[3]
    F = [np.full((L + 1, D + 1), np.inf)]
    F[0][L, 0] = 0.0
    # every position's finite stages, by position then k: their k, their cost, and the row
    # (k + w + 1) * K + q of their rest in the shifted previous table
    Pn = max(1, min(n_exact, P))
    if finite is None:
        pp, kk, ww, qq = np.nonzero(np.isfinite(tb[:Pn]))
        cost = tb[:Pn][pp, kk, ww, qq]
        row = (kk + ww + 1) * K + qq
    else:
        pp, kk, row, cost = finite
    bounds = np.searchsorted(pp, np.arange(Pn + 1))
    ext = np.full((L + 1, D + 2), np.inf)  # the previous table, and an inf column (d < size)
    hit = np.zeros(D + 1 + int(sizes.max(initial=0)), dtype=bool)
    rows = np.zeros(L + W + 1, dtype=bool)  # the previous table's finite rows (none past L)
    for s in range(1, n_exact + 1):
        p = min(s, P) - 1
        Y = F[s - 1]
        finite_y = np.isfinite(Y)
        if not finite_y.any():  # no plan of s - 1 stages: none of s either (one read-only table)
            Y.flags.writeable = False
            F.append(Y)
            continue
        Fs = np.full((L + 1, D + 1), np.inf)
        F.append(Fs)
        a, b = int(bounds[p]), int(bounds[p + 1])
        rows[: L + 1] = finite_y.any(axis=1)
        live = rows[row[a:b] // K]
        kl, rl, cl = kk[a:b][live], row[a:b][live], cost[a:b][live]
        if kl.size == 0:
            continue
        # the columns d = c + size_q <= D, c a column of Y with a finite entry
        cols = np.flatnonzero(finite_y.any(axis=0))
        hit[:] = False
        hit[(cols[None, :] + sizes[:, None]).ravel()] = True
        dcols = np.flatnonzero(hit[: D + 1])
        if dcols.size == 0:
            continue
        run = int(dcols[-1]) - int(dcols[0]) + 1 == dcols.size  # (one run of columns)
        src = dcols[None, :] - sizes[:, None]  # (K, columns): Y's column d - size_q
        src[src < 0] = D + 1  # (the inf column)
        ext[:, : D + 1] = Y
        # shifted[r * K + q] = Y[r, dcols - size_q]: each candidate's rest is one row of it
        shifted = ext[:, src].reshape((L + 1) * K, dcols.size)
        starts = np.flatnonzero(np.concatenate(([True], kl[1:] != kl[:-1])))
        # the candidates of each k reduced together, in chunks of whole k groups
        per = max(1, BATCHED_TABLE_CHUNK // dcols.size)
        lo = 0
        while lo < starts.size:
            hi = max(lo + 1, int(np.searchsorted(starts, starts[lo] + per)))
            c0 = int(starts[lo])
            c1 = int(starts[hi]) if hi < starts.size else kl.size
            vals = shifted.take(rl[c0:c1], axis=0)
            vals += cl[c0:c1, None]
            best = np.minimum.reduceat(vals, starts[lo:hi] - c0, axis=0)
            if run:
                Fs[kl[starts[lo:hi]], dcols[0]: dcols[0] + dcols.size] = best
            else:
                Fs[kl[starts[lo:hi]][:, None], dcols[None, :]] = best
            lo = hi
    return F


def _span_tables(tb: np.ndarray, P: int, sizes: np.ndarray, D: int, n_exact: int
                 ) -> list[np.ndarray]:
    """:func:`_exact_tables` run by run of consecutive first layers ``k`` whose stage and rest
    are finite (:func:`_runs`), per submesh on the columns it reaches."""
    L = tb.shape[1]
    F = [np.full((L + 1, D + 1), np.inf)]
    F[0][L, 0] = 0.0
    finite_tb: dict[int, np.ndarray] = {}  # position -> where its stage costs are finite
    tmp = np.empty((L, D + 1))
    acc = np.empty((L + 1, D + 1))
    for s in range(1, n_exact + 1):
        p = min(s, P) - 1
        Y = F[s - 1]
        finite_y = np.isfinite(Y)
        rows = finite_y.any(axis=1)
        if not rows.any():  # no plan of s - 1 stages: none of s either (one read-only table)
            Y.flags.writeable = False
            F.append(Y)
            continue
        cols = np.flatnonzero(finite_y.any(axis=0))
        Fs = np.full((L + 1, D + 1), np.inf)
        F.append(Fs)
        if p not in finite_tb:
            finite_tb[p] = np.isfinite(tb[p])
        c_lo = int(cols[0])
        # only the columns where Y has a finite entry: a slice where they are one run (the
        # small clusters), else gathered (a large cluster's sums of submesh sizes are sparse)
        run = cols.size == int(cols[-1]) + 1 - c_lo
        Yc = Y[:, c_lo: c_lo + cols.size] if run else Y[:, cols]
        # Fs[k, d] = min over q, w of tb[p, k, w, q] + Y[k + w + 1, d - size_q]: each candidate
        # is one addition, so taking the minimum over the finite terms only (the runs of rows
        # whose stage and rest are both finite), in any order, gives the same value as over
        # all of them (an infinite term never wins)
        for q, spans in enumerate(_runs(finite_tb[p], rows)):
            size = int(sizes[q])
            # the columns d = col + size <= D
            n = (max(0, min(cols.size, D + 1 - size - c_lo)) if run
                 else int(np.searchsorted(cols, D + 1 - size)))
            if n == 0 or not spans:
                continue
            tq = tb[p, :, :, q]
            Yq = Yc[:, :n]
            k_lo, k_hi = min(k0 for _, k0, _ in spans), max(k1 for _, _, k1 in spans)
            if run:
                Fq = Fs[:, c_lo + size: c_lo + size + n]
            else:  # the spans' rows, in a buffer reused
                Fq = acc[:, :n]
                Fq[k_lo:k_hi] = np.inf
            for w, k0, k1 in spans:  # stages k .. k + w for k in k0 .. k1 - 1
                out = tmp[: k1 - k0, :n]
                np.add(tq[k0:k1, w, None], Yq[k0 + w + 1: k1 + w + 1], out=out)
                np.minimum(Fq[k0:k1], out, out=Fq[k0:k1])
            if not run:
                at = (slice(k_lo, k_hi), cols[:n] + size)
                Fs[at] = np.minimum(Fs[at], Fq[k_lo:k_hi])
    return F


def _runs(finite_p: np.ndarray, rows: np.ndarray) -> list[list[tuple[int, int, int]]]:
    """Per submesh ``q``, the runs of consecutive first layers ``k`` whose stage ``k .. k + w``
    is finite in ``finite_p`` (L, W, K) and whose rest ``k + w + 1 ..`` has a finite row in
    ``rows`` (L + 1,): ``(w, first k, one past the last k)``, by width."""
    L, W, K = finite_p.shape
    ok = np.zeros(L + W + 1, dtype=bool)
    ok[: L + 1] = rows
    nxt = np.arange(L)[:, None] + np.arange(1, W + 1)[None, :]  # (L, W): k + w + 1
    both = np.zeros((K, W, L + 2), dtype=np.int8)
    both[:, :, 1:-1] = (finite_p & ok[nxt][:, :, None]).transpose(2, 1, 0)
    step = np.diff(both, axis=2)
    qs, ws, starts = np.nonzero(step == 1)  # (in submesh, width, layer order)
    ends = np.nonzero(step == -1)[2]
    out: list[list[tuple[int, int, int]]] = [[] for _ in range(K)]
    for q, w, k0, k1 in zip(qs.tolist(), ws.tolist(), starts.tolist(), ends.tolist()):
        out[q].append((w, k0, k1))
    return out


def _least_t_max(prep: _Prepared, sizes: np.ndarray, D: int) -> float:
    """A bound below which no ``t_max`` has a plan: the least, over the splits of the layers into
    stages whose submeshes use exactly ``D`` devices, of the slowest stage, each stage costed at
    its cheapest position (any stage of a plan found at ``t_max`` costs at most ``t_max`` at its
    own position, so at least this much at some position)."""
    cmin = prep.tb.min(axis=0)  # (L, W, K)
    L, W, K = cmin.shape
    dcol = np.arange(D + 1)[None, :] - sizes[:, None]
    shift_idx = np.where(dcol >= 0, dcol, D + 1)  # (K, D+1); column D + 1 is inf
    G = np.full((L + 1, D + 2), np.inf)  # G[k, d]: the least slowest stage of layers k .. on d
    G[L, 0] = -np.inf
    Z = np.full((K, L + 1 + W, D + 1), np.inf)  # Z[q, r, d] = G[r, d - size_q]
    Z[:, L, :] = G[L][shift_idx]
    for k in range(L - 1, -1, -1):
        rest = Z[:, k + 1: k + 1 + W, :].transpose(1, 0, 2)  # (W, K, D+1)
        G[k, : D + 1] = np.maximum(cmin[k][:, :, None], rest).min(axis=(0, 1))
        Z[:, k, :] = G[k][shift_idx]
    return float(G[0, D])


def _merged_table(tb_last: np.ndarray, tail: np.ndarray, sizes: np.ndarray, D: int
                  ) -> _MergedTail:
    """The merged tail's table from the last position's stage costs ``tb_last`` (L, W, K) and
    the exact table ``tail`` of ``n_exact`` stages."""
    L, W = tb_last.shape[0], tb_last.shape[1]
    # shift index: Z[q, r, d] = Y[r, d - size_q], reading an extra inf column where d < size_q
    dcol = np.arange(D + 1)[None, :] - sizes[:, None]
    shift_idx = np.where(dcol >= 0, dcol, D + 1)  # (K, D+1)
    tlast = tb_last.transpose(0, 2, 1)  # (L, K, W)
    H = np.full((L + 1, D + 1), np.inf)
    argH = np.zeros((L, D + 1), dtype=np.int64)
    flag = np.zeros((L + 1, D + 1), dtype=bool)  # True where H beats the exact tail
    Z = _shifted(tail, shift_idx, W)  # of min(tail, H), updated row by row; H[L] = inf
    Z_finite = np.isfinite(Z)
    for k in range(L - 1, -1, -1):
        # the candidates q * W + w whose stage is finite, in that order: the first minimum
        # among them is the first among all (an infinite candidate never is the minimum)
        tk = tlast[k].ravel()
        idx = np.flatnonzero(np.isfinite(tk))
        if idx.size == 0:
            continue  # H[k] stays inf, argH[k] 0 (as the argmin of infinite candidates)
        qs, ws = np.divmod(idx, W)
        rows = k + 1 + ws
        # only the columns where some candidate is finite (elsewhere H stays inf, argH 0)
        live = np.flatnonzero(Z_finite[qs, rows, :].any(axis=0))
        if live.size == 0:
            continue
        cand = tk[idx][:, None] + Z[qs[:, None], rows[:, None], live[None, :]]
        a_in = cand.argmin(axis=0)
        h_live = cand[a_in, np.arange(live.size)]
        H[k, live] = h_live
        argH[k, live] = np.where(np.isfinite(h_live), idx[a_in], 0)
        h = H[k]
        better = h < tail[k]
        flag[k] = better
        yk = np.where(better, h, tail[k])
        Z[:, k, :] = np.append(yk, np.inf)[shift_idx]
        Z_finite[:, k, :] = np.isfinite(Z[:, k, :])
    return _MergedTail(H, argH, flag)


def _shifted(Y: np.ndarray, shift_idx: np.ndarray, W: int) -> np.ndarray:
    """Y (R, D+1) -> (K, R + W, D+1), ``Z[q, r, d] = Y[r, d - size_q]``, with rows past R
    padded with inf."""
    K, D1 = shift_idx.shape
    ext = np.concatenate([Y, np.full((Y.shape[0], 1), np.inf)], axis=1)
    Z = np.full((K, Y.shape[0] + W, D1), np.inf)
    Z[:, : Y.shape[0], :] = ext[:, shift_idx].transpose(1, 0, 2)
    return Z


def _best_stage_count(prep: _Prepared, t_max: float, F: list[np.ndarray],
                      merged: _MergedTail | None, sizes: np.ndarray, D: int, W: int,
                      min_stages: int):
    """The best number of stages (the first stage: per position, or with its per-step cost):
    ``(value, where, first)`` with ``where`` ``("exact", s)`` or ``("merged", 0)`` (None when no
    plan exists) and ``first`` the first stage's ``(w, q, c)`` when chosen with its config."""
    P, n_exact = prep.P, len(F) - 1
    best, where, first = np.inf, None, None
    counts = range(max(1, min_stages), n_exact + 1)
    got = ([(F[s][0, D], None) for s in counts] if prep.first_t is None
           else _first_stages(prep, np.minimum(np.arange(counts.start, counts.stop), P) - 1,
                              [F[s - 1] for s in counts], t_max, sizes, D, W))
    for s, (v, ch) in zip(counts, got):
        if v < best:
            best, where, first = v, ("exact", s), ch
    if merged is not None:
        if prep.first_t is None:
            v, ch = merged.H[0, D], None
        else:
            v, ch = _first_stages(prep, np.array([P - 1]), [np.minimum(F[n_exact], merged.H)],
                                  t_max, sizes, D, W)[0]
        if v < best:
            best, where, first = v, ("merged", 0), ch
    return best, where, first


def _stages(P: int, tb: np.ndarray, t_max: float, F: list[np.ndarray],
            merged: _MergedTail | None, where: tuple[str, int],
            first: tuple[int, int, int] | None, sizes: np.ndarray, D: int
            ) -> list[tuple[int, int, int, int | None]]:
    """The stages of the plan found, ``(start, end, q, c)`` in pipeline order, followed from
    ``where`` (and the first stage ``first`` when chosen with its config) through the tables
    (``tb`` the stage costs of the run's widths, each row read masked past ``t_max``)."""
    L, W, n_exact = tb.shape[1], tb.shape[2], len(F) - 1
    stages: list[tuple[int, int, int, int | None]] = []
    k, d = 0, D
    mode, s = where

    def advance(mode: str, s: int, k: int, d: int) -> tuple[str, int]:
        """The table the rest is read from: the merged one until the exact tail beats it."""
        if mode == "merged":
            return ("exact", n_exact) if not merged.flag[k, d] else (mode, s)
        return mode, s - 1

    if first is not None:  # the first stage was chosen with its config
        w, q, c = first
        stages.append((0, w + 1, q, c))
        k, d = w + 1, D - int(sizes[q])
        mode, s = advance(mode, s, k, d)
    while True:
        if mode == "merged":
            a = int(merged.argH[k, d])
        else:
            if s == 0:
                break
            a = _choice(_within(tb[min(s, P) - 1, k], t_max), F[s - 1], k, d, sizes, W, L)
        q, w = divmod(a, W)
        stages.append((k, k + w + 1, q, None))
        k, d = k + w + 1, d - int(sizes[q])
        mode, s = advance(mode, s, k, d)
    assert k == L and d == 0
    return stages


def stage_dp(
    t_intra: np.ndarray,
    submeshes: Sequence[tuple[int, int]],
    num_hosts: int,
    devices_per_host: int,
    microbatches: int,
    *,
    param_mem: np.ndarray | None = None,
    act_mem: np.ndarray | None = None,
    device_memory: float | None = None,
    max_stages: int | None = None,
    min_stages: int = 1,
    step_cost: np.ndarray | None = None,
    max_alternatives: int = 8,
    explain: bool = True,
) -> StageDPResult:
    """Alpa's stage-mesh dynamic program (Alpa Eq. 3-5), exact and vectorised.

    For a bound ``t_max`` on the latency of every stage (Alpa Eq. 3):

    .. math::

        F(s, k, d; t_{max}) = \\min_{k \\le i < L,\\; n \\cdot m \\le d}
            \\{ t_{intra}(k..i, (n, m), s) + F(s - 1, i + 1, d - n m; t_{max})
              \\mid t_{intra}(k..i, (n, m), s) \\le t_{max} \\}

    with ``F(0, L, 0) = 0`` and ``inf`` otherwise: ``d`` must reach exactly 0, so the submeshes
    cover all ``N M`` devices. ``s`` counts stages from the end, so the stage starting at ``k`` is
    the ``s``-th from the end. Then (Eq. 4)

    .. math::

        T^*(t_{max}) = \\min_s F(s, 0, N M; t_{max}) + (B - 1)\\, t_{max},

    and the answer is the minimum of ``T*`` over ``t_max`` in the distinct finite stage costs.

    ``t_intra(k..i, mesh, s)`` is the cheapest logical config ``c`` of ``t_intra[k, i, mesh, c]``
    that fits in memory at position ``s`` (Eq. 5): a 1F1B stage ``s``-th from the end keeps
    ``min(s, B)`` micro-batches of activations alive, so
    ``param_mem + min(s, B) * act_mem <= device_memory`` (Alpa writes ``s``; with fewer
    micro-batches than stages only ``B`` can be in flight). Taking the min over configs up front
    is exact: a cheaper stage never raises the sum nor the max.

    Speed-ups, all exact:

    * Configs are reduced per position before the search, and positions from which costs stop
      changing (at the latest ``B``) are merged into one self-referential table, so without a
      memory limit the DP has no stage-count dimension at all (``F(k, d)``).
    * Stages longer than the longest stage allowed by ``t_max`` are cut from the inner loop,
      and with a stage-count dimension each ``F(s)`` adds only the finite terms: per submesh
      and stage width, the rows whose stage fits ``t_max`` (and the memory) and whose rest
      ``F(s - 1)`` is finite. Each term is one addition and a minimum ignores ``inf``, so the
      table is the same as over every term.
    * ``F(t_max)`` is non-increasing in ``t_max``, and when the DP at ``t_max = t`` returns a plan
      whose slowest stage is ``m <= t``, ``F`` is constant on ``[m, t]``, so that plan's true
      latency ``F + (B - 1) m`` is the best of every candidate in ``[m, t]`` and none of them needs
      a DP run. The candidates are searched by bisection over intervals ``(lo, hi)`` with
      ``F(hi)`` known, taking the interval with the smallest lower bound first.
    * Early stop (Alpa's, tightened): a plan whose slowest stage takes ``t`` has latency at least
      ``max(sum_s t_s, t) + (B - 1) t >= max(F(t_hi), t) + (B - 1) t`` where ``t_hi >= t`` is any
      evaluated bound (stage costs are >= 0 and the sum includes the max, and ``F`` is
      non-increasing). So an interval of candidates whose smallest value is ``t_lo`` is dropped
      once ``max(F(t_hi), t_lo) + (B - 1) t_lo >= best``, and the search stops when the smallest
      such bound of all open intervals reaches the best latency found. This implies Alpa's
      ``B t_max >= T*`` rule and the weaker ``(B - 1) t_max >= T*``. Using ``t`` in place of
      ``F`` is valid because the optimal ``t_max`` is the max of some optimal plan (a plan with
      max ``m < t`` is already counted at ``m``).
    * A bound below which no ``t_max`` has a plan (:func:`_least_t_max`, the least slowest stage
      of any split on exactly ``N M`` devices, each stage at its cheapest position) answers the
      runs the bisection asks for below it without running the DP (the same bisection).
    * The per-position tables come from each config's count of fitting positions (one
      bisection), a position's from the one before with only the entries recomputed where a
      config stops fitting (:class:`_Positions`).

    Args:
        t_intra: shape ``(L, L, K, C)``: ``t_intra[i, j, k, c]`` is the latency of one
            micro-batch (forward and backward) through layers ``i..j`` (``j >= i``) on
            ``submeshes[k]`` with logical config ``c``; ``np.inf`` where impossible. Entries with
            ``j < i`` are ignored.
        submeshes: the ``K`` shapes, normally :func:`submesh_shapes`.
        num_hosts: ``N``.
        devices_per_host: ``M``.
        microbatches: ``B >= 1``.
        param_mem: optional, same shape: parameter, gradient and optimizer bytes per device.
        act_mem: optional, same shape: activation bytes per device for one micro-batch.
        device_memory: bytes per device; with it, Eq. 5 excludes choices that do not fit.
        max_stages: optional upper bound on the number of stages.
        min_stages: lower bound on the number of stages (with ``max_stages``: an exact count).
        step_cost: optional, same shape: the work a stage runs once per step (gradient
            synchronisation, optimizer update); the first stage's is added to ``T`` (see the
            module docstring), and the first stage's config is the one of least ``t + u``
            among those that fit and stay within ``t_max``.
        max_alternatives: how many of the distinct plans met during the search to return in
            :attr:`StageDPResult.alternatives`.
        explain: when no plan fits the memory, find the least ``device_memory`` with which one
            would (a bisection of DP runs) for the error; False raises without it.

    Returns:
        The optimal :class:`StageDPResult`.

    Raises:
        SearchError: malformed input (shapes, NaN, negative costs, bad submeshes).
        InfeasiblePlanError: no plan exists; ``least_memory`` is set when the memory limit is
            the reason (the smallest ``device_memory`` with which some plan fits).

    References:
        Alpa (Zheng et al., OSDI 2022), Section 5.2, Eq. 2 (pipeline latency), Eq. 3 (the DP),
        Eq. 4 (``T*``), Eq. 5 (1F1B memory), Algorithm 1.
    """
    problem = _check_inputs(t_intra, submeshes, num_hosts, devices_per_host, microbatches,
                            param_mem=param_mem, act_mem=act_mem, device_memory=device_memory,
                            max_stages=max_stages, min_stages=min_stages, step_cost=step_cost)
    return _solve(problem, None, explain, max_alternatives)


def stage_dp_counts(t_intra: np.ndarray, submeshes: Sequence[tuple[int, int]], num_hosts: int,
                    devices_per_host: int, microbatches: int,
                    counts: Sequence[tuple[int, int | None]], *,
                    param_mem: np.ndarray | None = None, act_mem: np.ndarray | None = None,
                    device_memory: float | None = None, step_cost: np.ndarray | None = None,
                    max_alternatives: int = 8, explain: bool = True
                    ) -> list[StageDPResult | InfeasiblePlanError]:
    """:func:`stage_dp` for each ``(min_stages, max_stages)`` of ``counts`` on the same cost
    arrays (the other arguments as :func:`stage_dp`'s), each result the one :func:`stage_dp`
    gives alone (or the :class:`InfeasiblePlanError` it raises), with the per-position tables
    made once."""
    out: list[StageDPResult | InfeasiblePlanError] = []
    positions = first = None
    for least, most in counts:
        if first is None:  # (the arrays checked once: the counts are all that differ)
            problem = first = _check_inputs(
                t_intra, submeshes, num_hosts, devices_per_host, microbatches,
                param_mem=param_mem, act_mem=act_mem, device_memory=device_memory,
                max_stages=most, min_stages=least, step_cost=step_cost)
        else:
            problem = _with_counts(first, most, least)
        dm = None if problem.device_memory is None else float(problem.device_memory)
        positions = positions or _Positions(problem.t, problem.pm, problem.am, dm)
        try:
            out.append(_solve(problem, positions, explain, max_alternatives))
        except InfeasiblePlanError as err:
            out.append(err)
    return out


def _solve(problem: _StageProblem, positions: _Positions | None, explain: bool,
           max_alternatives: int) -> StageDPResult:
    search = _TMaxSearch(problem, problem.prepared(
        None if problem.device_memory is None else float(problem.device_memory), positions))
    F_top = search.start()
    if F_top is None:
        _raise_infeasible(problem, explain)
    search.bisect(F_top)
    return search.result(max_alternatives)


@dataclass(frozen=True, eq=False)
class _StageProblem:
    """The checked inputs of :func:`stage_dp` (``device_memory`` and ``max_stages`` as given, for
    the messages)."""

    t: np.ndarray  # t_intra, (L, L, K, C)
    shapes: list[tuple[int, int]]  # the submeshes
    sizes: np.ndarray  # their device counts, (K,)
    num_hosts: int
    devices_per_host: int
    B: int  # micro-batches
    pm: np.ndarray | None  # param_mem (None without device_memory)
    am: np.ndarray | None  # act_mem (None without device_memory)
    step: np.ndarray | None  # step_cost
    device_memory: object
    max_stages: object
    s_cap: int  # the most stages a plan may have
    merge_allowed: bool  # no binding stage-count limit: the tail positions may be merged
    min_s: int  # the fewest stages a plan may have

    @property
    def L(self) -> int:
        return self.t.shape[0]

    @property
    def num_devices(self) -> int:
        return self.num_hosts * self.devices_per_host

    def prepared(self, device_memory: float | None, positions: _Positions | None = None
                 ) -> _Prepared:
        """The stage costs reduced over the configs that fit ``device_memory`` (from
        ``positions``, the tables of these costs and memory limit, when given)."""
        return _Prepared(self.t, self.pm, self.am, device_memory, self.B, self.s_cap, self.step,
                         positions)

    def layout(self, prep: _Prepared) -> tuple[int, bool]:
        """``(n_exact, merged_tail)`` of :func:`_dp` for ``prep``."""
        if self.merge_allowed:  # a plan through the merged tail has more than n_exact stages
            return max(prep.P - 1, self.min_s - 1), True
        return self.s_cap, False

    def dp(self, prep: _Prepared, t_max: float):
        """One run of :func:`_dp` at ``t_max``."""
        n_exact, merged_tail = self.layout(prep)
        return _dp(prep, t_max, self.sizes, self.num_devices, n_exact, merged_tail, self.min_s)


def _is_count(value: object, least: int) -> bool:
    """Whether ``value`` is an integer (not a bool) of at least ``least``."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and value >= least


def _check_inputs(t_intra, submeshes, num_hosts, devices_per_host, microbatches, *, param_mem,
                  act_mem, device_memory, max_stages, min_stages, step_cost) -> _StageProblem:
    """:func:`stage_dp`'s arguments checked (a :class:`SearchError` naming the first bad one and
    the fix) and converted."""
    _check_cluster(num_hosts, devices_per_host)
    num_hosts, devices_per_host = int(num_hosts), int(devices_per_host)
    t = _as_cost_array("t_intra", t_intra, None)
    L, _, K, _C = t.shape
    if len(submeshes) != K:
        raise SearchError(
            f"submeshes should list one shape per t_intra submesh index ({K}). Got {len(submeshes)} "
            "shapes. Fix: pass the same submesh list t_intra was computed for."
        )
    shapes = [_check_shape(s, num_hosts, devices_per_host, f"submeshes[{i}]")
              for i, s in enumerate(submeshes)]
    sizes = np.array([n * m for n, m in shapes], dtype=np.int64)
    upper = np.triu(np.ones((L, L), dtype=bool))
    if (t[upper] < 0).any():
        raise SearchError("t_intra should be >= 0 (latencies). Got negative entries. "
                          "Fix: check the cost model.")
    if not _is_count(microbatches, 1):
        raise SearchError(f"microbatches should be an integer >= 1. Got {microbatches!r}. "
                          "Fix: pass the number of micro-batches per step.")
    pm = am = None
    if device_memory is None:
        if param_mem is not None or act_mem is not None:
            raise SearchError(
                "param_mem/act_mem were given without device_memory. Got device_memory=None. "
                "Fix: pass device_memory=<bytes per device> too, or drop the memory arrays."
            )
    else:
        if not isinstance(device_memory, (int, float, np.integer, np.floating)) or not device_memory > 0:
            raise SearchError(f"device_memory should be a positive number of bytes. Got {device_memory!r}. "
                              "Fix: pass the per-device memory in bytes.")
        if param_mem is not None:
            pm = _as_cost_array("param_mem", param_mem, t.shape)
        if act_mem is not None:
            am = _as_cost_array("act_mem", act_mem, t.shape)
    step = None if step_cost is None else _as_cost_array("step_cost", step_cost, t.shape)
    if step is not None and (step[upper] < 0).any():
        raise SearchError("step_cost should be >= 0 (seconds). Got negative entries. "
                          "Fix: check the cost model.")
    problem = _StageProblem(t, shapes, sizes, num_hosts, devices_per_host, int(microbatches), pm,
                            am, step, device_memory, None, 1, merge_allowed=True, min_s=1)
    return _with_counts(problem, max_stages, min_stages)


def _with_counts(problem: _StageProblem, max_stages: object, min_stages: object) -> _StageProblem:
    """``problem`` (its arrays checked) with the stage counts ``min_stages .. max_stages``,
    checked (a :class:`SearchError` naming the bad one and the fix)."""
    if max_stages is not None and not _is_count(max_stages, 1):
        raise SearchError(f"max_stages should be None or an integer >= 1. Got {max_stages!r}. "
                          "Fix: pass e.g. max_stages=8 or leave it out.")
    if not _is_count(min_stages, 1):
        raise SearchError(f"min_stages should be an integer >= 1. Got {min_stages!r}. "
                          "Fix: pass e.g. min_stages=2 or leave it out.")
    natural_cap = min(problem.L, problem.num_devices)
    s_cap = natural_cap if max_stages is None else min(natural_cap, int(max_stages))
    return replace(problem, max_stages=max_stages, s_cap=s_cap, merge_allowed=s_cap == natural_cap,
                   min_s=int(min_stages))


#: :func:`_least_t_max` is sought where its table (layers x widths x submeshes x device counts)
#: has at most this many entries: on a large cluster it costs more than the DP runs it saves.
LEAST_T_MAX_WORK = 1 << 24


class _TMaxSearch:
    """The search of :func:`stage_dp` over the bound ``t_max``: the DP run at candidate bounds
    chosen by bisection with an early stop (see :func:`stage_dp`), the best plan met, and every
    distinct plan met (the alternatives)."""

    def __init__(self, problem: _StageProblem, prep: _Prepared):
        self.problem, self.prep = problem, prep
        self.cands = prep.candidates
        self.evaluated = 0  # DP runs
        self.seen: dict[tuple, tuple[float, list]] = {}  # plan -> (total latency, plan stats)
        self.best = math.inf  # the best total latency found
        self.best_plan: list = []
        self.best_max = math.nan  # its slowest stage's latency
        L, K = prep.tb.shape[1], prep.tb.shape[3]
        self.least = (_least_t_max(prep, problem.sizes, problem.num_devices)
                      if L * L * K * (problem.num_devices + 1) <= LEAST_T_MAX_WORK else -math.inf)

    def run(self, t_val: float):
        """The DP at ``t_max = t_val``, counted (no run below :func:`_least_t_max`'s bound: it
        would find no plan)."""
        self.evaluated += 1
        if t_val < self.least:
            return math.inf, None
        return self.problem.dp(self.prep, t_val)

    def plan_stats(self, stages):
        """Each stage's ``(start, end, q, c, cost, step cost)``, the plan's summed cost (with the
        first stage's per-step cost) and its slowest stage's cost."""
        prep, t, step = self.prep, self.problem.t, self.problem.step
        S = len(stages)
        out = []
        for idx, (a, b, q, c) in enumerate(stages):
            pos = min(S - idx, prep.n_pos) - 1
            if c is None:
                c = int(prep.cfg[pos, a, b - 1, q])
            u = 0.0 if step is None else float(step[a, b - 1, q, c])
            out.append((a, b, q, c, float(t[a, b - 1, q, c]), u))
        costs = [o[4] for o in out]
        return out, sum(costs) + out[0][5], max(costs)

    def remember(self, plan, s_sum: float, s_max: float) -> float:
        """Records a plan met (the first time) and returns its total latency."""
        total = s_sum + (self.problem.B - 1) * s_max
        self.seen.setdefault(tuple((a, b, q, c) for a, b, q, c, _, _ in plan), (total, plan))
        return total

    def start(self) -> float | None:
        """The DP at the largest candidate bound, whose plan is the first best: its value
        ``F(t_hi)``, or None when no plan exists."""
        cands = self.cands
        F_top, st = (math.inf, None) if cands.size == 0 else self.run(float(cands[-1]))
        if st is None:
            return None
        self.best_plan, best_sum, self.best_max = self.plan_stats(st)
        self.best = self.remember(self.best_plan, best_sum, self.best_max)
        return F_top

    def bisect(self, F_top: float) -> None:
        """Bisection over the candidate bounds below the best plan's slowest stage, the interval
        of least lower bound first, until no open interval can beat the best plan."""
        cands = self.cands
        # heap of open intervals of candidate indices (lo, hi), exclusive; F(cands[hi]) known
        heap: list[tuple[float, int, int, float, float]] = []
        self._push(heap, -1, int(np.searchsorted(cands, self.best_max)), math.nan, F_top)
        while heap:
            bound, lo, hi, f_lo, f_hi = heapq.heappop(heap)
            if bound >= self.best:
                break
            mid = (lo + hi) // 2
            f_mid, st = self.run(float(cands[mid]))
            if st is None:
                self._push(heap, mid, hi, math.inf, f_hi)
                continue
            plan, s_sum, s_max = self.plan_stats(st)
            total = self.remember(plan, s_sum, s_max)
            if total < self.best:
                self.best, self.best_plan, self.best_max = total, plan, s_max
            self._push(heap, lo, int(np.searchsorted(cands, s_max)), f_lo, f_mid)
            self._push(heap, mid, hi, f_mid, f_hi)

    def _push(self, heap: list, lo: int, hi: int, f_lo: float, f_hi: float) -> None:
        """Opens the interval ``(lo, hi)`` unless it is empty, known flat, or bounded below by
        the best latency found."""
        if hi - lo <= 1 or not math.isfinite(f_hi) or f_lo == f_hi:
            return
        c = float(self.cands[lo + 1])
        bound = max(f_hi, c) + (self.problem.B - 1) * c
        if bound < self.best:
            heapq.heappush(heap, (bound, lo, hi, f_lo, f_hi))

    def result(self, max_alternatives: int) -> StageDPResult:
        """The best plan, with the best ``max_alternatives`` distinct plans met."""
        shapes = self.problem.shapes

        def assignments(plan) -> tuple[StageAssignment, ...]:
            return tuple(StageAssignment(start=a, end=b, submesh=shapes[q], submesh_index=q,
                                         config_index=c, cost=cost, step_cost=u)
                         for a, b, q, c, cost, u in plan)

        ranked = sorted(self.seen.values(), key=lambda v: v[0])[:max(1, int(max_alternatives))]
        return StageDPResult(stages=assignments(self.best_plan), t_max=self.best_max,
                             total_latency=self.best, evaluated_t_max=self.evaluated,
                             alternatives=tuple((total, assignments(plan))
                                                for total, plan in ranked))


def _raise_infeasible(problem: _StageProblem, explain: bool = True):
    """Raises the :class:`InfeasiblePlanError` of a problem without a plan; with ``explain`` and
    a memory limit, finds the least ``device_memory`` with which one would fit (a bisection of
    DP runs) and says it."""
    p = problem
    if not explain:
        raise InfeasiblePlanError(f"no pipeline plan of {p.L} layers on {p.num_hosts} x "
                                  f"{p.devices_per_host} devices fits "
                                  f"device_memory={p.device_memory!r} bytes.")
    limit = "" if p.max_stages is None else f" with at most {p.max_stages} stages"
    if p.min_s > 1:
        limit += f" and at least {p.min_s}"

    def feasible(dm) -> bool:
        prep = p.prepared(dm)
        if prep.candidates.size == 0:
            return False
        return p.dp(prep, float(prep.candidates[-1]))[1] is not None

    if p.device_memory is None or not feasible(None):
        raise InfeasiblePlanError(
            f"no split of the {p.L} layers into stages{limit} on submeshes {p.shapes} covering all "
            f"{p.num_hosts} x {p.devices_per_host} = {p.num_devices} devices has finite t_intra. "
            f"Got t_intra with {int(np.isfinite(p.t).sum())} finite entries. Fix: provide finite "
            "costs for more (layers, submesh) pairs, allow more stages, or use a smaller cluster."
        )
    # memory is the reason: smallest device_memory with which a plan exists
    t, L = p.t, p.L
    n_pos = min(p.B, p.s_cap)
    pmz = np.zeros_like(t) if p.pm is None else p.pm
    amz = np.zeros_like(t) if p.am is None else p.am
    fin = np.isfinite(t) & np.triu(np.ones((L, L), dtype=bool))[:, :, None, None]
    vals = np.unique(np.concatenate([(pmz + (k + 1) * amz)[fin] for k in range(n_pos)]))
    lo, hi = 0, len(vals) - 1  # feasible(vals[-1]) holds: every choice fits there
    while lo < hi:
        mid = (lo + hi) // 2
        if feasible(float(vals[mid])):
            hi = mid
        else:
            lo = mid + 1
    least = float(vals[lo])
    raise InfeasiblePlanError(
        f"no pipeline plan fits in device_memory={p.device_memory!r} bytes per device (Alpa Eq. "
        f"5: parameters + in-flight 1F1B activations). Got a least feasible memory of {least:.6g} "
        "bytes. Fix: raise device_memory, use more or larger devices, or use fewer micro-batches "
        "in flight.",
        least_memory=least,
    )


def range_sums(a: np.ndarray) -> np.ndarray:
    """``out[i, j] = a[i] + ... + a[j]`` along the first axis (``inf`` when any is ``inf``)."""
    L = a.shape[0]
    bad = ~np.isfinite(a)
    z = np.zeros((1,) + a.shape[1:])
    vals = np.concatenate([z, np.cumsum(np.where(bad, 0.0, a), axis=0)])
    nbad = np.concatenate([z, np.cumsum(bad, axis=0)])
    out = np.full((L,) + a.shape, np.inf)
    for i in range(L):
        seg = vals[i + 1:] - vals[i]
        seg[(nbad[i + 1:] - nbad[i]) > 0] = np.inf
        out[i, i:] = seg
    return out


class MadeOnce:
    """What a stage-DP run reads, made from a recipe the first time it is asked for
    (:meth:`made`) and kept, but never pickled.

    A stage-DP run handed to a worker process carries its recipe: per-layer terms of kilobytes,
    where the arrays over every range of layers, submesh and configuration are tens of megabytes
    on a large cluster (42.5 MB for a lever run of GPT 39B on 64 GPUs), whose copy through the
    pipe and first touch in the worker took longer than making them there. The worker makes them
    by the same operations on the same numbers, so they are the same arrays; a subclass's
    :meth:`_make` says how. What is made stays where it was made (in the caller, for the next
    search of the same table)."""

    _made: Any = None

    def _make(self) -> Any:
        raise NotImplementedError

    def made(self) -> Any:
        if self._made is None:
            self._made = self._make()
        return self._made

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_made": None}


class MadeWhereRead(MadeOnce, Mapping):
    """Stage-DP inputs (the arrays ``t, step, pmem, amem``) made from a recipe where first read
    (:class:`MadeOnce`)."""

    _names = ("t", "step", "pmem", "amem")

    def __getitem__(self, name: str) -> np.ndarray:
        return self.made()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
