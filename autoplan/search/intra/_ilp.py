r"""Alpa's intra-operator ILP: choose one sharding strategy per operator to minimise step time.

Formulation (Zheng et al., Alpa, OSDI 2022, Section 4.2, Eq. 1). For the operator graph
:math:`G=(V,E)`, with :math:`k_v` strategies at node :math:`v`:

.. math::

    \min_{s}\; \sum_{v \in V} s_v^\top (c_v + d_v) \;+\; \sum_{(u,v) \in E} s_u^\top R_{uv}\, s_v

where :math:`s_v \in \{0,1\}^{k_v}` is one-hot (:math:`\sum_i s_{v,i} = 1`), :math:`c_v` the
strategies' own communication (the collectives of Alpa's table: all-reduce, reduce-scatter ...),
:math:`d_v` their compute time (FLOPs over the devices doing distinct work; replicated work costs
the full FLOPs), and :math:`R_{uv}[i,j]` the time to reshard the tensor ``u`` produces under its
strategy ``i`` into the spec ``v``'s strategy ``j`` needs (:mod:`autoplan.search.intra._reshard`). The
quadratic term is linearised with edge variables :math:`e_{uv} \in [0,1]^{k_u \times k_v}`, only
where both ends have more than one strategy:

.. math::

    \sum_{i,j} e_{uv,ij} = 1, \qquad \sum_j e_{uv,ij} = s_{u,i}, \qquad \sum_i e_{uv,ij} = s_{v,j}

Alpa writes the row and column constraints as ``<=``; with :math:`\sum e = 1` and one-hot
:math:`s` they are the same, and with them :math:`e` is forced to the product
:math:`s_u s_v^\top` even when relaxed to be continuous, so only the :math:`s` are integer.

Exact reductions applied before solving (each keeps the optimum unchanged):

* **follower merging** (Alpa): elementwise, broadcast, reshape, transpose, slice, pad, convert,
  reductions ... follow one operand (the largest, i.e. the one that can be tiled most); their
  strategy is a function of that operand's producer's strategy, so they share its variable; their
  costs and their other operands' resharding fold into it. Operators with no variable operand
  (``iota``, masks made from literals) are *free*: produced locally in whatever spec is needed.
* **edge compression**: an edge's cost depends only on the specs at its two ends, so the edge
  variables range over the distinct (source spec, destination spec) pairs rather than strategy
  pairs; all-zero edges are dropped, and edges whose cost matrix is separable
  (:math:`R_{ij} = a_i + b_j`, e.g. when one end has a single spec) fold into node costs.
* **elimination** (without a memory budget): a node with at most two neighbours is solved out
  (one neighbour: :math:`c_u[i] \mathrel{+}= \min_j c_v[j] + R[i,j]`; two: a new edge
  :math:`R'[i,k] = \min_j c_v[j] + R_1[i,j] + R_2[j,k]`), repeatedly, and recovered after the
  solve; a strategy that costs at least as much as another at its node and on every incident
  edge, whatever the neighbours do, is dropped (dominance).

:func:`evaluate` recomputes the objective of any complete assignment from first principles (no
compression or elimination); the tests check the solver's optimum against brute force with it.

Graph inputs (parameters, optimizer state, batch) have their own spec variables; each pays a
small penalty proportional to its replicated bytes (Alpa's trick to prefer sharding weights when
it costs nothing else; for a batch it prefers the split the consumers use over a replicated
batch that they slice for free). A training step's outputs that are updated
inputs (output leaf ``[k]<path>`` of the same shape as input ``<path>`` of argument ``k-1``) are
charged the resharding back to that input's spec, so a sharded weight update (reduce-scatter the
gradient, update a sharded optimizer state, all-gather the parameters) is a plan the ILP can
choose.

Memory: with ``memory_budget`` the live bytes per device (inputs plus the forward activations that
backward operators read) must fit: :math:`\sum_v s_v^\top m_v \le M_{budget}`. This sum is separable, so
the least memory any plan needs is :math:`\sum_v \min_i m_{v,i}`, computed exactly without an
ILP; a budget below it raises :class:`~autoplan.InfeasiblePlanError` with that value.

Sub-graphs: ``ops`` restricts the ILP to some operators (a segment); tensors they read from
outside become boundary variables, and ``fixed`` fixes any tensor's spec at the boundary (a
tensor read from outside gets exactly that spec; a tensor produced inside is charged the
resharding to it once per use outside the sub-graph, as the whole graph reshards per consumer).
``pins`` fixes graph inputs' specs, keyed by a regular expression over input names or by an
input's tensor id (:mod:`autoplan.search.intra._pins`).

References:
    Zheng, Li, Zhang, Zhuang, Chen, Huang, Wang, Xu, Zhuo, Xing, Gonzalez, Stoica. "Alpa:
    Automating Inter- and Intra-Operator Parallelism for Distributed Deep Learning", OSDI 2022.
    The XLA auto-sharding pass that descends from it (``auto_sharding.cc``) for follower merging.
"""

from __future__ import annotations

import functools
import math
import operator
import re
import time
import warnings
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, compress, repeat
from operator import attrgetter
from typing import Any

import numpy as np

from autoplan._dtype import dtype_bytes
from autoplan._errors import InfeasiblePlanError, SearchError
from autoplan._memo import memo
from autoplan._options import check_memory_budget, require_graph, require_instance
from autoplan.costs._cluster import LogicalMesh
from autoplan.plans._plan import Comm
from autoplan.plans._spec import Spec, tile_count
from autoplan.search.intra._pins import pin_specs
from autoplan.search.intra._reshard import reshard
from autoplan.search.intra._solver import MatrixModel, SolverTimeoutWarning, solve_assignment
from autoplan.search.intra._spec_space import checked_spec, enumerate_specs, replicated, tiles
from autoplan.search.intra._strategies import (
    Strategy,
    _derive,
    _op_key,
    fusion_context,
    gradient_feeds,
    is_follower,
    is_generator,
    is_heavy,
    leader_operand,
    strategies,
)
from autoplan.tracing._graph import OpGraph
from autoplan.tracing._operands import operand_arrays, runs

__all__ = [
    "ILPSolution",
    "ILPProblem",
    "UnsupportedPrimitiveWarning",
    "build_problem",
    "solve_ilp",
    "evaluate",
    "updated_input_pairs",
    "shared_reshards",
]

#: replicated-input penalty: this fraction of the time to move an input's replicated excess bytes
#: (its bytes per device above the fully sharded size) over the mesh's fastest axis
PARAM_PENALTY = 1e-3
_SCALE = 1e6  # objective in microseconds inside the solver (better conditioned)
_OUTPUT_LEAF = re.compile(r"^\[(\d+)\](.*)$")  # output leaf ``[k]<path>``


class UnsupportedPrimitiveWarning(UserWarning):
    """Some primitives have no sharding rule; they run replicated."""


# ---------------------------------------------------------------------------------------------
# the problem
# ---------------------------------------------------------------------------------------------

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


def _tables(prob: ILPProblem, strats: list[Strategy], cache: dict[tuple, _Tables]) -> _Tables:
    key = tuple(map(id, strats))
    hit = cache.get(key)
    if hit is not None and hit.cost.shape[0] == len(strats):
        return hit
    sizes = dict(zip(prob.mesh.axis_names, prob.mesh.shape))
    n_out = len(strats[0].out_specs)
    n_in = len(strats[0].in_specs)
    out_ids = [np.array([prob.intern(s.out_specs[j]) for s in strats], dtype=np.int64)
               for j in range(n_out)]
    out_tiles = [np.array([tile_count(s.out_specs[j], sizes) for s in strats], dtype=float)
                 for j in range(n_out)]
    in_ids: list[np.ndarray | None] = []
    for j in range(n_in):
        if any(s.in_specs[j] is None for s in strats):
            in_ids.append(None)
        else:
            in_ids.append(np.array([prob.intern(s.in_specs[j]) for s in strats], dtype=np.int64))
    tab = _Tables(np.array([s.cost for s in strats]), out_ids, out_tiles, in_ids)
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

    if chosen is None:
        _build_edges(prob)
    if count_unmerged:
        prob.vars_before_merging = _count_unmerged(prob)
    prob.build_seconds = time.perf_counter() - t0
    return prob


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
    graph, mesh, op_ids, free = prob.graph, prob.mesh, prob.ops, prob.free_tensors
    follow_cache: dict[tuple, Any] = {}
    contexts = fusion_context(graph)  # each operator's place in XLA's fusion
    table_cache: dict[tuple, _Tables] = {}
    read_back = _backward_read(graph)
    saved = set(filter(read_back.__contains__, chain.from_iterable(
        graph.ops[i].outputs for i in op_ids if graph.ops[i].role == "forward")))
    for i in op_ids:
        op = graph.ops[i]
        if all(t in free for t in op.outputs) and op.outputs:
            continue
        member: _Member | None = None
        if chosen is not None and i in chosen:
            prob.nodes.append(_Node(i, "op", None, [chosen[i]], np.zeros(1), np.zeros(1)))
            member = _Member(len(prob.nodes) - 1, np.zeros(1, dtype=np.int64), [chosen[i]], None)
        elif not is_heavy(op) and is_follower(op):
            cands = [k for k, t in enumerate(op.inputs)
                     if t is not None and t in prob.tensor_src and op.in_shapes[k] is not None]
            k = leader_operand(op, cands, graph) if cands else None
            if k is not None:
                nid, src_ids = prob.tensor_src[op.inputs[k]]
                ctx = contexts[i]
                ckey = (_op_key(op), ctx, k, src_ids.tobytes())
                hit = follow_cache.get(ckey)
                if hit is None:
                    uniq, inv = _unique_ids(src_ids)
                    strats = [_derive(op, mesh, k, prob.specs[u], ctx) for u in uniq]
                    hit = (strats, inv) if all(s is not None for s in strats) else None
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


def _free_tensors(graph: OpGraph) -> frozenset[int]:
    """Constants and every tensor computed only from them (by cheap operators); once per
    graph."""

    def make() -> frozenset[int]:
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

    return memo(graph, "free_tensors", make)


def _differing_operands(graph: OpGraph, op_ids: Sequence[int], op_strategy: Mapping[int, Strategy],
                        specs: Mapping[int, Spec]) -> list[tuple[int, int, Spec, Spec | None]]:
    """``(operator, tensor, spec, needed spec)`` for every operand of the operators ``op_ids``
    that have a strategy (in that order, operands in order) whose tensor has a spec in ``specs``
    other than the one the strategy needs (None: any). C-level passes over all operands, then a
    loop over the few that differ."""
    ids = op_ids
    strategies = list(map(op_strategy.get, ids))
    if any(map(operator.is_, strategies, repeat(None))):  # (no strategy: skipped)
        ids = [i for i, st in zip(ids, strategies) if st is not None]
        strategies = [st for st in strategies if st is not None]
    needed = list(map(attrgetter("in_specs"), strategies))
    costed = _costed_ops(graph)[0]
    if ids is costed or ids == costed:  # (the operands of every costed operator: made once)
        flat_t, counts, reader = memo(graph, "costed_operands",
                                      lambda: _operands_of(graph, costed))
    else:
        flat_t, counts, reader = _operands_of(graph, ids)
    if counts == list(map(len, needed)):
        flat_dst = list(chain.from_iterable(needed))
    else:  # (zip's pairing, operator by operator)
        ops = graph.ops
        rows = [(i, -1 if t is None else t, d) for i, want in zip(ids, needed)
                for t, d in zip(ops[i].inputs, want)]
        reader, flat_t, flat_dst = (list(c) for c in zip(*rows)) if rows else ([], [], [])
    src = list(map(specs.get, flat_t))  # (a literal, -1, has no spec)
    return [(reader[j], flat_t[j], src[j], flat_dst[j])
            for j in compress(range(len(flat_t)), map(operator.ne, src, flat_dst))
            if src[j] is not None]


def _operands_of(graph: OpGraph, ids: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """The operands of the operators ``ids``, in order, over the flat operand arrays: their
    tensors (-1: a literal), each operator's count, and each operand's operator."""
    arr = operand_arrays(graph)
    o = np.asarray(ids, dtype=np.int64)
    count = arr.count[o]
    return (arr.tensor[runs(arr.start[o], count)].tolist(), count.tolist(),
            np.repeat(o, count).tolist())


def _saves_activation(graph: OpGraph) -> list[bool]:
    """Per operator: whether it is a forward operator with a result some backward operator
    reads (an activation saved for backward); once per graph."""
    read_back = _backward_read(graph)
    return memo(graph, "saves_activation", lambda: [
        op.role == "forward" and any(t in read_back for t in op.outputs) for op in graph.ops])


def _costed_ops(graph: OpGraph) -> tuple[list[int], list[int], list[int]]:
    """The operators a complete plan costs (those with a result that is not free: see
    :func:`_free_tensors`), in order; each one's number of results; and their results, in
    order. Once per graph."""

    def make() -> tuple[list[int], list[int], list[int]]:
        free = _free_tensors(graph)
        costed = [op.id for op in graph.ops
                  if not (op.outputs and op.outputs[0] in free and free.issuperset(op.outputs))]
        arr = operand_arrays(graph)
        o = np.asarray(costed, dtype=np.int64)
        n_outs = arr.out_count[o]
        return costed, n_outs.tolist(), arr.output[runs(arr.out_start[o], n_outs)].tolist()

    return memo(graph, "costed_ops", make)


def _updated_pairs(graph: OpGraph) -> list[tuple[int, int]]:
    """:func:`updated_input_pairs`, once per graph."""
    return memo(graph, "updated_input_pairs", lambda: updated_input_pairs(graph))


def _updated_pairs_by_input(graph: OpGraph) -> dict[int, list[tuple[int, int]]]:
    """``{input tensor: [(position in updated_input_pairs, output tensor)]}``, once per graph (a
    segment problem looks up its own inputs' pairs instead of scanning every pair)."""

    def make() -> dict[int, list[tuple[int, int]]]:
        out: dict[int, list[tuple[int, int]]] = {}
        for k, (o, i) in enumerate(_updated_pairs(graph)):
            out.setdefault(i, []).append((k, o))
        return out

    return memo(graph, "updated_pairs_by_input", make)


def _backward_read(graph: OpGraph) -> frozenset[int]:
    """The tensors some backward operator reads (a forward result among them is an activation
    saved for backward), once per graph."""

    def make() -> frozenset[int]:
        read: set[int | None] = set()
        for op in graph.ops:
            if op.role == "backward":
                read.update(op.inputs)
        read.discard(None)
        return frozenset(read)  # type: ignore[arg-type]

    return memo(graph, "backward_read", make)


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


class _ReshardTable:
    def __init__(self, prob: ILPProblem):
        self.prob = prob
        self.cache: dict[tuple, float] = {}
        self.mcache: dict[tuple, np.ndarray] = {}

    def time(self, t: int, a: int, b: int, backward: bool = False) -> float:
        if a == b:
            return 0.0
        ten = self.prob.graph.tensors[t]
        key = (a, b, ten.shape, ten.dtype, backward)
        v = self.cache.get(key)
        if v is None:
            v = reshard(self.prob.specs[a], self.prob.specs[b], ten.shape, ten.dtype,
                        self.prob.mesh, backward)[0]
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
        small = np.array([[self.time(t, a, b) for b in ud] for a in us])
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


# ---------------------------------------------------------------------------------------------
# evaluating an assignment (independent of the edge compression: used to check the ILP)
# ---------------------------------------------------------------------------------------------

@dataclass
class _Breakdown:
    objective: float
    compute: float
    comm: float
    penalty: float
    memory: float
    op_strategy: dict[int, Strategy]
    specs: dict[int, Spec]
    comms: list[tuple[int | None, Comm]]  # (op id charged, comm)
    #: the operators that can read an operand in another spec than the tensor's (see
    #: :attr:`ILPSolution.reshard_readers`)
    reshard_readers: frozenset[int] | None = None


def _choice_vector(prob: ILPProblem, choice: Mapping[int | str, int]) -> list[int]:
    vec = []
    for n in prob.nodes:
        k = len(n.strategies)
        if n.key in choice:
            i = int(choice[n.key])
        elif k == 1:
            i = 0
        else:
            raise SearchError(f"evaluate: choice should give a strategy index for every decision "
                              f"node; {n.key!r} is missing. Fix: pass a dict with keys "
                              "problem.node_keys.")
        if not 0 <= i < k:
            raise SearchError(f"evaluate: node {n.key!r} has {k} strategies. Got index {i}.")
        vec.append(i)
    return vec


def _breakdown(prob: ILPProblem, vec: Sequence[int]) -> _Breakdown:
    graph, mesh = prob.graph, prob.mesh
    op_strategy: dict[int, Strategy] = {}
    specs: dict[int, Spec] = {}
    compute = comm = penalty = memory = 0.0
    comms: list[tuple[int | None, Comm]] = []
    for nid, n in enumerate(prob.nodes):
        if n.kind != "op":
            st = n.strategies[vec[nid]]
            specs[n.tensor] = st.out_specs[0]  # type: ignore[index]
            if n.penalty is not None:
                penalty += float(n.penalty[vec[nid]])
            if n.kind == "input":
                memory += st.memory
    for i in prob.ops:
        m = prob.members.get(i)
        if m is None:
            continue
        st = m.strats[m.idx[vec[m.node]]]
        op_strategy[i] = st
        compute += st.compute_time
        comm = _take_strategy(i, graph.ops[i].outputs, st, i in prob.grad_ops, specs, comms, comm)
    free = prob.free_tensors
    if len(prob.ops) < len(graph.ops):
        # only the free tensors the problem's operators read can get a spec: found from those
        # operators rather than from every free tensor of the graph
        free = dict.fromkeys(t for i in prob.ops for t in graph.ops[i].inputs if t in free)
    saved, comm, readers = _charge_plan(graph, mesh, prob.ops, op_strategy, specs,
                                        prob.out_pairs, prob.fixed_inside, free, comms, comm,
                                        prob.fixed_uses)
    memory += saved
    return _Breakdown(compute + comm + penalty, compute, comm, penalty, memory, op_strategy,
                      specs, comms, readers)


def _take_strategy(i: int, outputs: Sequence[int], st: Strategy, grad: bool,
                   specs: dict[int, Spec], comms: list[tuple[int | None, Comm]],
                   comm: float) -> float:
    """Record operator ``i``'s strategy in a plan being costed: its results' specs, and its
    own collectives in ``comms`` (tagged ``"grad-sync"`` when ``grad``: a gradient-producing
    backward operator). Returns ``comm`` plus their seconds."""
    for c in st.comm:
        comm += c.time
        comms.append((i, Comm(c.kind, c.bytes, c.axes, c.time, "grad-sync" if grad else "op")))
    specs.update(zip(outputs, st.out_specs))
    return comm


def _charge_plan(graph: OpGraph, mesh: LogicalMesh, op_ids: Sequence[int],
                 op_strategy: Mapping[int, Strategy], specs: dict[int, Spec],
                 out_pairs: Sequence[tuple[int, int]], fixed_inside: Mapping[int, Spec],
                 free_tensors: Iterable[int], comms: list[tuple[int | None, Comm]],
                 comm: float, fixed_uses: Mapping[int, int] | None = None
                 ) -> tuple[float, float, frozenset[int]]:
    """The terms of a plan that follow from its operators' strategies and its tensors' specs.

    ``specs`` holds the spec of every tensor with a source (an input, a boundary, an operator
    result); ``op_strategy`` the strategy of every operator costed (the others in ``op_ids``
    are free). Appends the resharding collectives to ``comms`` and gives each free tensor the
    spec its first consumer needs.

    Returns:
        ``(saved activation bytes per device, communication seconds, reshard readers)``: the
        forward results the backward pass reads; ``comm`` (the operators' own collectives) plus
        the resharding of every operand from its spec to the one its consumer needs, of each
        updated input back to its input's spec, and of each fixed tensor made inside to its spec
        (``fixed_uses[t]`` times, default once); and the operators that can read an operand in
        another spec than the tensor's once the free tensors have theirs (those charged a
        resharding, and the readers of a free tensor given a spec: see
        :attr:`ILPSolution.reshard_readers`).
    """
    tensors, ops, consumers = graph.tensors, graph.ops, graph.consumers
    read_back = _backward_read(graph)
    saved = 0.0
    n_tiles: dict[Spec, int] = {}  # spec -> tiles(spec, mesh)

    def charge(t: int, src: Spec, dst: Spec, op_id: int | None, times: int = 1) -> float:
        ten = tensors[t]
        tt, cs = reshard(src, dst, ten.shape, ten.dtype, mesh)
        for _ in range(times):
            for c in cs:
                comms.append((op_id, c))
        return tt * times

    # the saved activations (forward results a backward operator reads), operator by operator
    strategy_of = op_strategy.get
    saves = _saves_activation(graph)
    for i in compress(op_ids, map(saves.__getitem__, op_ids)):
        if strategy_of(i) is None:
            continue
        for t in ops[i].outputs:
            if t in read_back:
                sp = specs[t]
                n = n_tiles.get(sp)
                if n is None:
                    n = n_tiles[sp] = tiles(sp, mesh)
                saved += tensors[t].nbytes / n
    # the resharding of every operand to the spec its consumer needs
    readers: set[int] = set()
    for i, t, src, dst in _differing_operands(graph, op_ids, op_strategy, specs):
        readers.add(i)
        if dst is None:
            dst = replicated(len(tensors[t].shape))
        if dst != src and tensors[t].shape:  # scalars are never resharded
            comm += charge(t, src, dst, i)
    for o, inp in out_pairs:
        if specs[o] != specs[inp]:  # (an equal pair costs exactly 0.0: no resharding)
            comm += charge(o, specs[o], specs[inp], None)
    for t, spec in fixed_inside.items():
        comm += charge(t, specs[t], spec, None, (fixed_uses or {}).get(t, 1))
    # free tensors: the spec their first consumer needs
    for t in free_tensors:
        for c in consumers[t]:
            st = op_strategy.get(c)
            if st is not None:
                j = ops[c].inputs.index(t)
                if st.in_specs[j] is not None:
                    specs[t] = st.in_specs[j]
                    readers.update(consumers[t])
                    break
    return saved, comm, frozenset(readers)


def shared_reshards(graph: OpGraph, mesh: LogicalMesh, op_strategy: Mapping[int, Strategy],
                    specs: Mapping[int, Spec], ends: set[int] | None = None,
                    readers: Iterable[int] | None = None) -> list[tuple[int, Comm]]:
    """The resharding collectives a plan's costing charges more than once for what XLA does
    once: when several operators read one tensor in the same other spec (an activation gathered
    for a forward matmul and for its weight gradient, a weight gathered in forward and in
    backward), XLA computes the conversion once and shares it (common-subexpression
    elimination), while the ILP charges it on every edge (Alpa's formulation). Returned as
    ``(consumer operator, Comm)`` for every repeat after the first, in operator order.

    ``ends``, when given, receives in the same pass both ends of every resharding to a spec the
    consumer's strategy names: the consumer, and the operator that made the tensor when it has a
    strategy (the operators a plan pins, see
    :func:`~autoplan.search.intra._intra.plan_from_solution`).

    ``readers``, when given, holds every operator that can read an operand in another spec
    (a solution's :attr:`ILPSolution.reshard_readers`): only their operands are compared.
    """
    tensors = graph.tensors
    seen: set[tuple[int, Spec, Spec]] = set()
    out: list[tuple[int, Comm]] = []
    ids = sorted(op_strategy) if readers is None else sorted(filter(op_strategy.__contains__,
                                                                    readers))
    for i, t, src, dst in _differing_operands(graph, ids, op_strategy, specs):
        ten = tensors[t]
        if not ten.shape:
            continue
        if dst is None:
            dst = replicated(len(ten.shape))
        elif ends is not None and dst != src:
            ends.add(i)
            if ten.producer in op_strategy:
                ends.add(ten.producer)
        if dst == src:
            continue
        key = (t, src, dst)
        if key in seen:
            out.extend((i, c) for c in reshard(src, dst, ten.shape, ten.dtype, mesh)[1])
        else:
            seen.add(key)
    return out


def cost_strategies(graph: OpGraph, mesh: LogicalMesh, op_strategy: Mapping[int, Strategy],
                    input_specs: Mapping[int, Spec], *, pins: Mapping[str, Any] | None = None
                    ) -> tuple[_Breakdown, int]:
    """The cost of a whole-graph plan given as each operator's strategy and each input's spec,
    costed as given (each operator its own node: no follower merging, no enumeration).

    Every operand is charged the resharding from its producer's spec (or its input's) to the spec
    its consumer's strategy needs, as in :func:`evaluate`. Operators missing from
    ``op_strategy`` or inputs missing from ``input_specs`` (none in a complete plan) take their
    cheapest strategy by compute.

    Returns:
        The breakdown and the number of decision nodes (operators or inputs) given no choice.
    """
    done = _cost_complete(graph, mesh, op_strategy, input_specs, pins)
    if done is not None:
        return done
    # an operator without a strategy: the general problem resolves it (followers from their
    # leaders), then each node takes its cheapest strategy by compute
    prob = build_problem(graph, mesh, pins=pins, count_unmerged=False, chosen=op_strategy,
                         chosen_specs=input_specs)
    vec = [0 if len(n.strategies) == 1 else
           int(np.argmin([s.compute_time for s in n.strategies])) for n in prob.nodes]
    missing = sum(1 for n in prob.nodes if len(n.strategies) > 1)
    return _breakdown(prob, vec), missing


def _cost_complete(graph: OpGraph, mesh: LogicalMesh, op_strategy: Mapping[int, Strategy],
                   input_specs: Mapping[int, Spec], pins: Mapping[str, Any] | None
                   ) -> tuple[_Breakdown, int] | None:
    """:func:`cost_strategies` in one pass over the operators (the same terms, in the same
    order, as ``_breakdown`` of the chosen problem); None when an operator that is not free has
    no strategy."""
    free = _free_tensors(graph)
    tensors = graph.tensors
    pinned = pin_specs(graph, mesh, pins)
    specs: dict[int, Spec] = {}
    penalty = memory = 0.0
    missing = 0
    terms: dict[tuple, tuple[float, float]] = {}  # (spec, shape, dtype) -> (penalty, memory)
    for gi in graph.inputs:
        t = gi.tensor
        ten = tensors[t]
        if t in input_specs:
            spec = input_specs[t]
        elif t in pinned:
            spec = pinned[t]
        else:
            options = enumerate_specs(ten.shape, mesh)
            missing += len(options) > 1
            spec = options[0]  # every input strategy computes nothing: the first is cheapest
        term = terms.get((spec, ten.shape, ten.dtype))
        if term is None:
            st = _spec_strategy(spec, ten.shape, ten.dtype, mesh)
            term = terms[(spec, ten.shape, ten.dtype)] = (
                float(_penalty_vec(ten.nbytes, [st], mesh)[0]), st.memory)
        penalty += term[0]
        memory += term[1]
        specs[t] = spec
    feeds = gradient_feeds(graph)
    # the operators costed (not free), in order, each with its strategy: C-level passes over
    # them (the same terms, in the same order, as a loop taking each operator in turn)
    costed, n_outs, outputs = _costed_ops(graph)
    strategies = list(map(op_strategy.get, costed))
    if any(map(operator.is_, strategies, repeat(None))):
        return None
    chosen: dict[int, Strategy] = dict(zip(costed, strategies))
    compute = functools.reduce(operator.add, map(attrgetter("compute_time"), strategies), 0.0)
    out_specs = list(map(attrgetter("out_specs"), strategies))
    if list(map(len, out_specs)) == n_outs:  # (else zip's pairing, operator by operator)
        specs.update(zip(outputs, chain.from_iterable(out_specs)))
    else:
        ops = graph.ops
        for i, sp in zip(costed, out_specs):
            specs.update(zip(ops[i].outputs, sp))
    comm = 0.0
    comms: list[tuple[int | None, Comm]] = []
    ops = graph.ops
    for i, st in compress(zip(costed, strategies), map(attrgetter("comm"), strategies)):
        op = ops[i]  # (an operator whose strategy has collectives of its own)
        comm = _take_strategy(i, op.outputs, st, op.role == "backward" and feeds[i], specs,
                              comms, comm)
    input_tensors = graph.input_of_tensor
    out_pairs = [(o, inp) for o, inp in _updated_pairs(graph)
                 if o in specs and inp in input_tensors]
    # (``costed`` itself, the keys of ``chosen`` in order: the operand pass takes the operands
    # it made once per graph)
    saved, comm, readers = _charge_plan(graph, mesh, costed, chosen, specs, out_pairs, {}, free,
                                        comms, comm)
    return _Breakdown(compute + comm + penalty, compute, comm, penalty, memory + saved, chosen,
                      specs, comms, readers), missing


def evaluate(graph: OpGraph, mesh: LogicalMesh, choice: Mapping[int | str, int], *,
             problem: ILPProblem | None = None, ops: Sequence[int] | None = None,
             fixed: Mapping[int, Any] | None = None, pins: Mapping[str, Any] | None = None) -> float:
    """The ILP objective (seconds) of a complete assignment, computed without the ILP.

    Every operator's strategy is resolved (followers from their leaders), then the objective is
    summed from first principles: each strategy's compute and collectives, the resharding of
    every operand from its producer's spec to the spec the consumer needs, the resharding of
    updated inputs back to their input spec, and the replicated-parameter penalty.

    Args:
        graph: the operator graph.
        mesh: the logical mesh.
        choice: ``{node key: strategy index}`` for the problem's decision nodes (keys as in
            :attr:`ILPProblem.node_keys`; nodes with one strategy may be left out), e.g. an
            :attr:`ILPSolution.choice`.
        problem: a problem from :func:`build_problem` (built from the other arguments if None).
        ops, fixed, pins: as for :func:`solve_ilp`.

    Returns:
        The objective in seconds.
    """
    require_graph("evaluate", graph)
    require_instance("evaluate", "mesh", mesh, LogicalMesh, "pass cluster.logical_mesh((2, 4))")
    prob = problem or build_problem(graph, mesh, ops=ops, fixed=fixed, pins=pins,
                                    count_unmerged=False)
    return _breakdown(prob, _choice_vector(prob, choice)).objective


# ---------------------------------------------------------------------------------------------
# exact pre-solve reduction: eliminate nodes with at most two neighbours
# ---------------------------------------------------------------------------------------------

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
            le = (a[None, :, :] <= a[:, None, :] + tol).all(axis=2)  # le[i, j]: a[j] <= a[i]
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


# ---------------------------------------------------------------------------------------------
# solving
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ILPSolution:
    """The intra-operator plan found by :func:`solve_ilp`.

    Attributes:
        choice: ``{node key: strategy index}`` of every decision node (empty for a plan stitched
            from segments, which is no single problem's assignment).
        strategies: ``{op id: Strategy}`` for every operator (followers resolved); free
            operators (built from constants) are absent.
        specs: ``{tensor id: spec}`` for every tensor the problem touches.
        objective: seconds (compute + communication + the small parameter penalty).
        compute_time, comm_time, penalty: its parts.
        memory_per_device: live bytes per device (inputs + activations saved for backward).
        least_memory: the least such memory of any plan (exact; see the module docstring). For a
            plan stitched from segments: the inputs each sharded as much as its shape allows
            plus each segment's least saved activations (a lower bound).
        comms: ``(op id or None, Comm)`` of every collective (operators' own, tagged ``"op"`` or
            ``"grad-sync"``, and ``"reshard"``).
        vars_before_merging: binaries of Alpa's unmerged ILP.
        vars_after_merging: variables of the ILP solved (strategy binaries + edge variables).
        num_binaries, num_edge_vars, num_constraints, num_nodes, num_ops: sizes.
        build_seconds, solve_seconds: wall-clock times.
        status: ``"optimal"``, ``"feasible"`` (time limit, incumbent), ``"timeout-greedy"``
            (time limit without incumbent: a greedy assignment), or ``"trivial"`` (nothing to
            choose).
        solver: the solver's name.
        unknown_primitives: primitives run replicated for lack of a rule.
        solver_objective: the objective as the solver's (compressed) model computes it, in
            seconds; equals ``objective`` up to rounding (a check of the model's assembly).
        lower_bound: seconds no plan can beat (the LP relaxation's or the MIP's dual bound).
        gap: ``(objective - lower_bound) / objective`` as the solver certified it (at most
            ``mip_gap`` when optimal; 0 when the LP relaxation was integral).
        dives: LP re-solves spent rounding a fractional relaxation (see
            :func:`~autoplan.search.intra._solver.solve_assignment`).
        mip: whether branch-and-cut was needed.
        reshard_readers: the operators that can read an operand in another spec than the
            tensor's: those charged a resharding, and the readers of the free tensors (built
            from constants), which take the spec their first reader needs (None: any operator).
            :func:`shared_reshards` compares only their operands.
    """

    choice: dict[int | str, int]
    strategies: dict[int, Strategy]
    specs: dict[int, Spec]
    objective: float
    compute_time: float
    comm_time: float
    penalty: float
    memory_per_device: float
    least_memory: float
    comms: tuple[tuple[int | None, Comm], ...]
    vars_before_merging: int
    vars_after_merging: int
    num_binaries: int
    num_edge_vars: int
    num_constraints: int
    num_nodes: int
    num_ops: int
    build_seconds: float
    solve_seconds: float
    status: str
    solver: str
    unknown_primitives: tuple[str, ...] = ()
    solver_objective: float | None = None
    lower_bound: float | None = None
    gap: float | None = 0.0
    dives: int = 0
    mip: bool = False
    problem: ILPProblem | None = field(default=None, repr=False, compare=False)
    reshard_readers: frozenset[int] | None = field(default=None, repr=False, compare=False)


def solve_ilp(graph: OpGraph, mesh: LogicalMesh, *, ops: Sequence[int] | None = None,
              fixed: Mapping[int, Any] | None = None, memory_budget: float | None = None,
              pins: Mapping[str, Any] | None = None, time_limit: float = 60.0,
              problem: ILPProblem | None = None, reduce: bool = True,
              relax_first: bool = True, mip_gap: float = 1e-6,
              memory_weight: float = 0.0) -> ILPSolution:
    """Solve the intra-operator ILP of ``graph`` (or a segment of it) on ``mesh``.

    Args:
        graph: the operator graph (a traced training step).
        mesh: the logical mesh (``cluster.logical_mesh(shape)``).
        ops: operator ids of a sub-graph to solve alone (default: the whole graph). Tensors they
            read from outside become boundary variables.
        fixed: ``{tensor id: spec tuple or PartitionSpec}``: a tensor read from outside the
            segment (or a graph input) gets exactly this spec; a tensor produced inside is charged
            the resharding to it once per use outside the segment (at least once).
        memory_budget: bytes per device for live memory (inputs and saved activations).
        pins: ``{regex over input names, or input tensor id: PartitionSpec}`` fixing inputs'
            specs.
        time_limit: solver seconds; at the limit the incumbent is used (SolverTimeoutWarning).
        problem: a prebuilt :func:`build_problem` result to reuse.
        reduce: eliminate nodes with at most two neighbours before solving (exact; skipped with
            a memory budget).
        relax_first: solve the LP relaxation first and keep it when integral (then it is the
            ILP's optimum), dive to an integral solution when fractional, and run the MIP only
            when the dive is not within ``mip_gap`` of the LP bound; if False, run the MIP.
        memory_weight: seconds charged per byte of live memory per device: the ILP minimises
            ``time + memory_weight * memory`` (a Lagrangian of the memory budget: every
            solution is the fastest plan for its own memory). The reported objective is the
            time alone.
        mip_gap: relative optimality gap accepted (``(objective - bound) / objective``); the
            default is exact up to rounding. The pipeline search's layer ILPs use 0.5%.

    Returns:
        The :class:`ILPSolution`.

    Raises:
        InfeasiblePlanError: the memory budget is below the least memory any plan needs
            (``least_memory``, exact).
        SearchError: invalid pins, fixed specs or operator ids.
    """
    memory_budget = check_memory_budget("solve_ilp", memory_budget)
    require_graph("solve_ilp", graph)
    require_instance("solve_ilp", "mesh", mesh, LogicalMesh, "pass cluster.logical_mesh((2, 4))")
    prob = problem or build_problem(graph, mesh, ops=ops, fixed=fixed, pins=pins)
    least = _check_problem(prob, mesh, memory_budget)
    t0 = time.perf_counter()
    reducer, costs, edges, active = _reduce(prob, reduce and memory_budget is None, memory_weight)
    present = [np.isfinite(c) if active[v] and len(c) > 1 else None for v, c in enumerate(costs)]
    kept_edges = _fold_separable_edges(edges, costs, present)
    model = _build_model(prob, costs, active, present, kept_edges, memory_budget)
    build_lp = time.perf_counter() - t0

    t1 = time.perf_counter()
    out = _solve_model(prob, mesh, model, reducer, least, memory_budget=memory_budget,
                       time_limit=time_limit, mip_gap=mip_gap, relax_first=relax_first,
                       memory_weight=memory_weight)
    vec = out.vec
    if reducer is not None:
        reducer.recover(vec)
    solve_s = time.perf_counter() - t1
    bd = _breakdown(prob, vec)
    choice = {n.key: vec[nid] for nid, n in enumerate(prob.nodes)}
    return ILPSolution(
        choice=choice, strategies=bd.op_strategy, specs=bd.specs, objective=bd.objective,
        compute_time=bd.compute, comm_time=bd.comm, penalty=bd.penalty,
        memory_per_device=bd.memory, least_memory=least, comms=tuple(bd.comms),
        vars_before_merging=prob.vars_before_merging,
        vars_after_merging=model.n_bin + model.n_edge, num_binaries=model.n_bin,
        num_edge_vars=model.n_edge, num_constraints=model.n_con,
        num_nodes=len(prob.nodes), num_ops=len(prob.ops),
        build_seconds=prob.build_seconds + build_lp, solve_seconds=solve_s, status=out.status,
        solver=out.solver, unknown_primitives=tuple(sorted(prob.unknown)),
        solver_objective=out.solver_objective, lower_bound=out.lower_bound, gap=out.gap,
        dives=out.dives, mip=out.mip, problem=prob, reshard_readers=bd.reshard_readers)


def _check_problem(prob: ILPProblem, mesh: LogicalMesh, memory_budget: float | None) -> float:
    """Warn of primitives without a sharding rule; return the least memory of any plan, raising
    when it exceeds ``memory_budget``."""
    if prob.unknown:
        warnings.warn(
            f"intra-op search: no sharding rule for primitive(s) {', '.join(sorted(prob.unknown))}; "
            "they run replicated (every operand gathered). Fix: none needed unless they are heavy; "
            "report the primitive to extend autoplan's strategy table.",
            UnsupportedPrimitiveWarning, stacklevel=3)
    least = float(sum(n.memory.min() for n in prob.nodes))
    if memory_budget is not None and least > memory_budget * (1 + 1e-9):
        raise InfeasiblePlanError(
            f"no plan fits memory_budget={memory_budget:.4g} bytes per device on mesh "
            f"{mesh.shape}: the least live memory of any plan (parameters, optimizer state, batch "
            f"and saved activations, each sharded as much as possible) is {least:.4g} bytes. Fix: "
            "raise the budget, use more devices, or enable pipelining/rematerialisation.",
            least_memory=least)
    return least


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


@dataclass
class _Model:
    """The solver's matrix model with each node's strategy columns (``None``: no choice) and
    its sizes."""

    mm: MatrixModel
    scols: list[np.ndarray | None]
    n_bin: int
    n_edge: int
    n_con: int


def _build_model(prob: ILPProblem, costs: Sequence[np.ndarray], active: Sequence[bool],
                 present: Sequence[np.ndarray | None], kept_edges: Sequence[tuple],
                 memory_budget: float | None) -> _Model:
    """The matrix model: one-hot strategy columns per node, edge columns tied to both ends'
    strategies, and the memory row when there is a budget.

    Columns: each choosing node's present strategies (cost less the node's least), in node
    order, then each edge's ``e[a, b]`` at ``a * nw + b`` (cost less the edge's least). Rows:
    each choosing node's one-hot row, then per edge ``sum_b e[a, b] = sum of u's strategies in
    group a`` (one row per group ``a`` of ``u``) and likewise for ``w``. The columns and rows of
    all nodes, and of all edges, are made in one pass of array operations each (a layer ILP has
    tens of edges and is solved several times).
    """
    mm = MatrixModel()
    scols: list[np.ndarray | None] = [None] * len(prob.nodes)
    const = 0.0
    chosen = []  # (node, its present strategies, their costs)
    for nid, n in enumerate(prob.nodes):
        if len(n.strategies) == 1:
            const += float(costs[nid][0])
        elif active[nid]:
            pres = present[nid]
            cost = costs[nid][pres]
            base = float(cost.min())
            const += base
            chosen.append((nid, pres, (cost - base) * _SCALE))
    n_bin = n_edge = n_con = 0
    if chosen:
        sizes = [len(c) for _, _, c in chosen]
        cols = mm.add_cols(np.concatenate([c for _, _, c in chosen]), integer=True)
        off = 0
        for (nid, pres, _), size in zip(chosen, sizes):
            idx = np.full(len(pres), -1, dtype=np.int64)
            idx[pres] = cols[off:off + size]
            scols[nid] = idx
            off += size
        n_bin, n_con = off, len(chosen)
        mm.add_rows(np.repeat(np.arange(len(chosen)), sizes), cols, 1.0, 1.0, 1.0, len(chosen))
    if kept_edges:
        rows, cols, vals, count, ecost, bases = _edge_rows(kept_edges, scols, mm.num_cols)
        for base in bases.tolist():  # in edge order, after the nodes' (as they were summed)
            const += base
        mm.add_cols(ecost)
        mm.add_rows(rows, cols, vals, 0.0, 0.0, count)
        n_edge, n_con = len(ecost), n_con + count
    if memory_budget is not None and _add_memory_row(prob, mm, scols, memory_budget):
        n_con += 1
    mm.offset = const * _SCALE
    return _Model(mm, scols, n_bin, n_edge, n_con)


def _edge_rows(kept_edges: Sequence[tuple], scols: Sequence[np.ndarray | None], first_col: int):
    """The edges' columns and rows for :func:`_build_model`, over all edges at once.

    Returns ``(rows, cols, vals, count, costs, bases)``: triplets of ``count`` rows (numbered
    from 0) over the edge columns (numbered from ``first_col``) and the node strategy columns
    ``scols``; the edge columns' costs; each edge's least cost. Within every row the entries
    are in the order of a row-by-row construction (the edge columns by position, then the
    node's strategies), so the model's sparse rows are the same.
    """
    ms = [e[4] for e in kept_edges]
    nu = np.array([m.shape[0] for m in ms], dtype=np.int64)
    nw = np.array([m.shape[1] for m in ms], dtype=np.int64)
    size = nu * nw
    flat = np.concatenate([m.ravel() for m in ms])
    cstart = np.zeros(len(ms), dtype=np.int64)
    np.cumsum(size[:-1], out=cstart[1:])
    bases = np.minimum.reduceat(flat, cstart)
    costs = (flat - np.repeat(bases, size)) * _SCALE
    rstart = np.zeros(len(ms), dtype=np.int64)  # each edge's first row (u's groups, then w's)
    np.cumsum((nu + nw)[:-1], out=rstart[1:])
    q = np.arange(len(flat), dtype=np.int64)
    local = q - np.repeat(cstart, size)
    nwq = np.repeat(nw, size)
    a = local // nwq
    ru = np.repeat(rstart, size) + a
    rw = np.repeat(rstart + nu, size) + (local - a * nwq)

    def ends(side: int, first_row: np.ndarray):
        g = np.concatenate([e[2 + side] for e in kept_edges])
        s = np.concatenate([scols[e[side]] for e in kept_edges])  # type: ignore[misc]
        keep = (s >= 0) & (g >= 0)
        lens = np.array([len(e[2 + side]) for e in kept_edges], dtype=np.int64)
        return (np.repeat(first_row, lens) + g)[keep], s[keep]

    nru, ncu = ends(0, rstart)
    nrw, ncw = ends(1, rstart + nu)
    ecol = first_col + q
    rows = np.concatenate([ru, rw, nru, nrw])
    cols = np.concatenate([ecol, ecol, ncu, ncw])
    vals = np.concatenate([np.ones(2 * len(flat)), -np.ones(len(nru) + len(nrw))])
    return rows, cols, vals, int((nu + nw).sum()), costs, bases


def _add_memory_row(prob: ILPProblem, mm: MatrixModel, scols: Sequence[np.ndarray | None],
                    memory_budget: float) -> bool:
    """Add ``sum of the chosen strategies' memory <= memory_budget``; whether a row was added
    (none when no strategy choice changes the memory)."""
    mcols, mvals = [], []
    mconst = 0.0
    for nid, n in enumerate(prob.nodes):
        idx = scols[nid]
        if idx is None:
            mconst += float(n.memory[0])
        else:
            keep = (idx >= 0) & (np.asarray(n.memory) != 0)
            mcols.append(idx[keep])
            mvals.append(np.asarray(n.memory, dtype=float)[keep])
    if not (mcols and sum(len(c) for c in mcols)):
        return False
    mc = np.concatenate(mcols)
    mm.add_rows(np.zeros(len(mc), dtype=np.int64), mc, np.concatenate(mvals), -np.inf,
                memory_budget - mconst, 1)
    return True


@dataclass
class _SolverOutcome:
    """Each node's chosen strategy index (before the reducer's recovery) and how the solver got
    there (the :class:`ILPSolution` fields of the same names)."""

    vec: list[int]
    status: str
    solver: str = "none"
    solver_objective: float | None = None
    lower_bound: float | None = None
    gap: float | None = 0.0
    dives: int = 0
    mip: bool = False


def _solve_model(prob: ILPProblem, mesh: LogicalMesh, model: _Model, reducer: _Reducer | None,
                 least: float, *, memory_budget: float | None, time_limit: float, mip_gap: float,
                 relax_first: bool, memory_weight: float) -> _SolverOutcome:
    """Solve the model (LP relaxation, dive, MIP: :func:`solve_assignment`) and read each node's
    strategy off the solution; a greedy assignment when the time limit passes without one."""
    t1 = time.perf_counter()
    scols = model.scols
    if model.n_bin == 0:
        status = "trivial" if reducer is None or not reducer.eliminated else "optimal"
        return _SolverOutcome([0] * len(prob.nodes), status)
    groups = [idx[idx >= 0] for idx in scols if idx is not None]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = solve_assignment(model.mm, groups, time_limit=time_limit, mip_gap=mip_gap,
                               relax_first=relax_first)
    for w in caught:
        warnings.warn(w.message, w.category, stacklevel=3)
    out = _SolverOutcome([], "", res.result.solver, None,
                  None if res.bound is None else res.bound / _SCALE, res.gap, res.dives, res.mip)
    if res.x is None:
        timed_out = time.perf_counter() - t1 >= 0.95 * time_limit
        if not timed_out:
            raise InfeasiblePlanError(
                f"the intra-op ILP is infeasible on mesh {mesh.shape} (memory_budget="
                f"{memory_budget}). Fix: raise the budget or relax pins.", least_memory=least)
        warnings.warn(
            f"ILP solver stopped at its time limit ({time_limit} s) without a feasible plan; a "
            "greedy plan (each node's cheapest strategy) is used. Fix: raise time_limit.",
            SolverTimeoutWarning, stacklevel=3)
        out.status = "timeout-greedy"
        out.vec = _greedy(prob, memory_budget)
        return out
    out.status = res.result.status
    obj = res.result.objective
    out.solver_objective = None if obj is None or out.status != "optimal" or memory_weight \
        else obj / _SCALE
    if memory_weight:
        out.lower_bound = None  # a bound on time + weight * memory, not on the time
    out.vec = [0 if idx is None else int(np.argmax(np.where(idx >= 0, res.x[idx], -1.0)))
               for idx in scols]
    return out


def _greedy(prob: ILPProblem, memory_budget: float | None) -> list[int]:
    if memory_budget is not None:
        return [int(np.argmin(n.memory)) for n in prob.nodes]
    return [int(np.argmin(n.cost)) for n in prob.nodes]
