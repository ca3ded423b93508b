"""The intra-operator ILP (autoplan.search.intra._ilp): optimality against brute force, memory budgets,
pins, sub-graphs, time limits, unsupported primitives."""

from __future__ import annotations

import itertools
import math
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import autoplan
from autoplan import Cluster, InfeasiblePlanError, SearchError
from autoplan.search.intra import _ilp_problem as ilp_problem
from autoplan.search.intra._ilp import (
    UnsupportedPrimitiveWarning,
    build_problem,
    evaluate,
    solve_ilp,
    updated_input_pairs,
)
from autoplan.search.intra._ilp_problem import _unique_ids, _unique_rows
from autoplan.search.intra._ilp_reduce import _joint_groups
from autoplan.search.intra._solver import SolverTimeoutWarning
from autoplan.search.intra._spec_space import enumerate_specs

CL = Cluster.preset("p3.16xlarge")
S = jax.ShapeDtypeStruct
F32 = jnp.float32


# ---- brute force equals the ILP optimum --------------------------------------------------------

@st.composite
def programs(draw):
    """A small random function: a chain of dots / elementwise / transpose / reductions on small
    shapes, optionally as a training step (grad + SGD update returning the new weights). At most
    two dots (one in a training step, whose backward adds a second) keep brute force affordable."""
    sizes = st.sampled_from([2, 3, 4, 8])
    a, b = draw(sizes), draw(sizes)
    train = draw(st.booleans())
    steps = ["dot"] + draw(st.lists(st.sampled_from(["dot", "tanh", "add", "T", "sum", "mul"]),
                                    min_size=0, max_size=4))
    steps = steps[draw(st.integers(0, 1)):] or ["tanh"]  # mostly starting with a dot
    max_dots = 1 if train else 2
    out = []
    for op in steps:
        if op == "dot":
            if max_dots == 0:
                op = "tanh"
            max_dots -= op == "dot"
        out.append(op)
    widths = [draw(sizes) for _ in out]
    mesh_shape = draw(st.sampled_from([(1, 2), (2, 2)]))
    return a, b, out, widths, train, mesh_shape


def build_program(a, b, steps, widths, train):
    w_shapes = []
    shape = (a, b)
    for op, wd in zip(steps, widths):
        if op == "dot":
            w_shapes.append((shape[-1], wd))
            shape = (shape[0], wd)
        elif op == "T":
            shape = shape[::-1]

    def forward(ws, x):
        v, prev, k = x, x, 0
        for op in steps:
            if op == "dot":
                v = v @ ws[k]
                k += 1
            elif op == "tanh":
                v = jnp.tanh(v)
            elif op == "add":
                v = v + (prev if prev.shape == v.shape else v)
            elif op == "T":
                v = v.T
            elif op == "sum":
                v = v.sum(axis=0, keepdims=True) * v
            elif op == "mul":
                v = v * 0.5
            prev = v
        return v

    args = (tuple(S(s, F32) for s in w_shapes), S((a, b), F32))
    if train:
        def step(ws, x):
            loss, g = jax.value_and_grad(lambda ws: forward(ws, x).sum())(ws)
            return loss, tuple(w - 0.1 * gw for w, gw in zip(ws, g))
    else:
        step = forward
    return autoplan.trace(step, *args, arg_kinds=("parameter", "batch"))


LIMIT = 1500


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(programs(), st.data())
def test_ilp_optimum_equals_brute_force(prog, data):
    a, b, steps, widths, train, mesh_shape = prog
    g = build_program(a, b, steps, widths, train)
    mesh = CL.logical_mesh(mesh_shape)
    prob = build_problem(g, mesh)
    counts = prob.num_strategies()
    # pin graph inputs (to drawn specs) until brute force is affordable
    pins = {}
    order = sorted(g.inputs, key=lambda gi: -len(prob.nodes[prob.input_node[gi.tensor]].strategies))
    for gi in order:
        if math.prod(counts) <= LIMIT:
            break
        spec = data.draw(st.sampled_from(enumerate_specs(g.tensors[gi.tensor].shape, mesh)))
        pins["^" + re.escape(gi.name) + "$"] = spec.to_pspec()
        prob = build_problem(g, mesh, pins=pins)
        counts = prob.num_strategies()
    assume(math.prod(counts) <= LIMIT)
    event(f"combinations {10 ** int(math.log10(math.prod(counts)))}+")
    event(f"dots {steps.count('dot')}, train {train}")
    keys = prob.node_keys
    best = math.inf
    for combo in itertools.product(*(range(k) for k in counts)):
        best = min(best, evaluate(g, mesh, dict(zip(keys, combo)), problem=prob))
    # with and without the exact elimination of nodes with <= 2 neighbours and the LP relaxation
    for reduce, relax in ((True, True), (False, False)):
        sol = solve_ilp(g, mesh, problem=prob, reduce=reduce, relax_first=relax)
        assert sol.objective >= best - 1e-15
        assert sol.objective == pytest.approx(best, rel=1e-6, abs=1e-12), reduce
        # the solver's compressed model agrees with the first-principles evaluation
        if sol.solver_objective is not None:
            assert sol.solver_objective == pytest.approx(sol.objective, rel=1e-6, abs=1e-12)
        assert evaluate(g, mesh, sol.choice, problem=prob) == pytest.approx(sol.objective)


# ---- hand-written training step ---------------------------------------------------------------

def adam_step(params, opt, x):
    def loss_fn(p):
        h = jnp.tanh(x @ p["w1"])
        return ((h @ p["w2"]) ** 2).mean()

    loss, g = jax.value_and_grad(loss_fn)(params)
    m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, opt["m"], g)
    v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, opt["v"], g)
    new = jax.tree.map(lambda p, m, v: p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), params, m, v)
    return loss, new, {"m": m, "v": v}


def adam_graph(h=1024, batch=2048):
    p = {"w1": S((h, h), F32), "w2": S((h, h), F32)}
    return autoplan.trace(adam_step, p, {"m": p, "v": p}, S((batch, h), F32))


@pytest.fixture(scope="module")
def adam():
    return adam_graph()


def test_a_solved_problem_is_freed_by_reference_counting(adam):
    """A problem and what it holds form no reference cycle: dropped, it is freed at once, not
    left to the cyclic collector (a folded search solves 45 of them)."""
    import gc
    import weakref

    mesh = CL.logical_mesh((2, 4))
    was = gc.isenabled()
    gc.disable()
    try:
        prob = build_problem(adam, mesh)
        solve_ilp(adam, mesh, problem=prob)
        ref = weakref.ref(prob)
        del prob
        assert ref() is None
    finally:
        if was:
            gc.enable()


@pytest.mark.parametrize("n", [1, 7, 64, 300])
def test_unique_ids_and_rows_agree_with_numpy(n):
    rng = np.random.default_rng(n)
    ids = rng.integers(0, 12, size=n)
    u, inv = _unique_ids(ids)
    nu, ninv = np.unique(ids, return_inverse=True)
    assert u == nu.tolist() and np.array_equal(inv, ninv.reshape(-1))
    for cols in (1, 3):
        rows = rng.integers(0, 5, size=(n, cols))
        ur, rinv = _unique_rows(rows)
        nur, nrinv = np.unique(rows, axis=0, return_inverse=True)
        assert np.array_equal(ur, nur) and np.array_equal(rinv, nrinv.reshape(-1))


def test_updated_input_pairs(adam):
    pairs = updated_input_pairs(adam)
    names = {adam.input_of_tensor[i].name for _, i in pairs}
    assert names == {"params['w1']", "params['w2']", "opt['m']['w1']", "opt['m']['w2']",
                     "opt['v']['w1']", "opt['v']['w2']"}


def test_merging_shrinks_the_ilp_and_solution_is_consistent(adam):
    mesh = CL.logical_mesh((2, 4))
    sol = solve_ilp(adam, mesh)
    assert sol.status == "optimal"
    assert sol.vars_after_merging < sol.vars_before_merging / 3
    assert sol.num_nodes < len(adam) / 3
    free = {op.id for op in adam if all(t in sol.problem.free_tensors for t in op.outputs)}
    for i in free:  # free operators are computed from literals and constants only
        assert all(t is None or t in sol.problem.free_tensors for t in adam.ops[i].inputs)
    assert set(sol.strategies) == {op.id for op in adam} - free
    assert evaluate(adam, mesh, sol.choice) == pytest.approx(sol.objective)
    # every updated input ends in the spec it started with (resharding charged)
    for gi in adam.inputs:
        assert sol.specs[gi.tensor] is not None


def test_memory_weighted_solves_of_one_problem_equal_fresh_ones(adam):
    """The solves of one problem share its edge set-up (merged, compressed edges and the
    separable folds): each memory weight's plan is the one a freshly built problem gives."""
    mesh = CL.logical_mesh((2, 4))
    shared = build_problem(adam, mesh)
    fast = solve_ilp(adam, mesh, problem=shared)
    scale = fast.objective / max(fast.memory_per_device - fast.least_memory, 1.0)
    plans = set()
    for w in (0.0, scale, 4 * scale, 0.25 * scale, 0.0):
        got = solve_ilp(adam, mesh, problem=shared, memory_weight=w)
        ref = solve_ilp(adam, mesh, problem=build_problem(adam, mesh), memory_weight=w)
        assert got.choice == ref.choice
        assert (got.objective, got.memory_per_device) == (ref.objective, ref.memory_per_device)
        plans.add(frozenset(got.choice.items()))
    assert len(plans) > 1  # the weights reach different plans
    assert shared._edge_setup[0] is shared.edges  # made once, kept for the edge list


def _problem_fields(prob) -> list:
    """Everything a built problem holds, arrays as (dtype, shape, bytes): equal lists are the
    same problem, bit for bit (costs, ids, order)."""
    def arr(a):
        return None if a is None else (a.dtype.str, a.shape, a.tobytes())

    def strat(s):
        return (s.out_specs, s.in_specs, s.comm, s.compute_time, s.memory, s.label)

    out: list = [prob.ops, prob.specs, prob.out_pairs, prob.fixed_inside, prob.fixed_uses,
                 prob.input_node, sorted(prob.unknown), sorted(prob.grad_ops),
                 sorted(prob.free_tensors), prob.vars_before_merging]
    out += [(n.key, n.kind, n.tensor, [strat(s) for s in n.strategies], arr(n.cost),
             arr(n.memory), arr(n.penalty)) for n in prob.nodes]
    out += [(i, m.node, arr(m.idx), [strat(s) for s in m.strats], m.leader,
             [arr(x) for x in m.in_ids]) for i, m in sorted(prob.members.items())]
    out += [(t, u, arr(ids)) for t, (u, ids) in sorted(prob.tensor_src.items())]
    out += [(u, w, *map(arr, rest)) for u, w, *rest in prob.edges]
    return out


def _forget_shared_costs(graph=None) -> None:
    """Empty the process's shared caches of strategies, layouts, resharding and device times
    (and what ``graph``'s problems keep on it: its operators' leader operands and keys)."""
    from autoplan.search.intra import _ilp_problem, _reshard, _strategies  # noqa: PLC0415

    for cache in (_strategies._DERIVE_CACHE, _strategies._STRAT_CACHE,
                  _strategies._DERIVE_ALL_CACHE, _strategies._DEVICE_TIMES, _reshard._CACHE,
                  _reshard._TIMES, _ilp_problem._LAYOUTS, _ilp_problem._MATRICES):
        cache.clear()
    if graph is not None:
        _ilp_problem._leaders(graph).clear()
        _ilp_problem._op_keys(graph).clear()


def test_problems_built_on_shared_caches_equal_fresh_ones(adam):
    """The strategies, layouts, resharding matrices and collective times that problems share
    (by mesh, operator and specs) give every problem what a build with empty caches gives: on
    the same mesh after its segments, and on a mesh of the same shape with other bandwidths
    (one axis across hosts) after it."""
    cl = Cluster.preset("p3.16xlarge", nodes=2)
    inside, across = cl.logical_mesh((2, 4), submesh=(1, 8)), cl.logical_mesh((2, 4), submesh=(2, 4))
    assert inside.shape == across.shape and inside.beta != across.beta
    fwd = [op.id for op in adam if op.role == "forward"]
    x = next(op for op in adam if op.primitive == "dot_general").inputs[0]
    cases = [(inside, {}), (inside, {"ops": fwd, "fixed": {x: P("y")}}),
             (inside, {"ops": fwd}), (across, {}), (across, {"ops": fwd, "fixed": {x: P("x")}})]
    fresh = []
    for mesh, kw in cases:
        _forget_shared_costs(adam)
        fresh.append(_problem_fields(build_problem(adam, mesh, **kw)))
    _forget_shared_costs(adam)
    assert not ilp_problem._leaders(adam)
    for _ in range(2):  # the caches filled by the cases before each, then by all of them
        for (mesh, kw), want in zip(cases, fresh):
            assert _problem_fields(build_problem(adam, mesh, **kw)) == want
    assert fresh[0] != fresh[3]  # the bandwidths matter
    assert ilp_problem._leaders(adam) and ilp_problem._op_keys(adam)  # (kept and read again)


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=60))
def test_joint_groups_are_the_distinct_pairs_in_order(pairs):
    a = np.array([p[0] for p in pairs], dtype=np.int64)
    b = np.array([p[1] for p in pairs], dtype=np.int64)
    got, inv = _joint_groups(a, b)
    ref, ref_inv = _unique_rows(np.stack([a, b], axis=1))
    assert np.array_equal(got, ref) and np.array_equal(inv, ref_inv)


def test_memory_budget_forces_sharded_weight_update(adam):
    """With the batch split and the parameters replicated (pinned), a budget too small for a
    replicated optimizer state forces Alpa's sharded weight update: reduce-scatter the gradient,
    update the sharded state, all-gather the new parameters."""
    mesh = CL.logical_mesh((8, 1))
    pins = {r"^x$": P("x"), r"^params": P()}
    free = solve_ilp(adam, mesh, pins=pins)
    replicated_state = solve_ilp(adam, mesh, pins={**pins, r"^opt\[": P()})
    opt_bytes = sum(adam.tensors[gi.tensor].nbytes for gi in adam.inputs if gi.arg == 1)
    budget = replicated_state.memory_per_device - 0.8 * opt_bytes
    sol = solve_ilp(adam, mesh, pins=pins, memory_budget=budget)
    assert sol.memory_per_device <= budget
    for gi in adam.inputs:
        if gi.arg == 1:
            assert any(sol.specs[gi.tensor]), gi.name  # optimizer state sharded
    kinds = {(c.kind, c.where) for _, c in sol.comms}
    assert ("reduce-scatter", "grad-sync") in kinds
    assert ("all-gather", "reshard") in kinds
    assert sol.objective >= free.objective


def test_shared_reshards_gives_both_ends_of_every_resharding(adam):
    """The ends ``shared_reshards`` collects in its pass are, for every operand its consumer's
    strategy reads in another spec than the tensor's, the consumer and the tensor's producer
    (when costed); the repeats it returns are those of (tensor, from, to) seen before."""
    from autoplan.search.intra._ilp import shared_reshards

    mesh = CL.logical_mesh((8, 1))
    sol = solve_ilp(adam, mesh, pins={r"^x$": P("x"), r"^params": P()})
    want: set[int] = set()
    seen: dict[tuple, int] = {}
    for i in sorted(sol.strategies):
        for t, dst in zip(adam.ops[i].inputs, sol.strategies[i].in_specs):
            src = sol.specs.get(t) if t is not None else None
            if src is None or not adam.tensors[t].shape:
                continue
            if dst is not None and dst != src:
                want.add(i)
                if adam.tensors[t].producer in sol.strategies:
                    want.add(adam.tensors[t].producer)
            to = dst if dst is not None else (None,) * len(adam.tensors[t].shape)
            if to != src:
                seen[(t, src, to)] = seen.get((t, src, to), 0) + 1
    ends: set[int] = set()
    repeats = shared_reshards(adam, mesh, sol.strategies, sol.specs, ends=ends)
    assert want and ends == want
    assert repeats == shared_reshards(adam, mesh, sol.strategies, sol.specs)
    assert {i for i, _ in repeats} <= ends
    # the operators the solution says can read another spec are enough: the same repeats and
    # ends from their operands alone
    assert sol.reshard_readers is not None and len(sol.reshard_readers) < len(sol.strategies)
    few: set[int] = set()
    assert shared_reshards(adam, mesh, sol.strategies, sol.specs, ends=few,
                           readers=sol.reshard_readers) == repeats
    assert few == ends
    assert len({(i, c.kind) for i, c in repeats}) <= sum(n - 1 for n in seen.values())


@pytest.mark.parametrize("name, kw, shape", [
    ("gpt", dict(size="125M", layers=4, hidden=512, heads=8, seq_len=128, batch=8), (2, 4)),
    ("gpt", dict(size="125M", layers=4, hidden=512, heads=8, seq_len=128, batch=8), (1, 8)),
    ("wide_resnet", dict(size="tiny"), (1, 8))])
def test_a_stitched_plans_reshard_readers_give_its_shared_reshardings(name, kw, shape):
    """A folded plan's solution names the operators that can read an operand in another spec;
    the shared reshardings (and both ends of every resharding) from their operands alone are
    those found from every operand."""
    from autoplan.search.fold._levels import level_search
    from autoplan.search.intra._ilp import shared_reshards

    graph = autoplan.trace(autoplan.models.get(name, **kw))
    mesh = CL.logical_mesh(shape)
    sol = level_search(graph, CL, shape, level="folded").solution
    assert sol.reshard_readers is not None
    every: set[int] = set()
    few: set[int] = set()
    want = shared_reshards(graph, mesh, sol.strategies, sol.specs, ends=every)
    got = shared_reshards(graph, mesh, sol.strategies, sol.specs, ends=few,
                          readers=sol.reshard_readers)
    assert got == want and few == every and every


def test_reshard_readers_hold_the_readers_of_a_free_tensor_in_another_spec():
    """A tensor built from constants takes the spec its first reader needs; another reader may
    need another spec, and that reader is one of the solution's reshard readers (the shared
    reshardings and their ends are the same from the reshard readers alone)."""
    from autoplan.search.intra._ilp import shared_reshards
    from autoplan.search.intra._ilp_problem import _free_tensors

    def step(w1, w2, x):
        m = jnp.arange(64.0, dtype=jnp.float32).reshape(8, 8)  # free: built from constants
        return (x @ (w1 * m) + x @ (w2 * m)).sum()

    sd = jax.ShapeDtypeStruct
    g = autoplan.trace(step, sd((8, 8), jnp.float32), sd((8, 8), jnp.float32),
                       sd((4, 8), jnp.float32), arg_kinds=("parameter", "parameter", "batch"))
    mesh = CL.logical_mesh((1, 8))
    sol = solve_ilp(g, mesh, pins={r"^w1$": P(None, "y"), r"^w2$": P("y", None), r"^x$": P()})
    free = _free_tensors(g)
    other = [i for i, st in sol.strategies.items()
             for t, need in zip(g.ops[i].inputs, st.in_specs)
             if t in free and need is not None and need != sol.specs[t]]
    assert other and set(other) <= sol.reshard_readers
    every: set[int] = set()
    few: set[int] = set()
    assert (shared_reshards(g, mesh, sol.strategies, sol.specs, ends=few,
                            readers=sol.reshard_readers)
            == shared_reshards(g, mesh, sol.strategies, sol.specs, ends=every))
    assert few == every and set(other) <= every


def test_memory_budget_below_minimum_raises_with_least_memory(adam):
    mesh = CL.logical_mesh((2, 4))
    sol = solve_ilp(adam, mesh)
    least = sol.least_memory
    # the least memory shards every input and saved activation over all 8 devices
    inputs = sum(adam.tensors[gi.tensor].nbytes for gi in adam.inputs)
    saved = sum(adam.tensors[t].nbytes for op in adam if op.role == "forward" for t in op.outputs
                if any(adam.ops[c].role == "backward" for c in adam.consumers[t]))
    assert inputs / 8 < least <= (inputs + saved) / 8 + 1
    with pytest.raises(InfeasiblePlanError) as err:
        solve_ilp(adam, mesh, memory_budget=0.9 * least)
    assert err.value.least_memory == pytest.approx(least)
    ok = solve_ilp(adam, mesh, memory_budget=1.001 * least)
    assert ok.memory_per_device <= 1.001 * least * (1 + 1e-9)


def test_a_budget_below_the_least_memory_is_refused_before_the_edges_are_built(adam, monkeypatch):
    # the least memory is the nodes' own: the edges (most of a large problem's building) are
    # built only for a budget that some plan can meet, and the problem built in two halves is
    # the one build_problem makes
    from autoplan.search.intra import _ilp_problem

    mesh = CL.logical_mesh((2, 4))
    whole = build_problem(adam, mesh)
    least = float(sum(n.memory.min() for n in whole.nodes))
    built = []
    real = _ilp_problem._build_edges
    monkeypatch.setattr(_ilp_problem, "_build_edges", lambda prob: built.append(prob) or real(prob))
    with pytest.raises(InfeasiblePlanError) as err:
        solve_ilp(adam, mesh, memory_budget=0.9 * least)
    assert err.value.least_memory == pytest.approx(least, rel=1e-12) and built == []
    sol = solve_ilp(adam, mesh, memory_budget=1.5 * least)
    assert len(built) == 1
    same = solve_ilp(adam, mesh, memory_budget=1.5 * least, problem=whole)
    assert (sol.choice, sol.objective, sol.vars_before_merging) == (
        same.choice, same.objective, same.vars_before_merging)
    for a, b in zip(built[0].nodes, whole.nodes):
        assert a.key == b.key and np.array_equal(a.cost, b.cost) and np.array_equal(a.memory, b.memory)
    assert [e[:2] for e in built[0].edges] == [e[:2] for e in whole.edges]
    # the whole step's least memory is kept per graph, mesh and pins: refused again, nothing is
    # built; another mesh, other pins or a segment build their nodes
    nodes = []
    real_nodes = _ilp_problem._add_operator_nodes
    monkeypatch.setattr(_ilp_problem, "_add_operator_nodes",
                        lambda prob, chosen: nodes.append(prob) or real_nodes(prob, chosen))
    with pytest.raises(InfeasiblePlanError) as again:
        solve_ilp(adam, mesh, memory_budget=0.8 * least)
    assert again.value.least_memory == err.value.least_memory and nodes == []
    for kw in ({"mesh": CL.logical_mesh((4, 2))}, {"pins": {"^x$": P()}},
               {"ops": list(range(len(adam.ops)))}):
        with pytest.raises(InfeasiblePlanError):
            solve_ilp(adam, kw.pop("mesh", mesh), memory_budget=0.01 * least, **kw)
    assert len(nodes) == 3


def test_pins_honoured_and_validated(adam):
    mesh = CL.logical_mesh((2, 4))
    sol = solve_ilp(adam, mesh, pins={r"^params\['w1'\]$": P("y", "x"), r"^x$": P()})
    w1 = next(gi for gi in adam.inputs if gi.name == "params['w1']")
    x = next(gi for gi in adam.inputs if gi.name == "x")
    assert sol.specs[w1.tensor] == (("y",), ("x",))
    assert sol.specs[x.tensor] == (None, None)
    with pytest.raises(SearchError, match="matches no graph input"):
        solve_ilp(adam, mesh, pins={"no_such_input": P()})
    with pytest.raises(SearchError, match="not divisible"):
        solve_ilp(adam_graph(h=6), mesh, pins={r"w1'\]$": P("y")})
    with pytest.raises(SearchError, match="regular expression"):
        solve_ilp(adam, mesh, pins={"params[": P()})


def test_the_whole_steps_unmerged_count_is_counted_once_per_mesh_and_pins(adam, monkeypatch):
    """``vars_before_merging`` of a whole-step problem reads only the mesh and the pins: a second
    build (a search that changes only the memory budget) reuses it; other pins count again."""
    from autoplan.search.intra import _ilp_problem as ip  # noqa: PLC0415

    g = adam_graph(h=10)
    mesh = CL.logical_mesh((2, 4))
    counted = []
    real = ip._count_unmerged
    monkeypatch.setattr(ip, "_count_unmerged", lambda prob: counted.append(1) or real(prob))
    first = ip.build_problem(g, mesh).vars_before_merging
    assert ip.build_problem(g, mesh).vars_before_merging == first and len(counted) == 1
    pinned = ip.build_problem(g, mesh, pins={r"^params\['w1'\]$": P()}).vars_before_merging
    assert len(counted) == 2 and pinned < first  # one input with one strategy: fewer binaries
    assert real(ip.build_problem(g, mesh)) == first
    ip.build_problem(g, mesh, ops=range(3))
    assert len(counted) == 3  # a segment's problem: counted each time


def test_pins_by_input_tensor_id(adam):
    """A pin keyed by an input's tensor id (as the baselines write their per-input specs) is the
    same pin as a regular expression matching that input's name, and is resolved once per graph,
    mesh and pins however many problems use it."""
    mesh = CL.logical_mesh((2, 4))
    w1 = next(gi for gi in adam.inputs if gi.name == "params['w1']")
    by_regex = solve_ilp(adam, mesh, pins={r"^params\['w1'\]$": P("y", "x")})
    by_id = solve_ilp(adam, mesh, pins={w1.tensor: P("y", "x")})
    assert by_id.specs[w1.tensor] == (("y",), ("x",)) == by_regex.specs[w1.tensor]
    assert by_id.objective == pytest.approx(by_regex.objective, rel=1e-12)
    with pytest.raises(SearchError, match="tensor id of a graph input"):
        solve_ilp(adam, mesh, pins={len(adam.tensors) - 1: P()})
    with pytest.raises(SearchError, match="keys should be regular expressions"):
        solve_ilp(adam, mesh, pins={("w1",): P()})

    g = adam_graph(h=64, batch=128)
    pins = {r"w1'\]$": P(None, "y")}
    calls = []
    find = g.find_inputs
    g.find_inputs = lambda *a, **k: calls.append(a) or find(*a, **k)
    fwd = [op.id for op in g if op.role == "forward"]
    for ops in (None, fwd, fwd[:2]):
        build_problem(g, mesh, ops=ops, pins=pins)
    assert len(calls) == 1

def test_segment_with_fixed_boundary(adam):
    mesh = CL.logical_mesh((1, 8))
    fwd = [op.id for op in adam if op.role == "forward"]
    first_dot = next(op for op in adam if op.primitive == "dot_general")
    x = first_dot.inputs[0]  # a graph input read by the segment
    fixed = {x: P("y")}
    sol = solve_ilp(adam, mesh, ops=fwd, fixed=fixed)
    assert set(sol.strategies) <= set(fwd)
    assert sol.specs[x] == (("y",), None)
    assert evaluate(adam, mesh, sol.choice, ops=fwd, fixed=fixed) == pytest.approx(sol.objective)
    # a tensor produced inside the segment is charged the resharding to its fixed spec
    out_t = first_dot.outputs[0]
    fixed2 = {x: P("y"), out_t: P(None, "y")}
    sol2 = solve_ilp(adam, mesh, ops=fwd, fixed=fixed2)
    assert sol2.objective >= sol.objective - 1e-12
    assert evaluate(adam, mesh, sol2.choice, ops=fwd, fixed=fixed2) == pytest.approx(sol2.objective)
    # the backward + update segment reads forward activations: boundary variables "%<id>"
    rest = [op.id for op in adam if op.role != "forward"]
    sol3 = solve_ilp(adam, mesh, ops=rest)
    boundary = [k for k in sol3.choice if isinstance(k, str) and k.startswith("%")]
    assert boundary
    t = int(boundary[0][1:])
    assert adam.ops[adam.tensors[t].producer].role == "forward"
    with pytest.raises(SearchError):
        solve_ilp(adam, mesh, ops=[10**6])
    with pytest.raises(SearchError):
        solve_ilp(adam, mesh, ops=fwd, fixed={x: P("x", "x")})


def test_fixed_tensor_made_inside_is_charged_once_per_outside_operand():
    """A fixed boundary tensor made inside a segment is charged per operand that reads it
    outside (as the stitched plan reshards per operand): ``h * h`` reads it twice, so twice."""
    g = autoplan.trace(lambda w, x: (lambda h: (h * h).sum())(x @ w),
                       jax.ShapeDtypeStruct((8, 8), jnp.float32),
                       jax.ShapeDtypeStruct((4, 8), jnp.float32))
    mesh = CL.logical_mesh((2, 4))
    dot = next(op for op in g.ops if op.primitive == "dot_general")
    h = dot.outputs[0]
    assert len(g.consumers[h]) == 2  # one operator, two operands
    prob = build_problem(g, mesh, ops=[dot.id], fixed={h: (None, None)})
    assert prob.fixed_uses == {h: 2}


def test_time_limit_returns_plan_with_warning():
    g = adam_graph()
    mesh = CL.logical_mesh((2, 4))
    with pytest.warns(SolverTimeoutWarning):
        sol = solve_ilp(g, mesh, time_limit=1e-3)
    assert sol.status in ("feasible", "timeout-greedy")
    assert len(sol.strategies) == len(solve_ilp(g, mesh).strategies)
    assert evaluate(g, mesh, sol.choice) == pytest.approx(sol.objective)


def test_unsupported_primitives_one_warning():
    def f(x, w):
        y = jnp.fft.fft(x @ w).real
        return jnp.linalg.cholesky(y @ y.T + 10 * jnp.eye(y.shape[0])).sum()

    g = autoplan.trace(f, S((16, 16), F32), S((16, 16), F32))
    mesh = CL.logical_mesh((1, 4), submesh=(1, 4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sol = solve_ilp(g, mesh)
    ours = [w for w in caught if issubclass(w.category, UnsupportedPrimitiveWarning)]
    assert len(ours) == 1
    assert "fft" in str(ours[0].message) and "cholesky" in str(ours[0].message)
    assert set(sol.unknown_primitives) >= {"fft", "cholesky"}
    # one warning per call too where a budget is refused from the kept least memory, or met
    for budget in (0.5 * sol.least_memory, 0.5 * sol.least_memory, 2 * sol.least_memory):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                solve_ilp(g, mesh, memory_budget=budget)
            except InfeasiblePlanError as err:
                assert err.least_memory == sol.least_memory and budget < sol.least_memory
        ours = [w for w in caught if issubclass(w.category, UnsupportedPrimitiveWarning)]
        assert len(ours) == 1 and "fft" in str(ours[0].message)


def test_differing_operands_are_those_a_loop_over_the_operands_finds(adam):
    """The one-pass comparison of every operand's spec with the spec its consumer needs finds
    what a loop over the operators and their operands finds, in the same order: for all the
    costed operators (the lists made once per graph) and for a part of them."""
    from autoplan.search.intra._ilp_cost import _costed_ops, _differing_operands

    mesh = CL.logical_mesh((8, 1))
    sol = solve_ilp(adam, mesh, pins={r"^x$": P("x"), r"^params": P()})

    def by_loop(op_ids):
        out = []
        for i in op_ids:
            st = sol.strategies.get(i)
            if st is None:
                continue
            for t, dst in zip(adam.ops[i].inputs, st.in_specs):
                src = sol.specs.get(t) if t is not None else None
                if src is not None and src != dst:
                    out.append((i, t, src, dst))
        return out

    costed = _costed_ops(adam)[0]
    assert sorted(sol.strategies) == costed
    want = by_loop(costed)
    assert want and _differing_operands(adam, costed, sol.strategies, sol.specs) == want
    assert _differing_operands(adam, list(costed), sol.strategies, sol.specs) == want
    part = costed[::3] + [len(adam.ops) + 5]  # (an operator without a strategy is skipped)
    assert _differing_operands(adam, part, sol.strategies, sol.specs) == by_loop(part)


def test_pins_key_tells_pins_apart_and_keeps_two_tuples():
    """The memo key of a set of pins: equal pins give equal keys, another spec or input another
    key; an unhashable value gives None; and the key holds two tuples, not a pair per input."""
    from autoplan.search.intra._pins import pins_key

    a = {"w1": P("x", None), "w2": P(None, "y")}
    assert pins_key(a) == pins_key(dict(a)) and hash(pins_key(a)) == hash(pins_key(dict(a)))
    assert pins_key(a) != pins_key({"w1": P("x", None), "w2": P("y", None)})
    assert pins_key(a) != pins_key({"w1": P("x", None), "w3": P(None, "y")})
    assert pins_key({}) == pins_key(None) == ()
    assert pins_key({"w1": ["x", None]}) is None
    key = pins_key({i: P() for i in range(1000)})
    assert len(key) == 2 and all(type(part) is tuple and len(part) == 1000 for part in key)
