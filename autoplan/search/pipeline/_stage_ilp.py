"""TePDist's pipeline-stage ILP: split an operator DAG into stages without linearising it.

Every node ``v`` gets an integer stage ``x_v in [0, S - 1]``; an edge ``u -> v`` needs
``x_v >= x_u``; stages must be balanced, ``FLOPs(stage k) <= (1 + ratio) * total / S``; and the
bytes on edges that cross a stage boundary are minimised. Unlike a split of a topological order
(Alpa's operator clustering, GPipe), parallel branches may go to different stages at will.

Formulation (solved with :func:`autoplan.search.intra._solver.solve`):

* Cumulative binaries ``z[v, k] = [x_v <= k]`` for ``k`` in ``v``'s window, with
  ``z[v, k] <= z[v, k + 1]``. They give ``x_v = sum_k (1 - z[v, k])`` (an integer variable
  ``x_v`` is tied to that sum) and the one-hot stage indicators
  ``y[v, k] = z[v, k] - z[v, k - 1]``.
* Precedence ``x_v >= x_u`` on every edge, stated per stage as ``z[v, k] <= z[u, k]`` (the
  same constraint, and the form whose LP relaxation is tight).
* Cut indicators ``f_uv`` (binary): TePDist's big-M ``f_uv >= (x_v - x_u) / M_uv`` with
  ``M_uv`` the largest difference the windows allow (at most ``S - 1``), plus the equivalent
  per-stage form ``f_uv >= z[u, k] - z[v, k]``, which makes the relaxation much tighter.
* Balance: ``sum_v flops_v y[v, k] <= (1 + ratio) * total / S`` and every stage non-empty
  (``sum_v y[v, k] >= 1``).
* Objective: ``min sum_uv bytes_uv f_uv``. An edge counts once when its endpoints are in
  different stages, however many boundaries it crosses (the tensor is sent straight from the
  producer's mesh to the consumer's). Two edges from one producer count separately.

ASAP/ALAP windows (derived here; TePDist bounds ``x_v`` from accumulated FLOPs): let
``cap = (1 + ratio) * total / S``, ``A_v`` the FLOPs of ``v`` and all its ancestors and ``D_v``
those of ``v`` and all its descendants. The ancestors all sit in stages ``0 .. x_v``, which hold
at most ``(x_v + 1) cap`` FLOPs, so ``x_v >= ceil(A_v / cap) - 1`` (ASAP). The descendants sit in
``x_v .. S - 1``, so ``S - x_v >= ceil(D_v / cap)``, i.e. ``x_v <= S - ceil(D_v / cap)`` (ALAP).
Both are implied by the constraints, so they cut no feasible plan, only variables.

References:
    Alibaba, "TePDist: an HLO-based fully automatic distributed system" (2023), pipeline
    strategy section. The ILP text above is this module's own statement of it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Hashable
from dataclasses import dataclass

import networkx as nx
import pulp

from autoplan._errors import InfeasiblePlanError, SearchError
from autoplan.search.intra._solver import solve

__all__ = ["StageILPResult", "StageBalanceWarning", "stage_ilp", "stage_windows"]


class StageBalanceWarning(UserWarning):
    """The stage FLOPs balance could not be met at the requested ratio; a looser one was used."""


@dataclass(frozen=True)
class StageILPResult:
    """Outcome of :func:`stage_ilp`.

    Attributes:
        assignment: node -> stage (0-based); ``u -> v`` implies ``assignment[u] <= assignment[v]``.
        stage_flops: FLOPs of each stage.
        cut_bytes: bytes over edges whose endpoints are in different stages.
        ratio_used: the imbalance ratio the plan satisfies (the requested one, or a relaxed one).
        solve_seconds: solver time over all attempts.
        status: ``"optimal"``, or ``"feasible"`` when the solver stopped at its time limit.
    """

    assignment: dict[Hashable, int]
    stage_flops: list[float]
    cut_bytes: float
    ratio_used: float
    solve_seconds: float
    status: str = "optimal"


def _validate(dag: object, num_stages: object, ratio: object, time_limit: object):
    if not isinstance(dag, nx.DiGraph) or dag.is_multigraph():
        raise SearchError(
            f"dag should be a networkx.DiGraph. Got {type(dag).__name__}. Fix: build the operator "
            "graph as nx.DiGraph with node attribute 'flops' and edge attribute 'bytes'."
        )
    n = dag.number_of_nodes()
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise SearchError(f"num_stages should be an integer >= 1. Got {num_stages!r}. "
                          "Fix: pass the number of pipeline stages.")
    if num_stages > n:
        raise SearchError(
            f"num_stages should be at most the number of nodes ({n}), since every stage needs a "
            f"node. Got {num_stages}. Fix: use fewer stages or a finer graph."
        )
    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not ratio >= 0 \
            or not math.isfinite(ratio):
        raise SearchError(f"ratio should be a finite number >= 0. Got {ratio!r}. "
                          "Fix: pass e.g. ratio=0.08 (8% imbalance).")
    if not isinstance(time_limit, (int, float)) or not time_limit > 0:
        raise SearchError(f"time_limit should be a positive number of seconds. Got {time_limit!r}.")
    if not nx.is_directed_acyclic_graph(dag):
        cycle = nx.find_cycle(dag)
        raise SearchError(
            f"dag should be acyclic. Got a cycle through {[u for u, _ in cycle]!r}. Fix: pass the "
            "data-flow graph of one training step (loops unrolled or collapsed)."
        )
    for v, data in dag.nodes(data=True):
        f = data.get("flops")
        if not isinstance(f, (int, float)) or isinstance(f, bool) or not math.isfinite(f) or f < 0:
            raise SearchError(f"node {v!r} should have a finite attribute 'flops' >= 0. Got {f!r}. "
                              "Fix: set dag.nodes[v]['flops'].")
    for u, v, data in dag.edges(data=True):
        b = data.get("bytes")
        if not isinstance(b, (int, float)) or isinstance(b, bool) or not math.isfinite(b) or b < 0:
            raise SearchError(f"edge ({u!r}, {v!r}) should have a finite attribute 'bytes' >= 0. "
                              f"Got {b!r}. Fix: set dag.edges[u, v]['bytes'].")


def stage_windows(dag: nx.DiGraph, num_stages: int, ratio: float) -> dict[Hashable, tuple[int, int]] | None:
    """ASAP/ALAP stage windows ``(lo, hi)`` per node from accumulated FLOPs (see module docs).

    Returns ``None`` when some window is empty or a single node exceeds the stage capacity, i.e.
    no plan exists at this ratio.
    """
    S = num_stages
    order = list(nx.topological_sort(dag))
    index = {v: i for i, v in enumerate(order)}
    flops = [float(dag.nodes[v]["flops"]) for v in order]
    total = sum(flops)
    cap = (1.0 + ratio) * total / S
    if total <= 0:
        return {v: (0, S - 1) for v in order}
    if max(flops) > cap * (1 + 1e-12):
        return None
    # ancestor / descendant sets as bitmasks over the topological index
    anc = [0] * len(order)
    for v in order:
        i = index[v]
        m = 1 << i
        for u in dag.predecessors(v):
            m |= anc[index[u]]
        anc[i] = m
    desc = [0] * len(order)
    for v in reversed(order):
        i = index[v]
        m = 1 << i
        for w in dag.successors(v):
            m |= desc[index[w]]
        desc[i] = m

    def mass(mask: int) -> float:
        s = 0.0
        while mask:
            low = mask & -mask
            s += flops[low.bit_length() - 1]
            mask ^= low
        return s

    eps = 1e-9
    out: dict[Hashable, tuple[int, int]] = {}
    for v in order:
        i = index[v]
        lo = max(0, math.ceil(mass(anc[i]) / cap - eps) - 1)
        hi = min(S - 1, S - math.ceil(mass(desc[i]) / cap - eps))
        if lo > hi:
            return None
        out[v] = (lo, hi)
    return out


def _solve_once(dag: nx.DiGraph, S: int, ratio: float, windows, time_limit: float):
    nodes = list(dag.nodes)
    idx = {v: i for i, v in enumerate(nodes)}
    total = sum(float(dag.nodes[v]["flops"]) for v in nodes)
    cap = (1.0 + ratio) * total / S
    prob = pulp.LpProblem("tepdist_stages", pulp.LpMinimize)

    # z[v][k] for k in 0..S-2 : either a binary var or a constant 0/1 outside the window
    z: list[list[object]] = []
    for v in nodes:
        lo, hi = windows[v]
        row: list[object] = []
        for k in range(S - 1):
            if k < lo:
                row.append(0)
            elif k >= hi:
                row.append(1)
            else:
                row.append(prob.add_variable(f"z_{idx[v]}_{k}", cat="Binary"))
        z.append(row)

    def zk(i: int, k: int):
        if k < 0:
            return 0
        if k >= S - 1:
            return 1
        return z[i][k]

    def is_var(e: object) -> bool:
        return isinstance(e, pulp.LpVariable)

    x = {}
    for v in nodes:
        i = idx[v]
        lo, hi = windows[v]
        xv = prob.add_variable(f"x_{i}", lowBound=lo, upBound=hi, cat="Integer")
        x[v] = xv
        prob += xv == pulp.lpSum(1 - zk(i, k) for k in range(S - 1)), f"x_def_{i}"
        for k in range(S - 2):
            a, b = zk(i, k), zk(i, k + 1)
            if is_var(a) or is_var(b):
                prob += a <= b, f"mono_{i}_{k}"

    cut_terms = []
    for e_i, (u, v, data) in enumerate(dag.edges(data=True)):
        iu, iv = idx[u], idx[v]
        for k in range(S - 1):
            a, b = zk(iv, k), zk(iu, k)  # precedence: x_v <= k implies x_u <= k
            if is_var(a) or is_var(b):
                prob += a <= b, f"prec_{e_i}_{k}"
        big_m = windows[v][1] - windows[u][0]  # largest possible x_v - x_u
        if big_m <= 0:
            continue  # x_v == x_u is forced: never cut
        f = prob.add_variable(f"f_{e_i}", cat="Binary")
        prob += big_m * f >= x[v] - x[u], f"bigm_{e_i}"
        for k in range(S - 1):
            a, b = zk(iu, k), zk(iv, k)
            if is_var(a) or is_var(b):
                prob += f >= a - b, f"cut_{e_i}_{k}"
        cut_terms.append(float(data["bytes"]) * f)

    for k in range(S):
        members = [(float(dag.nodes[v]["flops"]), zk(idx[v], k) - zk(idx[v], k - 1)) for v in nodes
                   if windows[v][0] <= k <= windows[v][1]]
        if not members:
            return "infeasible", None, 0.0
        prob += pulp.lpSum(fl * y for fl, y in members) <= cap, f"flops_{k}"
        prob += pulp.lpSum(y for _, y in members) >= 1, f"nonempty_{k}"

    prob += pulp.lpSum(cut_terms) if cut_terms else pulp.lpSum([]), "cut_bytes"
    res = solve(prob, time_limit)
    if res.status == "infeasible":
        timed_out = res.seconds >= 0.95 * time_limit
        return ("timeout" if timed_out else "infeasible"), None, res.seconds
    assign = {}
    for v in nodes:
        val = x[v].varValue
        if val is None:  # pragma: no cover - variable presolved away
            val = sum(1 - (e.varValue if is_var(e) else e) for e in (zk(idx[v], k) for k in range(S - 1)))
        assign[v] = int(round(val))
    return res.status, assign, res.seconds


def stage_ilp(
    dag: nx.DiGraph,
    num_stages: int,
    *,
    ratio: float = 0.08,
    time_limit: float = 30.0,
) -> StageILPResult:
    """Split a DAG into ``num_stages`` balanced pipeline stages with the fewest bytes cut.

    Solves the TePDist ILP of the module docstring:

    .. math::

        \\min \\sum_{(u,v) \\in E} b_{uv} f_{uv} \\quad \\text{s.t.} \\quad
        x_v \\ge x_u,\\; f_{uv} \\ge \\frac{x_v - x_u}{S - 1},\\;
        \\sum_{v: x_v = k} \\mathrm{flops}_v \\le (1 + r) \\frac{\\sum_v \\mathrm{flops}_v}{S},\\;
        x_v \\in [\\mathrm{ASAP}_v, \\mathrm{ALAP}_v].

    If no plan meets ``ratio`` the ratio is multiplied by 1.5 (from at least 0.01) until a plan is
    found, and one :class:`StageBalanceWarning` names the ratio used; at ``1 + ratio >= S`` the balance constraint is void, and a
    plan always exists since ``S`` is at most the number of nodes.

    Args:
        dag: node attribute ``flops`` (>= 0), edge attribute ``bytes`` (>= 0).
        num_stages: ``S``, ``1 <= S <= number of nodes``.
        ratio: allowed imbalance, TePDist's default 8%.
        time_limit: seconds per solver call; at the limit the best plan found is used.

    Returns:
        A :class:`StageILPResult`.

    Raises:
        SearchError: bad input (not a DiGraph, a cycle, missing attributes, bad ``S``).
        InfeasiblePlanError: the solver found no plan within ``time_limit``.
    """
    _validate(dag, num_stages, ratio, time_limit)
    S = num_stages
    nodes = list(dag.nodes)
    if S == 1:
        flops = sum(float(dag.nodes[v]["flops"]) for v in nodes)
        return StageILPResult({v: 0 for v in nodes}, [flops], 0.0, float(ratio), 0.0)
    r = float(ratio)
    seconds = 0.0
    while True:
        windows = stage_windows(dag, S, r)
        status, assign = "infeasible", None
        if windows is not None:
            status, assign, sec = _solve_once(dag, S, r, windows, time_limit)
            seconds += sec
        if assign is not None:
            break
        if status == "timeout":
            raise InfeasiblePlanError(
                f"the stage ILP found no plan within time_limit={time_limit} s "
                f"({dag.number_of_nodes()} nodes, {S} stages, ratio {r:.3g}). Got no incumbent. "
                "Fix: raise time_limit, or coarsen the graph."
            )
        if 1.0 + r >= S:  # balance is void: only a solver failure can get here
            raise InfeasiblePlanError(
                f"no split of the DAG into {S} non-empty stages was found even with the balance "
                f"constraint relaxed to ratio {r:.3g}. Got {dag.number_of_nodes()} nodes. "
                "Fix: use fewer stages."
            )
        r = max(r * 1.5, 0.01)
    if r != ratio:
        warnings.warn(
            f"no {S}-stage split keeps every stage within (1 + {ratio:.3g}) x the average FLOPs; "
            f"relaxing the ratio stepwise (x1.5) found a plan at ratio {r:.3g}. Fix: use fewer "
            "stages or a finer graph to keep stages balanced.",
            StageBalanceWarning,
            stacklevel=2,
        )
    stage_flops = [0.0] * S
    for v in nodes:
        stage_flops[assign[v]] += float(dag.nodes[v]["flops"])
    cut = sum((float(d["bytes"]) for u, v, d in dag.edges(data=True) if assign[u] != assign[v]), 0.0)
    return StageILPResult(
        assignment=assign,
        stage_flops=stage_flops,
        cut_bytes=cut,
        ratio_used=r,
        solve_seconds=seconds,
        status="feasible" if status == "feasible" else "optimal",
    )
