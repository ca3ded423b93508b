"""Pipeline plans: layers, stage DP / DAG ILP, schedules, device use, plan files."""

import warnings
from dataclasses import replace

import pytest

import autoplan
from autoplan import models
from autoplan.algorithms import group_layers, pipeline_search
from autoplan.plans._plan import Plan
from autoplan.search.pipeline._pipeline import _is_chain, layer_dag
from autoplan.tracing._trace import forget_shared_traces


@pytest.fixture(scope="module")
def gpt_pipeline():
    wl = models.get("gpt", size="tiny", layers=4, batch=16)
    cluster = autoplan.Cluster.preset("p3.16xlarge", nodes=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return wl, cluster, pipeline_search(wl, cluster, microbatches=4, level="exhaustive")


def test_clustering_balances_and_covers_every_op():
    g = autoplan.trace(models.get("gpt", size="tiny", layers=4))
    layers = group_layers(g, 3)
    assert sorted(o for ly in layers for o in ly.ops) == list(range(len(g)))
    assert [ly.names for ly in layers][0][0] == "embed"
    sigs = [ly.signature for ly in group_layers(g)]
    assert sigs[1] == sigs[2] == sigs[3]  # repeated layers share a structural signature
    with pytest.raises(autoplan.SearchError, match="num_layers"):
        group_layers(g, 99)
    assert len(group_layers(g, max_layers=2)) == 2
    assert len(group_layers(g, max_layers=None)) == len(group_layers(g))  # 6 units < 64
    with pytest.raises(autoplan.SearchError, match="max_layers .* Got 0"):
        group_layers(g, max_layers=0)


def test_pipeline_plans_use_every_device_once(gpt_pipeline):
    wl, cluster, res = gpt_pipeline
    assert res.plans
    for p in res.plans:
        ids = [d for s in p.stages for d in s.device_ids]
        assert sorted(ids) == list(range(cluster.num_devices))
        assert p.num_devices == cluster.num_devices
        assert p.schedule.kind == "1f1b" and p.schedule.microbatches == 4
        assert p.schedule.num_stages == len(p.stages)
        covered = [n for s in p.stages for n in s.layers]
        assert covered == [ly.name for ly in autoplan.trace(wl).layers]
        ev = p.schedule.events
        # a forward and a backward per stage and micro-batch, and each stage's per-step work
        assert len(ev) == 2 * len(p.stages) * 4 + len(p.stages)
        assert sorted(e[5] for e in ev if e[5] == "update") == ["update"] * len(p.stages)
        assert max(e[1] for e in ev) == pytest.approx(p.predicted.step_time)
        assert 0 <= p.predicted.bubble_fraction < 1


def test_pipeline_plans_records_equal_their_checked_construction(gpt_pipeline):
    """The pipeline search composes each stage's operator records and the schedule without
    their constructors' checks: each equals (and hashes as) the record its constructor makes
    from the same fields, already in the stored form (tuples all the way down)."""
    from dataclasses import fields

    from autoplan.plans._plan import OpSharding, Schedule

    def checked(r):
        return type(r)(**{f.name: getattr(r, f.name) for f in fields(r)})

    _, _, res = gpt_pipeline
    assert any(len(p.stages) > 1 for p in res.plans)
    for p in res.plans:
        ops = [o for st in p.stages for o in st.ops]
        assert ops and all(type(o) is OpSharding for o in ops)
        for r in ops + [t for o in ops for t in o.tensors]:
            assert r == checked(r) and hash(r) == hash(checked(r))
        # each operator is its own graph operator under its own layer's name
        assert len({o.op for o in ops}) == len(ops)
        sched = p.schedule
        assert type(sched) is Schedule and sched == checked(sched)
        assert hash(sched) == hash(checked(sched))
        for rows in (sched.table, sched.events):
            assert type(rows) is tuple and all(type(row) is tuple for row in rows)
        assert all(e is None or type(e) is tuple for row in sched.table for e in row)
        assert len(sched.table) > 0 and len(sched.events) > 0


def test_pipeline_plan_json_round_trip(gpt_pipeline, tmp_path):
    _, _, res = gpt_pipeline
    p = res.plans[0]
    assert Plan.from_json(p.to_json()) == p
    specs = p.partition_specs()
    assert len(specs) == 3


def test_dag_models_use_the_stage_ilp():
    wl = models.get("unet", size="tiny")
    g = autoplan.trace(wl)
    dag = layer_dag(g, group_layers(g))
    assert not _is_chain(dag)  # skip connections
    cluster = autoplan.Cluster.parse("cpu:8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = pipeline_search(wl, cluster, microbatches=2, level="exhaustive")
    assert res.stats["stage_algorithm"] == "ilp"
    for p in res.plans:
        assert sorted(d for s in p.stages for d in s.device_ids) == list(range(8))


def test_search_auto_ranks_pipeline_and_intra_op_with_baselines():
    wl = models.get("gpt", size="tiny", layers=2, batch=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = autoplan.search(wl, "p3.16xlarge:2", microbatches=4, level="exhaustive")
    labels = {p.label for p in res.plans}
    assert "baseline: data parallel" in labels and "baseline: Megatron TP" in labels
    assert "baseline: Megatron TP x PP" in labels
    assert any(p.is_pipeline for p in res.plans) and any(not p.is_pipeline for p in res.plans)
    times = [p.predicted.step_time for p in res.plans if p.predicted.memory_per_device
             <= p.cluster.device_memory]
    assert times == sorted(times)
    assert res.best.predicted.step_time <= min(p.predicted.step_time for p in res.baselines) * (1 + 1e-9)


def test_searched_pipeline_plan_runs_and_matches_single_device():
    from autoplan.exec import run

    wl = models.get("gpt", size="tiny", layers=3, batch=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = autoplan.search(wl, "cpu:8", pipeline=True, microbatches=4, baselines=False)
    pipe = res.best
    assert pipe.is_pipeline and pipe.schedule.microbatches == 4
    rep = run(pipe, wl.concrete(), steps=2, check=True,
              compiler_options={"xla_backend_optimization_level": 0})
    assert rep.mode == "pipeline" and rep.equivalence.matched
    assert rep.constraints_skipped == 0 and rep.constraints_applied == len(pipe.ops) > 0


def test_submesh_hosts_pow2_restricts_multi_host_stages(capsys):
    from autoplan.cli import main

    wl = models.get("gpt", size="tiny")
    cl = autoplan.Cluster.preset("p3.16xlarge", 5)
    full = autoplan.search(wl, cl, pipeline=True, baselines=False, submesh_hosts="all")
    small = autoplan.search(wl, cl, pipeline=True, baselines=False, submesh_hosts="pow2")
    assert full.stats["pipeline_submeshes"] == 8 and small.stats["pipeline_submeshes"] == 7
    for plan in small.plans:
        assert all(s.submesh_shape[0] in (1, 2, 4, 5) for s in plan.stages)
        assert sum(s.submesh_shape[0] * s.submesh_shape[1] for s in plan.stages) == 40
    # a smaller space never finds a better plan than Alpa's full one
    assert full.best.predicted.step_time <= small.best.predicted.step_time * (1 + 1e-9)
    with pytest.raises(autoplan.SearchError, match="submesh_hosts"):
        autoplan.search(wl, cl, pipeline=True, baselines=False, submesh_hosts="odd")
    with pytest.raises(autoplan.SearchError, match="submesh_hosts.*Fix"):  # checked up front
        autoplan.search(wl, cl, pipeline=False, submesh_hosts="odd")
    assert main(["plan", "gpt", "--size", "tiny", "--cluster", "p3.16xlarge:5", "--pipeline", "yes",
                 "--submesh-hosts", "pow2"]) == 0
    assert "autoplan-pipeline" in capsys.readouterr().out


def test_cli_pipeline_options(capsys):
    from autoplan.cli import main

    assert main(["plan", "gpt", "--size", "tiny", "--set", "layers=4", "--cluster", "cpu:4",
                 "--pipeline", "yes", "--num-layers", "3", "--stage-algorithm", "dp",
                 "--microbatches", "2", "--level", "exhaustive"]) == 0
    out = capsys.readouterr().out
    assert "2 mb" in out and "stage" in out
    assert main(["plan", "gpt", "--size", "tiny", "--cluster", "cpu:4", "--pipeline", "yes",
                 "--microbatches", "auto", "--stage-algorithm", "ilp"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["plan", "gpt", "--microbatches", "many"])
    assert "'auto' or a positive integer" in capsys.readouterr().err
    assert main(["plan", "gpt", "--size", "tiny", "--cluster", "cpu:4", "--pipeline", "yes",
                 "--microbatches", "3"]) == 2
    assert "divide the batch" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["plan", "gpt", "--stage-algorithm", "greedy"])


def _solved_alike(plans):
    """Plans without what says how a search went (its seconds, the ILPs it solved)."""
    return [replace(p, search_seconds=0.0,
                    analysis={k: v for k, v in (p.analysis or {}).items() if k != "ilps"})
            for p in plans]


def test_a_memory_budget_change_reuses_the_layer_plans_and_finds_the_fresh_searchs_plans():
    """A layer's plans do not depend on the memory budget: a second search of the same step
    with a budget re-solves none of the plans the first solved (the Explorer's budget box), and
    finds the plans a search of a fresh copy of the workload finds. Another object of the same
    zoo spec shares the step's trace, and with it the layer plans; once the shared traces are
    forgotten it is searched afresh."""
    cluster = autoplan.Cluster.preset("p3.16xlarge", nodes=2)

    def workload():
        return models.get("gpt", size="tiny", layers=4, batch=16)

    forget_shared_traces()
    wl = workload()
    kw = dict(pipeline=True, baselines=False, cache=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = autoplan.search(wl, cluster, **kw)
        budget = 0.5 * first.best.predicted.memory_per_device
        again = autoplan.search(wl, cluster, memory_budget=budget, **kw)
        shared = autoplan.search(workload(), cluster, memory_budget=budget, **kw)
        forget_shared_traces()
        fresh = autoplan.search(workload(), cluster, memory_budget=budget, **kw)
    assert first.stats["pipeline_layer_plans_reused"] == 0
    assert first.stats["pipeline_layer_solves"] > 0
    for warm in (again, shared):
        assert warm.stats["pipeline_layer_solves"] == 0
        assert warm.stats["pipeline_layer_plans_reused"] > 0
    assert _solved_alike(shared.plans) == _solved_alike(again.plans)
    assert fresh.stats["pipeline_layer_plans_reused"] == 0
    assert fresh.stats["pipeline_layer_solves"] > 0
    assert _solved_alike(again.plans) == _solved_alike(fresh.plans)
    assert again.best.predicted.memory_per_device <= budget
    assert _solved_alike(again.plans) != _solved_alike(first.plans)  # (the budget mattered)
