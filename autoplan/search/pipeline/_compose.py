"""The :class:`~autoplan.Plan` of a simulated pipeline layout: each stage composed from its
layers' solutions (every operator under its own layer's name and scope), its collectives and
cross-stage transfers, the memory levers it uses, the schedule simulated and the prediction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import jax
import numpy as np

from autoplan._memo import memo
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
from autoplan.plans._schedule import schedule_table
from autoplan.search.fold._layers import op_layer_names
from autoplan.search.intra._intra import _comm_by_axis
from autoplan.search.pipeline._cost_table import _Table
from autoplan.search.pipeline._microbatches import batch_size
from autoplan.search.pipeline._simulate import _Eval
from autoplan.tracing._graph import OpGraph


def _add(out: dict[str, float], key: str, v: float) -> None:
    out[key] = out.get(key, 0.0) + v


def _layer_ops(table: _Table, li: int, k: int, c: int, res: Any,
               layer_names: Any) -> tuple[Any, ...]:
    """Layer ``li``'s operator shardings on cell ``(k, c)`` under its own operators, tensors,
    scopes and layer name (its kind's plan translated; once per cell, kept with the table's
    budget-free costs)."""
    def make() -> tuple[Any, ...]:
        graph = table.graph
        rep_sub, mine = table.sub(table.rep[table.kind[li]]), table.sub(li)
        names = {a.name: b.name for a, b in zip(rep_sub.inputs, mine.inputs)}
        names.update({f"%{lt}": f"%{gt}" for gt, lt in table.local(li).items()})
        # (the records made unchecked, as the kind's plan made them: every field but the names
        # is the kind's record's own, already in its stored form; a tensor whose name stays is
        # the kind's record itself)
        op_record, tensor_record = record_maker(OpSharding), record_maker(TensorSharding)
        out = []
        for o in res.plan.stages[0].ops:
            gop = graph.ops[mine.origin[o.op]]
            tensors = []
            for t in o.tensors:
                name = names.get(t.name, t.name)
                tensors.append(t if name == t.name else
                               tensor_record(name, t.role, t.shape, t.dtype, t.spec))
            out.append(op_record(gop.id, o.primitive, gop.scope_name, layer_names[gop.id],
                                 o.role, o.strategy, tuple(tensors), o.comm, o.flops))
        return tuple(out)

    return memo(table.shared, (_layer_ops, li, k, c), make)


def _compose(table: _Table, ev: _Eval, *, workload: Any, level: str, notes: tuple[str, ...]
             ) -> Plan:
    """The :class:`Plan` of a simulated layout: each stage composed from its layers' solutions,
    every operator under its own layer's name and scope."""
    ctx, graph, full, B = table.ctx, table.graph, table.ctx.full, ev.B
    layer_names = op_layer_names(graph)  # the layers' names as every view shows them
    full_shapes = {gi.name: full.tensors[gi.tensor].shape for gi in full.inputs}
    S = len(ev.layout)
    stages: list[Stage] = []
    inputs: dict[str, InputSpec] = {}
    per_stage = []  # (compute, comm seconds, comm time by kind, comm bytes, comm by axis)
    stage_of = [0] * table.L
    for s, (members, _, _) in enumerate(ev.layout):
        for li in members:
            stage_of[li] = s
    fwd_bytes, bwd_bytes = table.boundary_bytes(stage_of, S)
    for si, ((members, k, c), terms) in enumerate(zip(ev.layout, ev.stages)):
        n, m = ctx.submeshes[k]
        shape, _ = ctx.configs[k][c]
        mesh = ctx.mesh(k, shape)
        op_shardings = []
        mb_comms: list[Comm] = []
        step_comms: list[Comm] = []
        compute = 0.0
        for li in members:
            res = table.result(li, k, c)
            lc = table.cost(li, k, c)
            compute += B * (lc.forward_compute + lc.backward_compute) + lc.step_compute
            mb_comms += [*lc.forward_comms, *lc.backward_comms]
            step_comms += lc.step_comms
            mine = table.sub(li)
            op_shardings += _layer_ops(table, li, k, c, res, layer_names)
            for spec, gi in zip(res.plan.inputs, mine.inputs):
                if gi.kind == "activation" or gi.name in inputs:
                    continue
                inputs.setdefault(gi.name, replace(
                    spec, arg=gi.arg, arg_name=gi.arg_name, path=gi.path, kind=gi.kind,
                    stage=si, shape=tuple(full_shapes.get(gi.name, spec.shape))))
        inside = set(members)
        for a, b in table.passing():
            if a in inside and b in inside:
                fw, bw, st = table.pair(a, b, k, c)
                mb_comms += fw + bw
                step_comms += st
        comm_bytes: dict[str, float] = {}
        comm_time: dict[str, float] = {}
        by_axis: dict[str, float] = {}
        for times, comms in ((B, mb_comms), (1, step_comms)):
            for x in comms:
                _add(comm_bytes, x.kind, times * x.bytes)
                _add(comm_time, x.kind, times * x.time)
                axis: dict[str, float] = {}
                _comm_by_axis(x, mesh, axis)
                for ax, v in axis.items():
                    _add(by_axis, ax, times * v)
        # cross-stage transfers a device of this stage receives, per step
        for nbytes, src in ((fwd_bytes[si - 1] if si > 0 else 0.0, si - 1),
                            (bwd_bytes[si] if si < S - 1 else 0.0, si + 1)):
            if nbytes <= 0:
                continue
            cross = ctx.crosses_hosts(ev.placed[src], ev.placed[si])
            t, sr, ag = ctx.transfer(float(nbytes), k, cross, n * m)
            _add(comm_bytes, "send-recv", B * sr)
            if ag:
                _add(comm_bytes, "all-gather", B * ag)
            _add(comm_time, "send-recv", B * t)
        names = tuple(nm for li in members for nm in table.layers[li].names)
        lever = {}
        if ev.levers is not None and ev.levers[si]:
            lever, compute = _lever_fields(table, members, k, c, ev.levers[si], B, comm_bytes,
                                           comm_time, compute)
        stages.append(Stage(
            index=si, layers=names, layer_range=(members[0], members[-1] + 1), submesh_shape=(n, m),
            device_ids=tuple(ev.placed[si]), mesh_shape=tuple(shape), axis_names=mesh.axis_names,
            ops=tuple(op_shardings), forward_time=terms.forward, backward_time=terms.backward,
            memory=ev.memory[si], comm_bytes=comm_bytes, **lever))
        per_stage.append((compute, comm_time, comm_bytes, by_axis))
    busy = ev.stats.busy
    hot = int(np.argmax(busy))
    step = ev.step
    devices = sum(s.num_devices for s in stages[:ev.meshes])  # (interleaved: each mesh once)
    batch = batch_size(full)
    pred = Predicted(
        step_time=step, throughput=batch / step if step > 0 else 0.0,
        memory_per_device=max(ev.memory), compute_time=per_stage[hot][0],
        comm_time=sum(per_stage[hot][1].values()),
        comm_bytes={kk: max(p[2].get(kk, 0.0) for p in per_stage)
                    for kk in sorted({kk for p in per_stage for kk in p[2]})},
        comm_by_axis={ax: max(p[3].get(ax, 0.0) for p in per_stage)
                      for ax in sorted({ax for p in per_stage for ax in p[3]})},
        comm_time_by_kind=dict(per_stage[hot][1]), bubble_fraction=ev.stats.bubble_fraction,
        mfu=full.flops / (step * devices * ctx.cluster.peak_flops) if step > 0 else 0.0)
    if any(st.levers for st in stages):
        from autoplan.search.pipeline._levers import EXEC_NOTE  # noqa: PLC0415

        notes = (*notes, EXEC_NOTE)
    table_rows = schedule_table(ev.kind, S, B, ev.virtual_stages)
    # (made unchecked: the table and events are built here as tuples of tuples of names and
    # numbers, the form the checked constructor would store, whose walk of every entry took 10-70
    # ms per plan of GPT 39B)
    schedule = record_maker(Schedule)(
        ev.kind, B, S,
        tuple(tuple(None if e is None else (e.microbatch, e.stage, e.kind) for e in row)
              for row in table_rows),
        tuple((e.start, e.end, e.mesh, e.microbatch, e.stage, e.kind) for e in ev.events),
        ev.virtual_stages)
    return Plan(
        model=full.name, fingerprint=full.fingerprint, cluster=ctx.cluster, stages=tuple(stages),
        inputs=tuple(_complete_inputs(full, inputs)), predicted=pred, schedule=schedule,
        label="autoplan-pipeline" if S > 1 else "autoplan", level=level,
        config=dict(workload.config), jax_version=jax.__version__,
        notes=notes)


def _lever_fields(table: _Table, members: Sequence[int], k: int, c: int, lv: Any, B: int,
                  comm_bytes: dict[str, float], comm_time: dict[str, float], compute: float
                  ) -> tuple[dict[str, Any], float]:
    """A stage's lever fields (``zero``, ``zero_axes``, ``remat_layers``) and its compute with
    the recomputed forwards; ``comm_bytes`` and ``comm_time`` get ZeRO's collectives (none
    below zero)."""
    from autoplan.search.pipeline._levers import stage_extras  # noqa: PLC0415

    more, nbytes, seconds = stage_extras(table, members, k, c, lv, B)
    for kind, b in nbytes.items():
        comm_bytes[kind] = max(0.0, comm_bytes.get(kind, 0.0) + b)
    for kind, t in seconds.items():
        comm_time[kind] = max(0.0, comm_time.get(kind, 0.0) + t)
    remat = tuple(nm for li in members if li in lv.remat for nm in table.layers[li].names)
    return {"zero": lv.zero, "zero_axes": lv.axes, "remat_layers": remat}, compute + more


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
