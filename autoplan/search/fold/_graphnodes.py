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
import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

import networkx as nx
import numpy as np

from autoplan._memo import per_owner
from autoplan._options import require_graph
from autoplan.tracing._graph import OpGraph, OpNode
from autoplan.tracing._operands import index_in_run, operand_arrays
from autoplan.tracing._primitives import GRAPHNODE_ANCHORS, GRAPHNODE_HEAVY, GRAPHNODE_REDUCTIONS

__all__ = [
    "GraphNode",
    "GraphNodeGraph",
    "EdgeArrays",
    "group_graphnodes",
    "HEAVY",
    "ANCHORS",
    "data_dependent",
    "dependent_on",
    "batch_inputs",
    "op_label",
    "op_labels",
    "OpLabeler",
]

# views of the primitive registry (:mod:`autoplan.tracing._primitives` says where they differ from the
# intra-operator search's and the layers' views)
#: compute-heavy primitives: each starts its own GraphNode
HEAVY = GRAPHNODE_HEAVY
#: primitives that always start a GraphNode (heavy ops, gathers/scatters, sorts, control flow)
ANCHORS = GRAPHNODE_ANCHORS
#: reductions: each starts a normalisation GraphNode unless it reduces a value private to one
REDUCTIONS = GRAPHNODE_REDUCTIONS
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
        # string); the string is made once per distinct tuple, and equal strings share an id.
        # The tuple holds the params in their own order with the type of each value (so that
        # ``1``, ``1.0`` and ``True`` differ), unsorted and unfiltered, which is cheaper: equal
        # tuples here were equal in the sorted, filtered form, and params in another order or
        # differing volatile params only cost one more string (equal strings share an id).
        quick: dict[tuple, int] = {}
        ids = self.ids
        strings = self.strings
        for op in graph.ops:
            params = op.params
            if params:
                k = (op.primitive, op.in_shapes, op.out_shapes, op.in_dtypes, op.out_dtypes,
                     *params.items(), *map(type, params.values()))
            else:
                k = (op.primitive, op.in_shapes, op.out_shapes, op.in_dtypes, op.out_dtypes)
            try:
                i = quick.get(k)
            except TypeError:  # an unhashable parameter: the string alone
                k, i = None, None
            if i is None:
                s = op_label(op)
                i = table.get(s)
                if i is None:
                    i = table[s] = len(strings)
                    strings.append(s)
                if k is not None:
                    quick[k] = i
            ids.append(i)
        self._digests: dict[int, str] = {}

    def digest(self, op_id: int) -> str:
        i = self.ids[op_id]
        d = self._digests.get(i)
        if d is None:
            d = self._digests[i] = hashlib.blake2b(self.strings[i].encode(), digest_size=8).hexdigest()
        return d


@per_owner
def op_labels(graph: OpGraph) -> OpLabeler:
    """The graph's :class:`OpLabeler` (made once per graph)."""
    return OpLabeler(graph)


def data_dependent(graph: OpGraph) -> list[bool]:
    """For each operator, whether it depends (transitively) on the batch.

    The batch is the graph inputs of kind ``"batch"`` or ``"input"``; when the graph has none,
    every graph input counts. Operators that are not data dependent compute only from parameters,
    optimizer state, constants and literals (parameter broadcasts, masks, optimizer constants).
    """
    return dependent_on(graph, batch_inputs(graph))


def dependent_on(graph: OpGraph, sources: Iterable[int]) -> list[bool]:
    """For each operator, whether it depends (transitively) on any of the tensors ``sources``:
    one pass in operator (topological) order with a flag per tensor."""
    dep_t = bytearray(len(graph.tensors))
    consumers = graph.consumers
    first = len(graph.ops)  # no operator before the first reader of a source depends on it
    for t in sources:
        dep_t[t] = 1
        if consumers[t]:
            first = min(first, min(consumers[t]))
    dep = [False] * len(graph.ops)
    for op in itertools.islice(graph.ops, first, None):
        for t in op.inputs:
            if t is not None and dep_t[t]:
                dep[op.id] = True
                for u in op.outputs:
                    dep_t[u] = 1
                break
    return dep


def dependence_masks(graph: OpGraph, sources: Sequence[int]) -> list[int]:
    """For each operator, a bit mask of the tensors ``sources`` it depends on (transitively): bit
    ``k`` for ``sources[k]``. One pass in operator order for all of them, where
    :func:`dependent_on` would make one pass per source."""
    mask = [0] * len(graph.tensors)
    consumers = graph.consumers
    first = len(graph.ops)
    for k, t in enumerate(sources):
        mask[t] |= 1 << k
        if consumers[t]:
            first = min(first, min(consumers[t]))
    out = [0] * len(graph.ops)
    for op in itertools.islice(graph.ops, first, None):
        m = 0
        for t in op.inputs:
            if t is not None:
                m |= mask[t]
        if m:
            out[op.id] = m
            for u in op.outputs:
                mask[u] = m
    return out


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


class EdgeArrays(NamedTuple):
    """The edges of a :class:`GraphNodeGraph` as arrays, each edge numbered in order of the first
    operand it carries (operators in order, then operands).

    Attributes:
        u, v: per edge, its producing and its consuming GraphNode.
        tensor_ptr, tensors: edge ``e``'s tensors are ``tensors[tensor_ptr[e]:tensor_ptr[e + 1]]``
            (each once, first read first).
        port_ptr, ports: edge ``e``'s ports are rows ``port_ptr[e]:port_ptr[e + 1]`` of
            ``ports`` (shape ``(n, 4)``, int64, each edge's rows sorted): ``(member index of the
            producer in u, output index, member index of the consumer in v, operand index)``.
    """

    u: np.ndarray
    v: np.ndarray
    tensor_ptr: np.ndarray
    tensors: np.ndarray
    port_ptr: np.ndarray
    ports: np.ndarray


@dataclass
class GraphNodeGraph:
    """The GraphNode DAG of an operator graph.

    Attributes:
        graph: the operator graph.
        nodes: the GraphNodes, in order of their first operator.
        node_of_op: for each operator id, the id of its GraphNode.
        member_of_op: for each operator id, its index in its GraphNode's ``ops``.
        edge_arrays: the edges as arrays (:class:`EdgeArrays`): what the subgraph miner reads.
        labeler: the interned operator labels of ``graph``.
        edges: for each GraphNode edge ``(u, v)``: ``{"tensors": ids of the tensors u passes to
            v, "bytes": their total size}`` (made when first asked).
        ports: for each edge ``(u, v)``, the sorted tuple of ``(member index of the producer in u,
            output index, member index of the consumer in v, operand index)`` of the operands it
            carries: what the subgraph miner uses as edge labels (made when first asked).
    """

    graph: OpGraph
    nodes: list[GraphNode]
    node_of_op: list[int]
    member_of_op: list[int] = field(repr=False)
    edge_arrays: EdgeArrays = field(repr=False)
    labeler: OpLabeler | None = field(default=None, repr=False)

    @cached_property
    def edge_bytes(self) -> np.ndarray:
        """Per edge (as numbered in :attr:`edge_arrays`), the bytes of its tensors."""
        ea = self.edge_arrays
        tensors = self.graph.tensors
        nbytes = np.fromiter((tensors[t].nbytes for t in ea.tensors.tolist()), np.int64,
                             len(ea.tensors))
        if not len(nbytes):
            return np.zeros(len(ea.u), dtype=np.int64)
        return np.add.reduceat(nbytes, ea.tensor_ptr[:-1])

    @cached_property
    def edges(self) -> dict[tuple[int, int], dict]:
        ea = self.edge_arrays
        flat, ptr = ea.tensors.tolist(), ea.tensor_ptr.tolist()
        return {(a, b): {"tensors": flat[x:y], "bytes": n}
                for a, b, x, y, n in zip(ea.u.tolist(), ea.v.tolist(), ptr, ptr[1:],
                                         self.edge_bytes.tolist())}

    @cached_property
    def ports(self) -> dict[tuple[int, int], tuple[tuple[int, int, int, int], ...]]:
        ea = self.edge_arrays
        rows = list(map(tuple, ea.ports.tolist()))
        ptr = ea.port_ptr.tolist()
        return {uv: tuple(rows[a:b]) for uv, a, b in zip(self.edges, ptr, ptr[1:])}

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


def batch_inputs(graph: OpGraph) -> list[int]:
    """The tensor ids of the batch (see :func:`data_dependent`)."""
    batch = [gi.tensor for gi in graph.inputs if gi.kind in ("batch", "input")]
    return batch or [gi.tensor for gi in graph.inputs]


def group_graphnodes(graph: OpGraph) -> GraphNodeGraph:
    """Group the operators of ``graph`` into TAPAS GraphNodes (see the module docstring).

    Args:
        graph: the operator graph (from :func:`autoplan.trace`).

    Returns:
        The :class:`GraphNodeGraph`: every operator in exactly one GraphNode, and the GraphNode DAG
        whose edges carry the bytes passed between GraphNodes.

    Examples:
        >>> import jax, jax.numpy as jnp, autoplan
        >>> from autoplan.search.fold._graphnodes import group_graphnodes
        >>> f = lambda w, b, x: jnp.tanh(x @ w + b).sum()
        >>> g = autoplan.trace(f, jax.ShapeDtypeStruct((4, 8), jnp.float32),
        ...                    jax.ShapeDtypeStruct((8,), jnp.float32),
        ...                    jax.ShapeDtypeStruct((2, 4), jnp.float32),
        ...                    arg_kinds=("parameter", "parameter", "batch"))
        >>> [n.label for n in group_graphnodes(g)]
        ['dot_general+broadcast_in_dim+add+tanh', 'reduce_sum']
    """
    require_graph("group_graphnodes", graph)
    ops = graph.ops
    group_of, g_main, g_kind, g_role, final = _group(graph)
    # number the GraphNodes in order of their first operator: a GraphNode's first operator is the
    # first operator of its lowest group, and groups are numbered in order of their first operator
    node_of_group = [-1] * len(g_main)
    node_main: list[int] = []  # the group that started each GraphNode (its final group)
    for gid, f in enumerate(final):
        v = node_of_group[f]
        if v < 0:
            v = node_of_group[f] = len(node_main)
            node_main.append(f)
        node_of_group[gid] = v
    labeler = op_labels(graph)
    node_of_op = [node_of_group[gid] for gid in group_of]
    members, member_of_op, keys, edge_arrays = _wiring(graph, node_of_op, len(node_main),
                                                       labeler.ids)
    # equal keys mean equal member labels, hence equal primitive sequences: one label per key.
    # A GraphNode is made by filling its instance dict: the same object as GraphNode(...) gives
    # (the dataclass has no __post_init__), without the frozen __init__'s object.__setattr__ per
    # field, which is a third of this loop
    new_node = object.__new__
    key_table: dict[tuple, int] = {}
    label_of_key: list[str] = []
    nodes: list[GraphNode] = []
    flops_of = [op.flops for op in ops].__getitem__
    for nid, gid in enumerate(node_main):
        mem = members[nid]
        role = g_role[gid]
        key = key_table.setdefault((role, keys[nid]), len(key_table))
        if key == len(label_of_key):
            label_of_key.append("+".join([ops[o].primitive for o in mem]))
        main = g_main[gid]
        node = new_node(GraphNode)
        node.__dict__.update(id=nid, ops=mem, main=main, label=label_of_key[key], key=key,
                             kind=g_kind[gid], flops=float(sum(map(flops_of, mem))),
                             scope=ops[main].scope, role=role)
        nodes.append(node)
    return GraphNodeGraph(graph=graph, nodes=nodes, node_of_op=node_of_op,
                          edge_arrays=edge_arrays, labeler=labeler, member_of_op=member_of_op)


def _wiring(graph: OpGraph, node_of_op: list[int], n_nodes: int, labels: list[int]
            ) -> tuple[list[tuple[int, ...]], list[int], list[bytes], EdgeArrays]:
    """The GraphNodes' members, structure keys and edges, over the flat operand arrays.

    Returns ``(members, member_of_op, keys, edge_arrays)``: each GraphNode's operator ids in
    order; each operator's index among its GraphNode's; each GraphNode's
    wiring as bytes (equal bytes, equal structure): per member its label id, its operand count,
    and per operand the (member index * ``wide`` + output index) of its producer inside the
    GraphNode, or -1 (a literal), -2 (from another GraphNode) or -3 (a graph input or constant),
    as int64 words; and the :class:`EdgeArrays`.
    """
    ops, tensors = graph.ops, graph.tensors
    arr = operand_arrays(graph)
    n_ops = len(ops)
    node = np.asarray(node_of_op, dtype=np.int64)
    # each operator's index among its GraphNode's members (members in operator order)
    order = np.argsort(node, kind="stable")
    first = np.zeros(n_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(node, minlength=n_nodes), out=first[1:])
    member = np.empty(n_ops, dtype=np.int64)
    member[order] = np.arange(n_ops, dtype=np.int64) - first[node[order]]
    # each tensor's output index at its producer
    n_out = arr.out_count
    out_index = np.zeros(len(tensors), dtype=np.int64)
    out_index[arr.output] = index_in_run(n_out)
    wide = 1 + int(n_out.max(initial=0))
    # per operand: the reading and the producing GraphNode, and its code in the wiring
    t = arr.tensor
    p = arr.made_by
    reader = arr.reader
    literal = t < 0
    made = p >= 0
    pm = np.where(made, p, 0)
    v = node[reader]
    u = np.where(made, node[pm], -1)
    slot = member[pm] * wide + out_index[np.maximum(t, 0)]
    code = np.where(literal, -1, np.where(u == v, slot, np.where(u < 0, -3, -2)))
    # the wiring of every operator (label, operand count, codes), in operator order, then
    # gathered GraphNode by GraphNode
    count = arr.count
    size = count + 2
    flat = np.empty(int(size.sum()), dtype=np.int64)
    head = arr.start[:-1] + 2 * np.arange(n_ops, dtype=np.int64)
    flat[head] = np.asarray(labels, dtype=np.int64)
    flat[head + 1] = count
    flat[np.arange(len(t), dtype=np.int64) + 2 * reader + 2] = code
    size_sorted = size[order]
    new_head = np.zeros(n_ops + 1, dtype=np.int64)
    np.cumsum(size_sorted, out=new_head[1:])
    src = np.repeat(head[order] - new_head[:-1], size_sorted) + np.arange(len(flat),
                                                                         dtype=np.int64)
    buf = flat[src].tobytes()
    bounds = (new_head[first] * 8).tolist()
    keys = [buf[a:b] for a, b in zip(bounds, bounds[1:])]
    order_list = order.tolist()
    fl = first.tolist()
    members = [tuple(order_list[a:b]) for a, b in zip(fl, fl[1:])]
    # the edges between GraphNodes: per edge, its tensors (each once, first seen first) and its
    # ports (sorted)
    cross = np.flatnonzero(made & (u != v))
    cu, cv, ct = u[cross], v[cross], t[cross]
    uniq, seen_at, inverse = np.unique(cu * n_nodes + cv, return_index=True, return_inverse=True)
    n_edges = len(uniq)
    by_first = np.argsort(seen_at, kind="stable")
    rank = np.empty(n_edges, dtype=np.int64)
    rank[by_first] = np.arange(n_edges, dtype=np.int64)
    e = rank[inverse.reshape(-1)]  # each crossing operand's edge, numbered by first operand
    n_t = max(len(tensors), 1)
    et, et_at = np.unique(e * n_t + ct, return_index=True)
    et = et[np.argsort(e[et_at] * len(cross) + et_at, kind="stable")]  # per edge, first seen
    edge_no = np.arange(n_edges + 1, dtype=np.int64)
    fields = (e, member[pm[cross]], out_index[ct], member[reader[cross]],
              cross - arr.start[reader[cross]])
    srt = np.lexsort(fields[::-1])
    edge_arrays = EdgeArrays(
        u=uniq[by_first] // n_nodes, v=uniq[by_first] % n_nodes,
        tensor_ptr=np.searchsorted(et // n_t, edge_no), tensors=et % n_t,
        port_ptr=np.searchsorted(e[srt], edge_no),
        ports=np.ascontiguousarray(np.stack([f[srt] for f in fields[1:]], axis=1),
                                   dtype=np.int64).reshape(-1, 4))
    return members, member.tolist(), keys, edge_arrays



def _group(graph: OpGraph) -> tuple[list[int], list[int], list[str], list[str], list[int]]:
    """The grouping of :func:`group_graphnodes` (see the module docstring), in one pass over the
    operators that also learns which operators depend on the batch.

    Returns ``(group_of, main, kind, role, final)``: each operator's group; each group's first
    operator, kind and role; and the group each group ends in (itself, or the group a side group
    is absorbed into). Groups are numbered in order of their first operator.

    Each tensor carries one code that says all the grouping needs of it: the group of its producer
    ``g`` when that depends on the batch (``>= 0``), ``-3 - g`` for a side group's tensor, ``-2``
    for a batch input and ``-1`` for other graph inputs and constants.
    """
    ops = graph.ops
    tensors = graph.tensors
    code = [-1] * len(tensors)
    for t in batch_inputs(graph):
        code[t] = -2
    group_of: list[int] = []
    g_main: list[int] = []
    g_kind: list[str] = []
    g_role: list[str] = []
    g_x: list[int] = []  # for a normalisation: the operator that produced the reduced tensor
    users: dict[int, set[int]] = {}  # side group -> the other groups that read its values
    anchors, heavy, reductions = ANCHORS, HEAVY, REDUCTIONS
    for op in ops:
        role = op.role
        prim = op.primitive
        # one look at the operands: a batch dependence, the first two distinct data groups read
        # (more: a third), and the side groups read
        d = False
        a = b = -1
        more = False
        sides = None
        for t in op.inputs:
            if t is None:
                continue
            c = code[t]
            if c >= 0:
                d = True
                if a < 0:
                    a = c
                elif c != a and c != b:
                    if b < 0:
                        b = c
                    else:
                        more = True
            elif c == -2:
                d = True
            elif c != -1:
                if sides is None:
                    sides = [-3 - c]
                else:
                    sides.append(-3 - c)
        g = -1
        if not d:
            # side computation: group with side producers when they all lie in one side group
            if sides is not None and prim not in anchors and g_role[sides[0]] == role:
                s = sides[0]
                if all(x == s for x in sides):
                    g = s
            if g < 0:
                g = _new(g_main, g_kind, g_role, g_x, op.id, "side", role)
        elif prim in anchors:
            g = _new(g_main, g_kind, g_role, g_x, op.id, "heavy" if prim in heavy else "anchor",
                     role)
        elif prim in reductions:
            # a reduction of a value private to a normalisation continues it
            if a >= 0 and b < 0 and g_kind[a] == "norm" and g_role[a] == role:
                if _private(op, tensors, ops, code, graph.consumers):
                    g = a
            if g < 0:
                x = next((tensors[t].producer for t in op.inputs
                          if t is not None and code[t] >= 0), -1)
                g = _new(g_main, g_kind, g_role, g_x, op.id, "norm", role, x)
        else:
            # follower: join the producers' group when there is exactly one (same role), or a
            # normalisation whose values and input are all this operator reads
            if a >= 0 and b < 0:
                if g_role[a] == role:  # (a data group is never a side group)
                    g = a
            elif b >= 0 and not more:
                for gid in {a, b}:  # (a set's order decides between two normalisations)
                    x = g_x[gid]
                    if (g_kind[gid] == "norm" and g_role[gid] == role and x >= 0
                            and all(code[t] == gid or tensors[t].producer == x
                                    for t in op.inputs if t is not None and code[t] >= 0)):
                        g = gid
                        break
            if g < 0:
                g = _new(g_main, g_kind, g_role, g_x, op.id, "op", role)
        group_of.append(g)
        if sides is not None:
            for s in sides:
                if s != g:
                    u = users.get(s)
                    if u is None:
                        users[s] = {g}
                    else:
                        u.add(g)
        c = g if d else -3 - g
        for t in op.outputs:
            code[t] = c
    # absorb side groups into their single consuming group, consumers first
    final = list(range(len(g_main)))
    for s in sorted(users, reverse=True):
        targets = {final[g] for g in users[s]}
        if len(targets) == 1:
            final[s] = targets.pop()
    return group_of, g_main, g_kind, g_role, final


def _new(g_main: list[int], g_kind: list[str], g_role: list[str], g_x: list[int], first: int,
         kind: str, role: str, x: int = -1) -> int:
    """Start a group at operator ``first``; returns its id."""
    g_main.append(first)
    g_kind.append(kind)
    g_role.append(role)
    g_x.append(x)
    return len(g_main) - 1


def _private(op: OpNode, tensors: list, ops: list[OpNode], code: list[int],
             consumers: Sequence[Sequence[int]]) -> bool:
    """Whether every batch-dependent producer of ``op`` has ``op`` as its only consumer: no
    operand outside ``op`` reads any of its outputs (``consumers``: the graph's, one entry per
    operand reading a tensor)."""
    mine = Counter(t for t in op.inputs if t is not None and code[t] >= 0)
    seen = set()
    for t in mine:
        p = tensors[t].producer
        if p in seen:
            continue
        seen.add(p)
        outs = ops[p].outputs
        if sum(len(consumers[u]) for u in outs) != sum(mine[u] for u in outs):
            return False
    return True
