"""TePDist cones, critical nodes and segments (autoplan.search.fold._cones)."""

from __future__ import annotations

import functools
import itertools
import warnings

import jax
import jax.numpy as jnp
import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autoplan
from autoplan.search.fold._cones import (
    cone_roots,
    cones,
    critical_nodes,
    dag_critical_nodes,
    main_part,
    segments,
)

F32 = jnp.float32


def sds(*shape):
    return jax.ShapeDtypeStruct(shape, F32)


@functools.cache
def zoo_graph(name: str, **kw) -> autoplan.OpGraph:
    models = pytest.importorskip("autoplan.models")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return autoplan.trace(models.get(name, "tiny", **kw))


def chain(n_layers: int):
    def f(params, x):
        for w, b in params:
            x = jnp.tanh(x @ w + b)
        return x.sum()

    return f, [(sds(8, 8), sds(8))] * n_layers, sds(4, 8)


def diamond(params, x):
    """x -> h (fork) -> [a = tanh(h @ w1)] and [s = h @ ws] (a projection skip) -> a + s (join)."""
    w0, w1, ws, w2 = params
    h = jnp.tanh(x @ w0)
    a = jnp.tanh(h @ w1)
    y = a + h @ ws
    return jnp.tanh(y @ w2).sum()


def identity_skip(params, x):
    """x -> h -> a = tanh(h @ w1) -> a + h: the skip arm is an edge, not an operator."""
    w0, w1, w2 = params
    h = jnp.tanh(x @ w0)
    a = jnp.tanh(h @ w1)
    return jnp.tanh((a + h) @ w2).sum()


# ---- critical nodes ----------------------------------------------------------------------

def test_critical_nodes_chain_include_layer_boundaries():
    f, params, x = chain(4)
    g = autoplan.trace(f, params, x)
    crit = critical_nodes(g)
    tanhs = [op.id for op in g.ops if op.primitive == "tanh"]
    assert len(tanhs) == 4
    assert set(tanhs) <= set(crit)
    # the bias broadcasts do not depend on the batch: not part of the analysed chain
    bcasts = [op.id for op in g.ops if op.primitive == "broadcast_in_dim"]
    assert bcasts and not set(bcasts) & set(main_part(g))
    assert crit == sorted(crit)


def test_critical_nodes_training_chain_forward_part():
    f, params, x = chain(3)

    def step(params, x):
        loss, grads = jax.value_and_grad(f)(params, x)
        return loss, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

    g = autoplan.trace(step, params, x)
    fwd = critical_nodes(g, "forward")
    tanhs = [op.id for op in g.ops if op.primitive == "tanh" and op.role == "forward"]
    assert len(tanhs) == 3 and set(tanhs) <= set(fwd)
    assert all(g.ops[o].role == "forward" for o in fwd)
    # the whole step has far fewer cut points: gradients of every layer meet in the update
    assert len(critical_nodes(g, "all")) < len(fwd)


def test_diamond_has_no_critical_node_inside():
    g = autoplan.trace(diamond, [sds(8, 8)] * 4, sds(4, 8))
    prim = [op.primitive for op in g.ops]
    assert prim == ["dot_general", "tanh", "dot_general", "tanh", "dot_general", "add",
                    "dot_general", "tanh", "reduce_sum"]
    crit = critical_nodes(g)
    assert not {2, 3, 4} & set(crit)  # both arms of the diamond
    assert {1, 5} <= set(crit)  # its fork and join
    assert crit == [0, 1, 5, 6, 7, 8]


def test_identity_skip_is_an_edge():
    # with an identity skip only one arm has operators; they are comparable with every other
    # operator (critical by the definition) and the skip tensor crosses their cut
    g = autoplan.trace(identity_skip, [sds(8, 8)] * 3, sds(4, 8))
    assert critical_nodes(g) == list(range(len(g)))
    segs = segments(g, part="all", granularity="critical")
    h = g.ops[1].outputs[0]
    readers = [s.id for s in segs if h in s.inputs]
    assert readers == [2, 4]  # the join (segment 4) reads h from segment 1, over the branch


def brute_force_critical(dag: nx.DiGraph) -> list:
    n = dag.number_of_nodes()
    return [v for v in nx.topological_sort(dag)
            if len(nx.ancestors(dag, v)) + len(nx.descendants(dag, v)) == n - 1]


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 12).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))))
def test_dag_critical_nodes_match_brute_force(case):
    n, pairs = case
    dag = nx.DiGraph()
    dag.add_nodes_from(range(n))
    dag.add_edges_from((min(a, b), max(a, b)) for a, b in pairs if a != b)
    assert sorted(dag_critical_nodes(dag)) == sorted(brute_force_critical(dag))


def test_dag_critical_nodes_any_topological_order():
    dag = nx.DiGraph([(0, 1), (0, 2), (1, 3), (2, 3), (3, 4), (4, 5), (4, 6), (5, 7), (6, 7)])
    for order in itertools.islice(nx.all_topological_sorts(dag), 6):
        assert sorted(dag_critical_nodes(dag, order)) == [0, 3, 4, 7]


# ---- cones -------------------------------------------------------------------------------

@pytest.mark.parametrize("opt_level", ["O2", "O3"])
def test_cones_partition_and_roots(opt_level):
    g = zoo_graph("gpt", layers=2)
    cs = cones(g, opt_level)
    seen = sorted(o for c in cs for o in c.ops)
    assert seen == list(range(len(g)))  # every operator in exactly one cone
    roots = set(cone_roots(g, opt_level))
    assert {c.root for c in cs} == roots
    results = {o.tensor for o in g.outputs}
    cone_of = {o: c.id for c in cs for o in c.ops}
    for op in g.ops:
        users = {c for t in op.outputs for c in g.consumers[t]}
        n_users = len(users) + (1 if users and any(t in results for t in op.outputs) else 0)
        operands = {t for t in op.inputs if t is not None}
        is_root = n_users != 1 or (opt_level == "O2" and len(operands) > 1)
        assert (op.id in roots) == is_root
        if not is_root:  # a non-root's only user is in its cone
            assert cone_of[next(iter(users))] == cone_of[op.id]
    for c in cs:
        assert c.ops[-1] == c.root
    assert len(cones(g, "O2")) > len(cones(g, "O3"))


def test_cones_small_example():
    g = autoplan.trace(lambda w, x: jnp.tanh(jnp.exp(x) @ w).sum(), sds(4, 8), sds(2, 4))
    assert [c.ops for c in cones(g, "O3")] == [(0, 1, 2, 3)]
    assert [c.ops for c in cones(g, "O2")] == [(0, 1), (2, 3)]  # the dot has two operands
    with pytest.raises(ValueError):
        cones(g, "O1")
    assert {c.opt_level for c in cones(g, opt_level="O3")} == {"O3"}


def test_cones_level_keyword_is_a_deprecated_name_of_opt_level():
    """``level=`` (TePDist's O2/O3, now ``opt_level=``) still works for one release."""
    g = autoplan.trace(lambda w, x: jnp.tanh(jnp.exp(x) @ w).sum(), sds(4, 8), sds(2, 4))
    with pytest.warns(DeprecationWarning, match=r"use cones\(opt_level=\.\.\.\)"):
        old = cones(g, level="O3")
    assert old == cones(g, opt_level="O3")
    with pytest.warns(DeprecationWarning, match="use Cone.opt_level"):
        assert old[0].level == "O3"
    with pytest.warns(DeprecationWarning), pytest.raises(autoplan.AutoplanError, match="disagree"):
        cones(g, opt_level="O3", level="O2")
    with pytest.raises(autoplan.AutoplanError, match="opt_level='O2'"):
        cones(g, opt_level="O9")


# ---- segments ----------------------------------------------------------------------------

def check_partition(g, segs):
    seen = [o for s in segs for o in s.ops]
    assert sorted(seen) == list(range(len(g)))
    seg_of = {o: s.id for s in segs for o in s.ops}
    for s in segs:
        for t in s.inputs:
            assert seg_of[g.tensors[t].producer] != s.id
        for t in s.outputs:
            assert seg_of[g.tensors[t].producer] == s.id
    return seg_of


def test_segments_chain_partition():
    f, params, x = chain(4)
    g = autoplan.trace(f, params, x)
    segs = segments(g, part="all", granularity="critical")
    check_partition(g, segs)
    crit = critical_nodes(g)
    assert [s.critical for s in segs[:-1]] == crit[:-1]
    # each segment ends at its critical node: nothing of a later segment feeds an earlier one
    seg_of = {o: s.id for s in segs for o in s.ops}
    for op in g.ops:
        for t in op.inputs:
            if t is not None and g.tensors[t].producer >= 0:
                assert seg_of[g.tensors[t].producer] <= seg_of[op.id]


@pytest.mark.parametrize("scopes", [True, False])
def test_segments_gpt_one_per_layer(scopes):
    layers = 4
    g = zoo_graph("gpt", layers=layers, scopes=scopes)
    segs = segments(g)
    check_partition(g, segs)
    assert len(segs) == layers + 2  # embedding, layers, head
    ref = zoo_graph("gpt", layers=layers, scopes=True)
    for k in range(1, layers + 1):
        # the forward operators of segment k are layer k-1's (op ids agree with the scoped trace)
        fwd = {ref.ops[o].scope[0] for o in segs[k].main}
        assert fwd == {f"layers_{k - 1}"}
        # most of the layer's backward and update operators are attached to it
        bwd = [o for o in segs[k].ops if ref.ops[o].role == "backward"]
        own = [o for o in bwd if ref.ops[o].scope[0] == f"layers_{k - 1}"]
        assert len(own) >= 0.9 * len(bwd) and len(own) >= 0.9 * len(ref.layers[k].backward)
        assert any(ref.ops[o].role == "update" for o in segs[k].ops)
    assert {ref.ops[o].scope[0] for o in segs[0].main} == {"embed"}
    assert {ref.ops[o].scope[0] for o in segs[-1].main} == {"head"}


def test_segments_scope_attachment_agrees():
    g = zoo_graph("gpt", layers=2)
    a = segments(g)
    b = segments(g, attach="scope")
    assert [s.main for s in a] == [s.main for s in b]
    same = sum(len(set(x.ops) & set(y.ops)) for x, y in zip(a, b))
    assert same >= 0.95 * len(g)


def test_segments_wide_resnet_one_per_block():
    g = zoo_graph("wide_resnet", depth=50)
    segs = segments(g)
    check_partition(g, segs)
    names = [{g.ops[o].scope[0] for o in s.main} for s in segs]
    # block 0 (a projection block in no repeated class) stays with the stem before it; every
    # later block, repeated or not, gets its own segment between its neighbours' boundaries
    assert names[0] == {"stem", "blocks_0"}
    assert names[1:-1] == [{f"blocks_{i}"} for i in range(1, 16)]
    assert names[-1] == {"head"}


@pytest.mark.parametrize("name", ["gpt", "wide_resnet", "moe"])
def test_critical_nodes_of_models_match_brute_force(name):
    """critical_nodes (over the flat operand arrays) equals the definition, checked on the
    operator DAG of the main part."""
    from autoplan import models
    from autoplan.search.fold._cones import main_part

    g = autoplan.trace(models.get(name, size="tiny"))
    for part in ("forward", "all"):
        main = main_part(g, part)
        inside = set(main)
        dag = nx.DiGraph()
        dag.add_nodes_from(main)
        dag.add_edges_from((g.tensors[t].producer, op.id) for op in (g.ops[o] for o in main)
                           for t in op.inputs if t is not None and g.tensors[t].producer in inside)
        assert critical_nodes(g, part) == brute_force_critical(dag)


def _main_part_by_definition(g, part):
    """main_part written out: the operators depending on the primary batch input (the one whose
    dependents carry the most FLOPs), restricted by ``part``, that reach an end through
    candidates (an end: a candidate making a graph result)."""
    from autoplan.search.fold._graphnodes import batch_inputs, dependent_on

    best, score = None, None
    for src in batch_inputs(g):
        dep = dependent_on(g, (src,))
        s = (sum(op.flops for op, d in zip(g.ops, dep) if d), sum(dep))
        if score is None or s > score:
            best, score = dep, s
    cand = [d and (part == "all" or op.role == "forward") for op, d in zip(g.ops, best)]
    results = {o.tensor for o in g.outputs}
    alive = {i for i, c in enumerate(cand) if c and set(g.ops[i].outputs) & results}
    if not alive:
        alive = {i for i, c in enumerate(cand) if c and not any(
            cand[r] for t in g.ops[i].outputs for r in g.consumers[t])}
    for i in reversed(range(len(g.ops))):
        if cand[i] and any(r in alive for t in g.ops[i].outputs for r in g.consumers[t]):
            alive.add(i)
    return sorted(alive)


@pytest.mark.parametrize("name", ["gpt", "wide_resnet", "moe", "two_tower", "mlp"])
def test_main_part_and_dependence_masks_equal_their_definitions(name):
    """main_part (one dependence pass for every batch input, the backward sweep over the operand
    arrays) equals its definition, and each bit of dependence_masks equals dependent_on of that
    source."""
    from autoplan import models
    from autoplan.search.fold._graphnodes import batch_inputs, dependence_masks, dependent_on

    g = autoplan.trace(models.get(name, size="tiny"))
    sources = batch_inputs(g)
    masks = dependence_masks(g, sources)
    for k, src in enumerate(sources):
        assert [bool(m >> k & 1) for m in masks] == dependent_on(g, (src,))
    for part in ("forward", "all"):
        assert main_part(g, part) == _main_part_by_definition(g, part)
