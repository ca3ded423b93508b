"""Optimisation levels: hierarchical and folded plans are as good as the exhaustive ILP."""

import warnings

import pytest

import autoplan
from autoplan import models
from autoplan.algorithms import level_search

CASES = {
    "gpt2": ("gpt", dict(layers=2, hidden=64, heads=4, seq_len=32, batch=16, vocab=256)),
    "gpt4": ("gpt", dict(layers=4, hidden=64, heads=4, seq_len=32, batch=16, vocab=256)),
    "gpt8": ("gpt", dict(layers=8, hidden=64, heads=4, seq_len=32, batch=16, vocab=256)),
    "moe": ("moe", dict(layers=4)),
    "wide_resnet": ("wide_resnet", {}),
    "mlp": ("mlp", dict(layers=6, batch=64)),
}
MESHES = {(2, 4): "p3.16xlarge:1", (2, 8): "p3.16xlarge:2"}


@pytest.fixture(scope="module")
def graphs():
    return {k: autoplan.trace(models.get(name, size="tiny", **over)) for k, (name, over) in CASES.items()}


@pytest.mark.parametrize("mesh", list(MESHES))
@pytest.mark.parametrize("case", list(CASES))
def test_folded_and_hierarchical_match_exhaustive(graphs, case, mesh):
    g = graphs[case]
    cluster = autoplan.Cluster.parse(MESHES[mesh])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = level_search(g, cluster, mesh, level="exhaustive")
        hi = level_search(g, cluster, mesh, level="hierarchical")
        fo = level_search(g, cluster, mesh, level="folded")
    t_ex = ex.plan.predicted.step_time
    assert hi.plan.predicted.step_time <= t_ex * 1.01
    assert fo.plan.predicted.step_time <= t_ex * 1.01
    # costed as chosen, a stitched plan may beat the merged whole-graph ILP, but only where a
    # segment boundary lets a follower read a resharded operand: by little
    assert fo.plan.predicted.step_time >= t_ex * 0.98
    assert fo.stats["unique_classes"] <= hi.stats["unique_classes"] == hi.stats["segments"]
    assert fo.stats["stitch_mismatches"] == 0
    assert fo.solution.least_memory <= fo.solution.memory_per_device


@pytest.mark.parametrize("case", ["gpt4", "moe", "wide_resnet", "mlp"])
def test_costing_as_chosen_reproduces_the_ilp_objective(graphs, case):
    """Stitched plans are costed operator by operator; on an exhaustive plan that costing gives
    exactly the merged ILP's objective and memory, so the levels are compared on one measure."""
    from autoplan.search.intra._ilp import cost_strategies
    from autoplan.search.intra._intra import make_logical_mesh

    g = graphs[case]
    cluster = autoplan.Cluster.parse(MESHES[(2, 4)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = level_search(g, cluster, (2, 4), level="exhaustive").solution
    inputs = {gi.tensor: ex.specs[gi.tensor] for gi in g.inputs}
    bd, missing = cost_strategies(g, make_logical_mesh(cluster, (2, 4)), ex.strategies, inputs)
    assert missing == 0
    assert bd.objective == pytest.approx(ex.objective, rel=1e-9)
    assert bd.memory == pytest.approx(ex.memory_per_device, rel=1e-9)
    # a strategy changed by hand is charged: the heaviest operator with other output specs
    from autoplan.search.intra._strategies import strategies as op_strategies

    mesh = make_logical_mesh(cluster, (2, 4))
    heavy = max(ex.strategies, key=lambda i: g.ops[i].flops)
    other = next(s for s in op_strategies(g.ops[heavy], g, mesh, set())
                 if s.out_specs != ex.strategies[heavy].out_specs)
    changed, _ = cost_strategies(g, mesh, {**ex.strategies, heavy: other}, inputs)
    assert changed.objective != pytest.approx(bd.objective, rel=1e-6)


def test_folding_solves_each_layer_kind_once(graphs):
    g = graphs["gpt8"]
    cluster = autoplan.Cluster.parse("p3.16xlarge:1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fo = level_search(g, cluster, (2, 4), level="folded")
    st = fo.stats
    assert st["segments"] == 8 + 2  # embedding, 8 layers, head
    assert st["unique_classes"] <= 5  # embed, layer (first/middle/last may differ), head
    assert st["fold_ratio"] > 2
    for key in ("operators", "graphnodes", "segments", "unique_classes", "ilps_solved",
                "ilp_variables", "mine_seconds", "solve_seconds", "dp_seconds",
                "specs_pruned_by_shape_check"):
        assert key in st
    assert st["specs_pruned_by_shape_check"] > 0
    a = fo.analysis
    assert len(a.segments) == st["segments"]
    assert [s.cls for s in a.segments[2:7]] == [a.segments[2].cls] * 5


def test_search_reports_level_statistics():
    wl = models.get("gpt", size="tiny", layers=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = autoplan.search(wl, "cpu:8", pipeline=False, mesh_shape=(2, 4), baselines=False,
                              level="folded")
    assert res.best.level == "folded" and res.stats["level_used"] == {"2x4": "folded"}
    for key in ("operators", "segments", "unique_classes", "ilps_solved", "trace_seconds",
                "search_seconds"):
        assert key in res.stats
    with pytest.raises(autoplan.SearchError, match="level should be one of"):
        autoplan.search(wl, "cpu:8", level="O7")


def test_symbolic_shape_check_counts_invalid_assignments():
    from autoplan.search.intra._spec_space import enumerate_specs, pruned_by_shape_check

    mesh = autoplan.Cluster.parse("cpu:8").logical_mesh((2, 4))
    # dim of 6 on axes of 2 and 4: x alone divides it; y, and x with y, do not
    assert pruned_by_shape_check([(6,)], mesh) == 2
    assert len(enumerate_specs((6,), mesh)) == 2
    assert pruned_by_shape_check([(8, 8)], mesh) == 0


def test_a_deep_scoped_model_gets_one_segment_per_layer():
    """More named-scope layers than pipeline clustering's default cap (64): the levels still
    cut one segment per layer (plus embedding and head), so the folded search solves the same
    three classes as on a shallow model instead of merged multi-layer segments."""
    g = autoplan.trace(models.get("gpt", size="tiny", layers=66, hidden=32, heads=2, seq_len=8,
                                  batch=8, vocab=64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fo = level_search(g, autoplan.Cluster.parse("p3.16xlarge:1"), (2, 4), level="folded")
    assert fo.stats["segments"] == 66 + 2
    assert fo.stats["unique_classes"] == 3
    assert fo.stats["stitch_mismatches"] == 0


def _exhaustive_and_folded(workload, **links):
    """The exhaustive and folded searches of a workload on a 2x4 mesh of one p3.16xlarge (with
    every GPU pair at the node's NVLink rate unless ``links`` give the preset's own)."""
    g = autoplan.trace(workload)
    cluster = autoplan.Cluster.preset("p3.16xlarge", **(links or {"nvlinks": ()}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return (level_search(g, cluster, (2, 4), level="exhaustive"),
                level_search(g, cluster, (2, 4), level="folded"))


def test_chain_dp_value_is_the_stitched_plans_cost_on_wide_resnet():
    """A Wide-ResNet block's input is read by a convolution, the residual add and the shortcut
    convolution: a boundary spec fixed on it is paid by each of them in the stitched plan, so the
    segment that makes it is charged once per outside use. Charged once, the chain DP valued its
    plan 0.94 ms below the plan's cost and settled 1.5% above the exhaustive ILP; with the
    chain's spec vocabulary as boundary candidates both levels now reach the exhaustive plan."""
    ex, fo = _exhaustive_and_folded(models.get("wide_resnet", size="250M", batch=64))
    assert fo.stats["dp_value"] == pytest.approx(fo.stats["objective"], rel=1e-9)
    assert fo.stats["objective"] <= ex.solution.objective * (1 + 1e-4)
    assert fo.stats["unique_classes"] < fo.stats["segments"]


@pytest.mark.xfail(strict=True, reason="with axes of unequal bandwidth (the DGX-1 cube-mesh: "
                   "25 and 100 GB/s on a 2x4 mesh) the chain DP values Wide-ResNet's folded "
                   "plan 1.2 ms (0.5%) below its stitched cost, and the plan is 0.46% above "
                   "the exhaustive ILP: the DP charges a boundary tensor producer -> fixed spec "
                   "-> consumer, the stitched plan reshards producer -> consumer directly, and "
                   "XLA's direct route can cost more (see the test's docstring)")
def test_chain_dp_value_is_the_stitched_plans_cost_on_the_cube_mesh():
    """Why it fails (hierarchical level too, so not the folding): a block's input (``max`` of
    the previous block) is fixed to ``S(y)RRS(x)`` at the boundary; the producing segment's solve
    makes it ``S(x)RRS(y)`` and is charged the all-to-alls to the fixed spec, and the consuming
    segment's backward convolution reads it as ``RRRS(x,y)`` from the fixed spec (an all-to-all
    and an all-gather over ``y``: 0.19 ms). The stitched plan has no fixed spec between them: the
    convolution reads ``S(x)RRS(y)`` directly, which XLA compiles as one all-gather over both
    axes, 1.5 ms on the slow axis. With equal axes the two routes cost the same. The remedy is to
    make the stitched plan keep the DP's boundary spec (a sharding constraint at the boundary,
    costed once), so that the segments' sum is the plan's cost; until then the folded and
    hierarchical plans on such meshes can be a fraction of a percent off the exhaustive one."""
    ex, fo = _exhaustive_and_folded(models.get("wide_resnet", size="250M", batch=64),
                                    nvlinks=autoplan.Cluster.preset("p3.16xlarge").nvlinks)
    assert fo.stats["dp_value"] == pytest.approx(fo.stats["objective"], rel=1e-9)


def test_long_range_tensors_are_fixed_on_both_sides_on_two_tower():
    """The user tower's output skips the item tower's segments to reach the head (and its
    gradient comes back): fixed only in its consumers, the producing segment's chosen solve made
    another spec and the chain DP valued its plan 0.2 ms below the plan's cost, 8.4% above the
    exhaustive ILP. Fixed on both sides, with the spec chosen among the chain's vocabulary, the
    DP's value is the plan's cost and the plan is within 2% of exhaustive."""
    ex, fo = _exhaustive_and_folded(models.get("two_tower", size="large"))
    assert fo.stats["dp_value"] == pytest.approx(fo.stats["objective"], rel=1e-9)
    assert fo.stats["objective"] <= ex.solution.objective * 1.02


def test_folded_instances_pinned_differently_keep_their_own_pins(graphs):
    """Two instances of one layer class whose same parameter is pinned to different specs are
    solved apart (a class is its structure and its pins), so each keeps its pin."""
    from jax.sharding import PartitionSpec as P

    g = graphs["gpt4"]
    cluster = autoplan.Cluster.parse("p3.16xlarge:1")
    pins = {r"^params\['layers'\]\[1\]\['mlp'\]\['fc1'\]\['kernel'\]$": P(None, "y"),
            r"^params\['layers'\]\[2\]\['mlp'\]\['fc1'\]\['kernel'\]$": P("y", None)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = level_search(g, cluster, (2, 4), level="folded", pins=pins)
    spec = {i.name: tuple(i.spec) for i in res.plan.inputs}
    assert spec["params['layers'][1]['mlp']['fc1']['kernel']"] == (None, ("y",))
    assert spec["params['layers'][2]['mlp']['fc1']['kernel']"] == (("y",), None)


def test_a_budget_change_reuses_the_stitched_plan_and_a_tighter_one_runs_the_exhaustive_ilp(
        monkeypatch):
    """A stitched plan does not read the memory budget: a second search of the same graph that
    changes only the budget solves no segment again and returns the plan a fresh graph's search
    returns; a budget the stitched plan exceeds still gets the exhaustive ILP with the budget."""
    from autoplan.search.fold import _levels as levels

    def graph():
        return autoplan.trace(models.get("gpt", size="tiny", layers=4))

    cluster = autoplan.Cluster.parse("p3.16xlarge:1")
    g = graph()
    first = level_search(g, cluster, (2, 4), level="folded")
    assert first.stats["stitched_plan_reused"] is False and first.stats["ilps_solved"] > 0
    solves = []
    real = levels.solve_ilp
    monkeypatch.setattr(levels, "solve_ilp", lambda *a, **k: solves.append(1) or real(*a, **k))
    roomy = 2 * first.plan.predicted.memory_per_device
    again = level_search(g, cluster, (2, 4), level="folded", memory_budget=roomy)
    assert solves == [] and again.stats["stitched_plan_reused"] is True
    fresh = level_search(graph(), cluster, (2, 4), level="folded", memory_budget=roomy)
    assert len(solves) == fresh.stats["ilps_solved"] > 0
    assert fresh.stats["stitched_plan_reused"] is False
    for a, b in ((again, fresh), (again, first)):
        assert a.plan.predicted == b.plan.predicted and a.plan.inputs == b.plan.inputs
        assert [o.strategy for o in a.plan.ops] == [o.strategy for o in b.plan.ops]
    tight = 0.9 * first.plan.predicted.memory_per_device
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lean = level_search(g, cluster, (2, 4), level="folded", memory_budget=tight)
    assert any("exhaustive search with the memory constraint" in n for n in lean.plan.notes)
    assert lean.plan.predicted.memory_per_device <= tight


def test_pins_in_another_order_are_another_search_and_a_list_of_pins_is_refused():
    """A later pin overrides an earlier one on the same input, so two pin dicts with the same
    items in another order may pin differently: the stitched plan kept for one is not the
    other's. Pins that are not a dict are refused by name."""
    from jax.sharding import PartitionSpec as P

    g = autoplan.trace(models.get("gpt", size="tiny", layers=2))
    cluster = autoplan.Cluster.parse("p3.16xlarge:1")
    fc1 = r"\['fc1'\]\['kernel'\]$"
    first = {fc1: P(None, "y"), r"^params\['layers'\]\[1\]\['mlp'\]" + fc1: P("y", None)}
    name = "params['layers'][1]['mlp']['fc1']['kernel']"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = level_search(g, cluster, (2, 4), level="folded", pins=first)
        b = level_search(g, cluster, (2, 4), level="folded", pins=dict(reversed(first.items())))
    specs = [{i.name: tuple(i.spec) for i in r.plan.inputs}[name] for r in (a, b)]
    assert specs == [(("y",), None), (None, ("y",))]
    assert b.stats["stitched_plan_reused"] is False
    with pytest.raises(autoplan.SearchError, match="pins should be a dict"):
        level_search(g, cluster, (2, 4), level="folded", pins=[(fc1, P(None, "y"))])


@pytest.mark.parametrize("mesh", list(MESHES))
def test_the_least_memory_bound_is_at_most_the_least_memory(graphs, mesh):
    """The bound the level search refuses a budget by is never above the exact least memory
    (the sum of each node's least): every model of the suite, both meshes; and it is the least
    itself where every counted tensor splits over every device (the tiny GPT on 8 devices)."""
    from autoplan.search.intra._ilp_problem import least_memory_bound, problem_nodes

    m = autoplan.Cluster.parse(MESHES[mesh]).logical_mesh(mesh)
    for case, g in graphs.items():
        least = float(sum(n.memory.min() for n in problem_nodes(g, m).nodes))
        bound = least_memory_bound(g, m)
        assert 0 < bound <= least * (1 + 1e-12), case
        if case == "gpt2" and mesh == (2, 4):
            assert bound == pytest.approx(least, rel=0.05)


def test_a_budget_below_the_bound_is_refused_without_the_whole_steps_nodes(graphs, monkeypatch):
    """A budget below the least-memory bound is refused by the bound alone, before the
    exhaustive search builds the whole step's nodes; a budget between the bound and the least
    gets the exhaustive search's exact refusal, and one between the least and the stitched
    plan's memory the exhaustive ILP with the budget (as before). On the MoE, whose least is
    3% above the bound (its expert weights do not split over every device)."""
    from autoplan._errors import InfeasiblePlanError
    from autoplan.search.fold import _levels as levels
    from autoplan.search.intra import _ilp_solve
    from autoplan.search.intra._ilp_problem import least_memory_bound, problem_nodes

    g = graphs["moe"]
    cluster = autoplan.Cluster.parse("p3.16xlarge:1")
    first = level_search(g, cluster, (2, 4), level="folded")
    mesh = cluster.logical_mesh((2, 4))
    bound = least_memory_bound(g, mesh)
    least = float(sum(n.memory.min() for n in problem_nodes(g, mesh).nodes))
    assert least > bound * (1 + 100 * levels.BOUND_MARGIN)
    assert first.plan.predicted.memory_per_device > least
    whole = []
    real = _ilp_solve.problem_nodes
    monkeypatch.setattr(_ilp_solve, "problem_nodes",
                        lambda graph, m, **k: whole.append(k.get("ops")) or real(graph, m, **k))
    with pytest.raises(InfeasiblePlanError, match="at least") as err:
        level_search(g, cluster, (2, 4), level="folded", memory_budget=0.9 * bound)
    assert whole == [] and err.value.least_memory is None
    # (the exact refusal, for a budget the bound does not rule out, is unchanged: its least is
    # the exact one, from the whole step's nodes or from an earlier search's that kept it)
    with pytest.raises(InfeasiblePlanError) as err:
        level_search(g, cluster, (2, 4), level="folded", memory_budget=0.5 * (bound + least))
    assert err.value.least_memory == pytest.approx(least, rel=1e-12)
    roomy = 0.5 * (least + first.plan.predicted.memory_per_device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fits = level_search(g, cluster, (2, 4), level="folded", memory_budget=roomy)
    assert fits.plan.predicted.memory_per_device <= roomy * (1 + 1e-9)
