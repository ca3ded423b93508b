"""The intra-operator pass as a plan: solve Alpa's ILP on one logical mesh, return a :class:`Plan`.

:func:`intra_op_search` views the whole cluster as one logical mesh (default ``(1, n)`` on one
node, ``(nodes, devices_per_node)`` on several), solves :func:`autoplan.search.intra._ilp_solve.solve_ilp`
and turns the solution into a single-stage :class:`autoplan.Plan`: the spec of every graph
input, the strategy of every heavy operator (dot, convolution, gather, scatter), and the
predicted step time, memory and communication.
"""

from __future__ import annotations

import functools
import math
import operator
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import compress
from operator import attrgetter
from typing import Any

import jax

from autoplan._errors import ClusterError, SearchError
from autoplan._gc import gc_paused
from autoplan._memo import per_owner
from autoplan._options import check_memory_budget
from autoplan.costs._cluster import Cluster
from autoplan.costs._mesh import LogicalMesh, default_axis_names
from autoplan.plans._plan import (
    Comm,
    InputSpec,
    OpSharding,
    Plan,
    Predicted,
    Schedule,
    Stage,
    TensorSharding,
    record_maker,
)
from autoplan.plans._spec import Spec
from autoplan.search.intra._ilp_cost import shared_reshards
from autoplan.search.intra._ilp_problem import ILPProblem, _updated_pairs, build_problem
from autoplan.search.intra._ilp_solve import ILPSolution, solve_ilp
from autoplan.search.intra._pins import renamed_pin
from autoplan.search.intra._spec_space import replicated
from autoplan.search.intra._strategies import combined_latency
from autoplan.tracing._graph import OpGraph
from autoplan.tracing._primitives import PLAN_RECORDED

__all__ = ["IntraOpResult", "intra_op_search", "intra_op_result", "default_mesh_shape",
           "make_logical_mesh", "mesh_shapes_for", "plan_from_solution"]


@dataclass(frozen=True)
class IntraOpResult:
    """What :func:`intra_op_search` returns.

    Attributes:
        plan: the single-stage plan.
        solution: the ILP solution (strategies of every operator, specs of every tensor).
        stats: sizes and times: ``vars_before_merging``, ``vars_after_merging``,
            ``num_binaries``, ``num_edge_vars``, ``num_constraints``, ``num_nodes``, ``num_ops``,
            ``build_seconds``, ``solve_seconds``, ``total_seconds``, ``status``, ``solver``,
            ``objective``, ``lower_bound``, ``gap`` (certified relative optimality gap),
            ``dives``, ``mip`` (whether branch-and-cut ran), ``least_memory``, ``mesh_shape``.
    """

    plan: Plan
    solution: ILPSolution
    stats: dict[str, Any] = field(default_factory=dict)


def default_mesh_shape(cluster: Cluster) -> tuple[int, int]:
    """``(1, n)`` for a one-node cluster of ``n`` devices, else ``(nodes, devices_per_node)``."""
    if cluster.nodes == 1:
        return (1, cluster.devices_per_node)
    return (cluster.nodes, cluster.devices_per_node)


def mesh_shapes_for(n: int, nodes: int, per_node: int, all_shapes: bool = False) -> list[tuple[int, int]]:
    """Logical 2-D mesh shapes (n0, n1) with n0.n1 = n of a (nodes x per_node) (sub)mesh.

    With ``all_shapes`` every such shape whose inner axis stays within a node or spans whole
    nodes (Alpa's logical views of a physical mesh). By default a representative few, which is
    what the search tries: the pure data-parallel view (n, 1), the physical view (nodes,
    per_node), and the views with 2 and with half a node's devices on the inner axis.
    """
    out = []
    for n1 in range(1, n + 1):
        if n % n1:
            continue
        if nodes > 1 and not (n1 <= per_node and per_node % n1 == 0 or n1 % per_node == 0):
            continue
        out.append((n // n1, n1))
    if all_shapes or len(out) <= 4:
        return out
    want = [(n, 1), (nodes, per_node) if nodes > 1 else (1, n), (n // 2, 2),
            (n // max(1, per_node // 2), max(1, per_node // 2))]
    return [s for s in dict.fromkeys(want) if s in out]


def make_logical_mesh(cluster: Cluster, mesh_shape: Sequence[int] | None = None,
                      mesh_axis_names: Sequence[str] | None = None) -> LogicalMesh:
    """The logical mesh (:class:`~autoplan.LogicalMesh`, a device mesh with a cost per axis, not a
    :class:`jax.sharding.Mesh` as :func:`jax.make_mesh` returns) over the whole cluster, with a
    validated shape.

    ``mesh_axis_names`` defaults to ``x, y, z, w`` (as many as the shape has axes).

    Raises:
        SearchError: a non-positive or non-integer entry, a product different from the number of
            devices, or fewer axis names than mesh dimensions.
    """
    if not isinstance(cluster, Cluster):
        raise SearchError(f"cluster should be an autoplan.Cluster. Got {type(cluster).__name__}: "
                          f"{cluster!r:.60}. Fix: pass Cluster.preset('p3.16xlarge') or "
                          "Cluster.parse('cpu:8').")
    n = cluster.num_devices
    if mesh_shape is None:
        shape = default_mesh_shape(cluster)
    else:
        try:
            shape = tuple(mesh_shape)
        except TypeError:
            raise SearchError(f"mesh_shape should be a tuple of positive integers. Got {mesh_shape!r}. "
                              f"Fix: e.g. mesh_shape=(1, {n}).") from None
        if not shape or any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in shape):
            raise SearchError(f"mesh_shape should be a tuple of positive integers. Got {mesh_shape!r}. "
                              f"Fix: e.g. mesh_shape=(1, {n}) or ({cluster.nodes}, "
                              f"{cluster.devices_per_node}).")
        if math.prod(shape) != n:
            examples = dict.fromkeys([(1, n), (cluster.nodes, cluster.devices_per_node), (n, 1)])
            raise SearchError(f"mesh_shape {shape} has {math.prod(shape)} devices but cluster "
                              f"{cluster.spec} has {n}. Fix: use a shape whose product is {n}, e.g. "
                              + " or ".join(map(str, list(examples)[:2])) + ".")
    names = default_axis_names(len(shape)) if mesh_axis_names is None else tuple(mesh_axis_names)
    if len(names) < len(shape) or len(set(names)) != len(names):
        raise SearchError(f"mesh_axis_names should give {len(shape)} distinct names for mesh_shape "
                          f"{shape}. Got {names!r}. Fix: e.g. mesh_axis_names="
                          f"{default_axis_names(len(shape))!r}, or leave it out for those.")
    try:
        return cluster.logical_mesh(shape, axis_names=names[:len(shape)])
    except ClusterError as err:
        raise SearchError(f"mesh_shape {shape} does not fit cluster {cluster.spec}: {err}") from None


def _comm_by_axis(c: Comm, mesh: LogicalMesh, out: dict[str, float],
                  sizes: Mapping[str, int] | None = None) -> None:
    """Add the bytes of ``c`` to ``out`` per mesh axis (``sizes``: the mesh's axis sizes, when
    the caller has them)."""
    if sizes is None:
        sizes = dict(zip(mesh.axis_names, mesh.shape))
    b = c.bytes
    axes = c.axes
    if len(axes) > 1:
        axes = sorted(axes, key=mesh.axis_names.index, reverse=True)  # innermost first
    for a in axes:
        out[a] = out.get(a, 0.0) + b
        if c.kind in ("all-reduce", "reduce-scatter"):
            b /= sizes[a]


@per_owner
def _op_kinds(graph: OpGraph) -> tuple[list[bool], list[bool]]:
    """Per operator: whether it is a forward operator, and whether its primitive is one a plan
    always lists (:data:`autoplan.tracing._primitives.PLAN_RECORDED`); once per graph."""
    return ([op.role == "forward" for op in graph.ops],
            [op.primitive in PLAN_RECORDED for op in graph.ops])


def plan_from_solution(graph: OpGraph, mesh: LogicalMesh, sol: ILPSolution, *,
                       label: str = "autoplan", level: str = "exhaustive",
                       config: Mapping[str, Any] | None = None,
                       search_seconds: float = 0.0) -> Plan:
    """A single-stage :class:`Plan` from an ILP solution over the whole graph.

    ``predicted.step_time`` is the solution's compute plus communication (gradient collectives of
    backward operators already discounted by the cluster's gamma; the small input penalty is not
    included), less the repeats of a resharding several operators need (XLA does it once:
    :func:`~autoplan.search.intra._ilp_cost.shared_reshards`), plus what a step costs once:
    launching its executable
    (:meth:`~autoplan.Cluster.step_overhead` of the graph's inputs, counted as compute) and the
    latency of the collectives XLA combines (once per combined group, counted as communication:
    :func:`~autoplan.search.intra._strategies.combined_latency`); ``comm_bytes`` sums each
    collective's ``B`` (the size in :meth:`~autoplan.LogicalMesh.collective_time`'s formulas: the
    gathered size of an all-gather, the buffer of an all-reduce or reduce-scatter, each device's
    buffer of an all-to-all);
    ``comm_by_axis`` splits those bytes over the axes a collective spans (hierarchically, innermost
    axis first); ``memory_per_device`` is the ILP's live memory (inputs plus saved activations).

    The plan's operator shardings (``Stage.ops``, which the executor pins with sharding
    constraints on operands and results) are the heavy operators and both ends of every
    resharding: an operator that reads an operand in another spec than the one it was made in,
    the operator that made it, and the operators making updated inputs (new parameters and
    optimizer state) in another spec than their input's. Between those points every tensor keeps
    its spec, so XLA compiles the collectives the plan costed where it costed them; left free,
    XLA's sharding propagation moves reshardings (measured with
    ``benchmarks/comm_validation.py``: up to 2.5x the predicted bytes with only the heavy
    operators pinned).
    """
    cluster = mesh.cluster
    inputs = _input_records(graph, sol.specs)
    planned, repeats, fwd_compute, bwd_compute = _planned_ops(graph, mesh, sol)
    ops = _op_records(graph, sol, planned)
    comm_bytes, comm_time_by_kind, comm_by_axis, fwd, bwd, shared = _comm_totals(graph, mesh, sol,
                                                                                 repeats)
    # once per step: the executable's launch, and the latency of each combined collective group
    launch = cluster.step_overhead(len(graph.inputs))
    combined = combined_latency(graph, mesh, sol.comms)
    for kind, t in combined.items():
        comm_time_by_kind[kind] = comm_time_by_kind.get(kind, 0.0) + t
    # (``reduce(add, ...)`` adds one by one, left to right, as a loop of ``+=`` does)
    fwd = functools.reduce(operator.add, fwd_compute, fwd + launch)
    bwd = functools.reduce(operator.add, bwd_compute, bwd + sum(combined.values()))
    compute_time = sol.compute_time + launch
    comm_time = sol.comm_time + sum(combined.values()) - shared
    step = compute_time + comm_time
    devices = mesh.size
    batch = (config or {}).get("batch")
    throughput = float(batch) / step if batch and step > 0 else 0.0
    mfu = graph.flops / (step * devices * cluster.peak_flops) if step > 0 else 0.0
    predicted = Predicted(step_time=step, throughput=throughput,
                          memory_per_device=sol.memory_per_device, compute_time=compute_time,
                          comm_time=comm_time, comm_bytes=comm_bytes, comm_by_axis=comm_by_axis,
                          comm_time_by_kind=comm_time_by_kind, bubble_fraction=0.0, mfu=mfu)
    layers = graph.layer_order
    stage = Stage(index=0, layers=layers, layer_range=(0, len(layers)), submesh_shape=mesh.submesh,
                  device_ids=mesh.device_ids, mesh_shape=mesh.shape, axis_names=mesh.axis_names,
                  ops=tuple(ops), forward_time=fwd, backward_time=bwd,
                  memory=sol.memory_per_device, comm_bytes=dict(comm_bytes))
    notes = [f"intra-op ILP: {sol.status} ({sol.solver}), {sol.vars_after_merging} variables "
             f"({sol.vars_before_merging} before merging), solved in {sol.solve_seconds:.2f} s"]
    if sol.unknown_primitives:
        notes.append("replicated for lack of a sharding rule: " + ", ".join(sol.unknown_primitives))
    return Plan(model=graph.name, fingerprint=graph.fingerprint, cluster=cluster, stages=(stage,),
                inputs=inputs, schedule=Schedule("none", 1, 1), predicted=predicted, label=label,
                level=level, config=dict(config or {}), search_seconds=search_seconds,
                jax_version=jax.__version__, notes=tuple(notes))


def _input_records(graph: OpGraph, specs: Mapping[int, Spec]) -> tuple[InputSpec, ...]:
    """The spec of every graph input (replicated where the solution has none)."""
    graph_tensors = graph.tensors
    # (records made by their unchecked makers: a deep model's plan holds tens of thousands)
    input_record = record_maker(InputSpec)
    spec_of = Spec.of
    inputs = []
    for gi in graph.inputs:
        ten = graph_tensors[gi.tensor]
        spec = specs[gi.tensor] if gi.tensor in specs else replicated(len(ten.shape))
        inputs.append(input_record(gi.arg, gi.arg_name, gi.path, gi.kind, ten.shape, ten.dtype,
                                   spec_of(spec), 0))
    return tuple(inputs)


def _planned_ops(graph: OpGraph, mesh: LogicalMesh, sol: ILPSolution
                 ) -> tuple[list[int], list[tuple[int, Comm]], list[float], list[float]]:
    """``(planned, repeats, forward compute, backward compute)``: the operators the plan lists
    (those a plan always lists, both ends of every resharding, and the makers of updated inputs
    in another spec than their input's), the repeats of a resharding several operators need, and
    the compute times of the forward and the backward operators in the solution's order."""
    graph_ops, graph_tensors, specs = graph.ops, graph.tensors, sol.specs
    # one pass over the strategies: the operators the plan lists, and each operator's compute
    # time on its side of the step (added after the collectives, in this order)
    forward, listed = _op_kinds(graph)
    ids = list(sol.strategies)
    times = list(map(attrgetter("compute_time"), sol.strategies.values()))
    is_forward = list(map(forward.__getitem__, ids))
    fwd_compute = list(compress(times, is_forward))
    bwd_compute = list(compress(times, map(operator.not_, is_forward)))
    planned_set = set(compress(ids, map(listed.__getitem__, ids)))
    # both ends of every resharding, and the repeats of a resharding several operators need
    # (XLA does it once: they come off the totals), in one pass
    repeats = shared_reshards(graph, mesh, sol.strategies, specs, ends=planned_set,
                              readers=sol.reshard_readers)
    for o, inp in _updated_pairs(graph):
        p = graph_tensors[o].producer
        if p in sol.strategies and o in specs and inp in specs and specs[o] != specs[inp]:
            planned_set.add(p)
    planned = sorted(i for i in planned_set
                     if i in sol.strategies and len(graph_ops[i].outputs) == 1)
    return planned, repeats, fwd_compute, bwd_compute


def _op_records(graph: OpGraph, sol: ILPSolution, planned: list[int]) -> list[OpSharding]:
    """The sharding of each planned operator: its strategy, the specs of its operands and
    results, and its collectives (reshardings left out)."""
    graph_ops, graph_tensors = graph.ops, graph.tensors
    input_of = graph.input_of_tensor
    tensor_record = record_maker(TensorSharding)
    op_record = record_maker(OpSharding)
    spec_of = Spec.of
    op_comm: dict[int, list[Comm]] = {}
    for i, c in sol.comms:
        if i is not None and c.where != "reshard":
            op_comm.setdefault(i, []).append(c)
    ops = []
    layer_names = graph.layer_names
    for i in planned:
        op, st = graph_ops[i], sol.strategies[i]
        tensors = []
        for t, spec in zip(op.inputs, st.in_specs):
            if t is None:
                continue
            ten = graph_tensors[t]
            gi = input_of.get(t)
            if gi is None:
                name, role = f"%{t}", "input"
            else:
                name, role = gi.name, "weight" if gi.kind == "parameter" else "input"
            if spec is None:
                spec = replicated(len(ten.shape))
            tensors.append(tensor_record(name, role, ten.shape, ten.dtype, spec_of(spec)))
        for t, spec in zip(op.outputs, st.out_specs):
            ten = graph_tensors[t]
            tensors.append(tensor_record(f"%{t}", "output", ten.shape, ten.dtype, spec_of(spec)))
        layer = layer_names[i] or (op.scope[0] if op.scope else "(root)")
        ops.append(op_record(i, op.primitive, op.scope_name, layer, op.role, st.name,
                             tuple(tensors), tuple(op_comm.get(i, ())), op.flops))
    return ops


def _comm_totals(graph: OpGraph, mesh: LogicalMesh, sol: ILPSolution,
                 repeats: list[tuple[int, Comm]]
                 ) -> tuple[dict[str, float], dict[str, float], dict[str, float], float, float, float]:
    """``(bytes by kind, time by kind, bytes by axis, forward time, backward time, shared)``
    of the solution's collectives, less the repeats of a resharding several operators need
    (``shared``: their time)."""
    graph_ops = graph.ops
    comm_bytes: dict[str, float] = {}
    comm_time_by_kind: dict[str, float] = {}
    comm_by_axis: dict[str, float] = {}
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    fwd = bwd = 0.0
    for i, c in sol.comms:
        comm_bytes[c.kind] = comm_bytes.get(c.kind, 0.0) + c.bytes
        comm_time_by_kind[c.kind] = comm_time_by_kind.get(c.kind, 0.0) + c.time
        _comm_by_axis(c, mesh, comm_by_axis, sizes)
        if i is not None and graph_ops[i].role == "forward":
            fwd += c.time
        else:
            bwd += c.time
    # a resharding several operators need is done once (XLA shares it): its repeats come off
    shared = 0.0
    for i, c in repeats:
        comm_bytes[c.kind] -= c.bytes
        comm_time_by_kind[c.kind] -= c.time
        _comm_by_axis(replace(c, bytes=-c.bytes), mesh, comm_by_axis, sizes)
        shared += c.time
        if graph_ops[i].role == "forward":
            fwd -= c.time
        else:
            bwd -= c.time
    return comm_bytes, comm_time_by_kind, comm_by_axis, fwd, bwd, shared


@gc_paused
def intra_op_search(graph: OpGraph, cluster: Cluster, mesh_shape: Sequence[int] | None = None, *,
                    memory_budget: float | None = None, pins: Mapping[Any, Any] | None = None,
                    time_limit: float = 60.0, mesh_axis_names: Sequence[str] | None = None,
                    label: str = "autoplan", level: str = "exhaustive",
                    config: Mapping[str, Any] | None = None,
                    count_unmerged: bool = True, mip_gap: float = 1e-6,
                    memory_weight: float = 0.0, problem: ILPProblem | None = None,
                    pin: Mapping[Any, Any] | None = None) -> IntraOpResult:
    """Search the intra-operator plan of a training step on the whole cluster (no pipeline).

    Args:
        graph: the traced training step (:func:`autoplan.trace`).
        cluster: the cluster.
        mesh_shape: the logical mesh; default ``(1, n)`` on one node, else
            ``(nodes, devices_per_node)``. Its product must be the number of devices.
        memory_budget: bytes per device the live memory must fit (None: unconstrained; pass
            ``cluster.device_memory`` to require a plan that fits the device).
        pins: ``{regex over input names: PartitionSpec}`` fixing some inputs' specs (a graph
            input's tensor id, ``gi.tensor``, may stand for a regex: that input alone; see
            :mod:`autoplan.search.intra._pins`).
        time_limit: ILP solver seconds (at the limit the best plan found is used, with a
            :class:`~autoplan.search.intra._solver.SolverTimeoutWarning`).
        mesh_axis_names: names of the mesh axes (default ``x, y, z, w``, one per axis).
        label: the plan's label.
        level: the search level recorded in the plan.
        config: the workload's config (its ``batch`` gives the throughput).
        count_unmerged: count the variables of Alpa's unmerged ILP for the statistics (the
            pipeline search, which solves hundreds of layer ILPs, skips it).
        mip_gap: relative optimality gap the ILP may stop at (default: exact up to rounding).
        memory_weight: seconds charged per byte of live memory (see
            :func:`~autoplan.search.intra._ilp_solve.solve_ilp`); trades step time for memory without a
            hard budget.
        problem: a prebuilt :func:`~autoplan.search.intra._ilp_problem.build_problem` of ``graph`` on this
            mesh with these pins (reused across solves that differ only in weights or budget).
        pin: the old name of ``pins`` (deprecated: a :class:`DeprecationWarning`).

    Returns:
        :class:`IntraOpResult` with the plan, the ILP solution and statistics.

    Raises:
        SearchError: bad mesh shape or axis names, invalid pins.
        InfeasiblePlanError: no plan fits ``memory_budget`` (``least_memory`` says what would).

    Examples:
        >>> import jax, jax.numpy as jnp, autoplan
        >>> g = autoplan.trace(lambda w, x: jnp.tanh(x @ w).sum(),
        ...                    jax.ShapeDtypeStruct((1024, 1024), jnp.float32),
        ...                    jax.ShapeDtypeStruct((4096, 1024), jnp.float32))
        >>> res = intra_op_search(g, autoplan.Cluster.preset("p3.16xlarge"))
        >>> res.plan.mesh_shape, res.solution.status
        ((1, 8), 'optimal')
    """
    pins = renamed_pin("intra_op_search", pins, pin)
    memory_budget = check_memory_budget("intra_op_search", memory_budget)
    t0 = time.perf_counter()
    mesh = make_logical_mesh(cluster, mesh_shape, mesh_axis_names)
    if problem is None and not count_unmerged:
        problem = build_problem(graph, mesh, pins=pins, count_unmerged=False)
    sol = solve_ilp(graph, mesh, memory_budget=memory_budget, pins=pins, time_limit=time_limit,
                    problem=problem, mip_gap=mip_gap, memory_weight=memory_weight)
    return intra_op_result(graph, mesh, sol, time.perf_counter() - t0, label=label, level=level,
                           config=config)


def intra_op_result(graph: OpGraph, mesh: LogicalMesh, sol: ILPSolution, total: float, *,
                    label: str = "autoplan", level: str = "exhaustive",
                    config: Mapping[str, Any] | None = None) -> IntraOpResult:
    """What :func:`intra_op_search` returns for the solution ``sol`` of ``graph``'s ILP on
    ``mesh``, found in ``total`` seconds: its plan and statistics (a caller that solves several
    ILPs and keeps one of them makes the plan of that one only)."""
    plan = plan_from_solution(graph, mesh, sol, label=label, level=level, config=config,
                              search_seconds=total)
    stats = {
        "vars_before_merging": sol.vars_before_merging,
        "vars_after_merging": sol.vars_after_merging,
        "num_binaries": sol.num_binaries,
        "num_edge_vars": sol.num_edge_vars,
        "num_constraints": sol.num_constraints,
        "num_nodes": sol.num_nodes,
        "num_ops": sol.num_ops,
        "build_seconds": sol.build_seconds,
        "solve_seconds": sol.solve_seconds,
        "total_seconds": total,
        "status": sol.status,
        "solver": sol.solver,
        "objective": sol.objective,
        "lower_bound": sol.lower_bound,
        "gap": sol.gap,
        "dives": sol.dives,
        "mip": sol.mip,
        "least_memory": sol.least_memory,
        "mesh_shape": mesh.shape,
    }
    return IntraOpResult(plan=plan, solution=sol, stats=stats)
