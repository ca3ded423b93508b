"""Memory levers of the pipeline search: a ZeRO level per stage and rematerialised layers, chosen
under the memory limit; the plan file, summary, memory figure and code snippet show them."""

from __future__ import annotations

import dataclasses
import json
import re
import warnings

import jax
import jax.numpy as jnp
import pytest

import autoplan
from autoplan import models
from autoplan.algorithms import pipeline_search
from autoplan.search.pipeline import _levers as lv
from autoplan.search.pipeline import _pipeline as pp
from autoplan.search.pipeline._cost_table import _Terms
from autoplan.search.pipeline._simulate import _evaluate_kind

MICROBATCHES = 4


def quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


def search(budget=None, levers=True):
    wl = models.get("gpt", "tiny", layers=4, batch=32)
    return quiet(pipeline_search, wl, autoplan.Cluster.parse("cpu:8"), microbatches=MICROBATCHES,
                 memory_budget=budget, levers=levers)


@pytest.fixture(scope="module")
def unlimited():
    """GPT tiny (4 layers, batch 32) on cpu:8 without a memory budget: nothing needs a lever."""
    return search()


@pytest.fixture(scope="module")
def least(unlimited):
    """The least memory of the plans that need no lever."""
    return min(p.predicted.memory_per_device for p in unlimited.plans)


@pytest.fixture(scope="module")
def tight(least):
    """A budget at half of that: the stages need ZeRO and rematerialised layers."""
    return search(0.5 * least), 0.5 * least


# ------------------------------------------------------------------------------------------
# the search
# ------------------------------------------------------------------------------------------


def test_plans_that_fit_are_the_same_with_and_without_levers(unlimited):
    plain = search(levers=False)
    assert [p.to_dict() for p in unlimited.plans] == [p.to_dict() for p in plain.plans]
    assert not any(s.levers for p in unlimited.plans for s in p.stages)
    assert not any(n.startswith("memory levers") for p in unlimited.plans for n in p.notes)


@pytest.mark.parametrize("fraction", [0.7, 0.5, 0.35])
def test_levers_make_a_plan_fit_that_did_not(least, fraction):
    budget = fraction * least
    with pytest.raises(autoplan.InfeasiblePlanError):
        search(budget, levers=False)
    res = search(budget)
    best = res.plans[0]
    assert res.stats["fits"] and best.predicted.memory_per_device <= budget
    assert any(s.levers for s in best.stages)
    assert lv.EXEC_NOTE in best.notes
    for s in best.stages:
        assert s.memory <= budget * (1 + 1e-9)
        assert set(s.remat_layers) <= set(s.layers)
        assert (s.zero > 0) == bool(s.zero_axes) and set(s.zero_axes) <= set(s.axis_names)


def test_levers_lower_the_predicted_step_under_a_budget(least):
    """At 90% of the leanest lever-free plan's memory, the best plan without levers is slower
    than the pipeline the levers let fit."""
    budget = 0.9 * least
    plain, levered = search(budget, levers=False).plans[0], search(budget).plans[0]
    assert levered.predicted.step_time < plain.predicted.step_time
    assert levered.predicted.memory_per_device <= budget
    assert any(s.levers for s in levered.stages)


def test_a_tight_budget_rematerialises_and_shards(tight):
    res, budget = tight
    best = res.plans[0]
    assert any(s.remat_layers for s in best.stages) and any(s.zero for s in best.stages)
    assert best.predicted.memory_per_device <= budget


def test_levers_must_be_a_bool():
    with pytest.raises(autoplan.SearchError, match="levers should be True or False"):
        search(levers="yes")


def test_zero_never_shards_an_input_the_user_pinned():
    """A pinned input keeps its pinned spec at rest: with every parameter and optimizer-state
    leaf pinned replicated, a budget the search meets with ZeRO unpinned is met by
    rematerialisation alone (ZeRO-1 would shard the optimizer state); with the parameters
    alone pinned, ZeRO-1 and -2 (the optimizer state, the gradient buffers) stay allowed and
    ZeRO-3 (the parameters) does not."""
    wl = models.get("gpt", "tiny", layers=4, batch=32)
    cluster = autoplan.Cluster.parse("cpu:8")

    def pinned(pins, fraction):
        free = quiet(pipeline_search, wl, cluster, microbatches=MICROBATCHES, pins=pins)
        budget = fraction * min(p.predicted.memory_per_device for p in free.plans)
        got = quiet(pipeline_search, wl, cluster, microbatches=MICROBATCHES, pins=pins,
                    memory_budget=budget)
        assert got.stats["fits"] and any(s.levers for p in got.plans for s in p.stages)
        return got, budget

    both = {r"^params": jax.sharding.PartitionSpec(), r"^opt_state": jax.sharding.PartitionSpec()}
    got, budget = pinned(both, 0.9)
    assert any(s.zero for p in search(budget).plans for s in p.stages)  # unpinned: ZeRO helps
    for p in got.plans:
        assert all(s.zero == 0 and not s.zero_axes for s in p.stages), p.summary()
        assert all(all(e is None for e in i.spec) for i in p.inputs
                   if i.kind in ("parameter", "optimizer_state"))
    got, _ = pinned({r"^params": jax.sharding.PartitionSpec()}, 0.6)
    assert all(s.zero <= 2 for p in got.plans for s in p.stages)
    assert any(s.zero for p in got.plans for s in p.stages)


def test_choose_keeps_zero_under_the_layers_pinned_level():
    terms = _Terms(1.0, 2.0, 0.5, 100.0, 10.0)
    free = layer(1.0, 10.0, zero=(0.0, 30.0, 40.0, 60.0), time=0.01)
    capped = dataclasses.replace(free, max_zero=2)
    (z, _, _), = lv.choose([([terms], [[free]], [[0]], 1.0)], 60.0, 4)
    assert z == 3
    # (110 bytes against 60: only ZeRO-3's 60 bytes fit it; remat saves 1)
    assert lv.choose([([terms], [[capped]], [[0]], 1.0)], 60.0, 4) is None
    (z, _, _), = lv.choose([([terms], [[capped]], [[0]], 1.0)], 75.0, 4)
    assert z == 2


# ------------------------------------------------------------------------------------------
# the choice, by hand
# ------------------------------------------------------------------------------------------


def layer(saving, recompute, zero=(0.0, 0.0, 0.0, 0.0), time=0.0):
    return lv.LayerLevers(recompute, recompute, saving, zero, 0.0,
                          ((0.0, 0.0, 0.0),) + ((0.0, 0.0, time),) * 3,
                          (({}, {}),) * 4, ("x",) if any(zero) else ())


def test_greedy_remat_takes_most_bytes_per_second_first():
    terms = _Terms(1.0, 2.0, 0.5, 100.0, 90.0)
    levs = [layer(30.0, 3.0), layer(30.0, 1.0), layer(10.0, 0.1)]  # 10, 30 and 100 bytes/s
    # 100 + 2 x 90 = 280; budget 230: drop 25+ per micro-batch in flight
    (z, remat, ts), = lv.choose([([terms], [levs], [[7, 8, 9]], 2.0)], 230.0, 4)
    assert z == 0 and remat == ((8, 9),)  # layer 9 (10 bytes) is not enough alone, then 8
    t = ts[0]
    assert t.backward == pytest.approx(2.0 + 1.0 + 0.1)
    assert t.activation == pytest.approx(50.0) and t.resident == pytest.approx(130.0)  # + peak 30
    assert t.resident + 2 * t.activation <= 230.0


def test_zero_is_chosen_when_it_is_cheaper_than_recomputing():
    terms = _Terms(1.0, 2.0, 0.5, 100.0, 10.0)
    levs = [layer(10.0, 5.0, zero=(0.0, 40.0, 50.0, 60.0), time=0.01)]
    (z, remat, ts), = lv.choose([([terms], [levs], [[0]], 1.0)], 75.0, 4)
    assert z == 1 and remat == ((),) and ts[0].resident == pytest.approx(60.0)
    assert lv.choose([([terms], [levs], [[0]], 1.0)], 20.0, 4) is None  # nothing fits


def test_zero_3_holds_the_largest_layers_gathered_parameters():
    """ZeRO-3 shards the parameters, and while a layer runs its parameters are gathered whole:
    the stage's resident memory keeps the largest such buffer of its layers."""
    terms = _Terms(1.0, 2.0, 0.5, 100.0, 10.0)
    levs = [dataclasses.replace(layer(0.0, 5.0, zero=(0.0, 20.0, 30.0, 40.0), time=0.01),
                                zero_buffer=b) for b in (6.0, 9.0)]
    assert lv._apply(terms, levs, 2, ()).resident == pytest.approx(100.0 - 60.0)
    assert lv._apply(terms, levs, 3, ()).resident == pytest.approx(100.0 - 80.0 + 9.0)
    # ZeRO-2 leaves 40 + 10, ZeRO-3 29 + 10: a budget of 45 needs ZeRO-3, and 35 fits nothing
    (z, remat, ts), = lv.choose([([terms], [levs], [[0, 1]], 1.0)], 45.0, 4)
    assert z == 3 and remat == ((),) and ts[0].resident == pytest.approx(29.0)
    assert lv.choose([([terms], [levs], [[0, 1]], 1.0)], 35.0, 4) is None


# ------------------------------------------------------------------------------------------
# the plan file, the summary, the memory figure and the code snippet
# ------------------------------------------------------------------------------------------


def test_plan_file_round_trip_and_validation(tight, unlimited):
    best = tight[0].plans[0]
    back = autoplan.Plan.from_json(best.to_json())
    assert back == best
    assert [(s.zero, s.zero_axes, s.remat_layers) for s in back.stages] == [
        (s.zero, s.zero_axes, s.remat_layers) for s in best.stages]
    # a plan without levers writes no lever field (files stay as before)
    assert not any(k in st for k in ("zero", "zero_axes", "remat_layers")
                   for st in unlimited.plans[0].to_dict()["stages"])
    d = json.loads(best.to_json())
    s = next(i for i, st in enumerate(d["stages"]) if st.get("remat_layers"))
    z = next(i for i, st in enumerate(d["stages"]) if st.get("zero"))
    for path, value, field in ((("stages", z, "zero"), 4, f"stages[{z}].zero"),
                               (("stages", z, "zero_axes"), ["nope"], f"stages[{z}].zero_axes[0]"),
                               (("stages", z, "zero_axes"), [], f"stages[{z}].zero_axes"),
                               (("stages", s, "remat_layers"), ["nope"],
                                f"stages[{s}].remat_layers[0]")):
        bad = json.loads(best.to_json())
        bad[path[0]][path[1]][path[2]] = value
        with pytest.raises(autoplan.PlanFileError) as err:
            autoplan.Plan.from_dict(bad)
        assert err.value.field == field


def test_summary_shows_each_stages_levers(tight):
    best = tight[0].plans[0]
    text = best.summary()
    said = dict(re.findall(r"^  stage (\d+) levers : (.*)$", text, flags=re.M))
    assert set(said) == {str(s.index) for s in best.stages if s.levers}
    for s in best.stages:
        if not s.levers:
            continue
        line = said[str(s.index)]
        m = re.search(r"ZeRO-(\d) \((.*) sharded over (.*?)\)", line)
        assert (int(m.group(1)), tuple(m.group(3).split(", "))) == (s.zero, s.zero_axes) if s.zero \
            else m is None
        r = re.search(r"remat (.*)$", line)
        assert (tuple(r.group(1).split(", ")) if r else ()) == s.remat_layers
    assert "the stage executor (exec.run, launch) applies them" in text


def test_memory_figure_shows_the_levers(tight):
    from autoplan.viz import memory_figure
    from autoplan.viz._timeline import memory_breakdown

    best = tight[0].plans[0]
    fig = memory_figure(best)
    shown = {a.name: a.text for a in fig.layout.annotations if (a.name or "").startswith("levers")}
    for s in best.stages:
        text = shown.get(f"levers of stage {s.index}", "")
        zero = re.search(r"ZeRO-(\d)", text)
        remat = re.search(r"remat (\d+) layer", text)
        assert (int(zero.group(1)) if zero else 0) == s.zero
        assert (int(remat.group(1)) if remat else 0) == len(s.remat_layers)
    assert "with the stages' memory levers" in fig.layout.title.text
    # the stage figure's devices name their stage's levers on hover
    from autoplan.plans._plan_text import stage_levers
    from autoplan.viz import stage_figure

    hovers = [t for row in stage_figure(best).data[0].hovertext for t in row]
    for s in best.stages:
        mine = [t for t in hovers if f"stage {s.index}:" in t]
        assert mine and all((f"memory levers: {stage_levers(s)}" in t) == s.levers
                            for t in mine)
    # ZeRO's optimizer-state sharding is in the breakdown: less than the specs alone hold
    rows = memory_breakdown(best)
    plain = memory_breakdown(best.with_(stages=tuple(
        s.__class__(**{**{f: getattr(s, f) for f in s.__dataclass_fields__}, "zero": 0,
                       "zero_axes": ()}) for s in best.stages)))
    for s, r, q in zip(best.stages, rows, plain):
        if s.zero:
            assert r["optimizer_state"] < q["optimizer_state"]
        assert r["total"] == pytest.approx(q["total"])


def test_to_code_names_the_remat_layers_and_zero_levels(tight):
    best = tight[0].plans[0]
    ns: dict = {}
    exec(best.to_code(), ns)
    assert ns["REMAT_LAYERS"] == {n for s in best.stages for n in s.remat_layers}
    assert ns["ZERO"] == {s.index: (s.zero, tuple(s.zero_axes)) for s in best.stages if s.zero}
    name = next(iter(ns["REMAT_LAYERS"]))

    def block(w, x):
        return jnp.tanh(x @ w)

    w, x = jnp.ones((4, 4)) * 0.1, jnp.ones((2, 4))
    wrapped = ns["remat"](name, block)
    assert wrapped is not block and ns["remat"]("not a layer", block) is block
    g1 = jax.grad(lambda w: wrapped(w, x).sum())(w)
    g2 = jax.grad(lambda w: block(w, x).sum())(w)
    assert jnp.allclose(g1, g2)
    assert "nothing_saveable" in str(jax.make_jaxpr(jax.grad(lambda w: wrapped(w, x).sum()))(w))


def test_a_plan_with_levers_runs_equal_to_one_device(tight):
    """The executor applies the levers (tests/exec/test_levers_applied.py says how), and the
    numbers are those of one device."""
    from autoplan.exec import run

    best = tight[0].plans[0]
    wl = models.get("gpt", "tiny", layers=4, batch=32, abstract=False)
    rep = quiet(run, best, wl, steps=1,
                compiler_options={"xla_backend_optimization_level": 0,
                                  "xla_cpu_use_fusion_emitters": False})
    assert rep.equivalence.matched
    assert set(rep.pipeline["levers"]) == {s.index for s in best.stages if s.levers}


# ------------------------------------------------------------------------------------------
# the schedules' in-flight counts
# ------------------------------------------------------------------------------------------


def test_zb_h1_and_gpipe_plans_fit_with_levers(least):
    for schedule in ("zb-h1", "gpipe"):
        wl = models.get("gpt", "tiny", layers=4, batch=32)
        best = quiet(pipeline_search, wl, autoplan.Cluster.parse("cpu:8"),
                     microbatches=MICROBATCHES, schedule=schedule,
                     memory_budget=0.4 * least).plans[0]
        assert best.schedule.kind == schedule and any(s.levers for s in best.stages)
        assert all(s.memory <= 0.4 * least * (1 + 1e-9) for s in best.stages)


def test_interleaved_meshes_share_one_zero_level_and_fit():
    """Interleaved 1F1B: the levers are chosen per mesh (its chunks), and the mesh's simulated
    memory then fits."""
    wl = models.get("gpt", "tiny", layers=4, batch=32)
    cluster = autoplan.Cluster.parse("cpu:8")
    full, graph = pp._traces(wl, MICROBATCHES)
    layers = pp.group_layers(graph)
    ctx = pp._Context(cluster, full, pp.submesh_shapes(1, 8), "interleaved",
                      cluster.device_memory, 60.0, False)
    table = pp._Table(ctx, graph, layers, MICROBATCHES)
    k = ctx.submeshes.index((1, 4))
    c = ctx.configs[k].index(((4, 1), False))
    half = table.L // 2
    layout = ((tuple(range(half)), k, c), (tuple(range(half, table.L)), k, c))
    free = quiet(_evaluate_kind, table, layout, "interleaved", 2)
    assert free.fits and free.levers is None
    ctx.budget = 0.6 * max(free.memory)
    got = quiet(_evaluate_kind, table, layout, "interleaved", 2)
    assert got.fits and got.levers is not None and max(got.memory) <= ctx.budget
    P = len(layout)
    for s, lev in enumerate(got.levers):
        assert lev.zero == got.levers[s % P].zero
    assert any(got.levers)
    ctx.levers = False
    assert not quiet(_evaluate_kind, table, layout, "interleaved", 2).fits


def test_zero_collectives_by_kind_add_up_to_their_times():
    """Each ZeRO level's collectives split by kind (what plans add to comm_time_by_kind) sum to
    the seconds the level adds to the forward, backward and per-step times."""
    wl = models.get("gpt", "tiny", layers=4, batch=32)
    cluster = autoplan.Cluster.parse("cpu:8")
    full, graph = pp._traces(wl, MICROBATCHES)
    layers = pp.group_layers(graph)
    ctx = pp._Context(cluster, full, pp.submesh_shapes(1, 8), "1f1b", cluster.device_memory,
                      60.0, False)
    table = pp._Table(ctx, graph, layers, MICROBATCHES)
    k = ctx.submeshes.index((1, 8))
    checked = 0
    for c in range(len(ctx.configs[k])):
        for li in range(table.L):
            x = lv.layer_levers(table, li, k, c)
            if x is None or not x.axes:
                continue
            for z in lv.ZERO_LEVELS:
                per_mb, per_step = x.zero_kind_time[z]
                fwd, bwd, step = x.zero_time[z]
                assert sum(per_mb.values()) == pytest.approx(fwd + bwd, abs=1e-15)
                assert sum(per_step.values()) == pytest.approx(step, abs=1e-15)
                assert set(per_mb) | set(per_step) <= set(x.zero_bytes[z][0]) | set(
                    x.zero_bytes[z][1]) | {"all-reduce"}
            checked += 1
    assert checked


def test_search_and_the_command_line_can_turn_the_levers_off(least):
    wl = models.get("gpt", "tiny", layers=4, batch=32)
    kw = dict(pipeline=True, baselines=False, cache=False, workers=1, microbatches=MICROBATCHES,
              memory_budget=0.7 * least)
    best = quiet(autoplan.search, wl, "cpu:8", **kw).best
    assert any(s.levers for s in best.stages)
    with pytest.raises(autoplan.InfeasiblePlanError):
        quiet(autoplan.search, wl, "cpu:8", memory_levers=False, **kw)
    with pytest.raises(autoplan.SearchError, match="memory_levers should be True or False"):
        autoplan.search(wl, "cpu:8", memory_levers=1)
    with pytest.raises(autoplan.SearchError, match="memory_levers=False sets pipeline plans"):
        autoplan.search(wl, "cpu:8", pipeline=False, memory_levers=False)


def test_the_dag_stage_ilps_groups_fit_with_levers():
    """U-Net (skip connections): TePDist's stage groups get the levers too."""
    wl = models.get("unet", "tiny", batch=64)
    cluster = autoplan.Cluster.preset("p3.16xlarge", devices_per_node=4)
    free = quiet(pipeline_search, wl, cluster, microbatches=2, levers=False)
    assert free.stats["stage_algorithm"] == "ilp"
    budget = 0.5 * min(p.predicted.memory_per_device for p in free.plans)
    with pytest.raises(autoplan.InfeasiblePlanError):
        quiet(pipeline_search, wl, cluster, microbatches=2, levers=False, memory_budget=budget)
    best = quiet(pipeline_search, wl, cluster, microbatches=2, memory_budget=budget).plans[0]
    assert best.predicted.memory_per_device <= budget and any(s.levers for s in best.stages)


def test_lever_inputs_travel_as_their_recipe_and_make_the_same_arrays(least, monkeypatch):
    """A lever run's stage-DP inputs are made where they are first read: pickled for a worker,
    they carry the terms the base arrays and the deltas are made from, not those arrays nor the
    ones made from them (under half their bytes), and a copy makes arrays equal to the
    original's entry by entry (infinities where no lever is needed)."""
    import pickle

    import numpy as np

    made = []
    real = lv.lever_run

    def recording(*args, **kw):
        out = real(*args, **kw)
        if out is not None:
            made.append(out)
        return out

    monkeypatch.setattr(lv, "lever_run", recording)
    search(0.5 * least)
    assert made
    for inputs in made:
        blob = pickle.dumps(inputs)
        arrays = {name: np.array(inputs[name]) for name in ("t", "step", "pmem", "amem")}
        assert len(pickle.dumps(inputs)) == len(blob)  # (what was made stays behind)
        assert len(blob) < 0.5 * sum(a.nbytes for a in arrays.values())
        copy = pickle.loads(blob)
        assert copy._made is None and sorted(copy) == sorted(arrays)
        assert copy.base._made is None and copy.base.terms._made is None
        assert copy.deltas._made is None
        C = inputs.base["t"].shape[3]
        for name, arr in arrays.items():
            np.testing.assert_array_equal(copy[name], arr)
            np.testing.assert_array_equal(arr[..., :C], inputs.base[name])
        assert np.isfinite(arrays["t"][..., C:]).any() and not np.isfinite(arrays["t"]).all()


def test_stage_dp_arrays_and_lever_deltas_hold_each_layers_own_costs():
    """The stage DP's arrays over ranges of layers and the lever variants' changes are made
    once per layer kind and spread over the layers: every range holds the sum of its own
    layers' terms and levers (and the resharding between them), at the default micro-batch
    size and re-timed for another, for each kind (the embedding, the blocks, the head)."""
    import numpy as np

    from autoplan.search.pipeline._layouts import _chain_terms

    wl = models.get("gpt", "tiny", layers=4, batch=32)
    cluster = autoplan.Cluster.parse("cpu:8")
    full, graph = pp._traces(wl, MICROBATCHES)
    ctx = pp._Context(cluster, full, pp.submesh_shapes(1, 8), "1f1b", cluster.device_memory,
                      60.0, False)
    table = pp._Table(ctx, graph, pp.group_layers(graph), MICROBATCHES)
    reps, index = table.kind_index()
    assert len(reps) >= 3 and [table.kind[li] for li in reps] == list(dict.fromkeys(table.kind))
    L = table.L
    fwd, bwd = table.boundary_bytes(list(range(L)), L)
    checked = 0
    for ratio, B in ((1.0, MICROBATCHES), (0.5, 2 * MICROBATCHES)):
        t, step, pmem, amem = quiet(_chain_terms, table, ratio, B).made().values()
        deltas = quiet(lv._delta_terms, table, [], ratio, B, True).made()
        for k, c in ctx.cells():
            for a in range(L):
                for b in range(a, L):
                    st = quiet(table.stage, range(a, b + 1), k, c, ratio, B)
                    if st is None:
                        assert not np.isfinite(t[a, b, k, c])
                        continue
                    recv = (ctx.recv_estimate(fwd[a - 1] * ratio, k) if a else 0.0) + (
                        ctx.recv_estimate(bwd[b] * ratio, k) if b < L - 1 else 0.0)
                    assert t[a, b, k, c] == pytest.approx(st.forward + st.backward + recv,
                                                          rel=1e-12)
                    assert step[a, b, k, c] == pytest.approx(st.step, rel=1e-12)
                    assert pmem[a, b, k, c] == pytest.approx(st.resident, rel=1e-12)
                    assert amem[a, b, k, c] == pytest.approx(st.activation, rel=1e-12)
                    checked += 1
                x = quiet(lv.layer_levers, table, a, k, c, ratio, B)
                if x is None:
                    continue
                for v, (z, remat) in enumerate(lv.DP_VARIANTS):
                    if z > x.max_zero:
                        continue
                    f, bw, s = x.zero_time[z]
                    assert deltas[v, 0, a, a, k, c] == pytest.approx(
                        f + bw + (x.recompute if remat else 0.0), rel=1e-12)
                    assert deltas[v, 1, a, a, k, c] == pytest.approx(s, rel=1e-12, abs=1e-18)
                    assert deltas[v, 3, a, a, k, c] == -(x.remat_saving if remat else 0.0)
    assert checked
