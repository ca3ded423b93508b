"""Costing an assignment or a plan of the intra-operator ILP from first principles.

:func:`evaluate` recomputes the objective of a complete assignment of an :class:`ILPProblem`
without the edge compression or elimination of the solve (the tests check the solver's optimum
against brute force with it); :func:`cost_strategies` costs a whole-graph plan given as each
operator's strategy and each input's spec; :func:`shared_reshards` lists the resharding
collectives a plan's costing charges more than once for what XLA does once. The formulation is in
:mod:`autoplan.search.intra._ilp`.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import attrgetter
from typing import Any

import numpy as np

from autoplan._errors import SearchError
from autoplan._memo import per_owner
from autoplan._options import require_graph, require_instance
from autoplan.costs._mesh import LogicalMesh
from autoplan.plans._plan import Comm
from autoplan.plans._spec import Spec
from autoplan.search.intra._ilp_problem import (
    ILPProblem,
    _backward_read,
    _free_tensors,
    _penalty_vec,
    _spec_strategy,
    _updated_pairs,
    build_problem,
)
from autoplan.search.intra._pins import pin_specs
from autoplan.search.intra._reshard import reshard
from autoplan.search.intra._spec_space import enumerate_specs, replicated, tiles
from autoplan.search.intra._strategies import Strategy, gradient_feeds
from autoplan.tracing._graph import OpGraph
from autoplan.tracing._operands import operand_arrays, runs

__all__ = ["evaluate", "cost_strategies", "shared_reshards"]


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
        flat_t, counts, reader = _costed_operands(graph)
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


@per_owner
def _costed_operands(graph: OpGraph) -> tuple[list[int], list[int], list[int]]:
    """:func:`_operands_of` the costed operators (:func:`_costed_ops`), once per graph."""
    return _operands_of(graph, _costed_ops(graph)[0])


def _operands_of(graph: OpGraph, ids: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """The operands of the operators ``ids``, in order, over the flat operand arrays: their
    tensors (-1: a literal), each operator's count, and each operand's operator."""
    arr = operand_arrays(graph)
    o = np.asarray(ids, dtype=np.int64)
    count = arr.count[o]
    return (arr.tensor[runs(arr.start[o], count)].tolist(), count.tolist(),
            np.repeat(o, count).tolist())


@per_owner
def _saves_activation(graph: OpGraph) -> list[bool]:
    """Per operator: whether it is a forward operator with a result some backward operator
    reads (an activation saved for backward); once per graph."""
    read_back = _backward_read(graph)
    return [op.role == "forward" and any(t in read_back for t in op.outputs) for op in graph.ops]


@per_owner
def _costed_ops(graph: OpGraph) -> tuple[list[int], list[int], list[int]]:
    """The operators a complete plan costs (those with a result that is not free: see
    :func:`_free_tensors`), in order; each one's number of results; and their results, in
    order. Once per graph."""
    free = _free_tensors(graph)
    costed = [op.id for op in graph.ops
              if not (op.outputs and op.outputs[0] in free and free.issuperset(op.outputs))]
    arr = operand_arrays(graph)
    o = np.asarray(costed, dtype=np.int64)
    n_outs = arr.out_count[o]
    return costed, n_outs.tolist(), arr.output[runs(arr.out_start[o], n_outs)].tolist()
