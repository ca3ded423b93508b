"""The inter-operator (pipeline) search: layers -> stage costs -> stage DP or DAG ILP -> Plan.

Steps (Alpa's inter-operator pass, with TAPAS's folding and TePDist's DAG stage ILP):

1. Trace the training step at micro-batch size (the batch leaves' leading dimension divided by the
   number of micro-batches ``B``) and cluster its operators into layers
   (:func:`~autoplan.search.fold._clustering.cluster_layers`).
2. For every layer, submesh shape ``(n, m)`` (Alpa's (1,1), (1,2) ... (1,M), (2,M) ... (N,M)) and
   logical mesh of that submesh, solve the intra-operator ILP on the layer's subgraph. Layers with
   the same structural signature share one solve (folding): a 96-layer GPT solves three layer
   kinds (embedding, block, head), not 98 layers.
3. ``t_intra(i..j, submesh, logical)`` is the sum of its layers' costs per micro-batch (each
   layer's ILP charges the resharding of its own inputs from the specs it assumes; resharding
   between two layers whose plans disagree inside a stage is not charged); memory by Alpa's Eq. 5
   from the layers' parameter/optimizer bytes and activation bytes. Each cell has two variants:
   the fastest plan and a memory-lean one (:func:`_lean_plan`).
4. Alpa's stage DP (:func:`~autoplan.search.pipeline._stage_dp.stage_dp`) picks stages and submeshes; for a
   layer graph that is not a chain (U-Net skips, two towers) TePDist's stage ILP on the DAG
   (:func:`~autoplan.search.pipeline._stage_ilp.stage_ilp`) assigns layers to stages instead, and the stages
   get equal-sized submeshes.
5. Each chosen stage is composed from its layers' solutions (the ones the DP costed); the
   schedule (GPipe or 1F1B) is simulated with the stages' forward/backward times and the
   cross-mesh resharding time of the boundary tensors (send/recv, or Alpa's local all-gather:
   send 1/n of the tensor to each destination device and all-gather there).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, replace
from typing import Any

import jax
import numpy as np

from autoplan._cluster import Cluster, send_recv_time
from autoplan._errors import InfeasiblePlanError, SearchError
from autoplan._graph import OpGraph
from autoplan._memo import memo
from autoplan._plan import InputSpec, Plan, Predicted, Schedule, Stage
from autoplan._trace import trace
from autoplan.search.fold._clustering import LayerGroup, cluster_layers

__all__ = ["PipelineResult", "pipeline_search", "microbatch_workload_args", "layer_dag"]

#: Relative optimality gap of the per-layer ILPs (certified by the LP bound or the MIP's dual
#: bound). Memory-budgeted layer ILPs have integrality gaps of a few tenths of a percent that
#: branch-and-cut needs seconds to close; the stage DP's choices differ by more than this.
LAYER_MIP_GAP = 5e-3

#: Up to this many hosts the pipeline search uses Alpa's full submesh set; beyond it, multi-host
#: submeshes of a power-of-two number of hosts (plus all hosts): 11 shapes instead of 131 on 128
#: DGX nodes.
AUTO_ALL_HOSTS = 16


@dataclass
class PipelineResult:
    plans: list[Plan]
    stats: dict[str, Any]


def microbatch_workload_args(args: tuple, arg_kinds: tuple[str, ...], microbatches: int) -> tuple:
    """The step's arguments with every batch leaf's leading dimension divided by ``microbatches``."""
    out = []
    for a, kind in zip(args, arg_kinds):
        if kind != "batch":
            out.append(a)
            continue

        def shrink(x):
            shape = tuple(x.shape)
            if not shape or shape[0] % microbatches:
                raise SearchError(
                    f"pipeline: a batch leaf of shape {shape} cannot be split into {microbatches} "
                    "micro-batches along its leading dimension. Fix: choose microbatches dividing "
                    f"{shape[0] if shape else 1}.")
            return jax.ShapeDtypeStruct((shape[0] // microbatches,) + shape[1:], x.dtype)

        out.append(jax.tree.map(shrink, a))
    return tuple(out)


def traced(workload: Any) -> OpGraph:
    """``trace(workload)``, once per workload object (the search, its baselines and the pipeline
    search share it)."""
    return memo(workload, ("search", "trace"), lambda: trace(workload))


def _traces(workload: Any, microbatches: int) -> tuple[OpGraph, OpGraph]:
    """The full-batch and micro-batch graphs of a workload (once per workload object: the
    pipeline search and the Megatron TP x PP baseline use the same ones)."""
    def make() -> OpGraph:
        args = microbatch_workload_args(tuple(workload.args), tuple(workload.arg_kinds),
                                        microbatches)
        return trace(workload.fn, *args, arg_kinds=tuple(workload.arg_kinds),
                     name=traced(workload).name)

    return traced(workload), memo(workload, ("search", "microbatch trace", microbatches), make)


def layer_dag(graph: OpGraph, layers: list[LayerGroup]):
    """The layers' forward data-flow DAG (networkx): node ``i`` has ``flops``; an edge carries the
    ``bytes`` of forward tensors from layer i to layer j."""
    import networkx as nx  # noqa: PLC0415

    of = {o: ly.index for ly in layers for o in ly.forward}
    g = nx.DiGraph()
    for ly in layers:
        g.add_node(ly.index, flops=ly.flops)
    for ly in layers:
        for o in ly.forward:
            for t in graph.ops[o].outputs:
                for c in set(graph.consumers[t]):
                    j = of.get(c)
                    if j is not None and j != ly.index:
                        a, b = (ly.index, j) if ly.index < j else (j, ly.index)
                        w = graph.tensors[t].nbytes
                        if g.has_edge(a, b):
                            g.edges[a, b]["bytes"] += w
                        else:
                            g.add_edge(a, b, bytes=float(w))
    return g


def _is_chain(dag) -> bool:
    return all(b == a + 1 for a, b in dag.edges)


def _default_microbatches(batch: int, max_stages: int) -> int:
    """Enough micro-batches to keep the bubble small and the activations of the in-flight
    micro-batches modest: the largest power of two <= min(128, batch / 4) that divides the batch
    (at least 2 when the batch allows)."""
    cap = max(1, min(128, batch // 4))
    b = 1
    while b * 2 <= cap and batch % (b * 2) == 0:
        b *= 2
    if b == 1 and batch % 2 == 0:
        b = 2
    return b


def check_submesh_hosts(value: Any) -> None:
    """Raise :class:`SearchError` unless ``value`` is a ``submesh_hosts`` choice."""
    if value not in ("auto", "all", "pow2"):
        raise SearchError(f"search: submesh_hosts should be 'auto', 'all' or 'pow2'. Got "
                          f"{value!r}. Fix: 'all' is Alpa's full set of multi-host submeshes, "
                          "'pow2' keeps 2, 4, 8, ... hosts, 'auto' picks by cluster size.")


def _lean_plan(fast, run, steps: int = 5):
    """The memory-lean variant of a layer's plan: the fastest plan found whose live memory is at
    most halfway between the least memory and the fastest plan's.

    Instead of a memory-budgeted ILP (whose knapsack row makes the LP relaxation fractional and
    branch-and-cut slow), this solves the Lagrangian ``min time + w * memory`` (``run(w)``), whose
    every solution is the fastest plan for its own memory: ``w`` starts where the whole memory
    range is worth the fastest plan's time, grows 4x until the memory target is met, then
    bisects (geometrically) for the fastest plan that meets it. ``steps`` bounds the solves.
    """
    least = fast.solution.least_memory
    fast_mem = fast.solution.memory_per_device
    target = 0.5 * (least + fast_mem)
    w = fast.solution.objective / max(fast_mem - least, 1.0)
    lo, hi = 0.0, None
    best = leanest = None
    for _ in range(steps):
        res = run(w)
        mem = res.solution.memory_per_device
        if leanest is None or mem < leanest.solution.memory_per_device:
            leanest = res
        if mem <= target * (1 + 1e-9):
            if best is None or res.solution.objective < best.solution.objective:
                best = res
            hi = w
        else:
            lo = w
        if hi is None:
            w *= 4.0
        elif lo == 0.0:
            w = hi / 4.0
        else:
            w = math.sqrt(lo * hi)
        if best is not None and best.solution.memory_per_device >= 0.75 * target:
            break
    return best if best is not None else leanest


def _stage_memory(plan: Plan) -> tuple[float, float]:
    """(resident bytes, activation bytes) per device of a one-micro-batch plan: resident = the
    parameters, their gradients and the optimizer state as sharded; activations = the rest of
    the plan's live memory (the micro-batch, boundary activations, values saved for backward)."""
    state = grads = 0.0
    mesh = dict(zip(plan.axis_names, plan.mesh_shape))
    for i in plan.inputs:
        if i.kind not in ("parameter", "optimizer_state"):
            continue
        tiles = math.prod(mesh[a] for e in i.spec if e for a in e)
        nbytes = math.prod(i.shape) * np.dtype(i.dtype).itemsize / tiles
        state += nbytes
        if i.kind == "parameter":
            grads += nbytes
    act = max(0.0, plan.predicted.memory_per_device - state)
    return state + grads, act


def pipeline_search(workload: Any, cluster: Cluster, *, schedule: str = "1f1b",
                    microbatches: int | None = None, level: str = "folded",
                    memory_budget: float | None = None, time_limit: float = 60.0,
                    num_layers: int | None = None, stage_algorithm: str = "auto",
                    max_candidates: int = 3, megatron: bool = False,
                    submesh_hosts: str = "auto") -> PipelineResult:
    """Search pipeline plans (see the module docstring).

    ``submesh_hosts`` picks the multi-host submesh shapes: ``"all"`` (Alpa's ``(2, M) .. (N, M)``),
    ``"pow2"`` (2, 4, 8, ... hosts, plus ``N``), or ``"auto"`` (``"all"`` up to
    :data:`AUTO_ALL_HOSTS` hosts, ``"pow2"`` beyond).

    With ``megatron=True`` no search is made: the Megatron TP x PP baseline is built instead (one
    stage per node with equal layer counts, Megatron's tensor-parallel pins inside each node).

    Returns:
        The best plan per distinct number of stages (up to ``max_candidates``), best first.
    """
    from autoplan.search.intra._ilp import build_problem  # noqa: PLC0415
    from autoplan.search.intra._intra import intra_op_search, make_mesh, mesh_shapes_for  # noqa: PLC0415
    from autoplan.search.pipeline._schedule import schedule_events, schedule_stats, schedule_table  # noqa: PLC0415
    from autoplan.search.pipeline._stage_dp import place_submeshes, stage_dp, submesh_shapes  # noqa: PLC0415

    if stage_algorithm not in ("auto", "dp", "ilp"):
        raise SearchError(f"search: stage_algorithm should be 'auto', 'dp' or 'ilp'. Got {stage_algorithm!r}.")
    t0 = time.perf_counter()
    batch = int((getattr(workload, "config", {}) or {}).get("batch", 1))
    N, M = cluster.nodes, cluster.devices_per_node
    B = microbatches or _default_microbatches(batch, N * M)
    full, graph = _traces(workload, B)
    t_trace = time.perf_counter() - t0
    layers = cluster_layers(graph, num_layers)
    L = len(layers)
    dag = layer_dag(graph, layers)
    use_ilp = stage_algorithm == "ilp" or (stage_algorithm == "auto" and not _is_chain(dag))

    check_submesh_hosts(submesh_hosts)
    hosts = submesh_hosts if submesh_hosts != "auto" else ("all" if N <= AUTO_ALL_HOSTS else "pow2")
    submeshes = submesh_shapes(N, M, hosts)
    shapes_of = [mesh_shapes_for(n * m, n, m) for n, m in submeshes]
    # a config is a logical mesh and a variant: the fastest plan, or the memory-lean one (the
    # fastest plan within halfway between its least memory and the fastest plan's, _lean_plan),
    # which the DP takes when the fastest plans do not fit (Alpa's Eq. 5)
    configs = [[(shape, lean) for lean in (False, True) for shape in shapes] for shapes in shapes_of]
    C = max(len(c) for c in configs)
    results: dict[tuple, Any] = {}
    full_shapes = {gi.name: full.tensors[gi.tensor].shape for gi in full.inputs}
    solves = 0
    subgraphs: dict[str, OpGraph] = {}
    layer_subs: dict[int, OpGraph] = {}
    problems: dict[tuple, Any] = {}

    def layer_sub(li: int) -> OpGraph:
        if li not in layer_subs:
            layer_subs[li] = graph.subgraph(layers[li].ops, name=f"{graph.name}:{layers[li].name}")
        return layer_subs[li]

    def layer_result(li: int, n: int, m: int, shape, lean: bool):
        """The intra-op plan of layer li's kind on this submesh/logical mesh/variant, solved once
        per layer kind (on the first such layer's subgraph). The memory-lean variant is the
        fastest plan whose memory is at most halfway between the least memory and the fastest
        plan's (:func:`_lean_plan`), or the fastest plan itself when that is within 1.2x of the
        least."""
        nonlocal solves
        sig = layers[li].signature
        key = (sig, n, m, shape, lean, megatron)
        if key not in results:
            sub = subgraphs.get(sig)
            if sub is None:
                sub = subgraphs[sig] = layer_sub(li)
            kw: dict[str, Any] = {}
            if megatron:
                from autoplan.search.intra._pins import megatron_pins  # noqa: PLC0415

                kw["pin"] = megatron_pins(sub, m)
            view = replace(cluster, nodes=n, devices_per_node=m)
            pkey = (sig, n, m, shape, megatron)
            if pkey not in problems:  # one ILP build serves the fast and the lean solves
                problems[pkey] = build_problem(sub, make_mesh(view, shape), pins=kw.get("pin"),
                                               count_unmerged=False)

            def run(weight: float):
                nonlocal solves
                solves += 1
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    return intra_op_search(sub, view, shape, time_limit=time_limit,
                                           level="exhaustive", count_unmerged=False,
                                           mip_gap=LAYER_MIP_GAP, memory_weight=weight,
                                           problem=problems[pkey], **kw)

            if lean:
                fast, _ = layer_result(li, n, m, shape, False)
                if sum(_stage_memory(fast.plan)) <= 1.2 * fast.solution.least_memory:
                    results[key] = fast
                    return fast, sub
                results[key] = _lean_plan(fast, run)
            else:
                results[key] = run(0.0)
        return results[key], subgraphs[sig]

    t1 = time.perf_counter()
    layer_cost = np.full((L, len(submeshes), C), np.inf)
    fwd_frac = np.zeros(L)
    pmem = np.full((L, len(submeshes), C), np.inf)
    amem = np.full((L, len(submeshes), C), np.inf)
    for ly in layers:
        fl_f = sum(graph.ops[o].flops for o in ly.forward)
        fl_b = sum(graph.ops[o].flops for o in ly.backward)
        fwd_frac[ly.index] = fl_f / max(fl_f + fl_b, 1.0)
        if megatron:
            continue
        for k, (n, m) in enumerate(submeshes):
            for c, (shape, lean) in enumerate(configs[k]):
                res, _ = layer_result(ly.index, n, m, shape, lean)
                layer_cost[ly.index, k, c] = res.plan.predicted.step_time
                pmem[ly.index, k, c], amem[ly.index, k, c] = _stage_memory(res.plan)
    t_costs = time.perf_counter() - t1
    # t_intra[i, j, k, c] = sum of layer costs i..j (inf when any of them is impossible)
    def range_sums(a: np.ndarray) -> np.ndarray:
        bad = ~np.isfinite(a)
        z = np.zeros((1,) + a.shape[1:])
        vals = np.concatenate([z, np.cumsum(np.where(bad, 0.0, a), axis=0)])
        nbad = np.concatenate([z, np.cumsum(bad, axis=0)])
        out = np.full((L,) + a.shape, np.inf)
        for i in range(L):
            seg = vals[i + 1:] - vals[i]
            seg[(nbad[i + 1:] - nbad[i]) > 0] = np.inf
            out[i, i:] = seg
        return out

    t_intra, p_intra, a_intra = range_sums(layer_cost), range_sums(pmem), range_sums(amem)
    budget = memory_budget or cluster.device_memory

    t2 = time.perf_counter()
    layouts: list[list[tuple[int, int, int, int]]] = []  # (start, end, submesh k, config c)
    max_s = min(L, N * M)
    if megatron:
        if L < N:
            raise InfeasiblePlanError(f"Megatron TP x PP: {L} layers cannot fill {N} stages.")
        k = submeshes.index((1, M))
        c = configs[k].index(((1, M), False))
        cuts = [round(i * L / N) for i in range(N + 1)]
        layouts.append([(cuts[i], cuts[i + 1], k, c) for i in range(N)])
    elif not use_ilp:
        tried: set = set()
        single: list | None = None  # a one-stage layout: gradient accumulation over B micro-batches
        for mem_args in ({"param_mem": p_intra, "act_mem": a_intra, "device_memory": budget}, {}):
            for cap in sorted({max_s, *[s for s in (1, 2, 4, 8, 16) if s < max_s]}, reverse=True):
                try:
                    r = stage_dp(t_intra, submeshes, N, M, B, max_stages=cap, **mem_args)
                except InfeasiblePlanError:
                    continue
                lay = [(s.start, s.end, s.submesh_index, s.config_index) for s in r.stages]
                if len(lay) < 2:
                    # the intra-operator search covers one stage over the whole batch; it is a
                    # candidate only when nothing else fits (one device: gradient accumulation)
                    single = single or (lay if mem_args else None)
                    continue
                if tuple(lay) not in tried:
                    tried.add(tuple(lay))
                    layouts.append(lay)
                if len(layouts) >= max_candidates:
                    break
            if layouts:
                break  # else: nothing fits in memory; show the fastest layouts, marked as not fitting
            if single is not None and B > 1:
                layouts.append(single)
                break
    else:
        from autoplan.search.pipeline._stage_ilp import stage_ilp  # noqa: PLC0415

        for S in sorted({s for s in (2, 4, 8) if s <= max_s and (N * M) % s == 0}):
            per = N * M // S
            k = next((i for i, (n, m) in enumerate(submeshes) if n * m == per), None)
            if k is None:
                continue
            try:
                r = stage_ilp(dag, S, time_limit=time_limit)
            except (InfeasiblePlanError, SearchError):
                continue
            # stages as (sorted) layer sets; a DAG stage may be non-contiguous
            groups = [sorted(v for v, s in r.assignment.items() if s == st) for st in range(S)]
            if any(not g for g in groups):
                continue
            per_config = [max(float(np.sum(layer_cost[g, k, ci])) for g in groups)
                          for ci in range(len(configs[k]))]
            c = int(np.argmin(per_config))
            layouts.append([(g[0], g[-1] + 1, k, c, tuple(g)) for g in groups])
    t_dp = time.perf_counter() - t2
    if not layouts:
        least = float(np.nanmin(np.where(np.isfinite(p_intra[0, L - 1]), p_intra[0, L - 1], np.inf)))
        raise InfeasiblePlanError(
            f"pipeline: no stage layout fits {budget:.4g} bytes per device.", least if np.isfinite(least) else None)

    plans = []
    for lay in layouts:
        shapes = [submeshes[st[2]] for st in lay]
        try:
            placed = place_submeshes(shapes, N, M)
        except SearchError:
            continue
        stages, fwd_t, bwd_t, mems = [], [], [], []
        inputs: dict[str, InputSpec] = {}
        comm_total: dict[str, float] = {}
        comm_time: dict[str, float] = {}
        by_axis: dict[str, float] = {}
        boundary_bytes = []
        for si, st in enumerate(lay):
            members = list(st[4]) if len(st) > 4 else list(range(st[0], st[1]))
            n, m = submeshes[st[2]]
            shape, lean = configs[st[2]][st[3]]
            f_time = b_time = resident = act = 0.0
            stage_comm: dict[str, float] = {}
            op_shardings = []
            axis_names = ("x", "y")
            for li in members:
                res, rep_sub = layer_result(li, n, m, shape, lean)
                p = res.plan
                axis_names = p.axis_names
                mine_sub = layer_sub(li)
                f_time += p.predicted.step_time * fwd_frac[li]
                b_time += p.predicted.step_time * (1 - fwd_frac[li])
                r_mem, a_mem = _stage_memory(p)
                resident += r_mem
                act += a_mem
                for kind, v in p.predicted.comm_bytes.items():
                    stage_comm[kind] = stage_comm.get(kind, 0.0) + v
                    comm_total[kind] = comm_total.get(kind, 0.0) + v * B
                for kind, v in p.predicted.comm_time_by_kind.items():
                    comm_time[kind] = comm_time.get(kind, 0.0) + v * B
                for ax, v in p.predicted.comm_by_axis.items():
                    by_axis[ax] = by_axis.get(ax, 0.0) + v * B
                # the representative's solution, moved to this layer (same structure, same order)
                names = {a.name: b.name for a, b in zip(rep_sub.inputs, mine_sub.inputs)}
                for o in p.stages[0].ops:
                    op_shardings.append(replace(
                        o, op=mine_sub.origin[o.op],
                        tensors=tuple(replace(t, name=names.get(t.name, t.name)) for t in o.tensors)))
                for spec, gi in zip(p.inputs, mine_sub.inputs):
                    if gi.kind == "activation":
                        continue
                    inputs.setdefault(gi.name, replace(
                        spec, arg=gi.arg, arg_name=gi.arg_name, path=gi.path, kind=gi.kind,
                        stage=si, shape=tuple(full_shapes.get(gi.name, spec.shape))))
            fwd_t.append(f_time)
            bwd_t.append(b_time)
            s_from_end = len(lay) - si
            mem = resident + min(s_from_end if schedule == "1f1b" else B, B) * act
            mems.append(mem)
            names = tuple(nm for li in members for nm in layers[li].names)
            stages.append(Stage(
                index=si, layers=names, layer_range=(members[0], members[-1] + 1), submesh=(n, m),
                device_ids=tuple(placed[si]), mesh_shape=tuple(shape), axis_names=axis_names,
                ops=tuple(op_shardings), forward_time=f_time, backward_time=b_time, memory=mem,
                comm_bytes=stage_comm))
            ops = sorted(o for li in members for o in layers[li].ops)
            inside = set(ops)
            out_bytes = 0
            for o in ops:
                for t in graph.ops[o].outputs:
                    if any(c not in inside for c in graph.consumers[t]):
                        out_bytes += graph.tensors[t].nbytes
            boundary_bytes.append(out_bytes)
        # cross-mesh resharding: per boundary, min(send whole, send 1/n slices + all-gather)
        comm_s = []
        for si in range(len(stages) - 1):
            a, b = stages[si], stages[si + 1]
            cross = {d // M for d in a.device_ids} != {d // M for d in b.device_ids}
            nbytes = boundary_bytes[si] / 2  # forward activation and backward gradient split evenly
            whole = send_recv_time(cluster, nbytes, cross)
            ndst = b.num_devices
            sliced = send_recv_time(cluster, nbytes / ndst, cross)
            if ndst > 1:
                sliced += cluster.logical_mesh((ndst,), submesh=b.submesh).all_gather(nbytes, [0])
            comm_s.append(min(whole, sliced))
            comm_total["send-recv"] = comm_total.get("send-recv", 0.0) + 2 * nbytes * B
            comm_time["send-recv"] = comm_time.get("send-recv", 0.0) + 2 * min(whole, sliced) * B
        S = len(stages)
        events = schedule_events(schedule, S, B, fwd_t, bwd_t, comm_s or None)
        st_stats = schedule_stats(events, S)
        table = schedule_table(schedule, S, B)
        step = st_stats.step_time
        devices = sum(s.num_devices for s in stages)
        all_inputs = _complete_inputs(full, inputs)
        compute = sum(fwd_t) + sum(bwd_t)
        pred = Predicted(
            step_time=step, throughput=batch / step if step > 0 else 0.0,
            memory_per_device=max(mems), compute_time=compute * B / max(1, S),
            comm_time=sum(comm_time.values()) / max(1, S), comm_bytes=comm_total,
            comm_by_axis=by_axis, comm_time_by_kind={k: v / max(1, S) for k, v in comm_time.items()},
            bubble_fraction=st_stats.bubble_fraction,
            mfu=full.flops / (step * devices * cluster.peak_flops) if step > 0 else 0.0)
        plans.append(Plan(
            model=full.name, fingerprint=full.fingerprint, cluster=cluster, stages=tuple(stages),
            inputs=tuple(all_inputs), predicted=pred,
            schedule=Schedule(schedule, B, S,
                              table=tuple(tuple(None if e is None else (e.microbatch, e.stage, e.kind)
                                                for e in row) for row in table),
                              events=tuple((e.start, e.end, e.mesh, e.microbatch, e.stage, e.kind)
                                           for e in events)),
            label="autoplan-pipeline" if S > 1 else "autoplan", level=level,
            config=dict(getattr(workload, "config", {}) or {}),
            jax_version=jax.__version__,
            notes=(f"stage algorithm: {'TePDist DAG ILP' if use_ilp else 'Alpa stage DP'}",)))
    stats = {"layers": L, "microbatches": B, "submeshes": len(submeshes), "layer_solves": solves,
             "unique_layer_kinds": len(subgraphs), "trace_seconds": t_trace,
             "cost_seconds": t_costs, "dp_seconds": t_dp, "stage_algorithm": "ilp" if use_ilp else "dp"}
    plans.sort(key=lambda p: p.predicted.step_time)
    return PipelineResult(plans=plans, stats=stats)


def _complete_inputs(full: OpGraph, inputs: dict[str, InputSpec]) -> list[InputSpec]:
    """Every graph input in the full graph's order; inputs no stage read stay replicated on stage 0."""
    out = []
    for gi in full.inputs:
        if gi.name in inputs:
            out.append(inputs[gi.name])
        else:
            t = full.tensors[gi.tensor]
            out.append(InputSpec(gi.arg, gi.arg_name, gi.path, gi.kind, t.shape, t.dtype,
                                 (None,) * len(t.shape), 0))
    return out
