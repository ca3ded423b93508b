"""The solver layer (autoplan.search.intra._solver): matrix-form models passed to HiGHS in one call,
the assignment solve (LP relaxation, diving, branch-and-cut), the CBC fallback; the Lagrangian
memory weight of the intra-op ILP and the pipeline's memory-lean layer plans."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autoplan
from autoplan import Cluster
from autoplan.search.intra._ilp import build_problem, evaluate, solve_ilp
from autoplan.search.intra._solver import MatrixModel, solve_assignment, solve_matrix

S = jax.ShapeDtypeStruct
F32 = jnp.float32


def pairwise_model(node_costs, edge_costs, memory=None, budget=None):
    """A one-hot assignment with pairwise edge costs in the form the intra-op ILP uses: binaries
    s[v, i], continuous e[u, w, i, j] tied to both marginals."""
    mm = MatrixModel()
    cols = [mm.add_cols(np.asarray(c, float), integer=True) for c in node_costs]
    for c in cols:
        mm.add_rows(np.zeros(len(c)), c, 1.0, 1.0, 1.0, 1)
    for (u, w), m in edge_costs.items():
        m = np.asarray(m, float)
        nu, nw = m.shape
        e = mm.add_cols(m.ravel())
        mm.add_rows(np.concatenate([np.repeat(np.arange(nu), nw), np.arange(nu)]),
                    np.concatenate([e, cols[u]]), np.concatenate([np.ones(nu * nw), -np.ones(nu)]),
                    0.0, 0.0, nu)
        mm.add_rows(np.concatenate([np.tile(np.arange(nw), nu), np.arange(nw)]),
                    np.concatenate([e, cols[w]]), np.concatenate([np.ones(nu * nw), -np.ones(nw)]),
                    0.0, 0.0, nw)
    if memory is not None:
        allc = np.concatenate(cols)
        mm.add_rows(np.zeros(len(allc)), allc, np.concatenate(memory), -np.inf, budget, 1)
    return mm, cols


def brute(node_costs, edge_costs, memory=None, budget=None):
    best = np.inf
    for combo in itertools.product(*(range(len(c)) for c in node_costs)):
        if memory is not None and sum(memory[v][i] for v, i in enumerate(combo)) > budget + 1e-9:
            continue
        val = sum(node_costs[v][i] for v, i in enumerate(combo))
        val += sum(m[combo[u]][combo[w]] for (u, w), m in edge_costs.items())
        best = min(best, val)
    return best


def test_matrix_model_lp_and_mip_on_highs_and_cbc():
    # min x0 + 2 x1 + 0.5 with x0 + x1 = 1; and an LP whose optimum is fractional
    mm = MatrixModel()
    x = mm.add_cols([1.0, 2.0], integer=True)
    mm.add_rows([0, 0], x, 1.0, 1.0, 1.0, 1)
    mm.offset = 0.5
    for solver in ("HiGHS", "PULP_CBC_CMD"):
        sol = solve_matrix(mm, solver=solver)
        assert sol.result.status == "optimal" and sol.result.objective == pytest.approx(1.5)
        assert sol.x.tolist() == pytest.approx([1.0, 0.0])
    frac = MatrixModel()
    y = frac.add_cols([-1.0, -1.0], ub=1.0, integer=True)
    frac.add_rows([0, 0], y, [2.0, 2.0], -np.inf, 3.0, 1)  # 2 y0 + 2 y1 <= 3
    assert solve_matrix(frac, relax=True).result.objective == pytest.approx(-1.5)
    assert solve_matrix(frac).result.objective == pytest.approx(-1.0)
    assert solve_matrix(frac, solver="PULP_CBC_CMD").result.objective == pytest.approx(-1.0)
    bad = MatrixModel()
    z = bad.add_cols([1.0])
    bad.add_rows([0], z, 1.0, 2.0, 3.0, 1)  # z >= 2 with z <= 1
    assert solve_matrix(bad).result.status == "infeasible"


def test_symmetric_tie_dives_to_an_integral_optimum():
    # two strategies of equal cost on a 3-cycle whose edges charge for disagreeing: the LP
    # relaxation may sit at 1/2-1/2 everywhere; the dive breaks the tie at no cost
    agree = [[0.0, 1.0], [1.0, 0.0]]
    nodes = [[1.0, 1.0]] * 3
    edges = {(0, 1): agree, (1, 2): agree, (0, 2): agree}
    mm, cols = pairwise_model(nodes, edges)
    sol = solve_assignment(mm, cols)
    assert sol.result.status == "optimal"
    assert sol.result.objective == pytest.approx(brute(nodes, edges)) == pytest.approx(3.0)
    picks = [int(np.argmax(sol.x[c])) for c in cols]
    assert len(set(picks)) == 1 and all(np.isin(sol.x[np.concatenate(cols)], (0.0, 1.0)))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_assignment_equals_brute_force(data):
    k = data.draw(st.integers(2, 3))
    n = data.draw(st.integers(2, 5))
    val = st.floats(0, 10, allow_nan=False).map(lambda x: round(x, 2))
    nodes = [[data.draw(val) for _ in range(k)] for _ in range(n)]
    pairs = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1))
                               .filter(lambda p: p[0] < p[1]), unique=True, max_size=6))
    edges = {p: [[data.draw(val) for _ in range(k)] for _ in range(k)] for p in pairs}
    memory = budget = None
    if data.draw(st.booleans()):
        memory = [[data.draw(st.integers(1, 9)) for _ in range(k)] for _ in range(n)]
        budget = float(sum(min(m) for m in memory) + data.draw(st.integers(0, 6)))
    mm, cols = pairwise_model(nodes, edges, memory, budget)
    best = brute(nodes, edges, memory, budget)
    for relax_first in (True, False):
        sol = solve_assignment(mm, cols, relax_first=relax_first)
        assert sol.result.status == "optimal"
        assert sol.result.objective == pytest.approx(best, abs=1e-6)
        assert sol.bound <= sol.result.objective + 1e-6
        assert all(np.isin(np.round(sol.x[np.concatenate(cols)], 9), (0.0, 1.0)))
        if memory is not None:
            used = sum(memory[v][int(np.argmax(sol.x[c]))] for v, c in enumerate(cols))
            assert used <= budget + 1e-9


def knapsack_model(seed: int, n: int, slack: int):
    """A one-hot assignment of ``n`` nodes coupled by one memory row (``slack`` above the least
    memory): ``(model, columns, brute-force optimum)``."""
    rng = np.random.default_rng(seed)
    nodes = [list(rng.uniform(1, 5, 3)) for _ in range(n)]
    memory = [list(rng.integers(1, 9, 3).astype(float)) for _ in range(n)]
    budget = float(sum(min(m) for m in memory) + slack)
    mm, cols = pairwise_model(nodes, {}, memory, budget)
    return mm, cols, brute(nodes, {}, memory, budget)


def test_assignment_gap_is_certified_by_the_bound():
    # a knapsack-coupled assignment: the LP bound is below the integral optimum; with a loose
    # gap the dive's plan may be accepted, but never farther than the gap from the bound
    mm, cols, best = knapsack_model(seed=0, n=6, slack=4)
    exact = solve_assignment(mm, cols)
    assert exact.result.objective == pytest.approx(best)
    loose = solve_assignment(mm, cols, mip_gap=0.05)
    assert loose.result.objective >= best - 1e-9
    assert (loose.result.objective - loose.bound) / loose.result.objective <= 0.05 + 1e-12
    assert loose.gap == pytest.approx((loose.result.objective - loose.bound) / loose.result.objective)


def test_the_mip_runs_without_presolve_and_proves_the_optimum():
    """Branch-and-cut runs without HiGHS's presolve (on the intra-op ILPs its presolve and the
    restarts it triggered took most of the MIP's time): from no start and from a start, the
    knapsack-coupled model's optimum is found and proven."""
    from autoplan.search.intra._solver import _objective, _run_mip

    mm, _, best = knapsack_model(seed=1, n=7, slack=5)
    a = mm.arrays()
    start = None
    for _ in range(2):
        m, status, info, has = _run_mip(mm, a, start, 30.0, 1e-9, lambda: 30.0)
        got = m.getOptionValue("presolve")
        assert (got[1] if isinstance(got, tuple) else got) == "off"
        assert has and str(status).endswith("kOptimal")
        x = np.asarray(m.getSolution().col_value, dtype=np.float64)
        assert _objective(a["cost"], x, mm.offset) == pytest.approx(best, abs=1e-9)
        start = (best, x)


# ---- the Lagrangian memory weight ------------------------------------------------------------------

def mlp_step(p, x):
    def loss(p):
        return jnp.mean(jnp.tanh(x @ p["w1"]) @ p["w2"])
    g = jax.grad(loss)(p)
    return jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, p, g)


@pytest.fixture(scope="module")
def mlp():
    p = {"w1": S((2048, 4096), F32), "w2": S((4096, 2048), F32)}
    return autoplan.trace(mlp_step, p, S((256, 2048), F32))


def test_memory_weight_trades_time_for_memory(mlp):
    mesh = Cluster.preset("p3.16xlarge").logical_mesh((2, 4))
    prob = build_problem(mlp, mesh)
    fast = solve_ilp(mlp, mesh, problem=prob)
    mems, times = [fast.memory_per_device], [fast.objective]
    for w in (fast.objective / fast.memory_per_device * f for f in (1.0, 10.0, 1000.0)):
        sol = solve_ilp(mlp, mesh, problem=prob, memory_weight=w)
        # the reported objective is the time alone, as first-principles evaluation computes it
        assert evaluate(mlp, mesh, sol.choice, problem=prob) == pytest.approx(sol.objective)
        # each Lagrangian solution is the fastest plan for its own memory: a budgeted ILP at that
        # memory cannot be faster
        capped = solve_ilp(mlp, mesh, problem=prob, memory_budget=sol.memory_per_device)
        assert capped.objective >= sol.objective * (1 - 1e-6)
        mems.append(sol.memory_per_device)
        times.append(sol.objective)
    assert all(a >= b - 1e-6 for a, b in zip(mems, mems[1:]))  # memory falls as the weight grows
    assert all(a <= b + 1e-12 for a, b in zip(times, times[1:]))  # and time rises
    assert mems[-1] < mems[0] and mems[-1] == pytest.approx(fast.least_memory, rel=1e-6)


def test_lean_plan_meets_its_memory_target(mlp):
    from autoplan.search.intra._intra import intra_op_search
    from autoplan.search.pipeline._layer_costs import _lean_plan

    cl = Cluster.preset("p3.16xlarge")
    fast = intra_op_search(mlp, cl, (2, 4))
    target = 0.5 * (fast.solution.least_memory + fast.solution.memory_per_device)
    calls = []

    def run(w):
        calls.append(w)
        return intra_op_search(mlp, cl, (2, 4), memory_weight=w)

    lean = _lean_plan(fast, run)
    assert 1 <= len(calls) <= 5
    assert lean.solution.memory_per_device <= target * (1 + 1e-9)
    assert lean.solution.objective >= fast.solution.objective * (1 - 1e-9)
