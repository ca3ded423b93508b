"""Exact reductions of an :class:`ILPProblem` before it is solved.

Variable elimination (:class:`_Reducer`: a node with at most two neighbours is solved out and
recovered after the solve), dominance pruning, and the folding of separable edges
(``m[a, b] = x[a] + y[b]``) into node costs once the strategies left are known. Each keeps the
optimum unchanged (see :mod:`autoplan.search.intra._ilp`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from autoplan.search.intra._ilp_problem import ILPProblem, _compress, _unique_rows


def _reduce(prob: ILPProblem, reduce: bool, memory_weight: float
            ) -> tuple[_Reducer | None, list[np.ndarray], list[tuple], list[bool]]:
    """Each node's objective (time, plus ``memory_weight`` times memory) and, when ``reduce``,
    the nodes with at most two neighbours eliminated: the reducer, node costs, edges, and which
    nodes stay in the model."""
    reducer: _Reducer | None = None
    costs = [n.cost + memory_weight * np.asarray(n.memory, dtype=float) if memory_weight
             else n.cost for n in prob.nodes]
    edges = prob.edges
    active = [True] * len(prob.nodes)
    if reduce:
        reducer = _Reducer(prob, costs)
        reducer.run()
        costs = reducer.cost
        edges = [tuple(e) for e in reducer.edges.values()]
        active = [reducer.alive[v] or reducer.k[v] == 1 for v in range(len(prob.nodes))]
    return reducer, [np.array(c, dtype=float) for c in costs], edges, active


def _fold_separable_edges(edges: Iterable[tuple], costs: list[np.ndarray],
                          present: Sequence[np.ndarray | None]) -> list[tuple]:
    """Restrict edges to the strategies still present, and fold separable ones
    (``m[a, b] = x[a] + y[b]``) into the node costs (updated in place); returns the rest.

    The edges come compressed and tested for separability as they are (by the reducer, or by
    :func:`build_problem` without it): an edge whose every group still has a strategy present
    is kept as it is, and only restricted edges are tested again.
    """
    kept_edges = []
    for u, w, gu, gw, m in edges:
        nu, nw = m.shape
        rmask = np.zeros(nu, dtype=bool)
        rmask[gu[present[u]]] = True
        cmask = np.zeros(nw, dtype=bool)
        cmask[gw[present[w]]] = True
        if rmask.all() and cmask.all():
            kept_edges.append((u, w, gu, gw, m))
            continue
        rows = np.flatnonzero(rmask)
        cols = np.flatnonzero(cmask)
        m = m[np.ix_(rows, cols)]
        ru = np.full(int(gu.max()) + 1, -1)
        ru[rows] = np.arange(len(rows))
        rw = np.full(int(gw.max()) + 1, -1)
        rw[cols] = np.arange(len(cols))
        gu, gw = ru[gu], rw[gw]
        a = m[:, 0]
        b = m[0, :] - m[0, 0]
        if np.abs(m - a[:, None] - b[None, :]).max() <= 1e-12 * max(1e-30, np.abs(m).max()):
            costs[u] = costs[u] + np.where(gu >= 0, a[gu], 0.0)
            costs[w] = costs[w] + np.where(gw >= 0, b[gw], 0.0)
            continue
        kept_edges.append((u, w, gu, gw, m))
    return kept_edges


def _joint_groups(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ``(a[i], b[i])`` pairs of two group arrays in lexicographic order, and each
    ``i``'s index among them (``_unique_rows(np.stack([a, b], axis=1))``, with a table over the
    pairs instead of a sort: the groups are a few dozen)."""
    nb = int(b.max()) + 1
    size = (int(a.max()) + 1) * nb
    if size > 1 << 20:
        return _unique_rows(np.stack([a, b], axis=1))
    code = a * nb + b
    mark = np.zeros(size, dtype=bool)
    mark[code] = True
    uniq = np.flatnonzero(mark)
    inv = (np.cumsum(mark) - 1)[code]
    return np.stack([uniq // nb, uniq % nb], axis=1), inv


class _Reducer:
    """Variable elimination on the pairwise cost structure (exact).

    A node with no neighbour takes its cheapest strategy; a node with one neighbour ``u`` is
    folded into ``u``'s costs (``c_u[i] += min_j c_v[j] + R[i, j]``); a node with two neighbours
    ``u, w`` becomes an edge between them (``R'[i, k] = min_j c_v[j] + R_1[i, j] + R_2[j, k]``).
    Repeated until every remaining node has three or more neighbours. Eliminated nodes take the
    best strategy given their neighbours' choices, in reverse order, after the solve. Not used
    with a memory budget (the budget row couples every node).
    """

    def __init__(self, prob: ILPProblem, cost: Sequence[np.ndarray] | None = None):
        """``cost``: each node's strategy costs (default the problem's own)."""
        self.cost = [np.array(c, dtype=float) for c in
                     (cost if cost is not None else [n.cost for n in prob.nodes])]
        self.k = [len(n.strategies) for n in prob.nodes]
        setup = _edge_setup(prob)
        self.edges: dict[int, list] = dict(setup.edges)
        # (a node's edge ids, made on first use: most nodes of a large problem have no edge)
        self.adj: dict[int, set[int]] = defaultdict(set)
        for v, eids in setup.adj.items():
            self.adj[v] = set(eids)
        self.pair: dict[tuple[int, int], int] = dict(setup.pair)
        self.next_id = setup.next_id
        for v, extra in setup.folds:  # in the order the edges were added
            self.cost[v] = self.cost[v] + extra
        self.eliminated: list[tuple] = []  # (v, [(neighbour, gv, gn, m_vn)], cost_v)
        self.alive = [k > 1 for k in self.k]
        #: per node, what its last dominance test saw: (its cost array, its edge ids)
        self._pruned: dict[int, tuple[np.ndarray, frozenset[int]]] = {}
        self._finite: dict[int, tuple[np.ndarray, int]] = {}  # node -> (cost array, finite count)

    # -- edges ---------------------------------------------------------------------------------
    def add(self, u: int, w: int, gu: np.ndarray, gw: np.ndarray, m: np.ndarray) -> None:
        key = (min(u, w), max(u, w))
        eid = self.pair.get(key)
        if eid is not None:
            ou, ow, ogu, ogw, om = self.edges.pop(eid)
            del self.pair[key]
            self.adj[ou].discard(eid)
            self.adj[ow].discard(eid)
            if ou != u:
                gu, gw, m = gw, gu, m.T
            # joint groups on each side: (old group, new group) pairs
            pu, iu = _joint_groups(ogu, gu)
            pw, iw = _joint_groups(ogw, gw)
            m = om[np.ix_(pu[:, 0], pw[:, 0])] + m[np.ix_(pu[:, 1], pw[:, 1])]
            u, w, gu, gw = ou, ow, iu, iw
        m, gu, gw = _compress(m, gu, gw)
        if not m.any():
            return
        a = m[:, 0]
        b = m[0, :] - m[0, 0]
        if np.abs(m - a[:, None] - b[None, :]).max() <= 1e-12 * max(1e-30, np.abs(m).max()):
            self._fold(u, a[gu])
            self._fold(w, b[gw])
            return
        eid = self.next_id
        self.next_id += 1
        self.edges[eid] = [u, w, gu, gw, m]
        self.pair[key] = eid
        self.adj[u].add(eid)
        self.adj[w].add(eid)

    def _fold(self, v: int, extra: np.ndarray) -> None:
        """Add a separable edge's share to node ``v``'s costs."""
        self.cost[v] = self.cost[v] + extra

    def _view(self, eid: int, v: int):
        """Edge ``eid`` seen from ``v``: (neighbour, groups of v, groups of neighbour, m[v, n])."""
        u, w, gu, gw, m = self.edges[eid]
        if u == v:
            return w, gu, gw, m
        return u, gw, gu, m.T

    def _remove_edge(self, eid: int) -> None:
        u, w = self.edges[eid][0], self.edges[eid][1]
        del self.edges[eid]
        del self.pair[(min(u, w), max(u, w))]
        self.adj[u].discard(eid)
        self.adj[w].discard(eid)

    # -- elimination ---------------------------------------------------------------------------
    def _eff_k(self, v: int) -> int:
        c = self.cost[v]
        hit = self._finite.get(v)
        if hit is None or hit[0] is not c:  # (cost arrays are replaced, never changed in place)
            hit = self._finite[v] = (c, int(np.isfinite(c).sum()))
        return hit[1]

    def _eliminable(self, v: int) -> bool:
        return self.alive[v] and (len(self.adj[v]) <= 2 or self._eff_k(v) == 1)

    def eliminate(self) -> bool:
        """Eliminate while possible; True if anything was eliminated."""
        stack = [v for v in range(len(self.k)) if self._eliminable(v)]
        done = False
        while stack:
            v = stack.pop()
            if not self._eliminable(v):
                continue
            done = True
            views = [self._view(e, v) for e in self.adj[v]]
            for e in list(self.adj[v]):
                self._remove_edge(e)
            c = self.cost[v]
            self.eliminated.append((v, views, c))
            self.alive[v] = False
            if len(views) == 2 and self._eff_k(v) > 1:
                (n1, gv1, gn1, m1), (n2, gv2, gn2, m2) = views
                fin = np.flatnonzero(np.isfinite(c))
                # over neighbour groups: a (columns of m1), b (columns of m2); j over v's options
                t = (m1[gv1[fin]].T[:, :, None] + m2[gv2[fin]][None, :, :]
                     + c[fin][None, :, None])  # G1 x k_v x G2
                self.add(n1, n2, gn1, gn2, t.min(axis=1))
                stack.extend([n1, n2])
            else:
                fin = np.flatnonzero(np.isfinite(c))
                for n, gv, gn, m in views:
                    tot = m[gv[fin]].T[gn] + c[fin][None, :]  # k_n x options of v
                    self.cost[n] = self.cost[n] + tot.min(axis=1)
                    stack.append(n)
        return done

    def prune(self) -> bool:
        """Drop dominated strategies (cost +inf): ``i`` is dominated by ``j`` when ``j`` costs no
        more at the node and on every incident edge whatever the neighbour does. Exact: some
        optimum survives. True if anything was pruned."""
        changed = False
        pruned = self._pruned
        for v in range(len(self.k)):
            if not self.alive[v]:
                continue
            c = self.cost[v]
            seen = pruned.get(v)
            # the test of a node whose costs and edges have not changed since its last test
            # drops nothing more (edges are never changed in place; ids are never reused)
            if seen is not None and seen[0] is c and seen[1] == self.adj[v]:
                continue
            fin = np.flatnonzero(np.isfinite(c))
            if len(fin) < 2:
                continue
            cols = [c[fin][:, None]]
            for e in self.adj[v]:
                _, gv, _, m = self._view(e, v)
                cols.append(m[gv[fin]])
            a = np.concatenate(cols, axis=1)
            tol = 1e-12 * max(1e-30, float(np.abs(a).max()))
            # le[i, j]: a[j] <= a[i] (within tol; a + tol made once, not once per pair)
            le = (a[None, :, :] <= (a + tol)[:, None, :]).all(axis=2)
            eq = le & le.T
            order = np.arange(len(fin))
            dom = le & (~eq | (order[None, :] < order[:, None]))
            np.fill_diagonal(dom, False)
            drop = fin[dom.any(axis=1)]
            if len(drop):
                c = c.copy()
                c[drop] = np.inf
                self.cost[v] = c
                changed = True
            pruned[v] = (c, frozenset(self.adj[v]))
        return changed

    def run(self, max_rounds: int = 4) -> None:
        """Alternate elimination and dominance pruning until neither changes anything."""
        self.eliminate()
        for _ in range(max_rounds):
            if not self.prune():
                break
            if not self.eliminate():
                break

    def recover(self, vec: list[int]) -> None:
        """Fill in the eliminated nodes' choices (``vec`` holds the others')."""
        for v, views, c in reversed(self.eliminated):
            tot = c.copy()
            for n, gv, gn, m in views:
                tot = tot + m[gv, gn[vec[n]]]
            vec[v] = int(np.argmin(tot))


@dataclass
class _EdgeSetup:
    """A problem's edges as :class:`_Reducer` starts from them: parallel edges merged, rows and
    columns compressed, separable ones folded into node costs. None of this depends on the node
    costs, so it is done once per problem's edge list and shared by every solve of it (the
    pipeline search's memory-lean solves differ only in their costs).

    Attributes:
        edges, pair, adj, next_id: the reducer's edge tables after adding every edge.
        folds: ``(node, extra cost)`` of the separable edges, in the order they were found (each
            solve adds them to its node costs in this order: the same sums as adding the edges).
    """

    edges: dict[int, list]
    pair: dict[tuple[int, int], int]
    adj: dict[int, set[int]]
    next_id: int
    folds: list[tuple[int, np.ndarray]]


class _SetupRecorder(_Reducer):
    """Adds a problem's edges, recording the separable folds instead of applying them."""

    def __init__(self, prob: ILPProblem):  # noqa: D107  (no node costs: see _EdgeSetup)
        self.edges, self.pair, self.next_id = {}, {}, 0
        self.adj = {}
        self.folds: list[tuple[int, np.ndarray]] = []
        for u, w, gu, gw, m in prob.edges:
            self.adj.setdefault(u, set())
            self.adj.setdefault(w, set())
            self.add(u, w, gu, gw, m)

    def _fold(self, v: int, extra: np.ndarray) -> None:
        self.folds.append((v, extra))


def _edge_setup(prob: ILPProblem) -> _EdgeSetup:
    """The problem's :class:`_EdgeSetup`, made on first use and kept on the problem for its edge
    list (a copy of the problem sharing the list, as the pipeline search's per-step weighting makes, shares
    it)."""
    hit = prob.__dict__.get("_edge_setup")
    if hit is not None and hit[0] is prob.edges:
        return hit[1]
    rec = _SetupRecorder(prob)
    setup = _EdgeSetup(rec.edges, rec.pair, rec.adj, rec.next_id, rec.folds)
    prob._edge_setup = (prob.edges, setup)  # type: ignore[attr-defined]
    return setup
