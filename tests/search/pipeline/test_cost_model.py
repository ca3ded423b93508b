"""The pipeline cost model: per-micro-batch and per-step work, resharding inside a stage, Alpa's
Eq. 5 memory, ranking by simulation, searched micro-batches, side tensors, the DAG stage ILP
under a memory limit, operator labels, and workloads without a zoo config."""

from __future__ import annotations

import math
import re
import warnings
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import autoplan
from autoplan import models
from autoplan.algorithms import pipeline_search
from autoplan.search.intra._ilp_problem import build_problem
from autoplan.search.intra._reshard import reshard
from autoplan.search.pipeline import _pipeline as pp
from autoplan.search.pipeline._layouts import _chain_inputs
from autoplan.tracing._trace import forget_shared_traces

# every parameter and optimizer-state leaf replicated: the stages are data parallel
REPLICATED = {r"^params": P(), r"^opt_state": P()}


def quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


def four_gpus() -> autoplan.Cluster:
    return autoplan.Cluster.preset("p3.16xlarge", devices_per_node=4)


def cpu4() -> autoplan.Cluster:
    return autoplan.Cluster.preset("cpu", devices_per_node=4)


@pytest.fixture(scope="module")
def gpt_tiny():
    """GPT tiny (4 layers, batch 32) on cpu:8 at 4 micro-batches: its search and layer costs."""
    wl = models.get("gpt", "tiny", layers=4, batch=32)
    cluster = autoplan.Cluster.parse("cpu:8")
    return wl, cluster, quiet(pipeline_search, wl, cluster, microbatches=4), table_for(wl, cluster, 4)


def table_for(wl, cluster, B, pins=None, schedule="1f1b"):
    """The pipeline search's layer costs of ``wl`` at ``B`` micro-batches (its internals)."""
    full, graph = pp._traces(wl, B)
    layers = pp.group_layers(graph)
    ctx = pp._Context(cluster, full, pp.submesh_shapes(cluster.nodes, cluster.devices_per_node),
                      schedule, cluster.device_memory, 60.0, False, pins)
    return pp._Table(ctx, graph, layers, B)


def cell(table, submesh, shape, lean=False):
    k = table.ctx.submeshes.index(submesh)
    return k, table.ctx.configs[k].index((tuple(shape), lean))


# ------------------------------------------------------------------------------------------
# one layer's plan split by how often it runs
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt", "mlp", "wide_resnet"])
def test_layer_split_adds_up_to_the_plans_step(name):
    """Forward + backward + per-step work is the layer plan's one-micro-batch step time, and every
    collective of the ILP solution is in exactly one of them."""
    table = table_for(models.get(name, "tiny"), cpu4(), 2)
    checked = 0
    for li in table.rep.values():
        for k, c in table.ctx.cells():
            res, lc = quiet(table.result, li, k, c), table.cost(li, k, c)
            sol = res.solution
            # (a tensor resharded to one spec for two readers is charged once; the executable's
            # launch is charged per task by the simulation)
            launch = table.ctx.cluster.step_overhead(len(table.sub(li).inputs))
            assert lc.forward + lc.backward + lc.step + launch == pytest.approx(
                res.plan.predicted.step_time, rel=1e-9, abs=1e-15)
            comms = [*lc.forward_comms, *lc.backward_comms, *lc.step_comms]
            assert sum(x.time for x in comms) + lc.repeated_gathers == pytest.approx(
                sol.comm_time, rel=1e-9, abs=1e-15)
            # what the ILP tags as gradient synchronisation runs once per step
            tagged = sum(x.bytes for _, x in sol.comms if x.where == "grad-sync")
            assert sum(x.bytes for x in lc.step_comms if x.where == "grad-sync") >= tagged
            checked += 1
    assert checked >= 10


def test_per_step_terms_are_weighted_in_the_layer_ilp():
    """per_step_weighted lowers each strategy's cost by (1 - w) x its gradient-synchronisation
    and update part: the plan's per-step work, as :class:`LayerCost` splits it."""
    table = table_for(models.get("gpt", "tiny", batch=32), autoplan.Cluster.parse("cpu:8"), 4)
    li = table.rep[table.layers[1].signature]
    k, c = cell(table, (1, 8), (8, 1))
    res = quiet(table.result, li, k, c)
    base = build_problem(table.sub(li), table.ctx.mesh(k, (8, 1)), count_unmerged=False)
    prob = pp.per_step_weighted(base, 1 / 4)  # as the layer ILP is weighted (B = 4)
    assert res.solution.problem is None  # (a layer plan does not carry its problem)
    vec = [res.solution.choice[n.key] for n in base.nodes]
    drop = sum(b.cost[v] - w.cost[v] for b, w, v in zip(base.nodes, prob.nodes, vec))
    lc = table.cost(li, k, c)
    update_reshard = sum(x.time for x in lc.step_comms if x.where == "reshard")
    # (the combined collectives' latency is added after the solve, not weighted in it)
    assert drop == pytest.approx(
        (1 - 1 / 4) * (lc.step - update_reshard - lc.combined_latency), rel=1e-9)
    assert lc.grad_sync > 0 and drop > 0
    assert pp.per_step_weighted(base, 1.0) is base


# ------------------------------------------------------------------------------------------
# per-step work once per step (the requirement's 2-stage GPT)
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt_dp_stages():
    """A small GPT on 4 GPUs, 2 stages of 2 data-parallel GPUs each, at 4 and 16 micro-batches."""
    wl = models.get("gpt", "tiny", layers=4, batch=64, seq_len=64, hidden=256)
    out = {}
    for B in (4, 16):
        res = quiet(pipeline_search, wl, four_gpus(), microbatches=B, pins=REPLICATED)
        out[B] = next(p for p in res.plans if len(p.stages) == 2)
    return wl, out


def test_gradient_sync_is_charged_once_per_step(gpt_dp_stages):
    """Each stage's predicted all-reduce bytes per device per step are its parameters' gradients
    (all-reduced over the stage's data-parallel devices) plus, on the stage computing the loss,
    the loss's 4-byte mean once per micro-batch, at 4 and at 16 micro-batches alike."""
    wl, plans = gpt_dp_stages
    for B, plan in plans.items():
        assert plan.schedule.microbatches == B
        for s in plan.stages:
            assert s.submesh_shape == (1, 2) and s.mesh_shape == (2, 1)
            held = [i for i in plan.inputs if i.stage == s.index and i.kind == "parameter"]
            grads = sum(math.prod(i.shape) * 4 for i in held)
            embed = sum(math.prod(i.shape) * 4 for i in held if "embed" in i.path)
            loss = 4 * B if "head" in s.layers else 0
            if s.comm_bytes.get("all-gather"):
                # the embedding's memory-lean plan gathers the activations' gradient (once per
                # micro-batch) and computes the tables' gradients whole: nothing to all-reduce
                assert s.comm_bytes["all-gather"] == pytest.approx(64 * 64 * 256 * 4)  # gathered size
                grads -= embed
            assert s.comm_bytes["all-reduce"] == pytest.approx(grads + loss)
        assert plan.predicted.comm_bytes["all-reduce"] == max(
            s.comm_bytes["all-reduce"] for s in plan.stages)
    # the per-step bytes do not grow with the micro-batches (they did 4x before)
    a, b = (plans[B].stages[-1].comm_bytes["all-reduce"] - 4 * B for B in (4, 16))
    assert a == b


def test_searched_plans_pay_gradient_sync_once():
    """A default search on GPT-2.6B (remat, fp16) on one p3.16xlarge: the all-reduce bytes per
    device per step of every pipeline candidate stay below the model's fp16 gradients (5.2 GB),
    where one sync per micro-batch predicted 731 GiB."""
    wl = models.get("gpt", size="2.6B", remat=True, dtype="float16", layers=4)
    res = quiet(pipeline_search, wl, autoplan.Cluster.preset("p3.16xlarge"))
    grads = 2 * wl.num_params
    for p in res.plans:
        if p.is_pipeline:
            assert p.predicted.comm_bytes.get("all-reduce", 0.0) < grads


# ------------------------------------------------------------------------------------------
# resharding between two layers of one stage
# ------------------------------------------------------------------------------------------


def test_resharding_between_differently_solved_layers_is_charged():
    table = table_for(models.get("mlp", "tiny"), autoplan.Cluster.parse("cpu:8"), 2)
    found = None
    for (a, b), entries in table.passing().items():
        for k, c in table.ctx.cells():
            if a < b and any(quiet(table.pair, a, b, k, c)):
                found = (a, b, k, c, entries)
                break
        if found:
            break
    assert found, "some adjacent layers are solved with different boundary specs"
    a, b, k, c, _ = found
    mesh = table.ctx.mesh(k, table.ctx.configs[k][c][0])
    by_hand = {"forward": 0.0, "backward": 0.0}
    # activations a passes to b, and gradients b passes back to a: from the producer's spec to
    # the spec the consumer's plan assumed for its input
    for src, dst in ((a, b), (b, a)):
        ss, sd = table.result(src, k, c).solution.specs, table.result(dst, k, c).solution.specs
        ls, ld = table.local(src), table.local(dst)
        for t, role in table.passing().get((src, dst), []):
            ten = table.graph.tensors[t]
            if ss[ls[t]] != sd[ld[t]]:
                by_hand[role] += reshard(ss[ls[t]], sd[ld[t]], ten.shape, ten.dtype, mesh)[0]
    assert by_hand["forward"] + by_hand["backward"] > 0
    ta, tb = table.terms(a, k, c), table.terms(b, k, c)
    both = table.stage(range(a, b + 1), k, c)
    assert both.forward == pytest.approx(ta.forward + tb.forward + by_hand["forward"])
    assert both.backward == pytest.approx(ta.backward + tb.backward + by_hand["backward"])
    # and the stage DP's cost of that stage holds it (plus receiving its input and gradients)
    t = _chain_inputs(table)["t"]
    fwd, bwd = table.boundary_bytes(list(range(table.L)), table.L)
    recv = (table.ctx.recv_estimate(fwd[a - 1], k) if a else 0.0) + (
        table.ctx.recv_estimate(bwd[b], k) if b < table.L - 1 else 0.0)
    assert t[a, b, k, c] == pytest.approx(both.forward + both.backward + recv)


# ------------------------------------------------------------------------------------------
# memory: Alpa's Eq. 5
# ------------------------------------------------------------------------------------------


def test_stage_memory_is_alpas_eq5_by_hand():
    """GPT (remat, fp32) on 4 GPUs, three stages, the middle one two blocks on two data-parallel
    GPUs: parameters, gradients and Adam's two moments once (16 bytes per parameter), plus one
    micro-batch's output gradient and the update's two bias-correction scalars per block, plus
    each in-flight micro-batch's block inputs (remat keeps only those), 2 in flight (1F1B, 3
    stages, the second)."""
    h, s, mb, B = 256, 64, 16, 4
    wl = models.get("gpt", "tiny", layers=4, batch=mb * B, seq_len=s, hidden=h, remat=True)
    table = table_for(wl, four_gpus(), B, REPLICATED)
    k2, c2 = cell(table, (1, 2), (2, 1))
    k1, c1 = cell(table, (1, 1), (1, 1))
    layout = (((0, 1), k1, c1), ((2, 3), k2, c2), ((4, 5), k1, c1))
    ev = quiet(pp._evaluate, table, layout)
    block = 12 * h * h + 13 * h
    x = mb // 2 * s * h * 4  # a block's input per device: its micro-batch split over 2
    resident = 2 * (16 * block + x + 8)
    assert ev.stages[1].resident == pytest.approx(resident)
    assert ev.stages[1].activation == pytest.approx(2 * x)
    assert ev.memory[1] == pytest.approx(resident + 2 * 2 * x)
    gpipe = quiet(pp._evaluate, table_for(wl, four_gpus(), B, REPLICATED, "gpipe"), layout)
    assert gpipe.memory[1] == pytest.approx(resident + B * 2 * x)  # GPipe: all B in flight


# ------------------------------------------------------------------------------------------
# the stage DP, the simulation and the ranking
# ------------------------------------------------------------------------------------------


def test_ranking_is_by_the_simulated_step(gpt_tiny):
    """Every candidate layout of the DP is simulated; the search returns the simulated best,
    whose predicted step is its simulation; the one-stage layout's DP latency is its simulated
    step exactly."""
    wl, cluster, res, table = gpt_tiny
    found, fits, _, _ = quiet(pp._layouts, table, None, False)
    evals = [quiet(pp._evaluate, table, lay, dp_latency=v) for lay, v in found.items()]
    best = min(evals, key=lambda e: e.key)
    assert res.plans[0].predicted.step_time == pytest.approx(best.step, rel=1e-12)
    assert res.stats["dp_latency"] == pytest.approx(best.dp_latency, rel=1e-12)
    one = [e for e in evals if len(e.layout) == 1]
    assert one and all(e.dp_latency == pytest.approx(e.step, rel=1e-12) for e in one)
    for p in res.plans:
        assert max(e[1] for e in p.schedule.events) == pytest.approx(p.predicted.step_time)


def test_microbatch_count_is_searched_and_never_worse_than_the_default():
    wl = models.get("gpt", "tiny", layers=4, batch=64)
    cluster = cpu4()
    auto = quiet(pipeline_search, wl, cluster)
    B0 = auto.stats["microbatches_default"]
    fixed = quiet(pipeline_search, wl, cluster, microbatches=B0)
    assert len(auto.stats["microbatch_candidates"]) >= 3
    assert set(auto.stats["microbatch_candidates"]) <= {1, 2, 4, 8, 16, 32, 64}
    assert auto.stats["microbatches_exact"][0] == B0
    assert auto.plans[0].predicted.step_time <= fixed.plans[0].predicted.step_time * (1 + 1e-12)
    assert auto.plans[0].schedule.microbatches == auto.stats["microbatches"]
    with pytest.raises(autoplan.SearchError, match="divide the batch"):
        pipeline_search(wl, cluster, microbatches=3)
    with pytest.raises(autoplan.SearchError, match="microbatches"):
        pipeline_search(wl, cluster, microbatches="many")


def test_one_stage_accumulation_is_kept_and_ranked(gpt_tiny):
    """With multi-stage layouts that fit, the one-stage layout (gradient accumulation) is still
    a candidate, ranked with the others by the search."""
    wl, cluster, res, _ = gpt_tiny
    assert res.plans[0].is_pipeline and res.stats["fits"]
    one = [p for p in res.plans if not p.is_pipeline]
    assert one and one[0].schedule.microbatches == 4 and "accumulated" in one[0].describe()
    times = [p.predicted.step_time for p in res.plans]
    assert times == sorted(times)


# ------------------------------------------------------------------------------------------
# layer graphs: side tensors, DAGs
# ------------------------------------------------------------------------------------------


def test_a_scalar_passed_along_keeps_the_stage_dp():
    """MoE's auxiliary loss, a scalar carried from MoE layer to MoE layer and on to the head, does
    not make the layer graph a DAG: the stage DP runs and the best plan fits."""
    wl = models.get("moe", "tiny", layers=4)
    g = autoplan.trace(wl)
    dag = pp.layer_dag(g, pp.group_layers(g))
    side = [(a, b) for a, b, d in dag.edges(data=True) if d["side"]]
    assert side and all(dag.edges[e]["bytes"] <= 16 for e in side)
    assert pp._is_chain(dag)
    res = quiet(pipeline_search, wl, cpu4(), microbatches=2)
    assert res.stats["stage_algorithm"] == "dp"
    assert res.stats["fits"] and res.plans[0].predicted.memory_per_device <= 2 * 2**30


def _moe_family_table():
    """MoE tiny's layer costs on four devices: its first MoE layer starts the auxiliary loss from
    a literal ``0.0``, the second adds to the sum it is passed; one loose signature (traced
    afresh: no layer plan kept from another test)."""
    forget_shared_traces()
    table = table_for(models.get("moe", "tiny", layers=4), cpu4(), 2)
    names = [ly.name for ly in table.layers]
    first, second = names.index("layers_1"), names.index("layers_3")
    assert table.kind[first] != table.kind[second]
    return table, first, second


def test_layer_kinds_of_one_loose_signature_share_their_plans():
    """A layer kind that differs from another only where it reads a literal takes that kind's
    plans on every cell (no ILP solved for it), and each costs what its own solve gives."""
    table, first, second = _moe_family_table()
    assert table.family == {table.kind[second]: table.kind[first]}
    cells = list(table.ctx.cells())
    quiet(table.solve_cells, [(li, k, c) for li in (first, second) for k, c in cells], 1)
    assert table.ctx.mapped >= len(cells) // 2
    mapped = {kc: table.cost(second, *kc) for kc in cells}
    forget_shared_traces()
    own = table_for(models.get("moe", "tiny", layers=4), cpu4(), 2)
    own.family = {}
    quiet(own.solve_cells, [(second, k, c) for k, c in cells], 1)
    assert own.ctx.mapped == 0 and own.ctx.solves > 0
    assert all(mapped[kc] == own.cost(second, *kc) for kc in cells)


def test_aligned_nodes_asks_for_one_ilp_up_to_a_constant():
    """The two MoE layers' problems are one ILP up to a constant (the literal's layer has no
    node for the scalar it would read); a cost that moves by more than a constant, a memory that
    differs, or an edge's cost that differs makes them two."""
    from dataclasses import replace as dc_replace  # noqa: PLC0415

    from autoplan.search.intra._ilp_problem import aligned_nodes  # noqa: PLC0415

    table, first, second = _moe_family_table()
    k = table.ctx.submeshes.index((1, 4))
    mesh = table.ctx.mesh(k, (2, 2))
    a = build_problem(table.sub(first), mesh, count_unmerged=False)
    b = build_problem(table.sub(second), mesh, count_unmerged=False)
    align = aligned_nodes(a, b, 1e-12)
    assert align is not None and (align < 0).sum() == len(b.nodes) - len(a.nodes) == 1
    j = next(j for j, n in enumerate(b.nodes) if len(n.strategies) > 2 and align[j] >= 0)

    def changed(**node):
        out = copy_problem(b)
        out.nodes[j] = dc_replace(b.nodes[j], **node)
        return aligned_nodes(a, out, 1e-12)

    cost = b.nodes[j].cost
    assert changed(cost=cost + 1e-3) is not None  # a constant
    assert changed(cost=cost + np.linspace(0.0, 1e-3, len(cost))) is None
    assert changed(memory=b.nodes[j].memory + np.arange(len(cost))) is None
    edge = next(e for e in b.edges)
    out = copy_problem(b)
    out.edges = [(*edge[:4], edge[4] * 2.0 + 1e-3)] + [e for e in b.edges if e is not edge]
    assert aligned_nodes(a, out, 1e-12) is None


def copy_problem(prob):
    import copy  # noqa: PLC0415

    out = copy.copy(prob)
    out.nodes, out.edges = list(prob.nodes), list(prob.edges)
    return out


def test_a_search_plans_the_same_with_layer_families(monkeypatch):
    """The pipeline search with the family's plans taken over returns the plans it returns when
    every kind solves its own."""
    forget_shared_traces()
    res = quiet(pipeline_search, models.get("moe", "tiny", layers=4), cpu4(), microbatches=2)
    assert res.stats["layer_plans_mapped"] > 0
    monkeypatch.setattr(pp._Table, "_families", lambda self: {})
    forget_shared_traces()  # (the traces, and the layer plans kept on them, are solved again)
    own = quiet(pipeline_search, models.get("moe", "tiny", layers=4), cpu4(), microbatches=2)
    assert own.stats["layer_plans_mapped"] == 0
    assert own.stats["layer_solves"] > res.stats["layer_solves"]
    assert len(res.plans) == len(own.plans)
    for p, q in zip(res.plans, own.plans):
        assert (p.describe(), p.predicted, p.stages, p.inputs) == (
            q.describe(), q.predicted, q.stages, q.inputs)


def test_dag_stage_ilp_respects_memory_with_alpas_submeshes():
    """U-Net (skip connections): TePDist's stage ILP groups the layers, the stage DP gives the
    groups submeshes of Alpa's shapes (not only equal ones) within the memory limit; with a limit
    below the fastest layout's memory the search returns a layout that fits (at a batch of 64,
    where the fastest layout is not the leanest on the V100 preset)."""
    wl = models.get("unet", "tiny", batch=64)
    cluster = four_gpus()
    table = table_for(wl, cluster, 2)
    dag = pp.layer_dag(table.graph, table.layers)
    assert not pp._is_chain(dag)
    found, _, _, _ = quiet(pp._layouts, table, dag, True)
    sizes = {tuple(table.ctx.submeshes[k] for _, k, _ in lay) for lay in found}
    assert any(len({n * m for n, m in shp}) > 1 for shp in sizes)  # unequal submeshes
    evals = [quiet(pp._evaluate, table, lay) for lay in found]
    fastest = min(evals, key=lambda e: e.step)
    leanest = min(e.memory and max(e.memory) for e in evals)
    budget = 0.5 * (leanest + max(fastest.memory))
    assert leanest < budget < max(fastest.memory)
    res = quiet(pipeline_search, wl, cluster, microbatches=2, memory_budget=budget)
    assert res.stats["stage_algorithm"] == "ilp"
    assert res.plans[0].predicted.memory_per_device <= budget


# ------------------------------------------------------------------------------------------
# operator labels, plain workloads
# ------------------------------------------------------------------------------------------


def test_every_stage_operator_names_its_own_layer(gpt_tiny):
    wl, _, res, table = gpt_tiny
    graph = table.graph
    seen = set()
    for p in res.plans:
        for s in p.stages:
            for o in s.ops:
                assert o.layer in s.layers
                assert o.scope == graph.ops[o.op].scope_name and o.scope.startswith(o.layer)
                seen.add(o.layer)
    assert {"layers_0", "layers_1", "layers_2", "layers_3"} <= seen


def test_a_plain_workload_without_config_gets_pipeline_candidates():
    """An object with only fn, args and arg_kinds: the batch comes from the batch arguments'
    leading dimension, micro-batches are searched, and the search ends with pipeline plans."""
    keys = jax.random.split(jax.random.key(0), 4)
    params = {f"l{i}": {"w": jax.random.normal(keys[i], (64, 64)) * 0.1, "b": jnp.zeros(64)}
              for i in range(4)}

    def loss(p, x, y):
        for i in range(4):
            with jax.named_scope(f"l{i}"):
                x = jnp.tanh(x @ p[f"l{i}"]["w"] + p[f"l{i}"]["b"])
        return jnp.mean((x - y) ** 2)

    def step(p, x, y):
        value, g = jax.value_and_grad(loss)(p, x, y)
        return value, jax.tree.map(lambda a, b: a - 0.1 * b, p, g)

    x = jax.ShapeDtypeStruct((32, 64), jnp.float32)
    wl = SimpleNamespace(fn=step, args=(params, x, x), arg_kinds=("parameter", "batch", "batch"))
    res = quiet(autoplan.search, wl, "cpu:8")
    assert any(p.is_pipeline for p in res.plans)
    assert pp.batch_size(res.graph) == 32
    assert res.stats["pipeline_microbatches_default"] == 8  # 32 / 4: read from the data
    assert "pipeline_error" not in res.stats


def test_an_infeasible_pipeline_search_says_why():
    wl = models.get("gpt", "tiny", batch=16)
    with pytest.raises(autoplan.InfeasiblePlanError,
                       match="no stage layout fits 1000 bytes.*least memory with which") as err:
        quiet(pipeline_search, wl, cpu4(), memory_budget=1000.0, microbatches=2)
    assert err.value.least_memory > 1000
    with pytest.raises(autoplan.InfeasiblePlanError, match="no stage layout fits 1000 bytes"):
        quiet(autoplan.search, wl, cpu4(), memory_budget=1000.0, pipeline=True, baselines=False,
              microbatches=2)
    # without a budget the device's memory only ranks: non-fitting layouts come back, marked
    tight = autoplan.Cluster.preset("cpu", devices_per_node=4, device_memory=1000.0)
    res = quiet(pipeline_search, wl, tight, microbatches=2)
    assert not res.stats["fits"] and "no stage layout fits 1000 bytes" in res.stats["infeasible"]


def test_pins_that_match_nothing_are_refused():
    wl = models.get("gpt", "tiny")
    with pytest.raises(autoplan.SearchError, match="should match an input name"):
        pipeline_search(wl, autoplan.Cluster.parse("cpu:8"), pins={r"^nothing": P()})


FC1 = r"\['layers'\]\[{}\]\['mlp'\]\['fc1'\]\['kernel'\]"


def _inputs_named(plan, pattern):
    return {i.name: i.spec for i in plan.inputs if i.kind == "parameter" and re.search(pattern, i.name)}


def test_a_layer_pinned_unlike_its_kind_keeps_its_pin_and_does_not_lend_it():
    """Layers of one structure share a plan; a layer whose pins differ is a kind of its own. A
    pin on a layer that is not its kind's first is honoured in every pipeline plan, and a pin on
    the first layer is not handed to the others: their plans are the unpinned search's."""
    wl = models.get("gpt", "tiny", layers=3, batch=16)
    cluster = cpu4()
    res = quiet(pipeline_search, wl, cluster, microbatches=2, pins={FC1.format(1): P()})
    assert res.stats["unique_layer_kinds"] == quiet(
        pipeline_search, wl, cluster, microbatches=2).stats["unique_layer_kinds"] + 1
    for plan in res.plans:
        (spec,) = _inputs_named(plan, FC1.format(1)).values()
        assert all(e is None for e in spec), (plan.summary(), spec)
    free, pinned = table_for(wl, cluster, 2), table_for(wl, cluster, 2, pins={FC1.format(0): P()})
    # (the table's layers: the embedding, the three blocks, the head)
    assert pinned.kind[1] != pinned.kind[2] == pinned.kind[3] == free.kind[2]
    for k, c in free.ctx.cells():
        a, b = quiet(free.result, 2, k, c), quiet(pinned.result, 3, k, c)
        assert (a is None) == (b is None)
        if a is not None:
            assert b.solution.objective == pytest.approx(a.solution.objective)


def test_a_pin_keyed_by_tensor_id_is_held_by_the_pipeline_search():
    """A pin keyed by an input's tensor id (as ``autoplan.trace`` numbers them, the baselines'
    form) is the pin of that input's name: the layers' subgraphs and the micro-batch trace number
    tensors otherwise (it raised a TypeError)."""
    from autoplan.search.intra._pins import unheld_pins  # noqa: PLC0415

    wl = models.get("gpt", "tiny", layers=3, batch=16)
    graph = autoplan.trace(wl)
    t = next(gi.tensor for gi in graph.inputs if re.search(FC1.format(1), gi.name))
    res = quiet(pipeline_search, wl, cpu4(), microbatches=2, pins={t: P()})
    assert res.plans
    for plan in res.plans:
        assert unheld_pins(plan, graph, {t: P()}) == [], plan.summary()


def test_layer_cost_reports_batch_splits_for_rescaling():
    """The screened micro-batch counts reuse the default's plans: a plan splitting the
    micro-batch over k devices is valid at B micro-batches only if batch / B still divides by k."""
    table = table_for(models.get("mlp", "tiny", batch=64), autoplan.Cluster.parse("cpu:8"), 4)
    k, c = cell(table, (1, 8), (8, 1))
    lc = table.cost(1, k, c)
    assert (64, 8) in lc.batch_splits  # the micro-batch of 16 split over 8 devices
    assert lc.feasible(8) and not lc.feasible(16)  # 64 / 16 = 4 does not split over 8
    f, b, a = lc.rescaled(0.5, table.ctx.mesh(k, (8, 1)))
    assert a == pytest.approx(lc.activation / 2)
    assert f < lc.forward and b < lc.backward and np.isfinite(f)


def test_one_micro_batch_keeps_the_one_stage_layout():
    """An odd batch allows one micro-batch only: the one-stage layout is kept (the whole batch at
    once, the intra-operator plan composed from the layers') beside pure model-parallel ones."""
    wl = models.get("gpt", "tiny", batch=3)
    res = quiet(pipeline_search, wl, cpu4())
    assert res.stats["microbatches_default"] == 1 and list(res.stats["microbatch_candidates"]) == [1]
    one = [p for p in res.plans if not p.is_pipeline]
    assert one and one[0].schedule.microbatches == 1
    assert all(p.schedule.microbatches == 1 for p in res.plans)
