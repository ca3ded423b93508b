"""The candidate layouts of the pipeline search at one micro-batch count: the layers' data-flow
DAG (a chain, side tensors aside, or a true DAG), the stage DP's inputs over a chain of layers
or over the DAG stage ILP's fixed stages, and the stage-DP runs (tasks on the search's worker
processes) whose best ``t_max`` optima are the layouts simulated; the Megatron baseline's grid.

See :mod:`~autoplan.search.pipeline._pipeline` (step 5 of its docstring).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from autoplan._errors import InfeasiblePlanError, SearchError
from autoplan._memo import memo
from autoplan.search._parallel import Task, run_tasks
from autoplan.search.fold._layers import LayerGroup
from autoplan.search.pipeline._cost_table import _Context, _Table
from autoplan.search.pipeline._stage_dp import (
    MadeWhereRead,
    range_sums,
    stage_dp,
    stage_dp_counts,
)
from autoplan.tracing._graph import OpGraph

#: A forward edge that skips layers and carries at most this fraction of the median bytes passed
#: between adjacent layers is a side tensor (a scalar loss term, a small statistic): it does not
#: make the layer graph a non-chain.
SIDE_TENSOR_FRACTION = 0.01

#: Layouts of each stage-DP run simulated (its best ``t_max`` optima).
DP_ALTERNATIVES = 6

#: Besides the best over any number of stages and the one-stage layout, the stage DP gives the
#: best layouts of each of these stage counts (so every count is a ranked candidate). Not the
#: counts the DAG stage ILP groups the layers for (:func:`_dag_ilp_stage_counts`): those are
#: groupings of a layer DAG, each then costed by the DP over any number of stages.
RANKED_STAGE_COUNTS = (2, 4, 8, 16)


# ---------------------------------------------------------------------------------------------
# the layer graph
# ---------------------------------------------------------------------------------------------


def layer_dag(graph: OpGraph, layers: list[LayerGroup]):
    """The layers' forward data-flow DAG (networkx): node ``i`` has ``flops``; an edge carries the
    ``bytes`` of forward tensors from layer i to layer j, and ``side`` (True for an edge that
    skips layers carrying at most :data:`SIDE_TENSOR_FRACTION` of the median bytes between
    adjacent layers)."""
    import networkx as nx  # noqa: PLC0415

    of = {o: ly.index for ly in layers for o in ly.forward}
    g = nx.DiGraph()
    for ly in layers:
        g.add_node(ly.index, flops=ly.flops)
    for ly in layers:
        for o in ly.forward:
            for t in graph.ops[o].outputs:
                for c in set(graph.consumers[t]):
                    j = of.get(c)
                    if j is not None and j != ly.index:
                        a, b = (ly.index, j) if ly.index < j else (j, ly.index)
                        w = graph.tensors[t].nbytes
                        if g.has_edge(a, b):
                            g.edges[a, b]["bytes"] += w
                        else:
                            g.add_edge(a, b, bytes=float(w))
    adjacent = [d["bytes"] for a, b, d in g.edges(data=True) if b == a + 1]
    ref = float(np.median(adjacent)) if adjacent else 0.0
    for a, b, d in g.edges(data=True):
        d["side"] = b != a + 1 and d["bytes"] <= SIDE_TENSOR_FRACTION * ref
    return g


def _is_chain(dag) -> bool:
    """Every edge joins adjacent layers, or is a side tensor."""
    return all(b == a + 1 or d.get("side", False) for a, b, d in dag.edges(data=True))

# ---------------------------------------------------------------------------------------------
# stage-DP inputs
# ---------------------------------------------------------------------------------------------


def _dp_inputs(t: np.ndarray, step: np.ndarray, pmem: np.ndarray, amem: np.ndarray,
               schedule: str, B: int) -> dict[str, np.ndarray]:
    """The arrays :func:`stage_dp` takes; GPipe keeps all ``B`` micro-batches in flight on every
    stage (folded into the per-stage memory)."""
    if schedule == "gpipe":
        pmem, amem = pmem + B * amem, np.zeros_like(amem)
    return {"t": t, "step": step, "pmem": pmem, "amem": amem}


def _chain_inputs(table: _Table, ratio: float = 1.0, B: int | None = None) -> MadeWhereRead:
    """``t_intra``, per-step, resident and activation arrays ``(L, L, K, C)`` of the contiguous
    stages of a chain of layers (see :mod:`~autoplan.search.pipeline._pipeline`, step 4), made
    where first read (:class:`_ChainInputs`)."""
    B = B or table.B
    terms = memo(table.shared, (_chain_terms, ratio, B), lambda: _chain_terms(table, ratio, B))
    return _ChainInputs(terms, table.ctx.schedule, B)


def _chain_terms(table: _Table, ratio: float, B: int) -> _ChainTerms:
    """:func:`_chain_inputs`' arrays before the schedule's folding, made where first read from
    each layer kind's terms per cell, the resharding between two layers of a stage, and the time
    to receive a stage's input activations and output gradients (they read neither the schedule
    nor the memory budget: kept across searches with the table's shared costs, read-only)."""
    ctx, L = table.ctx, table.L
    K, C = len(ctx.submeshes), ctx.C
    cells = list(ctx.cells())
    # (a layer's terms are its kind's: made per kind, spread over the layers)
    reps, index = table.kind_index()
    per_kind = np.full((4, len(reps), K, C), np.inf)  # forward + backward, step, resident, activation
    for q, li in enumerate(reps):
        for k, c in cells:
            tt = table.terms(li, k, c, ratio, B)
            if tt is not None:
                per_kind[:, q, k, c] = (tt.forward + tt.backward, tt.step, tt.resident,
                                        tt.activation)
    # resharding between two layers of a stage: P[lo, hi] charged to every range holding both
    # (the pairs passing alike, by :meth:`_Table._fold`, cost alike: made once per fold, added
    # in the pairs' order; 0 on no cell)
    pairs: list[tuple[int, int, int]] = []
    by_fold: dict[tuple, int] = {}
    folds: list[tuple[np.ndarray, np.ndarray]] = []
    for a, b in table.passing():
        fold = table._fold(a, b)
        f_id = by_fold.get(fold)
        if f_id is None:
            fb, st = np.zeros((K, C)), np.zeros((K, C))
            for k, c in cells:
                f, bw, s = table.pair_terms(a, b, k, c, ratio)
                fb[k, c], st[k, c] = f + bw, s
            f_id = by_fold[fold] = len(folds)
            folds.append((fb, st))
        pairs.append((min(a, b), max(a, b), f_id))
    # receiving the input activations (cut i) and the output gradients (cut j + 1)
    fwd, bwd = table.boundary_bytes(list(range(L)), L)
    recv = [(np.array([0.0] + [ctx.recv_estimate(x * ratio, k) for x in fwd]),
             np.array([ctx.recv_estimate(x * ratio, k) for x in bwd] + [0.0])) for k in range(K)]
    return _ChainTerms(per_kind, np.asarray(index), pairs, folds, recv)


class _ChainTerms(MadeWhereRead):
    """:func:`_chain_terms`' arrays, made from their terms where first read."""

    def __init__(self, per_kind: np.ndarray, index: np.ndarray, pairs: list[tuple[int, int, int]],
                 folds: list[tuple[np.ndarray, np.ndarray]],
                 recv: list[tuple[np.ndarray, np.ndarray]]):
        self.per_kind, self.index, self.pairs, self.folds, self.recv = (per_kind, index, pairs,
                                                                         folds, recv)

    def _make(self) -> dict[str, np.ndarray]:
        L, K, C = len(self.index), *self.per_kind.shape[2:]
        t, step, pmem, amem = (range_sums(x) for x in self.per_kind[:, self.index])
        pair_mb, pair_step = np.zeros((L, L, K, C)), np.zeros((L, L, K, C))
        for lo, hi, f_id in self.pairs:
            fb, st = self.folds[f_id]
            pair_mb[lo, hi] += fb
            pair_step[lo, hi] += st
        for arr, pair in ((t, pair_mb), (step, pair_step)):
            inner = np.cumsum(pair, axis=1)  # over hi <= j
            arr += np.cumsum(inner[::-1], axis=0)[::-1]  # over lo >= i
        for k, (recv_f, recv_b) in enumerate(self.recv):
            t[:, :, k, :] += (recv_f[:, None] + recv_b[None, :])[:, :, None]
        for a in (t, step, pmem, amem):
            a.setflags(write=False)
        return dict(zip(self._names, (t, step, pmem, amem)))


class _ChainInputs(MadeWhereRead):
    """:func:`_chain_inputs`: the terms' arrays folded for the schedule (:func:`_dp_inputs`)."""

    def __init__(self, terms: _ChainTerms, schedule: str, B: int):
        self.terms, self.schedule, self.B = terms, schedule, B

    def _make(self) -> dict[str, np.ndarray]:
        return _dp_inputs(*(self.terms[name] for name in self._names), self.schedule, self.B)


def _group_inputs(table: _Table, groups: list[list[int]], ratio: float = 1.0,
                  B: int | None = None) -> dict[str, np.ndarray]:
    """The same arrays over fixed stages (``groups``, in pipeline order): only ``[g, g]`` is
    finite, so the DP keeps each group one stage and picks its submesh and logical mesh."""
    ctx = table.ctx
    B = B or table.B
    S, K, C = len(groups), len(ctx.submeshes), ctx.C
    arrs = np.full((4, S, S, K, C), np.inf)
    stage_of = [0] * table.L
    for g, members in enumerate(groups):
        for li in members:
            stage_of[li] = g
    fwd, bwd = table.boundary_bytes(stage_of, S)
    for g, members in enumerate(groups):
        for k, c in ctx.cells():
            tt = table.stage(members, k, c, ratio, B)
            if tt is None:
                continue
            recv = (ctx.recv_estimate(fwd[g - 1] * ratio, k) if g > 0 else 0.0) + (
                ctx.recv_estimate(bwd[g] * ratio, k) if g < S - 1 else 0.0)
            arrs[:, g, g, k, c] = (tt.forward + tt.backward + recv, tt.step, tt.resident,
                                   tt.activation)
    return _dp_inputs(*arrs, ctx.schedule, B)


# A layout: one (layer indices, submesh index, config index) per stage, in pipeline order.
Layout = tuple[tuple[tuple[int, ...], int, int], ...]


def _stage_dp_runs(inputs: dict[str, np.ndarray], submeshes: list[tuple[int, int]],
                   num_hosts: int, devices_per_host: int, B: int,
                   counts: Sequence[tuple[int, int | None]], budget: float | None
                   ) -> list[tuple[tuple[float, tuple[tuple[int, int, int, int], ...]], ...]]:
    """The :func:`stage_dp` runs of one set of cost arrays, one per ``(least, most)`` stage
    count range of ``counts`` (:func:`stage_dp_counts`: the per-position tables made once; a
    module-level function: the runs of a search are independent tasks of
    :func:`~autoplan.search._parallel.run_tasks`): each run's best ``t_max`` optima as ``(DP
    latency, ((start, end, submesh index, config index), ...))``, none when no layout exists;
    with ``budget`` every stage fits it (Alpa's Eq. 5)."""
    kw = ({"param_mem": inputs["pmem"], "act_mem": inputs["amem"], "device_memory": budget}
          if budget is not None else {})
    out = []
    for r in stage_dp_counts(inputs["t"], submeshes, num_hosts, devices_per_host, B, counts,
                             step_cost=inputs["step"], max_alternatives=DP_ALTERNATIVES,
                             explain=False, **kw):
        out.append(() if isinstance(r, InfeasiblePlanError) else tuple(
            (total, tuple((st.start, st.end, st.submesh_index, st.config_index)
                          for st in stages)) for total, stages in r.alternatives))
    return out


def _least_fitting_memory(inputs: dict[str, np.ndarray], ctx: _Context, B: int) -> float | None:
    """The least memory per device with which some layout of ``inputs`` would fit (a bisection
    of DP runs, sought only to say why nothing fits)."""
    try:
        stage_dp(inputs["t"], ctx.submeshes, ctx.num_hosts, ctx.devices_per_host, B,
                 step_cost=inputs["step"], param_mem=inputs["pmem"], act_mem=inputs["amem"],
                 device_memory=ctx.budget)
    except InfeasiblePlanError as err:
        return err.least_memory
    return None



# ---------------------------------------------------------------------------------------------
# layouts of one micro-batch count
# ---------------------------------------------------------------------------------------------


def _dag_ilp_stage_counts(L: int, D: int) -> list[int]:
    """Stage counts the DAG stage ILP is solved for: 2 .. 8, then powers of two, up to
    ``min(L, D)``."""
    cap = min(L, D)
    return [s for s in sorted({*range(2, 9), 16, 32, 64}) if s <= cap]


def _cells(layouts: Iterable[Layout]) -> list[tuple[int, int, int]]:
    """The ``(layer, submesh k, config c)`` cells the stages of ``layouts`` use."""
    return list(dict.fromkeys((li, k, c) for lay in layouts for members, k, c in lay
                              for li in members))


def _layouts(table: _Table, dag, use_ilp: bool, ratio: float = 1.0, B: int | None = None,
             full: bool = True, explain: bool = False, workers: int = 1
             ) -> tuple[dict[Layout, float], bool, float | None, float]:
    """The candidate layouts of ``table`` (re-timed by ``ratio`` for ``B`` micro-batches):
    ``(layouts with the DP's latency, whether they fit, the least memory that would fit, DP
    seconds)``. ``full`` runs the DP for each stage count of :data:`RANKED_STAGE_COUNTS` too (else the
    DP over any number of stages and the one-stage layout only). ``explain`` seeks the least
    memory that would fit when nothing does (a bisection of DP runs: only for a message). The
    DP runs are tasks on ``workers`` processes (:func:`_layouts_of`)."""
    return _layouts_of(table, dag, use_ilp, [(ratio, B or table.B, full)], explain, workers)[0]


def _layouts_of(table: _Table, dag, use_ilp: bool, items: Sequence[tuple[float, int, bool]],
                explain: bool = False, workers: int = 1
                ) -> list[tuple[dict[Layout, float], bool, float | None, float]]:
    """:func:`_layouts` of several ``(ratio, B, full)`` items at once: every stage-DP run of
    every item is an independent task (:func:`_stage_dp_runs`, the stage-count ranges of one set of cost arrays together) of one batch on ``workers``
    processes, first with the memory limit; the items where no layout fits it are run again
    without it (their layouts are then marked as not fitting). Each item's layouts come in the
    order one process would meet them; the seconds are the batch's, shared by its items."""
    ctx = table.ctx
    t0 = time.perf_counter()
    if ctx.megatron:
        lays = _megatron_layouts(table, grid=ctx.megatron == "grid")
        return [({lay: math.nan for lay in lays}, True, None, time.perf_counter() - t0)
                for _ in items]
    runs: list[Any] = [None] * len(items)

    def build(idx: Sequence[int]) -> None:
        for i in idx:
            runs[i] = _dp_runs(table, dag, use_ilp, *items[i])

    def dp_tasks(idx: Sequence[int], memory: bool) -> list[Task]:
        return [Task(_stage_dp_runs, None, (runs[i][r][0], ctx.submeshes, ctx.num_hosts,
                                            ctx.devices_per_host, items[i][1], list(counts),
                                            ctx.budget if memory else None),
                     label=f"stage DP, {items[i][1]} micro-batches, {len(counts)} stage counts")
                for i in idx for r, (_, counts, _, _) in enumerate(runs[i])]

    def build_and_run(idx: Sequence[int], memory: bool) -> list[Any]:
        build(idx)
        return run_tasks(dp_tasks(idx, memory), workers=workers)

    build([0])
    out: list[Any] = [None] * len(items)
    leasts: dict[int, float | None] = {}
    todo = list(range(len(items)))
    for memory in (True, False):
        if runs[-1] is None:
            # the first item's runs go to the workers while this process makes the other items'
            # arrays and then runs theirs (a local task ahead of them, whose batch the workers
            # join as they finish the first item's): the same tasks, and their outcomes in order
            rest = Task(build_and_run, None, (todo[1:], memory), label="stage-DP arrays and "
                        "runs of the other micro-batch counts", local=True)
            first = run_tasks([rest, *dp_tasks(todo[:1], memory)], workers=workers)
            for category, message in first[0].warnings:
                warnings.warn(message, category, stacklevel=2)
            outcomes = first[1:] + first[0].result()
        else:
            outcomes = run_tasks(dp_tasks(todo, memory), workers=workers)
        results = [res for o in outcomes for res in o.result()]
        found: dict[int, dict[Layout, float]] = {i: {} for i in todo}
        empty_runs: dict[int, list[int]] = {i: [] for i in todo}
        n = 0
        for i in todo:
            for r, (_, counts, members, levered) in enumerate(runs[i]):
                got_any = False
                for _ in counts:
                    for total, stages in results[n]:
                        if levered and all(c < ctx.C for _, _, _, c in stages):
                            continue  # (a lever run's layouts without a lever: the base run's)
                        found[i].setdefault(tuple((members(a, b), k, c % ctx.C)
                                                  for a, b, k, c in stages), total)
                        got_any = True
                    n += 1
                if not got_any:
                    empty_runs[i].append(r)
        left = []
        for i in todo:
            if memory and explain:
                for r in empty_runs[i]:
                    lm = _least_fitting_memory(runs[i][r][0], ctx, items[i][1])
                    if lm is not None:
                        least = leasts.get(i)
                        leasts[i] = lm if least is None else min(least, lm)
            if found[i] or not memory:
                out[i] = (found[i], memory)
            else:
                left.append(i)
        todo = left
        if not todo:
            break
    seconds = time.perf_counter() - t0
    return [(found_i, fits, leasts.get(i), seconds) for i, (found_i, fits) in enumerate(out)]


def _megatron_layouts(table: _Table, grid: bool = True) -> list[Layout]:
    """The Megatron TP x PP x DP baseline's layouts, as Megatron-LM's own benchmark grid-searches
    them: ``PP`` pipeline stages of equal layer counts (every ``PP`` dividing the devices, up to
    the layers), each on ``N / PP`` devices viewed as a ``DP x TP`` mesh with tensor parallelism
    of 1, 2, 4 or 8 devices inside a node (``TP`` on the inner axis). The micro-batch count is
    searched over them as for any layout. Without ``grid`` the one layout of one stage per node,
    tensor parallelism over the node's devices."""
    ctx, L = table.ctx, table.L
    n, per = ctx.num_hosts * ctx.devices_per_host, ctx.devices_per_host
    out: list[Layout] = []
    for pp in range(1, min(L, n) + 1):
        d = n // pp
        if n % pp or not grid and (pp != ctx.num_hosts or ctx.num_hosts == 1):
            continue
        sub = (1, d) if d <= per else (d // per, per)
        if sub not in ctx.submeshes or sub[0] * sub[1] != d:
            continue
        k = ctx.submeshes.index(sub)
        cuts = [round(i * L / pp) for i in range(pp + 1)]
        for c, (shape, lean) in enumerate(ctx.configs[k]):
            if lean or len(shape) != 2 or shape[1] not in (1, 2, 4, 8) or shape[1] > per:
                continue
            if not grid and shape != (1, per):
                continue
            out.append(tuple((tuple(range(cuts[i], cuts[i + 1])), k, c) for i in range(pp)))
    if not out:
        raise InfeasiblePlanError(f"Megatron TP x PP: no stage layout of {L} layers on "
                                  f"{ctx.num_hosts} x {per} devices.")
    return out


def _dp_runs(table: _Table, dag, use_ilp: bool, ratio: float, B: int, full: bool):
    """The stage-DP runs of one ``(ratio, B, full)`` item: ``(DP inputs, [(least, most)
    stages], layer indices of a run's stage start .. end)`` per run: one run over the chain of
    layers, or one per grouping of TePDist's DAG stage ILP."""
    ctx, L = table.ctx, table.L
    num_devices = ctx.num_hosts * ctx.devices_per_host
    if not use_ilp:
        counts: list[tuple[int, int | None]] = [(1, None), (1, 1)]
        if full:
            counts += [(s, s) for s in RANKED_STAGE_COUNTS if s <= min(L, num_devices)]

        def members(a: int, b: int) -> tuple[int, ...]:
            return tuple(range(a, b))

        base = _chain_inputs(table, ratio, B)
        return [(base, counts, members, False)] + _lever_runs(table, [(base, counts, members)],
                                                               None, ratio, B)
    from autoplan.search.pipeline._stage_ilp import stage_ilp  # noqa: PLC0415

    if ctx.groupings is None:
        ctx.groupings = [[list(range(L))]]
        for S in _dag_ilp_stage_counts(L, num_devices):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    r = stage_ilp(dag, S, time_limit=ctx.time_limit)
            except (InfeasiblePlanError, SearchError):
                continue
            groups = [sorted(v for v, s in r.assignment.items() if s == st) for st in range(S)]
            if all(groups):
                ctx.groupings.append(groups)
    out = []
    for groups in ctx.groupings:
        run = (_group_inputs(table, groups, ratio, B), [(1, None)],
               lambda a, b, g=groups: tuple(li for x in range(a, b) for li in g[x]))
        out += [(*run, False)] + _lever_runs(table, [run], groups, ratio, B)
    return out


def _lever_runs(table: _Table, runs: list, groups: list[list[int]] | None, ratio: float,
                B: int) -> list:
    """The lever runs (:func:`~autoplan.search.pipeline._levers.lever_run`) beside base runs:
    their layouts are kept only where they use a lever configuration."""
    if not table.ctx.levers:
        return []
    from autoplan.search.pipeline._levers import lever_run  # noqa: PLC0415

    out = []
    for inputs, counts, members in runs:
        lever = lever_run(table, inputs, groups, ratio, B)
        if lever is not None:
            out.append((lever, counts, members, True))
    return out
