"""Faults of clusters, options, plans and numbers: one device cap everywhere, every option
checked before any work, plans that contradict themselves or the workload (warned at ``show``,
refused by ``exec.run`` and ``launch``), non-finite losses, and the launcher's probe naming what
it was doing when its timeout ended it."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import autoplan
from autoplan import Cluster
from autoplan import algorithms as S
from autoplan._options import cache_max_bytes, check_mesh_shape
from autoplan.costs._cluster import MAX_DEVICES, MAX_SEARCH_DEVICES
from autoplan.exec import run
from autoplan.exec._probe import _PHASE, _probe_timeout
from autoplan.models import get
from autoplan.plans._plan_check import (
    PlanContradictionWarning,
    PlatformWarning,
    WorkloadView,
    inputs_fingerprint,
    plan_contradictions,
    platform_note,
    workload_contradictions,
)

ROOT = Path(__file__).resolve().parents[1]
FAST = {"xla_backend_optimization_level": 0}


# ---- one device cap ------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["cpu:99999999999999999999", "p3.16xlarge:200000",
                                  f"cpu:{MAX_DEVICES + 1}"])
def test_cluster_parse_refuses_absurd_clusters(spec):
    with pytest.raises(autoplan.ClusterError, match="at most 1,048,576 devices"):
        Cluster.parse(spec)


def test_presets_and_constructor_share_the_cap():
    with pytest.raises(autoplan.ClusterError, match="at most"):
        Cluster.preset("p3.16xlarge", MAX_DEVICES // 8 + 1)
    with pytest.raises(autoplan.ClusterError, match="at most"):
        Cluster.preset("p3.16xlarge", 1).with_nodes(MAX_DEVICES)
    assert Cluster.parse(f"cpu:{MAX_DEVICES}").num_devices == MAX_DEVICES  # the cap itself is fine


def test_plan_file_checker_reads_the_same_cap(mlp_plan):
    from autoplan.plans import _planfile

    assert _planfile._MAX_INDEX is MAX_DEVICES
    d = mlp_plan.to_dict()
    d["cluster"]["nodes"] = MAX_DEVICES  # x 8 devices per node
    with pytest.raises(autoplan.PlanFileError, match="at most 1,048,576 devices") as e:
        autoplan.Plan.from_dict(d)
    assert e.value.field == "cluster.nodes"


def test_a_search_larger_than_the_machine_is_refused_before_tracing():
    with pytest.raises(autoplan.SearchError, match="at most 65,536 devices") as e:
        autoplan.search(get("mlp", "tiny"), "p3.16xlarge:100000")
    assert "800,000" in str(e.value) and "p3.16xlarge:8192" in str(e.value)
    assert MAX_SEARCH_DEVICES == 2**16


# ---- options -------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, words", [
    (dict(memory_budget=True), "True is not a byte count"),
    (dict(memory_budget="1GB"), "memory_budget=2**30"),
    (dict(memory_budget=-1.0), "positive number of bytes"),
    (dict(memory_budget=math.nan), "positive number of bytes"),
    (dict(mesh_shape="2x4"), "mesh_shape=(2, 4)"),
    (dict(mesh_shape=(2, 0)), "positive integers"),
    (dict(progress=5), "progress should be None or a function"),
    (dict(partial="yes"), "partial should be None or a function"),
])
def test_search_options_are_checked_before_any_work(kw, words):
    with pytest.raises(autoplan.SearchError, match=words.replace("(", r"\(").replace(")", r"\)")
                       .replace("*", r"\*")):
        autoplan.search(get("mlp", "tiny"), "cpu:8", **kw)


def test_check_mesh_shape_accepts_lists():
    assert check_mesh_shape("x", [2, 4]) == (2, 4)


@pytest.mark.parametrize("text, want", [("", 7), ("0", 0), ("1000", 1000), ("1e9", 10**9),
                                        ("1_000", 1000)])
def test_cache_max_bytes_values(text, want):
    assert cache_max_bytes(7, {"AUTOPLAN_CACHE_MAX_BYTES": text}) == want


@pytest.mark.parametrize("text", ["abc", "-1", "1.5", "inf", "nan", "1e999"])
def test_cache_max_bytes_refuses_non_byte_counts(text):
    with pytest.raises(autoplan.ArgumentError, match="AUTOPLAN_CACHE_MAX_BYTES should be a whole"):
        cache_max_bytes(7, {"AUTOPLAN_CACHE_MAX_BYTES": text})


def test_bad_cache_bound_is_an_error_before_the_search(monkeypatch):
    monkeypatch.setenv("AUTOPLAN_CACHE_MAX_BYTES", "abc")
    with pytest.raises(autoplan.ArgumentError, match="'abc'"):
        autoplan.search(get("mlp", "tiny"), "cpu:8", pipeline=False, baselines=False)
    # cache=False reads no cache bound
    autoplan.search(get("mlp", "tiny"), "cpu:8", pipeline=False, baselines=False,
                    mesh_shape=(8, 1), cache=False)


def test_cache_bound_zero_stores_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("AUTOPLAN_CACHE_MAX_BYTES", "0")
    res = autoplan.search(get("mlp", "tiny"), "cpu:8", pipeline=False, baselines=False,
                          mesh_shape=(8, 1))
    assert res.stats["cache"] == "not stored"
    assert not list(tmp_path.rglob("*.entry"))


@pytest.mark.parametrize("name", ["cones", "critical_nodes", "segments", "group_graphnodes",
                                  "group_layers", "mine", "evaluate", "solve_ilp", "level_search",
                                  "baseline_plans", "pipeline_search", "enumerate_specs",
                                  "strategies"])
def test_public_algorithms_name_a_wrong_argument(name):
    fn = getattr(S, name)
    import inspect

    n = sum(1 for p in inspect.signature(fn).parameters.values()
            if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD)
    with pytest.raises(autoplan.ArgumentTypeError, match=r"should be .*Got NoneType.*Fix:"):
        fn(*([None] * n))


def test_a_workload_given_for_a_graph_is_named():
    with pytest.raises(autoplan.ArgumentTypeError, match="a workload: trace it first"):
        S.cones(get("mlp", "tiny"))


# ---- plans that contradict themselves ------------------------------------------------------
@pytest.fixture(scope="module")
def mlp_plan():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return autoplan.plan(get("mlp", "tiny"), "cpu:8", pipeline=False, level="exhaustive",
                             mesh_shape=(2, 4), baselines=False)


@pytest.fixture(scope="module")
def gpt_search():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return autoplan.search(get("gpt", "tiny"), "cpu:8", pipeline=True, microbatches=2)


def _edited(plan, edit):
    d = copy.deepcopy(plan.to_dict())
    edit(d)
    return json.loads(json.dumps(d))


def _read(d):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        plan = autoplan.Plan.from_dict(d)
    return plan, [x for x in w if issubclass(x.category, PlanContradictionWarning)]


def test_searched_plans_are_consistent(gpt_search, mlp_plan):
    plans = list(gpt_search.plans) + [mlp_plan]
    assert any(p.is_pipeline for p in plans) and len(plans) > 2
    for p in plans:
        assert inputs_fingerprint(p.inputs) == p.fingerprint
        assert plan_contradictions(p) == [], p.label
        _, w = _read(p.to_dict())
        assert not w, [str(x.message) for x in w]


def _swap_stage_layers(d):
    d["stages"][0]["layers"], d["stages"][1]["layers"] = d["stages"][1]["layers"], d["stages"][0]["layers"]


def _param_as_batch(d):
    d["inputs"][0]["kind"] = "batch"


def _first(d, key, value):
    i = next(i for i in d["inputs"] if i["kind"] == "parameter" and len(i["shape"]) == 2)
    i[key] = value


EDITS = {
    "shape": (lambda d: _first(d, "shape", [64, 16]), "fingerprint"),
    "dtype": (lambda d: _first(d, "dtype", "bfloat16"), "fingerprint"),
    "path": (lambda d: _first(d, "path", "['other']"), "fingerprint"),
    "kind": (_param_as_batch, "inputs[0].kind"),
    "devices_per_node": (lambda d: d["cluster"].update(devices_per_node=16),
                         "cluster.devices_per_node"),
    "nodes": (lambda d: d["cluster"].update(nodes=2), "cluster.nodes"),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_edited_plan_is_warned_when_read_and_refused_by_run(mlp_plan, edit):
    fn, field = EDITS[edit]
    d = _edited(mlp_plan, fn)
    plan, w = _read(d)
    assert w and f"{field} should be" in str(w[0].message)
    assert "Fix:" in str(w[0].message)
    with pytest.raises(autoplan.PlanFileError, match="the plan contradicts itself") as e:
        run(plan, get("mlp", "tiny", abstract=False), steps=1, compiler_options=FAST)
    assert e.value.field == field


def test_swapped_stage_layers_and_schedule_kind(gpt_search):
    pipe = next(p for p in gpt_search.plans if p.is_pipeline and p.schedule.kind == "1f1b"
                and p.analysis is not None)
    _, w = _read(_edited(pipe, _swap_stage_layers))
    assert [str(x.message).split(" should")[0].split(": ")[-1] for x in w] == [
        "stages[0].layers", "stages[1].layers", "stages[0].ops[0].layer"]
    assert "the stage the operator runs in (stages[1] holds 'embed')" in str(w[2].message)
    _, w = _read(_edited(pipe, lambda d: d["schedule"].update(kind="gpipe")))
    assert len(w) == 1 and "schedule.table is the 1f1b table" in str(w[0].message)
    assert "set schedule.kind to '1f1b'" in str(w[0].message)


def test_swapped_layers_found_against_the_trace_without_an_analysis(gpt_search):
    pipe = next(p for p in gpt_search.plans if p.is_pipeline)
    d = _edited(pipe, _swap_stage_layers)
    d["analysis"] = None  # a file without the analysis, and without operator records
    for st in d["stages"]:
        st["ops"] = []
    plan, w = _read(d)
    assert not w
    view = WorkloadView.of(autoplan.trace(get("gpt", "tiny")), get("gpt", "tiny").config)
    found = workload_contradictions(plan, view)
    assert [c.field for c in found] == ["stages[0].layers", "stages[1].layers"]


def test_model_and_config_are_checked_against_the_workload(mlp_plan):
    wl = get("mlp", "tiny", abstract=False)
    for edit, words in ((lambda d: d.update(model="gpt"), "model should be 'mlp'"),
                        (lambda d: d["config"].update(hidden=128), "config.hidden should be 64")):
        plan, w = _read(_edited(mlp_plan, edit))
        assert not w  # the file alone does not say it
        with pytest.raises(autoplan.PlanMismatchError, match="contradicts the workload: " + words):
            run(plan, wl, steps=1, compiler_options=FAST)


def test_whole_argument_kind_changed_is_found_against_the_workload(mlp_plan):
    def edit(d):
        for i in d["inputs"]:
            if i["arg"] == 1:
                i["kind"] = "parameter"
    plan, _ = _read(_edited(mlp_plan, edit))
    assert plan_contradictions(plan) == []
    with pytest.raises(autoplan.PlanMismatchError, match=r"inputs\[\d+\].kind should be "
                       "'optimizer_state'"):
        run(plan, get("mlp", "tiny", abstract=False), steps=1, compiler_options=FAST)


def test_show_warns_and_launch_refuses_before_any_worker(mlp_plan, tmp_path):
    d = _edited(mlp_plan, lambda d: d["cluster"].update(devices_per_node=16))
    (tmp_path / "p.json").write_text(json.dumps(d))
    env = {"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}
    show = subprocess.run([sys.executable, "-m", "autoplan.cli", "show", "p.json"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert show.returncode == 0
    assert "autoplan: warning: plan file 'p.json': cluster.devices_per_node should be" in show.stderr
    launch = subprocess.run([sys.executable, "-m", "autoplan.cli", "launch", "p.json", "--model",
                             "mlp"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert launch.returncode == 2
    lines = launch.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autoplan: error: launch: the plan contradicts "
                                                   "itself: cluster.devices_per_node")


# ---- non-finite numbers --------------------------------------------------------------------
def _with_inf_batch():
    wl = get("mlp", "tiny", abstract=False)
    params, opt, batch = wl.args
    x = np.array(batch["x"])
    x[0, 0] = np.inf
    return autoplan.Workload(wl.fn, (params, opt, {**batch, "x": x}), name=wl.name,
                             config=wl.config)


@pytest.mark.parametrize("check", [True, False])
def test_non_finite_loss_ends_the_run_and_says_one_device_agrees(mlp_plan, check):
    with pytest.raises(autoplan.NonFiniteError) as e:
        run(mlp_plan, _with_inf_batch(), steps=2, check=check, compiler_options=FAST)
    msg = str(e.value)
    assert "step 0 (of 2): the loss is nan" in msg
    assert "batch['x'] (1 inf)" in msg
    assert "the model's numbers, not the plan's" in msg
    assert "allow_nonfinite=True" in msg


def test_allow_nonfinite_keeps_the_run(mlp_plan):
    rep = run(mlp_plan, _with_inf_batch(), steps=1, compiler_options=FAST, allow_nonfinite=True)
    assert math.isnan(rep.losses[0]) and rep.equivalence.matched
    assert "the model's numbers" in rep.nonfinite
    ok = run(mlp_plan, get("mlp", "tiny", abstract=False), steps=1, compiler_options=FAST)
    assert ok.nonfinite == "" and all(math.isfinite(x) for x in ok.losses)


@pytest.mark.parametrize("kw, words", [(dict(rtol=-1), "rtol should be a finite number >= 0"),
                                       (dict(rtol=math.nan), "Got nan"),
                                       (dict(atol="1e-6"), "atol should be"),
                                       (dict(atol=True), "atol should be"),
                                       (dict(on_step=3), "on_step should be None or a function"),
                                       (dict(allow_nonfinite="no"), "allow_nonfinite should be")])
def test_run_options_are_checked(mlp_plan, kw, words):
    with pytest.raises(autoplan.ExecutionError, match=words):
        run(mlp_plan, get("mlp", "tiny", abstract=False), **kw)


# ---- platforms and the probe ---------------------------------------------------------------
def test_platform_note():
    gpu = Cluster.parse("p3.16xlarge:1")
    assert "emulated CPU" in platform_note(gpu, "cpu", 8)
    assert platform_note(Cluster.parse("cpu:8"), "cpu", 8) is None
    assert platform_note(Cluster.parse("cpu:8"), "cuda", 8) is not None


def test_a_gpu_plan_run_on_cpus_gets_a_note():
    wl = get("mlp", "tiny")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = autoplan.plan(wl, "p3.16xlarge:1", pipeline=False, mesh_shape=(8, 1),
                             baselines=False)
    with pytest.warns(PlatformWarning, match="made for p3.16xlarge:1"):
        rep = run(plan, get("mlp", "tiny", abstract=False), steps=1, compiler_options=FAST)
    assert rep.equivalence.matched


def test_probe_timeout_names_what_the_probe_was_doing():
    import time

    err = f"{_PHASE} {time.time() - 5:.2f} importing JAX\n{_PHASE} {time.time() - 2:.2f} " \
          "loading the workload (calling its function)\n"
    short = _probe_timeout(err, 3, {"model": "wls:workload"})
    assert "the timeout (3 s) ran out in the preflight" in short
    assert "loading the workload (calling its function) for the last 2." in short
    assert "raise timeout=" in short and "did not answer" not in short
    long = _probe_timeout(err, 300, {"model": "wls:workload"})
    assert "the preflight hung" in long and "wls:workload" in long
    jax_stuck = _probe_timeout(f"{_PHASE} {time.time():.2f} importing JAX\n", 300, None)
    assert "importing JAX" in jax_stuck and "import jax" in jax_stuck


@pytest.mark.parametrize("name", ["level_search", "intra_op_search", "solve_ilp", "pipeline_search"])
def test_algorithms_check_memory_budget(name):
    wl = get("mlp", "tiny")
    graph = autoplan.trace(wl)
    cluster = Cluster.parse("cpu:8")
    first = {"level_search": (graph, cluster), "intra_op_search": (graph, cluster),
             "solve_ilp": (graph, cluster.logical_mesh((2, 4))), "pipeline_search": (wl, cluster)}
    with pytest.raises(autoplan.ArgumentError, match="True is not a byte count"):
        getattr(S, name)(*first[name], memory_budget=True)
