"""Profiling the attached devices (autoplan.profile, Cluster.detect, 'autoplan profile') and the
cost model reading a measured profile."""

from __future__ import annotations

import json
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autoplan
from autoplan import Cluster, ClusterError
from autoplan.cli import main
from autoplan.costs._measured import CollectiveTable, ThroughputCurve
from autoplan.costs._mesh import COLLECTIVES
from autoplan.costs._profile import cache_key
from autoplan.search.intra._strategies import compute_time, fusion_context, strategies


@pytest.fixture(scope="module")
def measured() -> Cluster:
    """The quick profile of the 8 emulated devices (the one profile the suite measures)."""
    return autoplan.profile(quick=True, progress=False)


def test_quick_profile_of_the_attached_devices(measured):
    c = measured
    assert (c.name, c.nodes, c.devices_per_node, c.platform) == ("local", 1, 8, "cpu")
    assert c.is_measured and c.quick and c.device_kind == jax.devices()[0].device_kind
    assert c.describe_profile().startswith("measured quick profile of 8 x ")
    assert c.memory_bandwidth > 0 and c.launch_overhead + c.arg_overhead > 0
    assert c.op_overhead >= 0 and c.peak_flops > 0
    # matmul curves for the dtypes the zoo uses, a convolution curve, each fitted
    assert {("matmul", "float32"), ("conv", "float32")} <= {(k.op, k.dtype) for k in c.curves}
    for curve in c.curves:
        assert len(curve.sizes) >= 2 and curve.peak > 0 and curve.half >= 0
    # every collective over every axis of the 2-D meshes of 8 devices (8x1, 4x2, 2x4, 1x8)
    groups = {((8, 1),), ((4, 2),), ((2, 4),), ((4, 1),), ((2, 1),)}
    assert {(t.kind, t.group) for t in c.collectives} == {(k, g) for k in COLLECTIVES
                                                          for g in groups}
    # the JSON round-trips exactly
    assert Cluster.from_json(c.to_json()) == c
    assert json.loads(c.to_json())["schema"] == "autoplan.cluster"


def test_fitted_times_are_monotone_in_size(measured):
    sizes = [2.0 ** (k / 2) for k in range(0, 60)]  # 1 B .. 1 GiB, inside and outside the table
    for t in measured.collectives:
        times = [t.time(b) for b in sizes]
        assert all(b >= a for a, b in zip(times, times[1:])), (t.kind, t.group)
        assert times[0] > 0 and t.alpha >= 0 and t.beta >= 0
    mesh = measured.logical_mesh((2, 4))
    for kind in COLLECTIVES:
        for axes in ([0], [1], [0, 1]):
            times = [mesh.collective_time(kind, b, axes) for b in sizes]
            assert all(b >= a for a, b in zip(times, times[1:])), (kind, axes)
    flops = [10.0 ** (k / 2) for k in range(2, 26)]
    for curve in measured.curves:
        times = [curve.time(f) for f in flops]
        assert all(b >= a for a, b in zip(times, times[1:])), (curve.op, curve.dtype)


def test_profile_rejects_mixed_or_no_devices():
    with pytest.raises(ClusterError, match="non-empty list of JAX devices"):
        autoplan.profile([], progress=False)


def test_detect_profiles_once_then_reads_the_cache(measured, tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOPLAN_CACHE_DIR", str(tmp_path))
    calls = []

    def fake_measure(cls, devices=None, *, quick=False, progress=True):
        calls.append(quick)
        return measured

    monkeypatch.setattr(autoplan.costs._detect, "measured_cluster", fake_measure)
    assert Cluster.detect(quick=True, progress=False) == measured
    assert calls == [True]
    assert (tmp_path / f"{cache_key()}-quick.json").is_file()
    assert Cluster.detect(quick=True) == measured and calls == [True]  # cached
    # 'local' (the CLI form) wants the full profile: measured once, then cached
    assert Cluster.parse("local") == measured and calls == [True, False]
    assert Cluster.parse("local") == measured and calls == [True, False]
    Cluster.detect(refresh=True)
    assert calls == [True, False, False]


def test_a_profile_is_kept_where_detect_reads_it(measured, tmp_path, monkeypatch):
    """autoplan.profile() keeps its measurement in the cache, so Cluster.detect (and
    '--cluster local') of the same devices reads it instead of measuring again (the measuring
    itself is the module's one quick profile, handed back by a stand-in)."""
    monkeypatch.setenv("AUTOPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autoplan.costs._cluster, "measured_cluster",
                        lambda cls, devices=None, *, quick=False, progress=True: measured)
    few = jax.devices()[:2]
    got = autoplan.profile(few, quick=True, progress=False)
    assert got == measured
    assert (tmp_path / f"{cache_key(few)}-quick.json").is_file()
    assert not (tmp_path / f"{cache_key(few)}.json").exists()  # the quick one, not the full

    def no_measuring(*a, **k):
        raise AssertionError("Cluster.detect measured the devices again")

    monkeypatch.setattr(autoplan.costs._detect, "measured_cluster", no_measuring)
    assert Cluster.detect(few, quick=True) == got


def test_cli_profile_then_plan_with_the_file(measured, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(autoplan.costs._cluster, "profile", lambda *a, **k: measured)
    path = tmp_path / "cluster.json"
    assert main(["profile", "--quick", "--no-progress", "-o", str(path)]) == 0
    out = capsys.readouterr().out
    assert "measured quick profile" in out and "all-reduce" in out and str(path) in out
    assert Cluster.from_json(path) == measured
    assert main(["plan", "mlp", "--cluster", str(path), "--pipeline", "no", "--mesh", "8x1",
                 "-o", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out
    assert "measured quick profile of 8 x" in out
    plan = autoplan.Plan.from_json(str(tmp_path / "plan.json"))
    assert plan.cluster == measured
    assert main(["profile", "--cpu-devices", "0"]) == 2
    assert main(["plan", "mlp", "--cluster", str(tmp_path / "nope.json")]) == 2
    assert "cannot read cluster file" in capsys.readouterr().err


# ---- the cost model on a given profile ----------------------------------------------------------

def _given() -> Cluster:
    """A measured profile with round numbers."""
    tables = tuple(CollectiveTable(kind, ((8, 1),), (1e3, 1e6), (1e-4, 1.1e-3), 1e-4, 1e-9)
                   for kind in COLLECTIVES)
    curves = (ThroughputCurve("matmul", "float32", (1e6, 1e8, 1e10), (1e-3, 2e-2, 1.0), 1e10, 1e6),)
    return Cluster("local", 1, 8, 2**30, 1e10, 1e9, 1e9, compute_efficiency=1.0,
                   memory_bandwidth=1e9, op_overhead=5e-6, launch_overhead=2e-4,
                   arg_overhead=1e-5, curves=curves, collectives=tables,
                   profiled="2026-11-25T12:00:00", platform="cpu", device_kind="cpu")


def test_cost_terms_match_hand_values_on_a_given_profile():
    cl = _given()
    mesh = cl.logical_mesh((1, 8))
    m, k, n = 512, 1024, 256
    g = autoplan.trace(lambda a, b: jnp.tanh(a @ b).sum(), jax.ShapeDtypeStruct((m, k), jnp.float32),
                       jax.ShapeDtypeStruct((k, n), jnp.float32))
    dot = next(op for op in g if op.primitive == "dot_general")
    Y = ("y",)
    table = {(s.in_specs, s.out_specs): s for s in strategies(dot, g, mesh)}
    st = table[(((None, Y), (Y, None)), ((None, None),))]
    # compute: the roofline of the measured curve at an eighth of the FLOPs (33.6 MFLOP: linear
    # between the measured 1e6 and 1e8 points) and of the bytes moved, plus the kernel overhead
    f = 2 * m * k * n / 8
    t_flops = 1e-3 + (2e-2 - 1e-3) * (f - 1e6) / (1e8 - 1e6)
    q = (m * k + k * n) * 4 / 8 + m * n * 4
    assert st.compute_time == pytest.approx(max(t_flops, q / 1e9) + 5e-6)
    # the all-reduce of the (replicated) result, 512 KiB: interpolated in the measured table
    (c,) = st.comm
    b = m * n * 4
    assert c.time == pytest.approx(1e-4 + (1.1e-3 - 1e-4) * (b - 1e3) / (1e6 - 1e3))
    # beyond the table: the fit alpha + beta B scaled to meet the last measured point
    assert mesh.collective_time("all-reduce", 4e6, [1]) == pytest.approx(
        1.1e-3 * (1e-4 + 1e-9 * 4e6) / (1e-4 + 1e-9 * 1e6))
    # a loop-fusible operator (tanh) inside the reduction's kernel: no write, no overhead
    tanh = next(op for op in g if op.primitive == "tanh")
    assert compute_time(tanh, mesh, [(None, None)], [(None, None)], 1,
                        (False, (False,), False)) == pytest.approx(
        max(m * n / cl.peak_flops, 0.0))


def test_plan_adds_launch_and_combined_latency_once():
    """A data-parallel step on a given profile: the gradient all-reduces are combined (one
    latency), and the step's launch is counted once."""
    cl = _given()

    def step(w, x):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w["a"]) @ w["b"]))(w)
        return loss, jax.tree.map(lambda p, q: p - 0.1 * q, w, grad)

    w = {"a": jax.ShapeDtypeStruct((64, 64), jnp.float32),
         "b": jax.ShapeDtypeStruct((64, 8), jnp.float32)}
    g = autoplan.trace(step, w, jax.ShapeDtypeStruct((64, 64), jnp.float32))
    from autoplan.search.intra._intra import intra_op_search  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = intra_op_search(g, cl, (8, 1), pins={r"^x$": jax.sharding.PartitionSpec("x"),
                                                  r"^w\[": jax.sharding.PartitionSpec()})
    p = res.plan.predicted
    sol = res.solution
    grads = [c for i, c in sol.comms if c.where == "grad-sync" and c.kind == "all-reduce"]
    assert len(grads) >= 2
    mesh = cl.logical_mesh((8, 1))
    latency = mesh.latency("all-reduce", [0])
    assert latency == pytest.approx(1e-4)
    # each combinable all-reduce (the gradients', the loss's) was charged its transfer and 1/k
    # of the latency (k: the operators that may issue one); the plan pays one latency in all
    ctx = fusion_context(g)
    combined = [(i, c) for i, c in sol.comms
                if i is not None and c.where != "reshard" and ctx[i][2] < 1]
    assert {c.kind for _, c in combined} == {"all-reduce"} and len(combined) >= 3
    share = sum(ctx[i][2] for i, _ in combined)
    assert 0 < share <= 1
    for i, c in combined:
        full = mesh.collective_time("all-reduce", c.bytes, [0])
        transfer = mesh.collective_time("all-reduce", c.bytes, [0], latency=False)
        assert c.time == pytest.approx(transfer + ctx[i][2] * (full - transfer))
    assert p.comm_time == pytest.approx(sol.comm_time + (1 - share) * latency)
    assert p.compute_time == pytest.approx(sol.compute_time + cl.step_overhead(len(g.inputs)))
    assert p.step_time == pytest.approx(p.compute_time + p.comm_time)


# ---- a user's own train step on the profiled devices ------------------------------------------

def test_plain_jax_step_searched_on_the_profile_runs_and_matches(measured):
    """Not a zoo model: a two-layer MLP with SGD written in plain JAX, searched on the measured
    profile, run on the 8 devices and checked against one device."""
    from autoplan.exec import run  # noqa: PLC0415

    def train_step(params, batch):
        def loss_fn(p):
            h = jax.nn.relu(batch["x"] @ p["w1"] + p["b1"])
            return jnp.mean((h @ p["w2"] - batch["y"]) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return loss, jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)

    rng = np.random.default_rng(0)
    params = {"w1": rng.normal(size=(32, 64)).astype(np.float32) * 0.1,
              "b1": np.zeros(64, np.float32),
              "w2": rng.normal(size=(64, 4)).astype(np.float32) * 0.1}
    batch = {"x": rng.normal(size=(64, 32)).astype(np.float32),
             "y": rng.normal(size=(64, 4)).astype(np.float32)}
    g = autoplan.trace(train_step, params, batch, name="user_mlp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = autoplan.search(g, measured, pipeline=False)
    best = result.best
    assert best.cluster == measured and math.isfinite(best.predicted.step_time)
    assert "measured quick profile" in best.summary()

    class Step:
        fn = staticmethod(train_step)
        args = (params, batch)
        arg_kinds = ("parameter", "batch")
        name = "user_mlp"

    rep = run(best, Step(), steps=1, check=True)
    assert rep.equivalence.matched
