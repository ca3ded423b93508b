"""Pins are resolved in one module (``search/intra/_pins.py``), every search function takes them
as ``pins=``, and the public functions' old ``pin=`` still works with a DeprecationWarning."""

from __future__ import annotations

import dataclasses
import pathlib
import re
import warnings

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import autoplan
from autoplan import SearchError
from autoplan.algorithms import intra_op_search, level_search, pipeline_search
from autoplan.search.intra._intra import make_logical_mesh
from autoplan.search.intra._pins import (
    INTRA_BASELINES,
    baseline_pins,
    pin_specs,
    pins_by_name,
    renamed_pin,
)

CPU8 = autoplan.Cluster.parse("cpu:8")
W = r"\['w'\]"


def _step(params, batch):
    h = jnp.tanh(batch["x"] @ params["w"])
    return jnp.mean((h @ params["v"] - batch["y"]) ** 2)


def _sgd(params, batch):
    loss, g = jax.value_and_grad(_step)(params, batch)
    return loss, jax.tree.map(lambda p, d: p - 0.1 * d, params, g)


@pytest.fixture(scope="module")
def workload():
    params = {"w": jnp.ones((16, 32)), "v": jnp.ones((32, 8))}
    batch = {"x": jnp.ones((32, 16)), "y": jnp.ones((32, 8))}
    return autoplan.Workload(_sgd, (params, batch))


@pytest.fixture(scope="module")
def graph(workload):
    return autoplan.trace(workload)


def test_pin_specs_checks_each_pin_on_the_mesh(graph):
    mesh = make_logical_mesh(CPU8, (2, 4))
    w = next(gi.tensor for gi in graph.inputs if gi.name == "params['w']")
    specs = pin_specs(graph, mesh, {W: P(None, "y")})
    assert list(specs) == [w] and specs[w].to_pspec() == P(None, "y")
    assert pin_specs(graph, mesh, {W: P(None, "y")}) is specs  # once per graph, mesh and pins
    assert pin_specs(graph, mesh, None) == {} and pin_specs(graph, mesh, {}) == {}
    with pytest.raises(SearchError, match=r"for input params\['w'\] \(16, 32\).*'z' is not a mesh axis"):
        pin_specs(graph, mesh, {W: P("z")})  # no axis z on the mesh
    with pytest.raises(SearchError, match="matches no graph input"):
        pin_specs(graph, mesh, {"nothing": P()})


def test_pins_by_name_anchors_tensor_ids(graph):
    w = next(gi.tensor for gi in graph.inputs if gi.name == "params['w']")
    assert pins_by_name(graph, {w: P(), "batch": P("x")}) == {
        "^" + re.escape("params['w']") + "$": P(), "batch": P("x")}
    assert pins_by_name(graph, None) is None


def test_baseline_pins_give_each_baselines_mesh(graph):
    shape, pins = baseline_pins(graph, CPU8, "baseline: data parallel")
    assert shape == (8, 1)
    assert {graph.input_of_tensor[t].kind: p for t, p in pins.items()} == {
        "parameter": P(), "batch": P("x")}
    assert baseline_pins(graph, CPU8, "baseline: ZeRO-3")[0] == (8, 1)
    assert baseline_pins(graph, CPU8, "baseline: Megatron TP") is None  # no Megatron layers
    one = autoplan.Cluster.parse("cpu:1")
    assert baseline_pins(graph, one, "baseline: ZeRO-2") is None
    assert len(INTRA_BASELINES) == 4
    with pytest.raises(SearchError, match="label should be one of"):
        baseline_pins(graph, CPU8, "baseline: something else")


def test_renamed_pin():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert renamed_pin("f", {"a": P()}, None) == {"a": P()}
    with pytest.warns(DeprecationWarning, match="f: pin= is deprecated.*use pins="):
        assert renamed_pin("f", None, {"a": P()}) == {"a": P()}
    with pytest.raises(SearchError, match="Got both"):
        renamed_pin("f", {"a": P()}, {"a": P()})


def test_the_public_functions_take_pins_and_warn_on_pin(workload, graph):
    pins = {W: P(None, "x")}
    kw = dict(pipeline=False, mesh_shape=(8, 1), baselines=False, cache=False, workers=1)
    new = autoplan.search(workload, CPU8, pins=pins, **kw)
    with pytest.warns(DeprecationWarning, match="search: pin= is deprecated") as seen:
        old = autoplan.search(workload, CPU8, pin=pins, **kw)
    assert seen[0].filename == __file__  # pointed at the caller
    assert old.best.describe() == new.best.describe()
    w = next(i for i in new.best.inputs if i.name == "params['w']")
    assert w.spec.to_pspec() == P(None, "x")
    with pytest.raises(SearchError, match="Got both"):
        autoplan.search(workload, CPU8, pins=pins, pin=pins, **kw)
    with pytest.warns(DeprecationWarning, match="intra_op_search: pin=") as seen:
        res = intra_op_search(graph, CPU8, (8, 1), pin=pins)
    assert seen[0].filename == __file__
    assert res.plan.describe() == intra_op_search(graph, CPU8, (8, 1), pins=pins).plan.describe()
    with pytest.warns(DeprecationWarning, match="level_search: pin="):
        level_search(graph, CPU8, (8, 1), pin=pins)
    with pytest.warns(DeprecationWarning, match="pipeline_search: pin="):
        pipeline_search(workload, CPU8, pin=pins, microbatches=1, workers=1)


def test_pins_are_resolved_in_one_module():
    root = pathlib.Path(autoplan.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"_resolve_pins|_pin_specs|_mesh_and_pins", text), path
        if path.name != "_pins.py":
            assert not re.search(r"^def (resolve_pins|pin_specs|pins_by_name|baseline_pins)\b",
                                 text, re.M), path


# ------------------------------------------------------------------------------------------
# every candidate holds the pins: checked after the search, a plan that breaks one left out
# ------------------------------------------------------------------------------------------

FC1 = r"\['layers'\]\[1\]\['mlp'\]\['fc1'\]\['kernel'\]"


def test_unheld_pins_names_a_changed_spec_and_a_zero_stage_sharding_a_pinned_input():
    from autoplan import models  # noqa: PLC0415
    from autoplan.search.intra._pins import unheld_pins  # noqa: PLC0415

    wl = models.get("gpt", "tiny")
    pins = {FC1: P(), r"^opt_state.*\['layers'\]\[0\]\['mlp'\]\['fc2'\]\['kernel'\]": P()}
    res = autoplan.search(wl, "cpu:8", pins=pins, cache=False, baselines=False)
    for plan in res.plans:
        assert unheld_pins(plan, res.graph, pins) == [], plan.summary()
    plan = res.plans[0]
    name = next(i.name for i in plan.inputs if re.search(FC1, i.name))
    inputs = tuple(i if i.name != name else dataclasses.replace(i, spec=(None, ("x",))) for i in plan.inputs)
    moved = plan.with_(inputs=inputs)
    (why,) = unheld_pins(moved, res.graph, pins)
    assert name in why and "pinned P()" in why
    # a pinned spec over an axis of size 1 splits nothing: held (every stage's mesh made (n, 1),
    # whatever the search chose, so that the case is always met)
    flat = tuple(dataclasses.replace(s, mesh_shape=(s.num_devices, 1)) for s in plan.stages)
    inner = {s.index: s.axis_names[1] for s in plan.stages}
    same = tuple(i if i.name != name else dataclasses.replace(i, spec=(None, (inner[i.stage],)))
                 for i in plan.inputs)
    assert unheld_pins(plan.with_(inputs=same, stages=flat), res.graph, pins) == []
    # ZeRO-1 over an axis the pinned (replicated) optimizer-state leaf leaves whole
    stage = plan.stages[0]
    axis = next(a for a, n in zip(stage.axis_names, stage.mesh_shape) if n > 1)
    zeroed = plan.with_(stages=(dataclasses.replace(stage, zero=1, zero_axes=(axis,)),) + plan.stages[1:])
    why = unheld_pins(zeroed, res.graph, pins)
    assert any("ZeRO-1" in w and "fc2" in w for w in why), why
    assert unheld_pins(zeroed, res.graph, None) == []


def test_a_candidate_that_breaks_a_pin_is_left_out_with_a_warning(monkeypatch):
    """The guard behind the search: with the pipeline search made to lend one layer's plan to
    a layer pinned otherwise (the fault its layer kinds fixed), every plan that breaks the pin
    is left out with a PinNotHeldWarning naming it, and what is returned holds it."""
    from autoplan import models  # noqa: PLC0415
    from autoplan.search._api import PinNotHeldWarning  # noqa: PLC0415
    from autoplan.search.intra._pins import unheld_pins  # noqa: PLC0415
    from autoplan.search.pipeline import _cost_table  # noqa: PLC0415

    monkeypatch.setattr(_cost_table._Table, "_kinds", lambda self: [
        ly.signature for ly in self.layers])
    pins = {FC1: P()}
    with pytest.warns(PinNotHeldWarning, match=r"left out: it does not hold the pins: .*fc1"):
        res = autoplan.search(models.get("gpt", "tiny"), "cpu:8", pins=pins, cache=False,
                              baselines=False)
    assert res.plans and all(unheld_pins(p, res.graph, pins) == [] for p in res.plans)
