"""TAPAS GraphNodes: operators that are used together, grouped into one node.

TAPAS (Section 4.2) converts the operator graph into *GraphNodes* before mining repeated
subgraphs: "GraphNode is the basic unit for deriving the parallel strategy. It is a container of
operators collectively used together [...] a dense layer can be a GraphNode, which consists of a
matrix multiplication (MatMul) op, an addition (BiasAdd) op, and an activation (ReLU) op".

:func:`group_graphnodes` builds them in one pass over the operators in topological order (operator
ids are a topological order in an :class:`~autoplan.OpGraph`):

* **anchors** start a GraphNode: ``dot_general`` / ``conv_general_dilated`` (heavy ops), gathers,
  scatters, sorts and opaque control flow;
* **reductions** start a *normalisation* GraphNode whose input is the reduced tensor ``x``; every
  later operator that reads only that GraphNode's values and ``x`` joins it, so the mean, variance,
  ``x - mean``, ``rsqrt``, scale and shift of a LayerNorm / BatchNorm (or the max, ``exp``, sum and
  divide of a softmax) form one GraphNode; a reduction of a value used only inside the normalisation
  (the variance's ``sum((x - mean)^2)``) joins it too;
* **followers** (elementwise and data-movement operators) join the GraphNode of their producers
  when all their producers lie in one GraphNode of the same role: the bias add, activation,
  elementwise chain and cheap reshapes after a dot join the dot's GraphNode;
* **side operators** (those that do not depend on the batch: parameter broadcasts, ``iota``
  masks, literal broadcasts, optimizer constants) are grouped among themselves the same way and
  then absorbed into the GraphNode of their consumer when they have only one consuming GraphNode.

Every operator lands in exactly one GraphNode. The GraphNode graph is a DAG: an operator joins a
GraphNode only when all its producers are inside it (or are the normalisation's input ``x``), so
edges enter a GraphNode only at its first operator (and from ``x``), which cannot close a cycle;
absorbed side groups have no data producers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import networkx as nx

from autoplan._graph import OpGraph, OpNode
from autoplan._memo import memo

__all__ = [
    "GraphNode",
    "GraphNodeGraph",
    "group_graphnodes",
    "HEAVY",
    "ANCHORS",
    "data_dependent",
    "op_label",
    "op_labels",
    "OpLabeler",
]

#: compute-heavy primitives: each starts its own GraphNode
HEAVY = frozenset({"dot_general", "conv_general_dilated", "ragged_dot"})
#: primitives that always start a GraphNode (heavy ops, gathers/scatters, sorts, control flow)
ANCHORS = HEAVY | frozenset({
    "gather", "scatter", "scatter-add", "scatter_add", "scatter-mul", "scatter_mul", "scatter-min",
    "scatter-max", "sort", "argsort", "top_k", "while", "cond", "scan", "custom_call",
    "select_and_scatter_add", "reduce_window", "reduce_window_sum", "reduce_window_max",
    "all_reduce", "psum", "all_gather", "all_to_all",
})
#: reductions: each starts a normalisation GraphNode unless it reduces a value private to one
REDUCTIONS = frozenset({
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "argmax",
    "argmin", "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "reduce_precision_sum",
})
#: params that differ between otherwise identical repeated operators (left out of labels)
_VOLATILE_PARAMS = frozenset({"index", "name"})


def _params_repr(params: dict[str, Any]) -> str:
    return repr(sorted((k, v) for k, v in params.items() if k not in _VOLATILE_PARAMS))


def op_label(op: OpNode) -> str:
    """The structural label of an operator: primitive, operand/result shapes and dtypes, params.

    Scope names, roles and operator ids are not part of it, so the same layer traced with or
    without ``jax.named_scope`` has the same labels. Literal operands appear as ``None`` shapes.
    """
    return (f"{op.primitive}|{op.in_shapes}|{op.out_shapes}|{op.in_dtypes}|{op.out_dtypes}|"
            f"{_params_repr(op.params)}")


class OpLabeler:
    """Interns :func:`op_label` strings of a graph's operators as small integers (``ids``) and
    gives stable hex digests (``digest``) for canonical hashes."""

    def __init__(self, graph: OpGraph):
        table: dict[str, int] = {}
        self.ids: list[int] = []
        self.strings: list[str] = []
        # operators are first interned by a tuple of the label's parts (much cheaper than the
        # string); the string is made once per distinct tuple, and equal strings share an id
        quick: dict[tuple, int] = {}
        for op in graph.ops:
            try:
                k = (op.primitive, op.in_shapes, op.out_shapes, op.in_dtypes, op.out_dtypes,
                     tuple([(p, v, type(v)) for p, v in sorted(op.params.items())
                            if p not in _VOLATILE_PARAMS]))
                i = quick.get(k)
            except TypeError:  # an unhashable parameter: the string alone
                k, i = None, None
            if i is None:
                s = op_label(op)
                i = table.get(s)
                if i is None:
                    i = table[s] = len(self.strings)
                    self.strings.append(s)
                if k is not None:
                    quick[k] = i
            self.ids.append(i)
        self._digests: dict[int, str] = {}

    def digest(self, op_id: int) -> str:
        i = self.ids[op_id]
        d = self._digests.get(i)
        if d is None:
            d = self._digests[i] = hashlib.blake2b(self.strings[i].encode(), digest_size=8).hexdigest()
        return d


def op_labels(graph: OpGraph) -> OpLabeler:
    """The graph's :class:`OpLabeler` (made once per graph)."""
    return memo(graph, "op_labeler", lambda: OpLabeler(graph))


def data_dependent(graph: OpGraph) -> list[bool]:
    """For each operator, whether it depends (transitively) on the batch.

    The batch is the graph inputs of kind ``"batch"`` or ``"input"``; when the graph has none,
    every graph input counts. Operators that are not data dependent compute only from parameters,
    optimizer state, constants and literals (parameter broadcasts, masks, optimizer constants).
    """
    return _Links(graph).dep


@dataclass(frozen=True)
class GraphNode:
    """A group of operators used together (TAPAS's GraphNode).

    Attributes:
        id: index in ``GraphNodeGraph.nodes`` (also its ``nx`` node).
        ops: its operator ids, ascending (a topological order).
        main: the operator that started it (a dot/conv, a normalisation's first reduction, ...).
        label: the primitive sequence of its operators, joined by ``+``
            (``"dot_general+broadcast_in_dim+add"``).
        key: an integer naming its internal structure (its role, operator labels with shapes and
            dtypes, and which member feeds which operand): equal keys mean isomorphic GraphNodes
            (with the same member order). Valid within one :class:`GraphNodeGraph`.
        kind: how it started: ``"heavy"``, ``"anchor"``, ``"norm"``, ``"op"`` or ``"side"``.
        flops: FLOPs of its operators.
        scope: named scope of its main operator.
        role: role of its main operator.
    """

    id: int
    ops: tuple[int, ...]
    main: int
    label: str
    key: int
    kind: str
    flops: float
    scope: tuple[str, ...]
    role: str

    def __len__(self) -> int:
        return len(self.ops)


@dataclass
class GraphNodeGraph:
    """The GraphNode DAG of an operator graph.

    Attributes:
        graph: the operator graph.
        nodes: the GraphNodes, in order of their first operator.
        node_of_op: for each operator id, the id of its GraphNode.
        edges: for each GraphNode edge ``(u, v)``: ``{"tensors": ids of the tensors u passes to
            v, "bytes": their total size}``.
        ports: for each edge ``(u, v)``, the sorted tuple of ``(member index of the producer in u,
            output index, member index of the consumer in v, operand index)`` of the operands it
            carries: what the subgraph miner uses as edge labels.
        labeler: the interned operator labels of ``graph``.
    """

    graph: OpGraph
    nodes: list[GraphNode]
    node_of_op: list[int]
    edges: dict[tuple[int, int], dict] = field(repr=False)
    ports: dict[tuple[int, int], tuple[tuple[int, int, int, int], ...]] = field(repr=False)
    labeler: OpLabeler | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.nodes)

    @cached_property
    def nx(self) -> nx.DiGraph:
        """``networkx.DiGraph`` over GraphNode ids (node attribute ``gn``); an edge carries
        ``tensors`` and ``bytes`` as in :attr:`edges`."""
        dg = nx.DiGraph()
        dg.add_nodes_from((n.id, {"gn": n}) for n in self.nodes)
        dg.add_edges_from((u, v, d) for (u, v), d in self.edges.items())
        return dg

    def __iter__(self):
        return iter(self.nodes)

    def __getitem__(self, i: int) -> GraphNode:
        return self.nodes[i]

    def ops_of(self, node_ids: Iterable[int]) -> tuple[int, ...]:
        """The sorted operator ids of the given GraphNodes."""
        return tuple(sorted(o for n in node_ids for o in self.nodes[n].ops))

    def summary(self) -> str:
        """Counts of GraphNodes by kind and the most common labels."""
        kinds: dict[str, int] = {}
        labels: dict[str, int] = {}
        for n in self.nodes:
            kinds[n.kind] = kinds.get(n.kind, 0) + 1
            labels[n.label] = labels.get(n.label, 0) + 1
        top = sorted(labels.items(), key=lambda kv: -kv[1])[:6]
        return (f"{len(self.graph)} operators -> {len(self.nodes)} GraphNodes "
                f"({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}); edges "
                f"{len(self.edges)}; top labels: "
                + "; ".join(f"{lab[:60]} x{c}" for lab, c in top))


class _Group:
    __slots__ = ("id", "ops", "kind", "role", "x_op", "side", "final")

    def __init__(self, gid: int, first: int, kind: str, role: str, side: bool, x_op: int = -1):
        self.id = gid
        self.ops = [first]
        self.kind = kind
        self.role = role
        self.side = side
        self.x_op = x_op  # for a normalisation: the operator that produced the reduced tensor
        self.final = gid  # the group it was absorbed into (itself if not absorbed)


class _Links:
    """What one pass over the operators learns: each operator's distinct producer operators and
    distinct consumer operators (in operand / operator order), whether it depends on the batch
    (see :func:`data_dependent`), and each tensor's producer and index among its outputs."""

    __slots__ = ("prods_of", "cons_of", "dep", "producer", "out_index")

    def __init__(self, graph: OpGraph):
        ops = graph.ops
        producer = [t.producer for t in graph.tensors]
        out_index = [0] * len(producer)
        batch = {gi.tensor for gi in graph.inputs if gi.kind in ("batch", "input")}
        dep_t = bytearray(len(producer))
        for t in batch or (gi.tensor for gi in graph.inputs):
            dep_t[t] = 1
        prods_of: list[list[int]] = []
        cons_of: list[list[int]] = [[] for _ in ops]
        dep = [False] * len(ops)
        for op in ops:
            o = op.id
            ps: list[int] = []
            d = False
            for t in op.inputs:
                if t is not None:
                    if dep_t[t]:
                        d = True
                    p = producer[t]
                    if p >= 0 and p not in ps:
                        ps.append(p)
                        cons_of[p].append(o)
            prods_of.append(ps)
            for j, t in enumerate(op.outputs):
                out_index[t] = j
                if d:
                    dep_t[t] = 1
            dep[o] = d
        self.prods_of, self.cons_of, self.dep = prods_of, cons_of, dep
        self.producer, self.out_index = producer, out_index


def group_graphnodes(graph: OpGraph) -> GraphNodeGraph:
    """Group the operators of ``graph`` into TAPAS GraphNodes (see the module docstring).

    Args:
        graph: the operator graph (from :func:`autoplan.trace`).

    Returns:
        The :class:`GraphNodeGraph`: every operator in exactly one GraphNode, and the GraphNode DAG
        whose edges carry the bytes passed between GraphNodes.

    Examples:
        >>> import jax, jax.numpy as jnp, autoplan
        >>> from autoplan.search._graphnodes import group_graphnodes
        >>> f = lambda w, b, x: jnp.tanh(x @ w + b).sum()
        >>> g = autoplan.trace(f, jax.ShapeDtypeStruct((4, 8), jnp.float32),
        ...                    jax.ShapeDtypeStruct((8,), jnp.float32),
        ...                    jax.ShapeDtypeStruct((2, 4), jnp.float32),
        ...                    arg_kinds=("parameter", "parameter", "batch"))
        >>> [n.label for n in group_graphnodes(g)]
        ['dot_general+broadcast_in_dim+add+tanh', 'reduce_sum']
    """
    ops = graph.ops
    tensors = graph.tensors
    links = _Links(graph)
    dep, prods_of, cons_of = links.dep, links.prods_of, links.cons_of
    producer, out_index = links.producer, links.out_index
    group_of = [-1] * len(ops)
    groups: list[_Group] = []
    single_user = [len(c) == 1 for c in cons_of]

    def new(op: OpNode, kind: str, side: bool, x_op: int = -1) -> None:
        g = _Group(len(groups), op.id, kind, op.role, side, x_op)
        groups.append(g)
        group_of[op.id] = g.id

    for op in ops:
        prods = prods_of[op.id]
        prim = op.primitive
        if not dep[op.id]:
            # side computation: group with side producers when they all lie in one side group
            pg = {group_of[p] for p in prods}
            if len(pg) == 1 and prim not in ANCHORS:
                g = groups[pg.pop()]
                if g.side and g.role == op.role:
                    g.ops.append(op.id)
                    group_of[op.id] = g.id
                    continue
            new(op, "side", True)
            continue
        if prim in ANCHORS:
            new(op, "heavy" if prim in HEAVY else "anchor", False)
            continue
        data_groups = {group_of[p] for p in prods if dep[p]}
        if prim in REDUCTIONS:
            # a reduction of a value private to a normalisation continues it
            if len(data_groups) == 1:
                g = groups[next(iter(data_groups))]
                if (g.kind == "norm" and g.role == op.role
                        and all(single_user[p] for p in prods if dep[p])):
                    g.ops.append(op.id)
                    group_of[op.id] = g.id
                    continue
            x_op = next((p for p in prods if dep[p]), -1)
            new(op, "norm", False, x_op)
            continue
        # follower: join the producers' group when there is exactly one (same role), or a
        # normalisation whose values and input are all this operator reads
        target = None
        if len(data_groups) == 1:
            g = groups[next(iter(data_groups))]
            if g.role == op.role and not g.side:
                target = g
        elif len(data_groups) == 2:
            for gid in data_groups:
                g = groups[gid]
                if (g.kind == "norm" and g.role == op.role and g.x_op >= 0
                        and all(group_of[p] == gid or p == g.x_op for p in prods if dep[p])):
                    target = g
                    break
        if target is not None:
            target.ops.append(op.id)
            group_of[op.id] = target.id
        else:
            new(op, "op", False)

    # absorb side groups into their single consuming group, consumers first
    for g in reversed(groups):
        if not g.side:
            continue
        targets: set[int] = set()
        for o in g.ops:
            for c in cons_of[o]:
                cg = group_of[c]
                if cg != g.id:
                    targets.add(groups[cg].final)
        if len(targets) == 1:
            g.final = next(iter(targets))

    members: dict[int, list[int]] = {}
    for g in groups:
        members.setdefault(g.final, []).extend(g.ops)
    order = sorted(members, key=lambda gid: min(members[gid]))
    node_of_op = [-1] * len(ops)
    member_index = [0] * len(ops)
    for nid, gid in enumerate(order):
        mem = members[gid]
        mem.sort()
        for i, o in enumerate(mem):
            node_of_op[o] = nid
            member_index[o] = i
    labeler = op_labels(graph)
    label_ids = labeler.ids
    # one pass over the operands (operators in order, so each GraphNode's members come in member
    # order): the GraphNodes' internal wiring, and the edges between GraphNodes with their ports
    struct: list[list[tuple]] = [[] for _ in order]
    edges: dict[tuple[int, int], dict] = {}
    ports: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}
    for op in ops:
        o = op.id
        v = node_of_op[o]
        ins = []
        for k, t in enumerate(op.inputs):
            if t is None:
                ins.append(-1)
                continue
            p = producer[t]
            if p < 0:
                ins.append(-3)
                continue
            u = node_of_op[p]
            if u == v:
                ins.append((member_index[p], out_index[t]))
                continue
            ins.append(-2)
            port = (member_index[p], out_index[t], member_index[o], k)
            e = edges.get((u, v))
            if e is None:
                edges[(u, v)] = {"tensors": [t], "bytes": tensors[t].nbytes}
                ports[(u, v)] = [port]
                continue
            if t not in e["tensors"]:
                e["tensors"].append(t)
                e["bytes"] += tensors[t].nbytes
            ports[(u, v)].append(port)
        struct[v].append((label_ids[o], tuple(ins)))
    key_table: dict[tuple, int] = {}
    nodes: list[GraphNode] = []
    for nid, gid in enumerate(order):
        mem = members[gid]
        main = groups[gid].ops[0]
        mop = ops[main]
        key = key_table.setdefault((mop.role, tuple(struct[nid])), len(key_table))
        nodes.append(GraphNode(
            id=nid, ops=tuple(mem), main=main,
            label="+".join([ops[o].primitive for o in mem]), key=key, kind=groups[gid].kind,
            flops=float(sum([ops[o].flops for o in mem])), scope=mop.scope, role=mop.role))
    return GraphNodeGraph(graph=graph, nodes=nodes, node_of_op=node_of_op, edges=edges,
                          ports={e: tuple(sorted(v)) for e, v in ports.items()}, labeler=labeler)
