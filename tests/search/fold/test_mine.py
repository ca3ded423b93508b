"""TAPAS GraphNodes and repeated-subgraph mining (autoplan.search.fold._graphnodes, _mine)."""

from __future__ import annotations

import functools
import re
import warnings

import jax
import jax.numpy as jnp
import networkx as nx
import pytest

import autoplan
from autoplan.search.fold._graphnodes import group_graphnodes
from autoplan.search.fold._mine import canonical_hash, mine

F32 = jnp.float32


def sds(*shape):
    return jax.ShapeDtypeStruct(shape, F32)


@functools.cache
def zoo_graph(name: str, **kw) -> autoplan.OpGraph:
    models = pytest.importorskip("autoplan.models")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return autoplan.trace(models.get(name, "tiny", **kw))


def dense_chain(n_layers: int, residual: bool = True):
    """An embedding-like tanh, then ``n_layers`` identical dense(+residual) layers, then a sum."""

    def f(params, x):
        x = jnp.tanh(x)
        for w, b in params:
            y = jnp.tanh(x @ w + b)
            x = y + x if residual else y
        return x.sum()

    return f, [(sds(16, 16), sds(16))] * n_layers, sds(4, 16)


def train_chain(n_layers: int):
    f, params, x = dense_chain(n_layers)

    def step(params, x):
        loss, grads = jax.value_and_grad(f)(params, x)
        return loss, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

    return step, params, x


def assert_disjoint_isomorphic(graph, result):
    seen: set[int] = set()
    for cls in result.classes:
        hashes = {canonical_hash(graph, inst) for inst in cls.instances}
        assert hashes == {cls.hash}
        assert len({len(inst) for inst in cls.instances}) == 1
        for inst in cls.instances:
            assert not seen & set(inst)
            seen |= set(inst)
            assert list(inst) == sorted(inst)
        for a in cls.aligned:
            assert [graph.ops[o].primitive for o in a] == [graph.ops[o].primitive for o in cls.aligned[0]]
    assert seen | set(result.unassigned) == set(range(len(graph)))
    assert not seen & set(result.unassigned)


# ---- GraphNodes --------------------------------------------------------------------------

def test_graphnodes_partition_and_dense_layer():
    f, params, x = dense_chain(3)
    g = autoplan.trace(f, params, x)
    gng = group_graphnodes(g)
    assert sorted(o for n in gng for o in n.ops) == list(range(len(g)))
    assert all(gng.node_of_op[o] == n.id for n in gng for o in n.ops)
    assert nx.is_directed_acyclic_graph(gng.nx)
    dense = [n for n in gng if n.kind == "heavy"]
    assert len(dense) == 3
    # MatMul + BiasAdd (with the bias broadcast absorbed) + activation in one GraphNode
    assert all(n.label == "dot_general+broadcast_in_dim+add+tanh" for n in dense)
    assert len({n.key for n in dense}) == 1
    assert all(d["bytes"] > 0 for _, _, d in gng.nx.edges(data=True))


def test_graphnodes_layernorm_is_one_node():
    g = zoo_graph("gpt", layers=2)
    gng = group_graphnodes(g)
    assert sorted(o for n in gng for o in n.ops) == list(range(len(g)))
    assert nx.is_directed_acyclic_graph(gng.nx)
    norms = [n for n in gng if n.role == "forward" and n.label.count("reduce_sum") == 2
             and "rsqrt" in n.label]
    # ln1, ln2 per layer and ln_f: mean, variance, rsqrt, scale and shift together
    assert len(norms) == 2 * 2 + 1
    assert len({n.key for n in norms}) == 1
    # graph edges between GraphNodes carry the bytes of the tensors they pass
    for _u, _v, d in gng.nx.edges(data=True):
        assert d["bytes"] == sum(g.tensors[t].nbytes for t in d["tensors"])


def _wiring_by_definition(g: autoplan.OpGraph, gng) -> tuple[dict, dict, list]:
    """The GraphNode edges, ports and structures, operand by operand (the definition the array
    construction follows)."""
    node, member, out_index = gng.node_of_op, {}, {}
    for n in gng:
        for m, o in enumerate(n.ops):
            member[o] = m
    for op in g.ops:
        for k, t in enumerate(op.outputs):
            out_index[t] = k
    wide = 1 + max(len(op.outputs) for op in g.ops)
    edges, ports, wiring = {}, {}, [[] for _ in gng]
    for op in g.ops:
        v = node[op.id]
        wiring[v] += [gng.labeler.ids[op.id], len(op.inputs)]
        for k, t in enumerate(op.inputs):
            p = -1 if t is None else g.tensors[t].producer
            if t is None:
                wiring[v].append(-1)
            elif p < 0:
                wiring[v].append(-3)
            elif node[p] == v:
                wiring[v].append(member[p] * wide + out_index[t])
            else:
                wiring[v].append(-2)
                e = edges.setdefault((node[p], v), {"tensors": [], "bytes": 0})
                if t not in e["tensors"]:
                    e["tensors"].append(t)
                    e["bytes"] += g.tensors[t].nbytes
                ports.setdefault((node[p], v), []).append(
                    (member[p], out_index[t], member[op.id], k))
    return edges, {e: tuple(sorted(v)) for e, v in ports.items()}, wiring


@pytest.mark.parametrize("name", ["gpt", "moe", "wide_resnet", "two_tower"])
def test_graphnode_edges_ports_and_keys_follow_the_operands(name):
    g = zoo_graph(name)
    gng = group_graphnodes(g)
    edges, ports, wiring = _wiring_by_definition(g, gng)
    # the same edges, in order of their first operand, with the same tensors, bytes and ports
    assert list(gng.edges.items()) == list(edges.items())
    assert list(gng.ports.items()) == list(ports.items())
    assert gng.edge_arrays.u.tolist() == [u for u, _ in edges]
    assert gng.edge_bytes.tolist() == [e["bytes"] for e in edges.values()]
    # equal keys exactly when the role and the wiring are equal
    by_structure = {}
    for n in gng:
        by_structure.setdefault((n.role, tuple(wiring[n.id])), set()).add(n.key)
    assert all(len(keys) == 1 for keys in by_structure.values())
    assert len(by_structure) == len({n.key for n in gng})


# ---- mining ------------------------------------------------------------------------------

def test_mine_dense_chain_one_class_per_layer():
    f, params, x = dense_chain(5)
    g = autoplan.trace(f, params, x)
    r = mine(g, min_size=1)
    assert [c.count for c in r.classes] == [5]
    assert r.fold_ratio > 1
    assert_disjoint_isomorphic(g, r)
    # the instances follow the layers: each holds one dot
    for inst in r.classes[0].instances:
        assert sum(g.ops[o].primitive == "dot_general" for o in inst) == 1


def test_mine_training_chain_attaches_backward_and_update():
    step, params, x = train_chain(4)
    g = autoplan.trace(step, params, x)
    r = mine(g, min_size=2)
    top = r.classes[0]
    assert top.count == 4
    assert_disjoint_isomorphic(g, r)
    roles = {g.ops[o].role for o in top.instances[0]}
    assert roles == {"forward", "backward", "update"}
    assert r.fold_ratio > 2


@pytest.mark.parametrize("layers", [2, 4, 8])
@pytest.mark.parametrize("scopes", [True, False])
def test_mine_gpt_one_class_of_layers(layers, scopes):
    g = zoo_graph("gpt", layers=layers, scopes=scopes)
    r = mine(g)
    matching = [c for c in r.classes if c.count == layers]
    assert len(matching) == 1
    cls = matching[0]
    assert r.fold_ratio > 1
    assert_disjoint_isomorphic(g, r)
    # the layer class covers forward, backward and update operators of each layer
    assert {g.ops[o].role for o in cls.instances[0]} == {"forward", "backward", "update"}
    if scopes:
        # instance i is layer i: its forward operators are exactly layers_i's (but for an
        # unused constant that nothing connects to)
        for i, inst in enumerate(cls.instances):
            fwd = {o for o in inst if g.ops[o].role == "forward" and g.ops[o].scope[:1] != ("optimizer",)}
            layer = {o for o in g.layers[i + 1].forward}
            assert g.layers[i + 1].name == f"layers_{i}"
            assert fwd <= layer and len(layer - fwd) <= 1
    # with or without named scopes the same structure is found
    other = mine(zoo_graph("gpt", layers=layers, scopes=not scopes))
    assert [(c.count, c.size, c.hash) for c in other.classes] == [(c.count, c.size, c.hash) for c in r.classes]
    assert other.fold_ratio == pytest.approx(r.fold_ratio)
    assert set(r.timings) >= {"graphnodes", "signatures", "grow", "verify", "total"}


def test_mine_wide_resnet_one_class_per_block_type():
    g = zoo_graph("wide_resnet", depth=50)  # stages of 3, 4, 6, 3 bottleneck blocks
    r = mine(g)
    assert r.fold_ratio > 1
    assert_disjoint_isomorphic(g, r)

    def block(o):
        m = re.fullmatch(r"blocks_(\d+)", g.ops[o].scope[0]) if g.ops[o].scope else None
        return int(m.group(1)) if m else None

    found = []
    for cls in r.classes:
        blocks = []
        for inst in cls.instances:
            fwd = {block(o) for o in inst if g.ops[o].role == "forward"}
            blocks.append(fwd.pop() if len(fwd) == 1 else None)
        found.append(tuple(blocks))
    # the blocks after each stage's first (projection) block have equal shapes
    for expected in [(1, 2), (4, 5, 6), (8, 9, 10, 11, 12), (14, 15)]:
        assert expected in found, found


def test_canonical_hash_invariance():
    f, params, x = dense_chain(3, residual=False)
    g = autoplan.trace(f, params, x)
    gng = group_graphnodes(g)
    dense = [n for n in gng if n.kind == "heavy"]
    h = [canonical_hash(g, n.ops) for n in dense]
    assert h[0] == h[1] == h[2]
    # order of the ids given does not matter; another shape does
    assert canonical_hash(g, reversed(dense[0].ops)) == h[0]
    f2, params2, x2 = dense_chain(1, residual=False)
    g2 = autoplan.trace(f2, [(sds(16, 8), sds(8))], x2)
    other = [n for n in group_graphnodes(g2) if n.kind == "heavy"][0]
    assert canonical_hash(g2, other.ops) != h[0]


def test_min_support_and_min_size():
    f, params, x = dense_chain(3)
    g = autoplan.trace(f, params, x)
    assert mine(g, min_support=4, min_size=1).classes == []
    assert mine(g, min_size=50).classes == []
    r = mine(g, min_size=50)
    assert r.fold_ratio == 1.0 and len(r.unassigned) == len(g)


@pytest.mark.parametrize("name", ["gpt", "wide_resnet"])
def test_array_growth_equals_per_instance_growth(name, monkeypatch):
    """From ``_WIDE`` instances on, the growth checks candidates over arrays; forcing that path
    on every class must find exactly the classes the per-instance path finds."""
    from autoplan.search.fold import _mine

    graph = zoo_graph(name, layers=6) if name == "gpt" else zoo_graph(name)
    ref = mine(graph)
    monkeypatch.setattr(_mine, "_WIDE", 2)
    wide = mine(graph)
    assert [(c.hash, c.instances, c.aligned) for c in wide.classes] == \
        [(c.hash, c.instances, c.aligned) for c in ref.classes]
    assert len(ref.classes) >= 1


def test_array_verification_matches_positional_signatures():
    """The all-instances verification keeps exactly the instances whose per-instance positional
    signature equals the representative's, also when instances are perturbed (an operator
    swapped for its neighbour, two positions exchanged, a shorter instance)."""
    from autoplan.search.fold._graphnodes import op_labels
    from autoplan.search.fold._mine import _positional_signature, _same_signature_as_first

    graph = zoo_graph("gpt", layers=6)
    labeler = op_labels(graph)
    aligned = [list(a) for a in mine(graph).classes[0].aligned]
    assert len(aligned) == 6
    variants = [aligned,
                [aligned[0], aligned[1][:-1]] + aligned[2:],
                [aligned[0], aligned[1][1:] + aligned[1][:1]] + aligned[2:],
                [aligned[0]] + [a[:3] + [a[4], a[3]] + a[5:] for a in aligned[1:3]] + aligned[3:]]
    swapped = [list(a) for a in aligned]
    k = next(i for i in range(len(swapped[2]) - 1)
             if graph.ops[swapped[2][i]].primitive != graph.ops[swapped[2][i + 1]].primitive)
    swapped[2][k], swapped[2][k + 1] = swapped[2][k + 1], swapped[2][k]
    variants.append(swapped)
    kept_counts = []
    for inst in variants:
        ref = _positional_signature(graph, labeler, inst[0])
        expect = [j for j, a in enumerate(inst) if _positional_signature(graph, labeler, a) == ref]
        assert _same_signature_as_first(graph, labeler, inst) == expect
        kept_counts.append(len(expect))
    assert kept_counts[0] == 6 and min(kept_counts[1:]) < 6
