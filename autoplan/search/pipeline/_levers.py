"""Memory levers of the pipeline search: a ZeRO level per stage and rematerialised layers.

A stage that does not fit the memory limit with its layers' plans as solved can still fit by
two levers of large-model training, chosen here per stage inside the stage costs the stage DP
(or the DAG stage ILP's groups) and the schedule simulation use:

* **ZeRO level** ``z`` (Rajbhandari et al., SC'20) over the mesh axes the stage's gradients are
  synchronised over (its data-parallel axes, of ``D`` devices; per tensor the ``d`` of them its
  spec does not split already): ``z >= 1`` shards the optimizer state (``/ d``), ``z >= 2`` the
  gradient accumulation buffers (``/ D``), ``z = 3`` the parameters (``/ d``). Communication,
  from the cluster's collective costs (:meth:`~autoplan.costs._mesh.LogicalMesh.collective_time`):
  ZeRO-1 replaces each gradient all-reduce by a reduce-scatter of the same bytes and
  all-gathers the updated parameters once per step; ZeRO-2 also keeps the accumulated gradient
  sharded, so the reduce-scatter runs after every micro-batch's backward (discounted by the
  cluster's ``gamma`` as any backward gradient collective); ZeRO-3 gathers a layer's parameters
  in its forward and again in its backward, every micro-batch, holds one layer's gathered copy
  at a time, and needs no all-gather after the update. The update's own compute is not divided
  by ``d`` (a conservative estimate).
* **Rematerialisation** of a layer (``jax.checkpoint`` of its forward): the activations it saves
  for the backward drop to its inputs (what it receives from earlier layers and the
  micro-batch), and its backward first runs its forward again (the layer's forward time,
  collectives included). While one rematerialised layer is recomputed its dropped activations
  are live again: the largest of those is held once.

Choice (:func:`choose`): for each ZeRO level that changes anything (lowest first), the
rematerialised layers are added greedily, most bytes saved (times the micro-batches in flight)
per second of recompute first, until the stage fits; the fitting choice of least busy time
(``B x (forward + backward) + per step``) is kept, the lower level on ties. The levers are only
ever applied to a layout whose stages do not fit without them, so a search whose layouts fit
is the same as without levers.

The stage DP sees the levers as extra logical-mesh configurations of a separate DP run
(:func:`lever_run`): each base configuration ``c`` is followed by the variants ``(z, remat all
layers)`` of :data:`DP_VARIANTS`, finite only where the base configuration does not fit at the
deepest pipeline position. Layouts that use a variant are simulated like any other layout, with
the levers then chosen per stage by :func:`choose` at the schedule's real in-flight counts.

Plans record the levers (``Stage.zero``, ``Stage.zero_axes``, ``Stage.remat_layers``) and
their predicted memory is the memory with the levers applied. The stage executor applies them
(:mod:`autoplan.exec._levers`: the backward runs a rematerialised layer's forward operators
again, and ZeRO keeps the state sharded between steps); a plan that uses them says so in its
notes (:data:`EXEC_NOTE`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoplan._memo import memo
from autoplan.plans._spec import ZERO_SHARDED, tile_count
from autoplan.search.intra._spec_space import tiles
from autoplan.search.pipeline._stage_dp import MadeOnce, MadeWhereRead, range_sums

__all__ = ["LayerLevers", "StageLevers", "layer_levers", "choose", "lever_run", "LeverInputs",
           "DP_VARIANTS", "EXEC_NOTE", "ZERO_LEVELS"]

ZERO_LEVELS = (0, 1, 2, 3)

#: The lever variants the stage DP sees per base configuration: ``(ZeRO level, rematerialise
#: every layer of the stage)``. The simulation then picks the least the stage needs.
DP_VARIANTS = ((1, False), (3, False), (0, True), (1, True), (3, True))

#: The note a plan with levers carries (the text summary shows it).
EXEC_NOTE = ("memory levers: stages use ZeRO levels or rematerialised layers to fit the memory "
             "limit; the stage executor (exec.run, launch) applies them, and to_code lists them "
             "(REMAT_LAYERS, remat(), ZERO) for a step of your own")


@dataclass(frozen=True)
class LayerLevers:
    """What the levers change for one layer on one cell (at one micro-batch size).

    Attributes:
        recompute: seconds of the layer's forward run again in its backward when rematerialised.
        recompute_compute: the computation part of it.
        remat_saving: activation bytes per micro-batch in flight the rematerialisation drops.
        zero_saving: resident bytes ZeRO level ``z`` removes (index ``z``; ``[0] == 0``).
        zero_buffer: bytes of the layer's parameters gathered while ZeRO-3 runs it.
        zero_time: ``(forward, backward, per step)`` seconds ZeRO level ``z`` adds (index ``z``).
        zero_bytes: ``{collective kind: bytes}`` per micro-batch and per step that ZeRO level
            ``z`` adds (negative where it removes), index ``z``: ``(per micro-batch, per step)``.
        axes: the mesh axes its gradients are synchronised over (what ZeRO shards over).
        zero_kind_time: ``{collective kind: seconds}`` ZeRO level ``z`` adds (negative where it
            removes), index ``z``: ``(per micro-batch, per step)``; the split by kind of
            ``zero_time``'s collectives.
        max_zero: the highest ZeRO level that leaves every input the user pinned at its pinned
            spec: 0 where a pinned optimizer-state leaf could be sharded further (ZeRO-1 and up
            shard it), 2 where a pinned parameter could (ZeRO-3 shards it), else 3. A stage
            holding the layer uses no higher level.
    """

    recompute: float
    recompute_compute: float
    remat_saving: float
    zero_saving: tuple[float, float, float, float]
    zero_buffer: float
    zero_time: tuple[tuple[float, float, float], ...]
    zero_bytes: tuple[tuple[dict[str, float], dict[str, float]], ...]
    axes: tuple[str, ...]
    zero_kind_time: tuple[tuple[dict[str, float], dict[str, float]], ...] = (({}, {}),) * 4
    max_zero: int = 3


@dataclass(frozen=True)
class StageLevers:
    """The levers chosen for one stage: its ZeRO level, its ZeRO axes and its rematerialised
    layers (indices into the search's layers)."""

    zero: int = 0
    axes: tuple[str, ...] = ()
    remat: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.zero or self.remat)


def layer_levers(table: Any, li: int, k: int, c: int, ratio: float = 1.0,
                 B: int | None = None) -> LayerLevers | None:
    """:class:`LayerLevers` of layer ``li`` on cell ``(k, c)`` of a search's layer table
    (re-timed by ``ratio`` for ``B`` micro-batches); None where the layer has no plan there.
    Once per layer kind, cell and ratio."""
    def make() -> LayerLevers | None:
        tt = table.terms(li, k, c, ratio, B)
        return None if tt is None else _layer_levers(table, li, k, c, ratio, tt)

    # (kept with the table's shared costs, across searches)
    return memo(table.shared, (layer_levers, table.kind[li], k, c, ratio,
                               B if ratio != 1.0 else None), make)


def _layer_levers(table: Any, li: int, k: int, c: int, ratio: float, tt: Any) -> LayerLevers:
    # (what does not read the ratio: once per layer kind and cell, for every ratio)
    kept, zero = memo(table.shared, (_layer_levers, table.kind[li], k, c),
                      lambda: _unscaled_levers(table, li, k, c))
    saving = max(0.0, tt.activation - kept * ratio)
    return LayerLevers(tt.forward, table.cost(li, k, c).forward_compute * ratio, saving, *zero)


def _unscaled_levers(table: Any, li: int, k: int, c: int) -> tuple[float, tuple]:
    """Layer ``li``'s levers on cell ``(k, c)`` that do not read the micro-batch ratio: the
    bytes of the inputs a rematerialised layer keeps, and the ZeRO fields of
    :class:`LayerLevers` (``zero_saving`` .. ``max_zero``)."""
    ctx = table.ctx
    shape = ctx.configs[k][c][0]
    mesh = ctx.mesh(k, shape)
    names = list(mesh.axis_names)
    sizes = dict(zip(names, mesh.shape))
    lc = table.cost(li, k, c)
    res = table.result(li, k, c)
    rep = table.rep[table.kind[li]]
    sub = table.sub(rep)
    # rematerialisation: keep the layer's inputs (not the transient backward inputs)
    transient = table._transient(rep)
    specs = res.solution.specs
    kept = 0.0
    for gi in sub.inputs:
        if gi.kind in ("activation", "batch") and gi.tensor not in transient:
            spec = specs.get(gi.tensor)
            ten = sub.tensors[gi.tensor]
            kept += ten.nbytes / (tiles(spec, mesh) if spec is not None else 1)
    # ZeRO: the gradient-synchronisation axes and what each tensor keeps unsplit over them
    grad_sync = [x for x in lc.step_comms if x.where == "grad-sync"]
    axes = tuple(a for a in names if any(a in x.axes for x in grad_sync) and sizes[a] > 1)
    D = math.prod(sizes[a] for a in axes)
    unsynced = {a: 1 if a in axes else n for a, n in sizes.items()}
    opt = grads = params = 0.0
    gathers: dict[tuple[int, ...], float] = {}
    pinned = _user_pinned(table, sub)
    max_zero = 3
    for i in res.plan.inputs:
        if i.kind not in ("parameter", "optimizer_state"):
            continue
        nbytes = math.prod(i.shape) * np.dtype(i.dtype).itemsize
        used = {a for e in i.spec if e for a in e}
        if i.name in pinned and any(n > 1 and a not in used for a, n in sizes.items()):
            # (ZeRO could shard it over an axis its pinned spec leaves whole: no level that
            # shards its kind, by the rule the stage executor applies)
            max_zero = min(max_zero, max(z for z in ZERO_LEVELS if i.kind not in ZERO_SHARDED[z]))
        free = tuple(names.index(a) for a in axes if a not in used)
        d = math.prod(mesh.shape[a] for a in free)
        local = nbytes / tile_count(i.spec, sizes)
        if i.kind == "optimizer_state":
            opt += local * (1 - 1 / d)
            continue
        grads += nbytes / tile_count(i.spec, unsynced) * (1 - 1 / D)
        params += local * (1 - 1 / d)
        if free:
            gathers[free] = gathers.get(free, 0.0) + local
    zero_saving = (0.0, opt, opt + grads, opt + grads + params)

    def ag(backward: bool = False) -> float:  # the parameters' all-gathers, one latency per group
        return sum(mesh.collective_time("all-gather", b, ax, backward, latency=False)
                   + mesh.latency("all-gather", ax) for ax, b in gathers.items())

    ag_bytes = sum(gathers.values())
    ar = rs = 0.0
    ar_bytes = rs_bytes = 0.0
    rs_groups: set[tuple[int, ...]] = set()
    less: dict[str, float] = {}  # the gradient synchronisation ZeRO replaces, by kind
    for x in grad_sync:
        ax = tuple(names.index(a) for a in x.axes)
        t_x = mesh.collective_time(x.kind, x.bytes, ax, True, latency=False)
        ar += t_x
        less[x.kind] = less.get(x.kind, 0.0) - t_x
        rs += mesh.collective_time("reduce-scatter", x.bytes, ax, True, latency=False)
        if x.kind == "all-reduce":
            ar_bytes += x.bytes
        rs_bytes += x.bytes
        rs_groups.add(ax)
    rs_latency = sum(mesh.latency("reduce-scatter", ax) for ax in rs_groups)
    gather = ag()
    zero_time = ((0.0, 0.0, 0.0),
                 (0.0, 0.0, rs - ar + gather),
                 (0.0, rs + rs_latency, gather - ar),
                 (gather, rs + rs_latency + gather, -ar))
    less_ar = {"all-reduce": -ar_bytes, "reduce-scatter": ar_bytes}
    zero_bytes = (({}, {}),
                  ({}, {**less_ar, "all-gather": ag_bytes}),
                  ({"reduce-scatter": rs_bytes}, {"all-reduce": -ar_bytes,
                                                   "reduce-scatter": ar_bytes - rs_bytes,
                                                   "all-gather": ag_bytes}),
                  ({"reduce-scatter": rs_bytes, "all-gather": 2 * ag_bytes},
                   {"all-reduce": -ar_bytes, "reduce-scatter": ar_bytes - rs_bytes}))
    rs_mb = rs + rs_latency
    kind_time = (({}, {}),
                 ({}, _sum_kinds(less, {"reduce-scatter": rs, "all-gather": gather})),
                 ({"reduce-scatter": rs_mb}, _sum_kinds(less, {"all-gather": gather})),
                 ({"reduce-scatter": rs_mb, "all-gather": 2 * gather}, dict(less)))
    if not axes:  # nothing is synchronised over several devices: ZeRO changes nothing
        zero_saving, zero_time = (0.0,) * 4, ((0.0, 0.0, 0.0),) * 4
        zero_bytes, params, kind_time = (({}, {}),) * 4, 0.0, (({}, {}),) * 4
    return kept, (zero_saving, params if axes else 0.0, zero_time, zero_bytes, axes, kind_time,
                  max_zero)


def _user_pinned(table: Any, sub: Any) -> frozenset[str]:
    """The names of ``sub``'s inputs that the user's pins (by name, as the pipeline search
    holds them) match; the Megatron baseline's layout is not a user's pin."""
    return frozenset(gi.name for pat in table.ctx.pins
                     for gi in sub.find_inputs(pat, names_only=True))


def _sum_kinds(*parts: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in parts:
        for kind, v in part.items():
            out[kind] = out.get(kind, 0.0) + v
    return out


def _apply(terms: Any, lev: Sequence[LayerLevers], zero: int, remat: Sequence[int]) -> Any:
    """A stage's terms (``_Terms``) with ZeRO level ``zero`` on every layer of ``lev`` and the
    layers at positions ``remat`` rematerialised."""
    out = type(terms)(terms.forward, terms.backward, terms.step, terms.resident, terms.activation)
    for x in lev:
        f, b, s = x.zero_time[zero]
        out.forward += f
        out.backward += b
        out.step += s
        out.resident -= x.zero_saving[zero]
    if zero == 3:
        out.resident += max((x.zero_buffer for x in lev), default=0.0)
    for p in remat:
        out.backward += lev[p].recompute
        out.activation -= lev[p].remat_saving
    out.resident += max((lev[p].remat_saving for p in remat), default=0.0)
    return out


def _busy(terms: Any, B: int) -> float:
    return B * (terms.forward + terms.backward) + terms.step


def choose(groups: Sequence[tuple[Sequence[Any], Sequence[Sequence[LayerLevers]],
                                  Sequence[Sequence[int]], float]],
           budget: float, B: int) -> list[tuple[int, tuple[tuple[int, ...], ...], list[Any]]] | None:
    """The levers of the stages that do not fit (see the module docstring): per group of
    stages sharing a mesh (one stage, or an interleaved mesh's chunks) given as ``(terms per
    stage, LayerLevers per stage's layers, layer indices per stage, micro-batches in flight)``,
    ``(ZeRO level, rematerialised layers per stage, new terms per stage)``; None when some group
    fits with no choice. A group's memory is taken as ``sum(resident) + in flight x
    sum(activation)`` (for one stage its memory; an upper bound for an interleaved mesh, whose
    exact memory the simulation then gives)."""
    out = []
    for terms, levs, members, q in groups:
        def memory(ts: Sequence[Any], q: float = q) -> float:
            return sum(t.resident for t in ts) + q * sum(t.activation for t in ts)

        if memory(terms) <= budget * (1 + 1e-9):
            out.append((0, tuple(() for _ in terms), list(terms)))
            continue
        flat = [(s, p) for s, lev in enumerate(levs) for p in range(len(lev))]
        order = sorted((sp for sp in flat if levs[sp[0]][sp[1]].remat_saving > 0),
                       key=lambda sp: -q * levs[sp[0]][sp[1]].remat_saving
                       / max(levs[sp[0]][sp[1]].recompute, 1e-30))
        best = None
        top = min((x.max_zero for lev in levs for x in lev), default=3)
        for z in ZERO_LEVELS:
            if z > top:
                break  # it would shard an input the user pinned
            if z and all(x.zero_saving[z] <= x.zero_saving[z - 1] for lev in levs for x in lev):
                continue  # this level shards nothing more
            chosen: list[list[int]] = [[] for _ in terms]
            ts = [_apply(t, lev, z, ()) for t, lev in zip(terms, levs)]
            for n in range(len(order) + 1):
                if n:
                    s, p = order[n - 1]
                    chosen[s].append(p)
                    ts[s] = _apply(terms[s], levs[s], z, sorted(chosen[s]))
                if memory(ts) <= budget * (1 + 1e-9):
                    busy = sum(_busy(t, B) for t in ts)
                    if best is None or busy < best[0] * (1 - 1e-12):
                        best = (busy, z, tuple(tuple(sorted(members[s][p] for p in ch))
                                               for s, ch in enumerate(chosen)), ts)
                    break
        if best is None:
            return None
        out.append(best[1:])
    return out


# ---------------------------------------------------------------------------------------------
# the stage DP's lever configurations
# ---------------------------------------------------------------------------------------------


def _range_max(a: np.ndarray) -> np.ndarray:
    """``out[i, j] = max(a[i], ..., a[j])`` along the first axis (``-inf`` below the diagonal)."""
    L = a.shape[0]
    out = np.full((L,) + a.shape, -np.inf)
    for i in range(L):
        out[i, i:] = np.maximum.accumulate(a[i:], axis=0)
    return out


def _delta_terms(table: Any, members_of: Sequence[Sequence[int]], ratio: float, B: int,
                 chain: bool) -> _DeltaTerms | None:
    """Per lever variant of :data:`DP_VARIANTS`, the changes ``(t, step, resident, activation)``
    of every stage: over ranges ``(L, L, K, C)`` of a chain (``chain``), or over fixed groups
    ``(S, S, K, C)`` (only ``[g, g]`` used), made where first asked for from each layer's changes
    and peaks (:class:`_DeltaTerms`); None when no layer has any lever."""
    ctx = table.ctx
    K, C = len(ctx.submeshes), ctx.C
    V = len(DP_VARIANTS)
    # per layer: (t, step, resident, activation, zero buffer, remat peak) per variant (a
    # layer's levers are its kind's: made per kind, spread over the layers)
    reps, index = table.kind_index()
    per_kind = np.zeros((6, V, len(reps), K, C))
    any_lever = False
    for q, li in enumerate(reps):
        for k, c in ctx.cells():
            x = layer_levers(table, li, k, c, ratio, B)
            if x is None:
                continue
            any_lever = any_lever or x.remat_saving > 0 or x.zero_saving[3] > 0
            for v, (z, remat) in enumerate(DP_VARIANTS):
                if z > x.max_zero:  # (it would shard an input the user pinned: no stage with it)
                    per_kind[0, v, q, k, c] = np.inf
                    continue
                f, b, s = x.zero_time[z]
                per_kind[:, v, q, k, c] = (f + b + (x.recompute if remat else 0.0), s,
                                           -x.zero_saving[z], -(x.remat_saving if remat else 0.0),
                                           x.zero_buffer if z == 3 else 0.0,
                                           x.remat_saving if remat else 0.0)
    if not any_lever:
        return None
    return _DeltaTerms(per_kind, np.asarray(index), chain,
                       None if chain else [list(m) for m in members_of])


class _DeltaTerms(MadeOnce):
    """:func:`_delta_terms`' array ``(V, 4, L, L, K, C)`` (or over groups), made from each
    layer's changes and peaks where first asked for (:meth:`made`), read-only."""

    def __init__(self, per_kind: np.ndarray, index: np.ndarray, chain: bool,
                 members_of: list[list[int]] | None):
        self.per_kind, self.index, self.chain, self.members_of = per_kind, index, chain, members_of

    def _make(self) -> np.ndarray:
        out = self._sums()
        out.setflags(write=False)
        return out

    def _sums(self) -> np.ndarray:
        per = self.per_kind[:, :, self.index]
        V, L, K, C = per.shape[1:]
        if self.chain:
            out = np.empty((V, 4, L, L, K, C))
            for v in range(V):
                for q in range(4):
                    # (variants that change a quantity alike share its sums: ZeRO's level alone
                    # sets the per-step time, rematerialisation alone most activations)
                    same = next((w for w in range(v) if np.array_equal(per[q, w], per[q, v])),
                                None)
                    out[v, q] = range_sums(per[q, v]) if same is None else out[same, q]
            made: list[tuple[int, np.ndarray]] = []
            for v in range(V):  # (then the peaks, once the sums are all made)
                add = next((a for w, a in made if np.array_equal(per[4:, w], per[4:, v])), None)
                if add is None:
                    peaks = _range_max(per[4, v])
                    peaks += _range_max(per[5, v])
                    add = np.where(np.isfinite(peaks), peaks, 0.0)
                    made.append((v, add))
                out[v, 2] += add
            return out
        members_of = self.members_of or []
        S = len(members_of)
        out = np.full((V, 4, S, S, K, C), np.inf)
        for g, members in enumerate(members_of):
            idx = list(members)
            for v in range(V):
                part = per[:, v][:, idx]
                out[v, :, g, g] = np.stack([part[0].sum(0), part[1].sum(0),
                                            part[2].sum(0) + part[4].max(0) + part[5].max(0),
                                            part[3].sum(0)])
        return out


def lever_run(table: Any, base: dict[str, np.ndarray], members_of: Sequence[Sequence[int]] | None,
              ratio: float, B: int) -> LeverInputs | None:
    """The stage-DP inputs of the lever run beside a base run's ``base`` inputs (its arrays
    ``t, step, pmem, amem`` after :func:`~autoplan.search.pipeline._layouts._dp_inputs`):
    configurations ``c + C v`` for the variants ``v >= 1`` of :data:`DP_VARIANTS` (``C`` the
    search's configurations per submesh), finite only where the base configuration does not fit
    the memory limit at the deepest pipeline position, and never faster than it. None when no
    entry needs a lever (the run would find nothing new) or no layer has a lever."""
    ctx = table.ctx
    t, pm, am = base["t"], base["pmem"], base["amem"]
    L = t.shape[0]
    deep = min(B, L, ctx.num_hosts * ctx.devices_per_host)
    need = np.isfinite(t) & (pm + deep * am > ctx.budget * (1 + 1e-9))
    if not need.any():
        return None
    groups = None if members_of is None else tuple(map(tuple, members_of))
    # (budget-free: kept across searches with the table's shared costs)
    deltas = memo(table.shared, (_delta_terms, ratio, B, groups),
                  lambda: _delta_terms(table, members_of or [], ratio, B, members_of is None))
    if deltas is None:
        return None
    return LeverInputs(base, deltas, need, B, ctx.schedule == "gpipe")


class LeverInputs(MadeWhereRead):
    """The stage-DP inputs of a lever run (:func:`lever_run`), the arrays ``t, step, pmem, amem``
    over configurations ``c + C v``, made from the base run's inputs and the lever deltas where
    first read (:class:`~autoplan.search.pipeline._stage_dp.MadeWhereRead`): a run handed to a
    worker process makes them there from the terms of both, so the search's caller makes only
    those of the runs it takes."""

    def __init__(self, base: Mapping[str, np.ndarray], deltas: _DeltaTerms, need: np.ndarray,
                 B: int, gpipe: bool):
        self.base, self.deltas, self.need, self.B, self.gpipe = base, deltas, need, B, gpipe

    def _make(self) -> dict[str, np.ndarray]:
        """Each variant's arrays: inf but where the base configuration needs a lever (computed
        there only, the same sums entry by entry)."""
        t, step, pm, am = (self.base[name] for name in ("t", "step", "pmem", "amem"))
        deltas = self.deltas.made()
        V, C, B = len(deltas), t.shape[3], self.B
        out = {name: np.full(t.shape[:3] + ((V + 1) * C,), np.inf)
               for name in ("t", "step", "pmem", "amem")}
        for name, base_arr in (("t", t), ("step", step), ("pmem", pm), ("amem", am)):
            out[name][..., :C] = base_arr
        at = np.nonzero(self.need)
        t_n, step_n, pm_n, am_n = t[at], step[at], pm[at], am[at]
        for v, dv in enumerate(deltas):
            dt, ds, dr, da = (x[at] for x in dv)
            ok = np.isfinite(dt)
            where = tuple(i[ok] for i in at[:3]) + (at[3][ok] + (v + 1) * C,)
            out["t"][where] = np.maximum(t_n + dt, t_n)[ok]
            out["step"][where] = np.maximum(step_n + ds, 0.0)[ok]
            res = pm_n + dr + (B * da if self.gpipe else 0.0)
            out["pmem"][where] = np.maximum(res, 0.0)[ok]
            out["amem"][where] = np.maximum(am_n + (0.0 if self.gpipe else da), 0.0)[ok]
        return out


def fit_layout(table: Any, chunks: Sequence[tuple[Sequence[int], int, int]], stages: Sequence[Any],
               kind: str, meshes: int, stats: Any, ratio: float, B: int
               ) -> tuple[tuple[StageLevers, Any], ...] | None:
    """The levers of a simulated layout that does not fit (:func:`choose`), per stage (chunk)
    ``(StageLevers, its terms with them)``; None when no choice fits. The micro-batches in
    flight are the schedule's: GPipe ``B``, 1F1B ``min(S - s, B)``, the simulated peaks of
    ZB-H1 (per stage) and of interleaved 1F1B (per mesh, over its chunks)."""
    from autoplan.plans._schedule import inflight_counts  # noqa: PLC0415

    S = len(chunks)
    levs = []
    for members, k, c in chunks:
        lev = [layer_levers(table, li, k, c, ratio, B) for li in members]
        if any(x is None for x in lev):
            return None
        levs.append(lev)
    inflight = inflight_counts(kind, S, B, stats, meshes)
    if kind == "interleaved":
        parts = [list(range(g, S, meshes)) for g in range(meshes)]
    else:
        parts = [[s] for s in range(S)]
    groups = [([stages[s] for s in part], [levs[s] for s in part],
               [list(chunks[s][0]) for s in part], float(q)) for part, q in zip(parts, inflight)]
    got = choose(groups, table.ctx.budget, B)
    if got is None:
        return None
    out: list[Any] = [None] * S
    for part, (z, remat, terms) in zip(parts, got):
        for s, r, t in zip(part, remat, terms):
            axes = tuple(dict.fromkeys(a for x in levs[s] for a in x.axes)) if z else ()
            out[s] = (StageLevers(z if axes else 0, axes, tuple(r)), t)
    return tuple(out)


def stage_extras(table: Any, members: Sequence[int], k: int, c: int, lv: StageLevers, B: int
                 ) -> tuple[float, dict[str, float], dict[str, float]]:
    """What a stage's levers add to its plan's accounting, per step: ``(compute seconds,
    {collective kind: bytes}, {collective kind: seconds})`` (the recomputed forwards; ZeRO's
    collectives, negative where it removes the gradient all-reduce). Their seconds are in the
    stage's forward, backward and per-step times."""
    compute = 0.0
    nbytes: dict[str, float] = {}
    seconds: dict[str, float] = {}
    for li in members:
        x = layer_levers(table, li, k, c)
        if x is None:
            continue
        if li in lv.remat:
            compute += B * x.recompute_compute
        for got, per_level in ((nbytes, x.zero_bytes), (seconds, x.zero_kind_time)):
            per_mb, per_step = per_level[lv.zero]
            for times, part in ((B, per_mb), (1, per_step)):
                for kind, v in part.items():
                    got[kind] = got.get(kind, 0.0) + times * v
    return compute, nbytes, seconds
