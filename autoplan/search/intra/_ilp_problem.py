"""The intra-operator ILP's problem: :class:`ILPProblem` and :func:`build_problem`.

Building a problem (the formulation is in :mod:`autoplan.search.intra._ilp`): one decision node
per graph input or boundary tensor, over its specs, and per operator that follows no operand,
over its strategies; followers merged into their leader operand's node; free tensors (built from
constants); each node's costs and saved memory; the tensor edges' resharding matrices, with
identical rows and columns merged and separable edges folded into node costs; and the facts of a
graph that building reads, made once per graph (free tensors, updated-input pairs, the tensors
backward operators read).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from autoplan._dtype import dtype_bytes
from autoplan._errors import SearchError
from autoplan._memo import BoundedCache, memo, per_owner
from autoplan.costs._mesh import LogicalMesh
from autoplan.plans._spec import Spec, tile_count
from autoplan.search.intra._pins import pin_specs, pins_key
from autoplan.search.intra._reshard import mesh_id, reshard_on
from autoplan.search.intra._spec_space import checked_spec, enumerate_specs, replicated, tiles
from autoplan.search.intra._strategies import (
    Strategy,
    _op_key,
    derive_all,
    fusion_context,
    gradient_feeds,
    is_follower,
    is_generator,
    is_heavy,
    leader_operand,
    strategies,
)
from autoplan.tracing._graph import OpGraph

__all__ = ["ILPProblem", "aligned_nodes", "build_problem", "least_memory_bound",
           "updated_input_pairs"]


#: replicated-input penalty: this fraction of the time to move an input's replicated excess bytes
#: (its bytes per device above the fully sharded size) over the mesh's fastest axis
PARAM_PENALTY = 1e-3


_OUTPUT_LEAF = re.compile(r"^\[(\d+)\](.*)$")  # output leaf ``[k]<path>``


@dataclass
class _Node:
    key: int | str
    kind: str  # "op" | "input" | "boundary"
    tensor: int | None
    strategies: list[Strategy]
    cost: np.ndarray
    memory: np.ndarray
    penalty: np.ndarray | None = None


@dataclass
class _Member:
    node: int
    idx: np.ndarray  # node strategy -> index into strats
    strats: list[Strategy]
    leader: int | None  # operand position followed (None for a root)
    in_ids: list[np.ndarray | None] = field(default_factory=list)  # per operand, over strats


@dataclass
class _Tables:
    """Per strategy list: costs and the spec ids of every operand and result."""

    cost: np.ndarray
    out_ids: list[np.ndarray]
    out_tiles: list[np.ndarray]
    in_ids: list[np.ndarray | None]


@dataclass(frozen=True)
class _Layout:
    """What :class:`_Tables` holds for a strategy list on a mesh shape, whatever the problem:
    the distinct operand and result specs in the order the problem interns them (each result
    position over the strategies, then each operand position that has no literal), each
    position's index into them, the results' tiles and the strategies' costs (arrays not to be
    changed: every problem with this strategy list shares them)."""

    strats: tuple[Strategy, ...]  # (held: the key is made of their ids)
    specs: tuple[Spec, ...]
    out_pos: list[np.ndarray]
    in_pos: list[np.ndarray | None]
    out_tiles: list[np.ndarray]
    cost: np.ndarray


#: :func:`_layout`'s layouts, by mesh shape and axis names and the strategies' ids
_LAYOUTS: BoundedCache[tuple, _Layout] = BoundedCache(50_000)  # (about 1 kB each)


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def _layout(mesh: LogicalMesh, strats: list[Strategy]) -> _Layout:
    """The :class:`_Layout` of a strategy list on ``mesh``'s shape, once per shape and list (the
    strategies come from the shared caches of :mod:`~autoplan.search.intra._strategies`, so a
    search's problems on one mesh meet the same lists again and again)."""
    key = (mesh.shape, mesh.axis_names, *map(id, strats))
    hit = _LAYOUTS.get(key)
    if hit is not None:
        return hit
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    order: dict[Spec, int] = {}  # first seen first, as interning them one by one would number them
    n_out = len(strats[0].out_specs)
    out_pos = [_frozen(np.array([order.setdefault(s.out_specs[j], len(order)) for s in strats],
                                dtype=np.int64)) for j in range(n_out)]
    out_tiles = [_frozen(np.array([tile_count(s.out_specs[j], sizes) for s in strats],
                                  dtype=float)) for j in range(n_out)]
    in_pos: list[np.ndarray | None] = []
    for j in range(len(strats[0].in_specs)):
        if any(s.in_specs[j] is None for s in strats):
            in_pos.append(None)
        else:
            in_pos.append(_frozen(np.array([order.setdefault(s.in_specs[j], len(order))
                                            for s in strats], dtype=np.int64)))
    return _LAYOUTS.put(key, _Layout(tuple(strats), tuple(order), out_pos, in_pos, out_tiles,
                                      _frozen(np.array([s.cost for s in strats]))))


def _tables(prob: ILPProblem, strats: list[Strategy], cache: dict[tuple, _Tables]) -> _Tables:
    key = tuple(map(id, strats))
    hit = cache.get(key)
    if hit is not None and hit.cost.shape[0] == len(strats):
        return hit
    lay = _layout(prob.mesh, strats)
    intern = prob.intern
    ids = np.array([intern(s) for s in lay.specs], dtype=np.int64)
    tab = _Tables(lay.cost, [ids[p] for p in lay.out_pos], lay.out_tiles,
                  [None if p is None else ids[p] for p in lay.in_pos])
    cache[key] = tab
    return tab


@dataclass
class ILPProblem:
    """The merged, cost-annotated problem :func:`solve_ilp` solves (also used by
    :func:`evaluate`).

    Attributes:
        graph: the operator graph; ``mesh`` the logical mesh.
        ops: operator ids in the problem (the segment).
        nodes: decision nodes; ``node_keys`` their keys: an op id (int) for an operator, the
            input's name for a graph input, ``"%<tensor id>"`` for a boundary tensor.
        unknown: primitives without a sharding rule (replicated).
        vars_before_merging: binaries Alpa's unmerged ILP would have (a strategy variable per
            operator and input with more than one strategy, plus an edge variable per strategy
            pair of every tensor edge between two such nodes).
    """

    graph: OpGraph
    mesh: LogicalMesh
    ops: list[int]
    nodes: list[_Node]
    members: dict[int, _Member]
    tensor_src: dict[int, tuple[int, np.ndarray]]
    free_tensors: frozenset[int]
    specs: list[Spec]
    spec_id: dict[Spec, int]
    out_pairs: list[tuple[int, int]]  # (output tensor, input tensor)
    fixed_inside: dict[int, Spec]
    input_node: dict[int, int]  # tensor id -> node index (inputs and boundaries)
    unknown: set[str]
    grad_ops: set[int]
    #: per tensor of ``fixed_inside``: how many times its fixed-spec resharding is charged (its
    #: uses outside the problem's operators, at least 1; see :func:`build_problem`)
    fixed_uses: dict[int, int] = field(default_factory=dict)
    vars_before_merging: int = 0
    edges: list[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    build_seconds: float = 0.0

    @property
    def node_keys(self) -> list[int | str]:
        return [n.key for n in self.nodes]

    def num_strategies(self) -> list[int]:
        return [len(n.strategies) for n in self.nodes]

    def intern(self, spec: Spec) -> int:
        i = self.spec_id.get(spec)
        if i is None:
            i = len(self.specs)
            self.specs.append(spec)
            self.spec_id[spec] = i
        return i


def updated_input_pairs(graph: OpGraph) -> list[tuple[int, int]]:
    """``(output tensor, input tensor)`` pairs where an output leaf ``[k]<path>`` is the update
    of input ``<path>`` of argument ``k-1`` (same shape), as in a train step returning
    ``(loss, new_params, new_opt_state)``."""
    by_key = {(gi.arg, gi.path): gi for gi in graph.inputs}
    out = []
    for o in graph.outputs:
        m = _OUTPUT_LEAF.match(o.path)
        if not m:
            continue
        gi = by_key.get((int(m.group(1)) - 1, m.group(2)))
        if gi is None or gi.tensor == o.tensor:
            continue
        if graph.tensors[gi.tensor].shape != graph.tensors[o.tensor].shape:
            continue
        out.append((o.tensor, gi.tensor))
    return out


def _penalty_vec(nbytes: float, strategies_: Sequence[Strategy], mesh: LogicalMesh) -> np.ndarray:
    betas = [b for b, n in zip(mesh.beta, mesh.shape) if n > 1]
    if not betas:
        return np.zeros(len(strategies_))
    floor = nbytes / mesh.size
    return np.array([PARAM_PENALTY * min(betas) * max(0.0, s.memory - floor) for s in strategies_])


def _spec_strategy(spec: Spec, shape: tuple[int, ...], dtype: str, mesh: LogicalMesh) -> Strategy:
    spec = Spec.of(spec)
    t = tiles(spec, mesh)
    return Strategy((spec,), (), (), 0.0, math.prod(shape) * dtype_bytes(dtype) / t, label=str(spec))


def _resolve_fixed(graph: OpGraph, mesh: LogicalMesh, fixed: Mapping[int, Any] | None
                   ) -> dict[int, Spec]:
    out: dict[int, Spec] = {}
    for t, pspec in (fixed or {}).items():
        if not isinstance(t, int | np.integer) or not 0 <= int(t) < len(graph.tensors):
            raise SearchError(f"fixed: keys should be tensor ids of the graph (0..{len(graph.tensors) - 1}). "
                              f"Got {t!r}. Fix: use ids from graph.tensors.")
        shape = graph.tensors[int(t)].shape
        spec = replicated(len(shape)) if pspec is None else checked_spec(pspec, shape, mesh)
        out[int(t)] = spec
    return out


def build_problem(graph: OpGraph, mesh: LogicalMesh, *, ops: Sequence[int] | None = None,
                  fixed: Mapping[int, Any] | None = None, pins: Mapping[str, Any] | None = None,
                  count_unmerged: bool = True, chosen: Mapping[int, Strategy] | None = None,
                  chosen_specs: Mapping[int, Spec] | None = None) -> ILPProblem:
    """Build the merged problem: nodes with their strategies, followers, tensor edges, costs.

    Args:
        graph: the operator graph.
        mesh: the logical mesh.
        ops: operator ids to include (default: all).
        fixed: ``{tensor id: spec or PartitionSpec}`` fixed specs at a segment's boundary.
        pins: ``{regex over input names, or input tensor id: PartitionSpec}`` fixed input specs.
        count_unmerged: also count the variables of the unmerged ILP (``vars_before_merging``).
        chosen: ``{op id: strategy}``: these operators are nodes of their own with this one
            strategy (no follower merging, no enumeration), to cost a given plan with
            :func:`cost_strategies`; such a problem has no edges and is not for solving.
        chosen_specs: ``{input tensor id: spec}``: the one spec of these inputs (with ``chosen``).

    Raises:
        SearchError: a pin or fixed spec is invalid, or a pin matches nothing.
    """
    prob = problem_nodes(graph, mesh, ops=ops, fixed=fixed, pins=pins, chosen=chosen,
                         chosen_specs=chosen_specs)
    return problem_edges(prob, ops=ops, fixed=fixed, pins=pins, chosen=chosen,
                         count_unmerged=count_unmerged)


def problem_nodes(graph: OpGraph, mesh: LogicalMesh, *, ops: Sequence[int] | None = None,
                  fixed: Mapping[int, Any] | None = None, pins: Mapping[str, Any] | None = None,
                  chosen: Mapping[int, Strategy] | None = None,
                  chosen_specs: Mapping[int, Spec] | None = None) -> ILPProblem:
    """The first half of :func:`build_problem` (same arguments): the nodes with their
    strategies, costs and memory, without the edges between them. The least memory of any plan
    is known from it (the sum of each node's least), so a memory budget below it is refused
    without building the edges (:func:`~autoplan.search.intra._ilp_solve.solve_ilp`);
    :func:`problem_edges` completes it."""
    t0 = time.perf_counter()
    op_ids = sorted(set(range(len(graph.ops)) if ops is None else (int(i) for i in ops)))
    for i in op_ids:
        if not 0 <= i < len(graph.ops):
            raise SearchError(f"ops: operator ids should be in 0..{len(graph.ops) - 1}. Got {i}. "
                              "Fix: pass ids of graph.ops.")
    in_seg = set(op_ids)
    pinned = pin_specs(graph, mesh, pins)
    fixed_specs = _resolve_fixed(graph, mesh, fixed)
    prob = ILPProblem(graph=graph, mesh=mesh, ops=op_ids, nodes=[], members={}, tensor_src={},
                      free_tensors=frozenset(), specs=[], spec_id={}, out_pairs=[], fixed_inside={},
                      input_node={}, unknown=set(), grad_ops=set())

    # free tensors: constants and everything computed only from them
    # (the graph's set itself unless a fixed tensor is in it: no copy per segment problem)
    free = _free_tensors(graph)
    if any(t in free for t in fixed_specs):
        free = free.difference(fixed_specs)
    prob.free_tensors = free

    needed = ([gi.tensor for gi in graph.inputs] if ops is None
              else _read_from_outside(graph, op_ids, in_seg, free))
    _add_input_nodes(prob, needed, fixed_specs, pinned, chosen_specs)
    _add_operator_nodes(prob, chosen)
    _add_fixed_and_pairs(prob, fixed_specs, in_seg)

    # gradient-producing backward operators (for tagging collectives): a gradient reaches the
    # optimizer update through movement/elementwise ops only; an activation gradient reaches it
    # only through a reduction, e.g. a bias gradient
    feeds = gradient_feeds(graph)
    prob.grad_ops = {i for i in op_ids if graph.ops[i].role == "backward" and feeds[i]}
    prob.build_seconds = time.perf_counter() - t0
    return prob


def problem_edges(prob: ILPProblem, *, ops: Sequence[int] | None = None,
                  fixed: Mapping[int, Any] | None = None, pins: Mapping[str, Any] | None = None,
                  chosen: Mapping[int, Strategy] | None = None,
                  count_unmerged: bool = True) -> ILPProblem:
    """The second half of :func:`build_problem`: ``prob`` (from :func:`problem_nodes`, called
    with the same ``ops``, ``fixed``, ``pins`` and ``chosen``) with its edges, and
    ``vars_before_merging`` counted when ``count_unmerged``. Returns ``prob``."""
    t0 = time.perf_counter()
    graph, mesh = prob.graph, prob.mesh
    if chosen is None:
        _build_edges(prob)
    if count_unmerged:
        key = pins_key(pins)
        if ops is None and not fixed and chosen is None and key is not None:
            # (the whole step's count reads only the mesh and the pins: a search that changes
            # only the memory budget, whose exhaustive ILP is built again, counts nothing again)
            prob.vars_before_merging = memo(graph, (_count_unmerged, mesh_id(mesh), key),
                                            lambda: _count_unmerged(prob))
        else:
            prob.vars_before_merging = _count_unmerged(prob)
    prob.build_seconds += time.perf_counter() - t0
    return prob


def aligned_nodes(a: ILPProblem, b: ILPProblem, tol: float) -> np.ndarray | None:
    """Each node of ``b`` as a node of ``a`` (-1: a node of ``b``'s own with one strategy)
    where the two problems are the same ILP up to a constant: then every assignment of ``b``'s
    nodes costs what the same strategies cost in ``a`` plus one constant, within ``tol``
    seconds, and so does its memory (without ``tol``: bytes per device are exact), so a solution
    of ``a`` taken node by node is a solution of ``b`` that is as close to optimal. None where
    they are not.

    The nodes line up by what they are: an operator's by its id (the operators of the two
    problems' graphs in one order, as layers of one loose signature have them:
    :func:`~autoplan.search.fold._layers.loose_signature`), an input's by the first operator
    that reads it and the operand it is. A node one problem has and the other lacks (a scalar
    read from outside where the other reads a literal) must have a single strategy and no
    edge: a constant. Aligned nodes must have as many strategies, costs and memory that differ
    by a constant, and the edges must join the same nodes with the same costs.
    """
    if a.mesh.shape != b.mesh.shape:
        return None
    ka, kb = _alignment_keys(a), _alignment_keys(b)
    if ka is None or kb is None:
        return None
    where = {k: i for i, k in enumerate(ka)}
    align = np.array([where.get(k, -1) for k in kb], dtype=np.int64)
    if len(where) != len(ka):
        return None
    alone_a = np.ones(len(a.nodes), dtype=bool)
    alone_a[align[align >= 0]] = False
    alone_b = align < 0
    if any(len(a.nodes[i].strategies) != 1 for i in np.flatnonzero(alone_a)) or any(
            len(b.nodes[j].strategies) != 1 for j in np.flatnonzero(alone_b)):
        return None
    dev = 0.0
    for j, i in enumerate(align.tolist()):
        if i < 0:
            continue
        na, nb = a.nodes[i], b.nodes[j]
        if len(na.strategies) != len(nb.strategies):
            return None
        if len(nb.cost) > 1:
            dev += float(np.ptp(nb.cost - na.cost))
            if np.ptp(nb.memory - na.memory) != 0:
                return None
    edges_a = {(u, w): (gu, gw, m) for u, w, gu, gw, m in a.edges}
    if (len(edges_a) != len(a.edges) or len(edges_a) != len(b.edges)
            or any(alone_a[u] or alone_a[w] for u, w in edges_a)
            or any(alone_b[u] or alone_b[w] for u, w, *_ in b.edges)):
        return None
    for u, w, gu, gw, m in b.edges:
        hit = edges_a.get((int(align[u]), int(align[w])))
        if hit is None:
            return None
        mb, ma = m[gu][:, gw], hit[2][hit[0]][:, hit[1]]
        if mb.shape != ma.shape:
            return None
        dev += float(np.abs(mb - ma).max())
    return align if dev <= tol else None


def _alignment_keys(prob: ILPProblem) -> list[tuple] | None:
    """:func:`aligned_nodes`'s key of each node of ``prob``; None where an input is read by no
    operator (nothing places it)."""
    graph = prob.graph
    consumers = graph.consumers
    out: list[tuple] = []
    for n in prob.nodes:
        if n.kind == "op":
            out.append(("op", n.key))
            continue
        readers = consumers[n.tensor]
        if not readers:
            return None
        c = min(readers)
        out.append(("in", c, graph.ops[c].inputs.index(n.tensor)))
    return out


def _read_from_outside(graph: OpGraph, op_ids: Sequence[int], in_seg: set[int],
                       free: frozenset[int]) -> list[int]:
    """The tensors a segment's operators read from outside it (non-free), in the order read."""
    needed: list[int] = []
    seen: set[int] = set()
    for i in op_ids:
        for t in graph.ops[i].inputs:
            if t is None or t in seen or t in free:
                continue
            p = graph.tensors[t].producer
            if p < 0 or p not in in_seg:
                seen.add(t)
                needed.append(t)
    return needed


def _add_input_nodes(prob: ILPProblem, needed: Sequence[int], fixed_specs: Mapping[int, Spec],
                     pinned: Mapping[int, Spec], chosen_specs: Mapping[int, Spec] | None) -> None:
    """One node per graph input or boundary tensor, over its fixed, chosen, pinned or every
    spec (inputs pay the parameter penalty; boundary activations' memory is their producer's)."""
    graph, mesh = prob.graph, prob.mesh
    input_of = graph.input_of_tensor
    for t in needed:
        ten = graph.tensors[t]
        gi = input_of.get(t)
        if t in fixed_specs:
            specs = [fixed_specs[t]]
        elif chosen_specs is not None and t in chosen_specs:
            specs = [chosen_specs[t]]
        elif t in pinned:
            specs = [pinned[t]]
        elif t in graph.key_tensors:  # PRNG keys are replicated, never sharded
            specs = [replicated(len(ten.shape))]
        else:
            specs = enumerate_specs(ten.shape, mesh)
        strats = [_spec_strategy(s, ten.shape, ten.dtype, mesh) for s in specs]
        cost = np.zeros(len(strats))
        mem = np.array([s.memory for s in strats])
        if gi is not None:
            cost = cost + _penalty_vec(ten.nbytes, strats, mesh)
        if gi is None:
            mem = np.zeros(len(strats))  # boundary activations are counted by their producer
        key: int | str = gi.name if gi is not None else f"%{t}"
        prob.nodes.append(_Node(key, "input" if gi is not None else "boundary", t, strats, cost,
                                mem, cost.copy()))
        nid = len(prob.nodes) - 1
        prob.input_node[t] = nid
        prob.tensor_src[t] = (nid, np.array([prob.intern(s) for s in specs], dtype=np.int64))


def _add_operator_nodes(prob: ILPProblem, chosen: Mapping[int, Strategy] | None) -> None:
    """The operators' nodes: a root enumerates its strategies, a follower joins its leader
    operand's node (its strategy derived from each of the leader's); costs and saved memory."""
    graph, mesh, op_ids, free, specs = prob.graph, prob.mesh, prob.ops, prob.free_tensors, prob.specs
    follow_cache: dict[tuple, Any] = {}
    contexts = fusion_context(graph)  # each operator's place in XLA's fusion
    table_cache: dict[tuple, _Tables] = {}
    leaders, op_keys = _leaders(graph), _op_keys(graph)
    read_back = _backward_read(graph)
    saved = set(filter(read_back.__contains__, chain.from_iterable(
        graph.ops[i].outputs for i in op_ids if graph.ops[i].role == "forward")))
    for i in op_ids:
        op = graph.ops[i]
        # (which operators get a node and which results count as memory: _memory_bytes, the
        # least-memory bound, follows the same rules and must keep to them)
        if all(t in free for t in op.outputs) and op.outputs:
            continue
        member: _Member | None = None
        if chosen is not None and i in chosen:
            prob.nodes.append(_Node(i, "op", None, [chosen[i]], np.zeros(1), np.zeros(1)))
            member = _Member(len(prob.nodes) - 1, np.zeros(1, dtype=np.int64), [chosen[i]], None)
        elif not is_heavy(op) and is_follower(op):
            cands = tuple(k for k, t in enumerate(op.inputs)
                          if t is not None and t in prob.tensor_src and op.in_shapes[k] is not None)
            lkey = (i, cands)
            k = leaders.get(lkey, -1)
            if k == -1:  # (its operands' sizes and producers: once per graph and candidates)
                k = leaders[lkey] = leader_operand(op, cands, graph) if cands else None
            if k is not None:
                nid, src_ids = prob.tensor_src[op.inputs[k]]
                ctx = contexts[i]
                okey = op_keys.get(i)
                if okey is None:
                    okey = op_keys[i] = _op_key(op)
                ckey = (okey, ctx, k, src_ids.tobytes())
                hit = follow_cache.get(ckey)
                if hit is None:
                    uniq, inv = _unique_ids(src_ids)
                    strats = derive_all(op, mesh, k, tuple([specs[u] for u in uniq]), ctx, okey)
                    hit = None if strats is None else (strats, inv)
                    follow_cache[ckey] = hit
                if hit is not None:
                    member = _Member(nid, hit[1], hit[0], k)  # type: ignore[arg-type]
        if member is None:
            strats = strategies(op, graph, mesh, prob.unknown)
            node = _Node(i, "op", None, strats, np.zeros(len(strats)), np.zeros(len(strats)))
            prob.nodes.append(node)
            member = _Member(len(prob.nodes) - 1, np.arange(len(strats)), strats, None)
        prob.members[i] = member
        tab = _tables(prob, member.strats, table_cache)
        member.in_ids = tab.in_ids
        node = prob.nodes[member.node]
        node.cost = node.cost + tab.cost[member.idx]
        for j, t in enumerate(op.outputs):
            prob.tensor_src[t] = (member.node, tab.out_ids[j][member.idx])
            if t in saved:
                node.memory = node.memory + graph.tensors[t].nbytes / tab.out_tiles[j][member.idx]


def _add_fixed_and_pairs(prob: ILPProblem, fixed_specs: Mapping[int, Spec],
                         in_seg: set[int]) -> None:
    """Fixed tensors produced inside the segment, with their uses outside, and the updated-input
    pairs whose resharding back to the input's spec is charged.

    A fixed tensor is charged once per use outside the segment: the whole graph (and a stitched
    plan, costed by cost_strategies) reshards an operand per consumer, from the producer's spec
    to the consumer's, so when the other segment's consumers read the fixed spec the producer ->
    fixed resharding is paid once by each of them (a boundary activation read by a convolution, a
    residual add and a shortcut convolution is gathered three times, not once); charged once,
    the segments' objectives would undercount the stitched plan.
    """
    graph = prob.graph
    consumers = graph.consumers
    for t, spec in fixed_specs.items():
        if t in prob.tensor_src and t not in prob.input_node:
            prob.fixed_inside[t] = spec
            # (``consumers`` lists an operator once per operand it reads ``t`` as)
            prob.fixed_uses[t] = max(1, sum(1 for c in consumers[t] if c not in in_seg))
    # updated inputs (new parameters / optimizer state) are charged the resharding back to the
    # input's spec in a segment too, whenever the segment holds both ends (looked up from the
    # problem's inputs, in the graph's order of the pairs)
    pairs_of = _updated_pairs_by_input(graph)
    hits = sorted((k, o, i) for i in prob.input_node for k, o in pairs_of.get(i, ())
                  if o in prob.tensor_src)
    prob.out_pairs = [(o, i) for _, o, i in hits]


@per_owner
def _leaders(graph: OpGraph) -> dict[tuple[int, tuple[int, ...]], int | None]:
    """``{(operator id, candidate operands): its leader operand}`` (:func:`leader_operand`,
    which reads only the operator, the candidates and the graph), filled as problems of
    ``graph`` are built: every mesh's problem, and every layer's on each submesh and logical
    mesh, asks again."""
    return {}


@per_owner
def _op_keys(graph: OpGraph) -> dict[int, tuple]:
    """``{operator id: _op_key(operator)}``, filled as problems of ``graph`` are built."""
    return {}


@per_owner
def _free_tensors(graph: OpGraph) -> frozenset[int]:
    """Constants and every tensor computed only from them (by cheap operators); once per
    graph."""
    # ``None`` (a literal operand) counts as free, so that one C-level ``issuperset`` tests
    # the operands; it rules out almost every operator before the primitive tests
    free: set[int | None] = set(graph.consts)
    free.add(None)
    for op in graph.ops:
        if not free.issuperset(op.inputs):
            continue
        if is_heavy(op) or not (is_follower(op) or is_generator(op)):
            continue
        free.update(op.outputs)
    free.discard(None)
    return frozenset(free)  # type: ignore[arg-type]


@per_owner
def _updated_pairs(graph: OpGraph) -> list[tuple[int, int]]:
    """:func:`updated_input_pairs`, once per graph."""
    return updated_input_pairs(graph)


@per_owner
def _updated_pairs_by_input(graph: OpGraph) -> dict[int, list[tuple[int, int]]]:
    """``{input tensor: [(position in updated_input_pairs, output tensor)]}``, once per graph (a
    segment problem looks up its own inputs' pairs instead of scanning every pair)."""
    out: dict[int, list[tuple[int, int]]] = {}
    for k, (o, i) in enumerate(_updated_pairs(graph)):
        out.setdefault(i, []).append((k, o))
    return out


def least_memory_bound(graph: OpGraph, mesh: LogicalMesh) -> float:
    """A lower bound on the least live memory per device of any plan of the whole step on
    ``mesh`` (what :func:`problem_nodes` sums, :func:`~autoplan.search.intra._ilp_solve.solve_ilp`'s
    ``least_memory``), without building a node: the bytes its nodes' memory counts (the graph
    inputs, and the forward results read back by the backward of the operators that get a
    node) split over all of the mesh's devices. No spec splits a tensor into more tiles than
    the mesh has devices, so each node's least is at least its share of this; the bound is the
    least itself where every such tensor can be split over every device."""
    return _memory_bytes(graph) / mesh.size


@per_owner
def _memory_bytes(graph: OpGraph) -> float:
    """The bytes the whole step's nodes count as live memory, each tensor unsplit (once per
    graph; :func:`least_memory_bound`)."""
    free, read_back = _free_tensors(graph), _backward_read(graph)
    total = sum(graph.tensors[gi.tensor].nbytes for gi in graph.inputs)
    for op in graph.ops:
        if op.role != "forward" or (op.outputs and all(t in free for t in op.outputs)):
            continue  # (an operator of free results only gets no node: _add_operator_nodes)
        total += sum(graph.tensors[t].nbytes for t in op.outputs if t in read_back)
    return float(total)


@per_owner
def _backward_read(graph: OpGraph) -> frozenset[int]:
    """The tensors some backward operator reads (a forward result among them is an activation
    saved for backward), once per graph."""
    read: set[int | None] = set()
    for op in graph.ops:
        if op.role == "backward":
            read.update(op.inputs)
    read.discard(None)
    return frozenset(read)  # type: ignore[arg-type]


def _tensor_edges(prob: ILPProblem):
    """Every (tensor, source node, source spec ids, destination node, destination spec ids)."""
    graph = prob.graph
    out = []
    for i in prob.ops:
        m = prob.members.get(i)
        if m is None:
            continue
        op = graph.ops[i]
        for j, t in enumerate(op.inputs):
            if t is None or t not in prob.tensor_src:
                continue
            if len(graph.tensors[t].shape) == 0:
                continue
            u, src = prob.tensor_src[t]
            dl = m.in_ids[j] if j < len(m.in_ids) else None
            if dl is None:
                dl = np.array([prob.intern(s.in_specs[j]) if s.in_specs[j] is not None else
                               prob.intern(replicated(len(graph.tensors[t].shape)))
                               for s in m.strats], dtype=np.int64)
            out.append((t, u, src, m.node, dl[m.idx]))
    for o, i in prob.out_pairs:
        u, src = prob.tensor_src[o]
        w, dst = prob.tensor_src[i]
        out.append((o, u, src, w, dst))
    return out


#: resharding times between distinct source and destination specs of a tensor shape and dtype,
#: by mesh (:func:`mesh_id`), the specs, the shape and the dtype
_MATRICES: BoundedCache[tuple, np.ndarray] = BoundedCache(200_000)


class _ReshardTable:
    def __init__(self, prob: ILPProblem):
        self.prob = prob
        self.mid = mesh_id(prob.mesh)
        self.cache: dict[tuple, float] = {}
        self.mcache: dict[tuple, np.ndarray] = {}

    def time(self, t: int, a: int, b: int, backward: bool = False) -> float:
        if a == b:
            return 0.0
        ten = self.prob.graph.tensors[t]
        key = (a, b, ten.shape, ten.dtype, backward)
        v = self.cache.get(key)
        if v is None:
            src, dst = self.prob.specs[a], self.prob.specs[b]
            v = 0.0 if src == dst else reshard_on(self.mid, src, dst, tuple(ten.shape),
                                                  dtype_bytes(ten.dtype), self.prob.mesh,
                                                  backward)[0]
            self.cache[key] = v
        return v

    def matrix(self, t: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """``R[i, j]`` for arrays of source and destination spec ids."""
        ten = self.prob.graph.tensors[t]
        key = (src.tobytes(), dst.tobytes(), ten.shape, ten.dtype)
        hit = self.mcache.get(key)
        if hit is not None:
            return hit
        us, iu = _unique_ids(src)
        ud, idd = _unique_ids(dst)
        specs = self.prob.specs
        gkey = (self.mid, tuple([specs[a] for a in us]), tuple([specs[b] for b in ud]),
                ten.shape, ten.dtype)
        small = _MATRICES.get(gkey)
        if small is None:
            small = _MATRICES.put(gkey, _frozen(np.array([[self.time(t, a, b) for b in ud]
                                                          for a in us])))
        out = small[np.ix_(iu, idd)]
        self.mcache[key] = out
        return out

    def diag(self, t: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        ten = self.prob.graph.tensors[t]
        key = ("d", src.tobytes(), dst.tobytes(), ten.shape, ten.dtype)
        hit = self.mcache.get(key)
        if hit is None:
            hit = self.mcache[key] = np.array([self.time(t, int(a), int(b))
                                               for a, b in zip(src, dst)])
        return hit


def _build_edges(prob: ILPProblem) -> None:
    """Fold self-edges and separable edges into node costs; keep the others compressed."""
    table = _ReshardTable(prob)
    pairs: dict[tuple[int, int], list] = {}
    for t, u, src, w, dst in _tensor_edges(prob):
        if u == w:
            prob.nodes[u].cost = prob.nodes[u].cost + table.diag(t, src, dst)
        elif len(prob.nodes[u].strategies) == 1 or len(prob.nodes[w].strategies) == 1:
            r = table.matrix(t, src, dst)
            if len(prob.nodes[u].strategies) == 1:
                prob.nodes[w].cost = prob.nodes[w].cost + r[0]
            else:
                prob.nodes[u].cost = prob.nodes[u].cost + r[:, 0]
        else:
            pairs.setdefault((u, w), []).append((t, src, dst))
    for t, spec in prob.fixed_inside.items():
        u, src = prob.tensor_src[t]
        b = prob.intern(spec)
        n = prob.fixed_uses.get(t, 1)
        prob.nodes[u].cost = prob.nodes[u].cost + n * np.array([table.time(t, int(a), b)
                                                                for a in src])
    edges = []
    cache: dict[tuple, tuple] = {}
    tens = prob.graph.tensors
    for (u, w), lst in pairs.items():
        rows_u = np.stack([src for _, src, _ in lst], axis=1)
        rows_w = np.stack([dst for _, _, dst in lst], axis=1)
        key = (rows_u.tobytes(), rows_u.shape, rows_w.tobytes(), rows_w.shape,
               tuple((tens[t].shape, tens[t].dtype) for t, _, _ in lst))
        hit = cache.get(key)
        if hit is None:
            gu_rows, gu = _unique_rows(rows_u)
            gw_rows, gw = _unique_rows(rows_w)
            m = np.zeros((len(gu_rows), len(gw_rows)))
            for e, (t, _, _) in enumerate(lst):
                m += table.matrix(t, gu_rows[:, e], gw_rows[:, e])
            hit = cache[key] = _compress_edge(gu, gw, m)
        _add_edge(prob, edges, u, w, hit)
    prob.edges = edges


def _unique_ids(ids: np.ndarray) -> tuple[list[int], np.ndarray]:
    """``np.unique(ids, return_inverse=True)`` of a 1-d array of ints, the distinct values as a
    list: on the short arrays of a node's strategies (mostly under 64 entries) a dict is several
    times faster than numpy's sort."""
    if len(ids) > 256:
        u, inv = np.unique(ids, return_inverse=True)
        return u.tolist(), inv.reshape(-1)
    values = ids.tolist()
    uniq = sorted(set(values))
    pos = {v: i for i, v in enumerate(uniq)}
    return uniq, np.array([pos[v] for v in values], dtype=np.intp)


def _unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(rows, axis=0, return_inverse=True)`` for small non-negative ints, faster."""
    if rows.shape[1] == 1:
        u, inv = _unique_ids(rows[:, 0])
        return np.array(u, dtype=rows.dtype)[:, None], inv
    base = int(rows.max()) + 1
    if base ** rows.shape[1] < 2**62:
        code = np.zeros(rows.shape[0], dtype=np.int64)
        for c in range(rows.shape[1]):
            code = code * base + rows[:, c]
        u, inv = _unique_ids(code)
        out = np.empty((len(u), rows.shape[1]), dtype=rows.dtype)
        out[inv] = rows  # (equal codes, equal rows)
        return out, inv
    u, inv = np.unique(rows, axis=0, return_inverse=True)
    return u, inv.reshape(-1)


def _unique_rows_float(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of a small matrix in first-seen order, and each row's index among them
    (``np.unique(m, axis=0, return_inverse=True)`` up to order, several times faster)."""
    seen: dict[bytes, int] = {}
    inv = np.fromiter((seen.setdefault(r.tobytes(), len(seen)) for r in m), np.int64, len(m))
    if len(seen) == len(m):
        return m, inv
    first = np.zeros(len(seen), dtype=np.int64)
    first[inv[::-1]] = np.arange(len(m) - 1, -1, -1)
    return m[first], inv


def _compress(m: np.ndarray, gu: np.ndarray, gw: np.ndarray):
    """Merge identical rows / columns of an edge matrix (groups re-indexed)."""
    m = np.ascontiguousarray(m)
    ru, iu = _unique_rows_float(m)
    gu = iu[gu]
    rwt, iw = _unique_rows_float(np.ascontiguousarray(ru.T))
    gw = iw[gw]
    return np.ascontiguousarray(rwt.T), gu, gw


def _compress_edge(gu: np.ndarray, gw: np.ndarray, m: np.ndarray) -> tuple | None:
    """An edge's cost matrix with identical rows / columns merged: ``None`` (no cost),
    ``("sep", cost_u, cost_w)`` when separable into node costs, or ``("edge", gu, gw, m)``."""
    if not m.any():
        return None
    m, gu, gw = _compress(m, gu, gw)
    a = m[:, 0]
    b = m[0, :] - m[0, 0]
    resid = m - a[:, None] - b[None, :]
    if np.abs(resid).max() <= 1e-12 * max(1e-30, np.abs(m).max()):
        return ("sep", a[gu], b[gw])
    return ("edge", gu, gw, m)


def _add_edge(prob: ILPProblem, edges: list, u: int, w: int, compressed: tuple | None) -> None:
    if compressed is None:
        return
    if compressed[0] == "sep":
        prob.nodes[u].cost = prob.nodes[u].cost + compressed[1]
        prob.nodes[w].cost = prob.nodes[w].cost + compressed[2]
        return
    edges.append((u, w, *compressed[1:]))


def _count_unmerged(prob: ILPProblem) -> int:
    """Binaries of the unmerged Alpa ILP (every operator and input its own node)."""
    graph, mesh = prob.graph, prob.mesh
    k: dict[str, int] = {}
    count = 0
    for t, nid in prob.input_node.items():
        n = len(prob.nodes[nid].strategies)
        k[f"t{t}"] = n
        if n > 1:
            count += n
    for i in prob.ops:
        op = graph.ops[i]
        if i not in prob.members:
            continue
        n = len(strategies(op, graph, mesh))
        k[f"o{i}"] = n
        if n > 1:
            count += n
    for i in prob.ops:
        if i not in prob.members:
            continue
        kv = k[f"o{i}"]
        if kv <= 1:
            continue
        for t in set(graph.ops[i].inputs):
            if t is None or t in prob.free_tensors:
                continue
            p = graph.tensors[t].producer
            ku = k.get(f"t{t}") if t in prob.input_node else k.get(f"o{p}")
            if ku and ku > 1:
                count += ku * kv
    return count
