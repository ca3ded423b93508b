"""Every public function, given bad arguments, raises an :class:`autoplan.AutoplanError`.

The walk covers each public name of ``autoplan``, ``autoplan.viz`` and ``autoplan.exec``: a
function or a class users construct has at least one bad call below; records that only the
library builds are listed with that reason. A name added to a public ``__all__`` without a case
fails :func:`test_every_public_name_is_walked`.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import pytest

import autoplan
import autoplan.exec as ex
import autoplan.viz as viz
from autoplan import AutoplanError, algorithms


def _graph():
    return autoplan.trace(lambda w, x: jnp.tanh(x @ w).sum(),
                          jax.ShapeDtypeStruct((4, 8), jnp.float32),
                          jax.ShapeDtypeStruct((2, 4), jnp.float32))


BAD_CALLS = {
    "autoplan.search": [lambda: autoplan.search(42),
                        lambda: autoplan.search(autoplan.models.get("mlp"), cluster="no-such-preset")],
    "autoplan.plan": [lambda: autoplan.plan("no-such-model")],
    "autoplan.SearchOptions": [lambda: autoplan.SearchOptions(level="O9"),
                               lambda: autoplan.SearchOptions(pipeline=False, microbatches=4),
                               lambda: autoplan.SearchOptions(time_limit=0)],
    "autoplan.trace": [lambda: autoplan.trace(42),
                       lambda: autoplan.trace(lambda x: x, jnp.ones(2), arg_kinds=("weights",)),
                       lambda: autoplan.trace(lambda x: x, jnp.ones(2), arg_kinds=("batch", "batch"))],
    "autoplan.load_workload": [lambda: autoplan.load_workload(42),
                               lambda: autoplan.load_workload("no_such_module_here:fn")],
    "autoplan.profile": [lambda: autoplan.profile(devices=42), lambda: autoplan.profile(devices=[])],
    "autoplan.Workload": [lambda: autoplan.Workload(42, ()),
                          lambda: autoplan.Workload(lambda x: x, (jnp.ones(2),), arg_kinds=("w",))],
    "autoplan.Cluster": [lambda: autoplan.Cluster.preset("no-such-preset"),
                         lambda: autoplan.Cluster.parse("p3.16xlarge:zero")],
    "autoplan.Plan": [lambda: autoplan.Plan.from_json("{}"),
                      lambda: autoplan.Plan.from_json("/no/such/plan.json")],
    "autoplan.models": [lambda: autoplan.models.get("no-such-model"),
                        lambda: autoplan.models.get("gpt", size="huge"),
                        lambda: autoplan.models.get("gpt", no_such_field=3)],
    "autoplan.algorithms.cones": [lambda: algorithms.cones(_graph(), opt_level="O9")],
    "autoplan.algorithms.critical_nodes": [lambda: algorithms.critical_nodes(_graph(), part="middle")],
    "autoplan.algorithms.segments": [lambda: algorithms.segments(_graph(), granularity="op"),
                                 lambda: algorithms.segments(_graph(), attach="nowhere")],
    "autoplan.viz.Explorer": [lambda: viz.Explorer(level="no-such-level"),
                              lambda: viz.Explorer(cluster=42)],
    "autoplan.viz.sharding_figure": [lambda: viz.sharding_figure(42)],
    "autoplan.viz.stage_figure": [lambda: viz.stage_figure(42)],
    "autoplan.viz.timeline_figure": [lambda: viz.timeline_figure(42)],
    "autoplan.viz.memory_figure": [lambda: viz.memory_figure(42)],
    "autoplan.viz.memory_breakdown": [lambda: viz.memory_breakdown(42)],
    "autoplan.viz.compare_figure": [lambda: viz.compare_figure(42), lambda: viz.compare_figure([])],
    "autoplan.viz.graph_figure": [lambda: viz.graph_figure(42),
                                  lambda: viz.graph_figure([{"name": "a"}], classes=[1, 2]),
                                  lambda: viz.graph_figure([{"name": "a"}], critical=["b"])],
    "autoplan.viz.report_html": [lambda: viz.report_html(42)],
    "autoplan.viz.set_notebook_renderer": [lambda: viz.set_notebook_renderer("no-such-renderer")],
    "autoplan.viz.tile_devices": [lambda: viz.tile_devices((4,), ("x", "y"), (2,), ("x",)),
                                  lambda: viz.tile_devices((4,), ("x",), (2,), ("x", "y"))],
    "autoplan.viz.tile_grid": [lambda: viz.tile_grid((4,), ("z",), (2,), ("x",))],
    "autoplan.viz.tile_color": [lambda: viz.tile_color([0], (0,)), lambda: viz.tile_color(42, (2,)),
                                lambda: viz.tile_color([5], (2,))],
    "autoplan.viz.op_layers": [lambda: viz.op_layers(42)],
    "autoplan.viz.mesh_color": [lambda: viz.mesh_color((5,), (2,)), lambda: viz.mesh_color(42, (2,)),
                                lambda: viz.mesh_color((0,), "2")],
    "autoplan.viz.timeline_events": [lambda: viz.timeline_events(42)],
    "autoplan.viz.pareto_front": [lambda: viz.pareto_front(42), lambda: viz.pareto_front([(1,)])],
    "autoplan.viz.device_color": [lambda: viz.device_color("x"), lambda: viz.device_color(-1)],
    "autoplan.viz.stage_color": [lambda: viz.stage_color("x")],
    "autoplan.viz.class_color": [lambda: viz.class_color("x")],
    "autoplan.exec.run": [lambda: ex.run(42, 42)],
    "autoplan.exec.launch": [lambda: ex.launch(42, 42)],
    "autoplan.exec.describe_workload": [lambda: ex.describe_workload(42)],
    "autoplan.exec.detect_devices": [lambda: ex.detect_devices("no-such-platform", timeout=1)],
    "autoplan.exec.cluster_command": [lambda: ex.cluster_command("no-such-kind", "p.json", {}, 8, 8)],
    "autoplan.exec.collectives": [lambda: ex.collectives(42)],
    "autoplan.exec.comm_bytes": [lambda: ex.comm_bytes(42)],
    "autoplan.exec.flatten": [lambda: ex.flatten(42)],
    "autoplan.algorithms.schedule_table": [lambda: algorithms.schedule_table("no-such-schedule", 2, 4),
                                       lambda: algorithms.schedule_table("gpipe", 0, 4)],
    "autoplan.algorithms.schedule_order": [lambda: algorithms.schedule_order("no-such-schedule", 2, 4)],
    "autoplan.algorithms.schedule_events": [lambda: algorithms.schedule_events("1f1b", 2, 2, [1.0], [1.0, 1.0])],
    "autoplan.exec.check_equivalence": [lambda: ex.check_equivalence(42, None, [], [])],
}

#: public names that are records the library builds (or lazily loaded modules): no user call to get wrong
RECORDS = {
    "autoplan": {"exec", "viz", "algorithms", "LogicalMesh", "GraphInput", "OpGraph", "OpNode", "Tensor",
                 "OpaqueControlFlowWarning", "SearchResult"},
    "autoplan.viz": {"Event"},
    "autoplan.exec": {"RunReport", "EquivalenceResult", "LaunchHandle", "LaunchResult", "DeviceInfo",
                      "Collective", "MemoryStats", "FlatProgram", "Task"},
}


def _public(module) -> list[str]:
    out = []
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            continue
        if callable(obj) or inspect.ismodule(obj):
            out.append(name)
    return out


@pytest.mark.parametrize("module", [autoplan, viz, ex], ids=lambda m: m.__name__)
def test_every_public_name_is_walked(module):
    missing = [n for n in _public(module)
               if f"{module.__name__}.{n}" not in BAD_CALLS and n not in RECORDS[module.__name__]]
    assert not missing, f"public names of {module.__name__} without a bad-argument case: {missing}"


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_bad_arguments_raise_an_autoplan_error(name):
    for call in BAD_CALLS[name]:
        with pytest.raises(AutoplanError) as info:
            call()
        message = str(info.value)
        assert "Fix" in message, message
