"""Hand-made plans for the executor's tests and benchmarks (stand-ins until the search lands).

* :func:`data_parallel_plan`: batch leaves split on ``"x"`` of an ``(8,)`` mesh, everything else
  replicated; predicted communication: one all-reduce of the gradients.
* :func:`tensor_parallel_plan`: a ``(2, 4)`` mesh ``("x", "y")``: batch on ``"x"``, every
  parameter of rank >= 2 split on ``"y"`` along its last dimension (or its first when the last does
  not divide), the optimizer state like its parameter, and sharding constraints on forward
  dot/conv results (batch dimension on ``"x"``, the feature dimension on ``"y"`` where the kernel
  is split so).
* :func:`pipeline_plan`: two stages, layers split in half, devices 0..3 and 4..7 (or stages of
  any sizes), data parallel inside each stage, a GPipe or 1F1B table over ``microbatches``
  micro-batches.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

import autoplan
from autoplan._dtype import dtype_bytes
from autoplan.algorithms import schedule_table
from autoplan.plans._plan import InputSpec, OpSharding, Plan, Predicted, Schedule, Stage, TensorSharding

__all__ = ["data_parallel_plan", "tensor_parallel_plan", "pipeline_plan", "traced"]


def traced(workload: Any) -> Any:
    """The workload's graph (trace warnings silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return autoplan.trace(workload)


def _ts(graph: Any, t: int) -> tuple[tuple[int, ...], str]:
    tt = graph.tensors[t]
    return tt.shape, tt.dtype


def _inputs(graph: Any, spec_fn, stage_fn=lambda gi: 0) -> tuple[InputSpec, ...]:
    out = []
    for gi in graph.inputs:
        shape, dtype = _ts(graph, gi.tensor)
        out.append(InputSpec(gi.arg, gi.arg_name, gi.path, gi.kind, shape, dtype,
                             spec_fn(gi, shape), stage_fn(gi)))
    return tuple(out)


def _param_path(gi: Any) -> str:
    """The parameter path an optimizer-state leaf mirrors (``['mu']['a']`` -> ``['a']``)."""
    if gi.kind == "optimizer_state" and gi.path.startswith(("['mu']", "['nu']")):
        return gi.path[6:]
    return gi.path


def _grad_bytes(graph: Any) -> float:
    return float(sum(graph.tensors[gi.tensor].nbytes for gi in graph.inputs_of_kind("parameter")))


def _plan(wl: Any, graph: Any, stages, inputs, schedule, comm, label: str) -> Plan:
    # the cluster has the devices the stages use (a plan's cluster is what it was made for)
    devices = sum(s.num_devices for s in stages)
    return Plan(model=wl.name, fingerprint=graph.fingerprint,
                cluster=autoplan.Cluster.parse(f"cpu:{devices}"),
                stages=tuple(stages), inputs=inputs, schedule=schedule,
                predicted=Predicted(step_time=0.0, throughput=0.0, memory_per_device=0.0,
                                    comm_bytes=comm),
                label=label, level="handmade", config=dict(getattr(wl, "config", {})))


def _batch_dim0(shape: tuple[int, ...], n: int, axis: str = "x") -> tuple:
    if shape and shape[0] % n == 0:
        return ((axis,),) + (None,) * (len(shape) - 1)
    return (None,) * len(shape)


def data_parallel_plan(wl: Any, graph: Any | None = None, n: int = 8) -> Plan:
    """Batch split on ``"x"`` over ``n`` devices, parameters and optimizer state replicated."""
    graph = graph or traced(wl)

    def spec(gi, shape):
        return _batch_dim0(shape, n) if gi.kind == "batch" else (None,) * len(shape)

    stage = Stage(0, tuple(ly.name for ly in graph.layers), (0, len(graph.layers)), (1, n),
                  tuple(range(n)), (n,), ("x",))
    # ring all-reduce of every gradient (B = the gradient's bytes)
    comm = {"all-reduce": _grad_bytes(graph)}
    return _plan(wl, graph, [stage], _inputs(graph, spec), Schedule("none", 1, 1), comm,
                 "handmade-dp")


def _tp_spec(shape: tuple[int, ...], y: int) -> tuple:
    spec: list = [None] * len(shape)
    if len(shape) >= 2:
        if shape[-1] % y == 0:
            spec[-1] = ("y",)
        elif shape[0] % y == 0:
            spec[0] = ("y",)
    return tuple(spec)


def tensor_parallel_plan(wl: Any, graph: Any | None = None, mesh: tuple[int, int] = (2, 4)) -> Plan:
    """Batch on ``"x"``, rank >= 2 parameters split on ``"y"``, constraints on forward dot/conv."""
    graph = graph or traced(wl)
    x, y = mesh
    param_spec = {gi.path: _tp_spec(_ts(graph, gi.tensor)[0], y) for gi in graph.inputs_of_kind("parameter")}

    def spec(gi, shape):
        if gi.kind == "batch":
            return _batch_dim0(shape, x)
        if gi.kind == "parameter":
            return param_spec[gi.path]
        p = param_spec.get(_param_path(gi))
        return p if p is not None and len(p) == len(shape) else (None,) * len(shape)

    inputs = _inputs(graph, spec)
    by_tensor = {gi.tensor: s for gi, s in zip(graph.inputs, inputs)}
    ops = []
    for op in graph.ops:
        if op.role != "forward" or op.primitive not in ("dot_general", "conv_general_dilated"):
            continue
        out_shape = op.out_shapes[0]
        if len(out_shape) < 2:
            continue
        out_spec: list = [None] * len(out_shape)
        if out_shape[0] % x == 0:
            out_spec[0] = ("x",)
        rhs = by_tensor.get(op.inputs[1]) if len(op.inputs) > 1 else None
        if rhs is not None and rhs.spec and rhs.spec[-1] == ("y",) and out_shape[-1] % y == 0:
            out_spec[-1] = ("y",)
        tensors = (TensorSharding(f"%{op.outputs[0]}", "output", out_shape, op.out_dtypes[0],
                                  tuple(out_spec)),)
        ops.append(OpSharding(op.id, op.primitive, op.scope_name, op.scope[0] if op.scope else "",
                              op.role, "handmade", tensors, flops=op.flops))
    stage = Stage(0, tuple(ly.name for ly in graph.layers), (0, len(graph.layers)), (1, x * y),
                  tuple(range(x * y)), (x, y), ("x", "y"), ops=tuple(ops))
    # gradients all-reduced over "x", each device holding its "y" shard of them
    comm = {"all-reduce": float(sum(
        graph.tensors[gi.tensor].nbytes / math.prod(y for e in param_spec[gi.path] if e)
        for gi in graph.inputs_of_kind("parameter")))}
    return _plan(wl, graph, [stage], inputs, Schedule("none", 1, 1), comm, "handmade-tp")


def pipeline_plan(wl: Any, graph: Any | None = None, schedule: str = "gpipe",
                  microbatches: int = 2, per_stage: int = 4,
                  sizes: tuple[int, ...] | None = None) -> Plan:
    """Stages of consecutive layers (split as evenly as the layers allow) on consecutive devices,
    each data parallel over its submesh: two stages of ``per_stage`` devices, or one stage per
    entry of ``sizes`` (devices per stage, in order)."""
    graph = graph or traced(wl)
    sizes = tuple(sizes) if sizes else (per_stage, per_stage)
    S = len(sizes)
    names = [ly.name for ly in graph.layers if ly.name not in ("optimizer", "(root)")]
    assert len(names) >= S, f"{len(names)} layers cannot fill {S} stages"
    bounds = [-(-k * len(names) // S) for k in range(S + 1)]  # earlier stages take the extra layer
    layers = [tuple(names[bounds[k]:bounds[k + 1]]) for k in range(S)]
    layer_stage = {n: s for s, ls in enumerate(layers) for n in ls}
    param_stage: dict[str, int] = {}
    for ly in graph.layers:
        for pname in ly.params:
            param_stage.setdefault(pname, layer_stage.get(ly.name, 0))
    first_use: dict[int, int] = {}
    for op in graph.ops:
        for t in op.inputs:
            if t is not None and t not in first_use:
                first_use[t] = layer_stage.get(op.scope[0], 0) if op.scope else 0

    def stage_of(gi):
        if gi.kind == "parameter":
            return param_stage.get(gi.name, 0)
        if gi.kind == "optimizer_state":
            return param_stage.get(f"{graph.inputs_of_kind('parameter')[0].arg_name}{_param_path(gi)}", 0)
        return first_use.get(gi.tensor, 0)

    def spec(gi, shape):
        if gi.kind == "batch":
            mb = (shape[0] // microbatches,) + tuple(shape[1:]) if shape else shape
            return _batch_dim0(mb, sizes[stage_of(gi)]) if shape else ()
        return (None,) * len(shape)

    inputs = _inputs(graph, spec, stage_of)
    stages = []
    first_id = 0
    for s, n in enumerate(sizes):
        ops = []
        for op in graph.ops:
            if (op.role != "forward" or op.primitive != "dot_general" or not op.scope
                    or layer_stage.get(op.scope[0]) != s):
                continue
            out_shape = op.out_shapes[0]
            out_spec = _batch_dim0((out_shape[0] // microbatches,) + tuple(out_shape[1:]), n)
            tensors = (TensorSharding(f"%{op.outputs[0]}", "output", out_shape, op.out_dtypes[0],
                                      out_spec),)
            ops.append(OpSharding(op.id, op.primitive, op.scope_name, op.scope[0], op.role,
                                  "handmade", tensors, flops=op.flops))
        ids = tuple(range(first_id, first_id + n))
        first_id += n
        stages.append(Stage(s, layers[s], (bounds[s], bounds[s + 1]), (1, n), ids, (n,), ("x",),
                            ops=tuple(ops)))
    table = tuple(tuple(row) for row in schedule_table(schedule, S, microbatches))
    grad = _grad_bytes(graph)
    # activations cross each cut once forward and once backward per micro-batch
    crossing: set[int] = set()
    for op in graph.ops:
        if op.role == "forward" and op.scope and layer_stage.get(op.scope[0], 0) > 0:
            for t in op.inputs:
                if t is None:
                    continue
                p = graph.tensors[t].producer
                if (p >= 0 and graph.ops[p].scope
                        and layer_stage.get(graph.ops[p].scope[0], 0) < layer_stage[op.scope[0]]):
                    crossing.add(t)
    cut_bytes = 2.0 * sum(graph.tensors[t].nbytes for t in crossing)
    # each micro-batch's backward all-reduces its stage's gradients inside the stage
    comm = {"all-reduce": microbatches * grad / S, "send-recv": cut_bytes}
    return _plan(wl, graph, stages, inputs, Schedule(schedule, microbatches, S, table), comm,
                 f"handmade-pipeline-{schedule}")


def nbytes(shape: tuple[int, ...], dtype: str) -> int:
    """Bytes of a tensor."""
    return int(np.prod(shape)) * dtype_bytes(dtype)
