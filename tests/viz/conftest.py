"""Hand-built plans for the viz tests (until the search produces real ones).

* ``intra_plan``: one stage on a 2x4 mesh (axes x, y) of a p3.16xlarge host, with dot operators
  whose tensors are replicated, split over one axis, over both axes, and of rank 3.
* ``pipeline_plan`` / ``gpipe_plan``: 3 stages on a 2-host x 4-device cluster (devices 0-3 as a
  1x4 mesh, 4-5 as 1x2 and 6; device 7 unused) with a 1F1B (or GPipe) schedule; weights split
  on their output dim over the mesh's y axis.
* ``compare_plans``: five plans with different labels and predictions whose Pareto front is
  known (``PARETO_LABELS``).
"""

from __future__ import annotations

from dataclasses import astuple

import pytest

from autoplan.costs._cluster import Cluster
from autoplan.plans._plan import (
    Comm,
    InputSpec,
    OpSharding,
    Plan,
    Predicted,
    Schedule,
    Stage,
    TensorSharding,
)
from autoplan.plans._schedule import schedule_events, schedule_table

X, Y, XY = ("x",), ("y",), ("x", "y")


def ts(name, role, shape, spec, dtype="float32"):
    return TensorSharding(name, role, tuple(shape), dtype, tuple(spec))


def dot(op, layer, tensors, role="forward", comm=(), flops=1e9, strategy="S(x)R x RS(y) -> S(x)S(y)"):
    return OpSharding(op=op, primitive="dot_general", scope=f"model/{layer}", layer=layer, role=role,
                      strategy=strategy, tensors=tuple(tensors), comm=tuple(comm), flops=flops)


def param(path, shape, spec, stage=0, kind="parameter"):
    return InputSpec(arg=0, arg_name="params", path=path, kind=kind, shape=tuple(shape),
                     dtype="float32", spec=tuple(spec), stage=stage)


INTRA_OPS = (
    # fc1: weight split on its output dim over y (4 devices); output split over both axes.
    dot(0, "fc1", [ts("x", "input", (64, 1024), (X, None)),
                   ts("params['fc1']['kernel']", "weight", (1024, 4096), (None, Y)),
                   ts("%3", "output", (64, 4096), (X, Y))]),
    # fc2: weight split on its input (contracting) dim; output all-reduced over y.
    dot(1, "fc2", [ts("%3", "input", (64, 4096), (X, Y)),
                   ts("params['fc2']['kernel']", "weight", (4096, 1024), (Y, None)),
                   ts("%5", "output", (64, 1024), (X, None))],
        comm=[Comm("all-reduce", 64 * 1024 * 4 / 2, ("y",), 2e-5)],
        strategy="S(x)S(y) x S(y)R -> S(x)R (all-reduce y)"),
    # attn: a rank-3 activation; weight split over both axes (8 tiles, 8 devices).
    dot(2, "attn", [ts("%6", "input", (64, 128, 1024), (X, None, None)),
                    ts("params['attn']['qkv']", "weight", (1024, 3072), (X, Y)),
                    ts("%8", "output", (64, 128, 3072), (X, None, Y))], strategy="ZeRO-3 gather"),
    # proj: one weight dim split over both axes at once (x major).
    dot(3, "proj", [ts("%8", "input", (64, 1024), (None, None)),
                    ts("params['proj']['kernel']", "weight", (1024, 8192), (None, XY)),
                    ts("%10", "output", (64, 8192), (None, XY))]),
    # head: replicated weight.
    dot(4, "head", [ts("%5", "input", (64, 1024), (X, None)),
                    ts("params['head']['kernel']", "weight", (1024, 10), (None, None)),
                    ts("%12", "output", (64, 10), (X, None))], strategy="S(x)R x RR -> S(x)R"),
    # a backward op, which the sharding figure leaves out.
    dot(5, "fc1", [ts("%3", "input", (64, 4096), (X, Y)),
                   ts("x", "input", (64, 1024), (X, None)),
                   ts("grad fc1", "output", (1024, 4096), (None, Y))], role="backward"),
)

INTRA_INPUTS = (
    param("['fc1']['kernel']", (1024, 4096), (None, Y)),
    param("['fc2']['kernel']", (4096, 1024), (Y, None)),
    param("['attn']['qkv']", (1024, 3072), (X, Y)),
    param("['proj']['kernel']", (1024, 8192), (None, XY)),
    param("['head']['kernel']", (1024, 10), (None, None)),
    InputSpec(1, "opt_state", "[0].mu['fc1']['kernel']", "optimizer_state", (1024, 4096), "float32",
              (None, Y)),
    InputSpec(2, "batch", "['x']", "batch", (64, 1024), "float32", (X, None)),
)


def make_intra_plan(label="autoplan", step_time=0.010, memory=6 * 2**30, **pred):
    cluster = Cluster.preset("p3.16xlarge", 1)
    stage = Stage(index=0, layers=("fc1", "fc2", "attn", "proj", "head"), layer_range=(0, 5),
                  submesh_shape=(1, 8), device_ids=tuple(range(8)), mesh_shape=(2, 4), axis_names=("x", "y"),
                  ops=INTRA_OPS, forward_time=step_time / 3, backward_time=2 * step_time / 3,
                  memory=memory, comm_bytes={"all-reduce": 1e6})
    predicted = Predicted(step_time=step_time, throughput=64 / step_time, memory_per_device=memory,
                          compute_time=pred.pop("compute_time", 0.7 * step_time),
                          comm_time=0.3 * step_time,
                          comm_bytes={"all-reduce": 3e6, "all-gather": 1e6},
                          comm_time_by_kind=pred.pop("comm_time_by_kind",
                                                     {"all-reduce": 0.2 * step_time,
                                                      "all-gather": 0.1 * step_time}),
                          **pred)
    return Plan(model="mlp-test", fingerprint="f" * 16, cluster=cluster, stages=(stage,),
                inputs=INTRA_INPUTS, schedule=Schedule("none", 1, 1), predicted=predicted,
                label=label, jax_version="0.10.2", notes=("hand-built for tests",))


def simulate(kind, fwd, bwd, m):
    """Earliest-start GPipe or 1F1B events ``(start, end, mesh, micro-batch, stage, kind)``."""
    return sorted(astuple(e) for e in schedule_events(kind, len(fwd), m, fwd, bwd))


def make_pipeline_plan(kind="1f1b", m=4, label="autoplan-pipeline"):
    cluster = Cluster.preset("p3.16xlarge", 2, devices_per_node=4)
    fwd = [1.0e-3, 1.2e-3, 0.8e-3]
    bwd = [2 * f for f in fwd]
    layout = [((0, 1, 2, 3), (1, 4), (1, 4)), ((4, 5), (1, 2), (1, 2)), ((6,), (1, 1), (1, 1))]
    stages = []
    # the batch: its leading dimension (48) is what the m micro-batches split
    inputs = [InputSpec(2, "batch", "['x']", "batch", (48, 512), "float32", (None, None))]
    for s, (devs, sub, mesh) in enumerate(layout):
        names = ("x", "y")
        spec_w = (None, Y) if mesh[1] > 1 else (None, None)
        ops = tuple(
            dot(10 * s + k, f"layer{4 * s + k}",
                [ts(f"%{100 * s + k}", "input", (16, 512), (X if mesh[0] > 1 else None, None)),
                 ts(f"params['layer{4 * s + k}']['kernel']", "weight", (512, 512), spec_w),
                 ts(f"%{100 * s + k + 50}", "output", (16, 512), (X if mesh[0] > 1 else None, spec_w[1]))])
            for k in range(4))
        stages.append(Stage(index=s, layers=tuple(f"layer{4 * s + k}" for k in range(4)),
                            layer_range=(4 * s, 4 * s + 4), submesh_shape=sub, device_ids=devs,
                            mesh_shape=mesh, axis_names=names, ops=ops, forward_time=fwd[s],
                            backward_time=bwd[s], memory=(3 - s) * 2**30))
        inputs += [param(f"['layer{4 * s + k}']['kernel']", (512, 512), spec_w, stage=s) for k in range(4)]
    events = simulate(kind, fwd, bwd, m)
    table = [[None if t is None else tuple(t) for t in row] for row in schedule_table(kind, 3, m)]
    step = max(e[1] for e in events)
    busy = sum(e[1] - e[0] for e in events)
    predicted = Predicted(step_time=step, throughput=64 / step, memory_per_device=3 * 2**30,
                          compute_time=busy / 3, comm_time=1e-4,
                          comm_time_by_kind={"send-recv": 1e-4, "all-reduce": 2e-4},
                          bubble_fraction=1 - busy / (3 * step), mfu=0.3)
    return Plan(model="mlp-test", fingerprint="f" * 16, cluster=cluster, stages=tuple(stages),
                inputs=tuple(inputs),
                schedule=Schedule(kind, m, 3, table=tuple(tuple(r) for r in table), events=tuple(events)),
                predicted=predicted, label=label)


# (label, step_time s, memory GiB): data-parallel is dominated by megatron; pipeline by zero-3.
COMPARE = [("autoplan", 0.010, 8.0), ("data-parallel", 0.015, 6.0), ("megatron", 0.012, 4.0),
           ("zero-3", 0.020, 2.0), ("pipeline", 0.025, 3.0)]
PARETO_LABELS = ["autoplan", "megatron", "zero-3"]


@pytest.fixture
def intra_plan():
    return make_intra_plan()


@pytest.fixture
def pipeline_plan():
    return make_pipeline_plan("1f1b")


@pytest.fixture
def gpipe_plan():
    return make_pipeline_plan("gpipe", m=3, label="gpipe")


@pytest.fixture
def compare_plans():
    return [make_intra_plan(label, t, g * 2**30, bubble_fraction=0.1 * k)
            for k, (label, t, g) in enumerate(COMPARE)]
