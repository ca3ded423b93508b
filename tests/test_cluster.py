"""Clusters, logical meshes, the collective cost formulas and measured profiles."""

import json

import pytest

from autoplan import Cluster, ClusterError
from autoplan.costs._cluster import PRESETS
from autoplan.costs._fit import fit_line
from autoplan.costs._measured import CollectiveTable, ThroughputCurve, canonical_group
from autoplan.costs._mesh import send_recv_time


def test_presets_and_parse():
    c = Cluster.parse("p3.16xlarge:8")
    assert (c.name, c.nodes, c.devices_per_node, c.num_devices) == ("p3.16xlarge", 8, 8, 64)
    assert c.device_memory == 16 * 2**30 and c.peak_flops == 125e12
    assert Cluster.preset("dgx-h100", nodes=16).num_devices == 128
    assert Cluster.parse("v100-32g-100gbe").nodes == 1
    cpu = Cluster.parse("cpu:4")
    assert (cpu.nodes, cpu.devices_per_node, cpu.spec) == (1, 4, "cpu:4")
    assert set(PRESETS) >= {"p3.16xlarge", "v100-32g-100gbe", "dgx-h100", "cpu"}
    assert Cluster.from_dict(c.to_dict()) == c
    # presets are datasheet profiles: peak, efficiency and memory bandwidth, nothing measured
    for p in PRESETS.values():
        assert p.memory_bandwidth > 0 and not p.is_measured and not p.curves
    assert c.describe_profile() == "datasheet preset p3.16xlarge (V100-SXM2-16GB)"


@pytest.mark.parametrize("spec, match", [
    ("p4d:2", "unknown preset 'p4d'"),
    ("p3.16xlarge:0", "positive node count"),
    ("p3.16xlarge:-1", "positive node count"),
    ("p3.16xlarge:two", "'two'"),
    ("p3.16xlarge:2:3", "name:nodes"),
    ("cpu:", "positive device count. Got '' in 'cpu:'"),  # not read as the preset's 8 devices
    ("p3.16xlarge:", "positive node count. Got ''"),
    (42, "name:nodes"),
    ("missing.json", "cannot read cluster file 'missing.json'"),
])
def test_bad_cluster_specs(spec, match):
    with pytest.raises(ClusterError, match=match):
        Cluster.parse(spec)


def test_bad_counts():
    with pytest.raises(ClusterError, match="nodes should be a positive integer. Got 0"):
        Cluster.preset("p3.16xlarge", nodes=0)
    with pytest.raises(ClusterError, match="devices_per_node"):
        Cluster("x", 1, -2, 1e9, 1e12, 1e9, 1e9)
    with pytest.raises(ClusterError, match="needs 32 devices"):
        Cluster.parse("p3.16xlarge:2").logical_mesh((4, 8))
    with pytest.raises(ClusterError, match="memory_bandwidth should be a non-negative number"):
        Cluster("x", 1, 2, 1e9, 1e12, 1e9, 1e9, memory_bandwidth=-1.0)


def test_mesh_axes_use_the_right_links():
    c = Cluster.parse("p3.16xlarge:2")
    m = c.logical_mesh((2, 8))
    # axis 1 inside a node: NVLink; axis 0 across nodes: the NIC shared by the 8 column groups
    assert m.beta[1] == pytest.approx(1 / 150e9)
    assert m.beta[0] == pytest.approx(8 / (25e9 / 8))
    assert m.alpha == (c.inter_latency, c.intra_latency)
    assert m.crosses == (True, False)
    # inside a V100 node an axis runs over the NVLinks among its groups' devices (DGX-1's
    # hybrid cube-mesh): the 4-GPU halves have 4 links per GPU among them, the pairs (0,4),
    # (1,5) two links and (2,6), (3,7) one, and the slowest group decides
    one = Cluster.parse("p3.16xlarge:1").logical_mesh((2, 4))
    assert one.beta == (pytest.approx(1 / 25e9), pytest.approx(1 / 100e9))
    assert Cluster.parse("p3.16xlarge:1").logical_mesh((4, 2)).beta == (
        pytest.approx(1 / 50e9), pytest.approx(1 / 25e9))
    # a whole node, and an NVSwitch node's any group, at the full per-GPU NVLink rate
    assert Cluster.parse("p3.16xlarge:1").logical_mesh((8,)).beta == (pytest.approx(1 / 150e9),)
    h100 = Cluster.parse("dgx-h100:1")
    assert h100.logical_mesh((4, 2)).beta == (pytest.approx(1 / h100.intra_bandwidth),) * 2


def test_group_bandwidth_follows_the_links():
    c = Cluster("t", 1, 4, 1e9, 1e12, intra_bandwidth=60e9, inter_bandwidth=1e9,
                nvlinks=((0, 1, 2), (1, 2, 1), (2, 3, 2), (3, 0, 1)), link_bandwidth=20e9,
                pcie_bandwidth=10e9)
    assert c.group_bandwidth((0, 1)) == pytest.approx(40e9)
    assert c.group_bandwidth((1, 2)) == pytest.approx(20e9)
    assert c.group_bandwidth(range(4)) == pytest.approx(60e9)  # 3 links, capped at the rate
    assert c.group_bandwidth((0, 2)) == pytest.approx(10e9)  # no link: PCIe
    assert Cluster.from_dict(c.to_dict()) == c
    with pytest.raises(ClusterError, match="nvlinks"):
        Cluster("t", 1, 4, 1e9, 1e12, 1e9, 1e9, nvlinks=((1, 1, 1),), link_bandwidth=1e9)


def test_collective_formulas_match_hand_values():
    c = Cluster("t", 1, 4, 1e9, 1e12, intra_bandwidth=1e9, inter_bandwidth=1e8,
                intra_latency=1e-5, inter_latency=1e-4)
    m = c.logical_mesh((4,))
    B = 1e6
    assert m.all_gather(B, [0]) == pytest.approx(1e-5 + 1e-9 * 3 / 4 * B)
    assert m.all_reduce(B, [0]) == pytest.approx(1e-5 + 1e-9 * 2 * 3 / 4 * B)
    assert m.reduce_scatter(B, [0]) == pytest.approx(1e-5 + 1e-9 * 3 / 4 * B)
    # B of an all-to-all is each device's buffer: it keeps 1/n and sends the rest
    assert m.all_to_all(B, [0]) == pytest.approx(1e-5 + 1e-9 * 3 / 4 * B)
    assert m.collective_time("send-recv", B, [0]) == pytest.approx(1e-5 + 1e-9 * B)
    assert m.all_reduce(0, [0]) == 0.0
    # without the latency: what a collective combined with others adds
    assert m.collective_time("all-reduce", B, [0], latency=False) == pytest.approx(1e-9 * 1.5 * B)
    assert m.latency("all-reduce", [0]) == pytest.approx(1e-5)
    # two axes: hierarchical, inner axis first; an all-reduce's outer axis sees the scattered
    # bytes, an all-gather's inner axis gathers the smaller parts
    m2 = Cluster("t", 2, 2, 1e9, 1e12, 1e9, 1e8, 1e-5, 1e-4).logical_mesh((2, 2))
    inner = 1e-5 + 1e-9 * 2 * 0.5 * B
    outer = 1e-4 + (2 / 1e8) * 2 * 0.5 * (B / 2)
    assert m2.all_reduce(B, [0, 1]) == pytest.approx(inner + outer)
    assert m2.all_gather(B, [0, 1]) == pytest.approx(1e-5 + 1e-9 * 0.5 * B / 2
                                                     + 1e-4 + (2 / 1e8) * 0.5 * B)
    assert send_recv_time(c, B, cross_node=True) == pytest.approx(1e-4 + B / 1e8)
    with pytest.raises(ClusterError, match="kind should be one of"):
        m.collective_time("broadcast", B, [0])


def test_tapas_gamma_and_epsilon():
    c = Cluster("t", 1, 4, 1e9, 1e12, 1e9, 1e8, intra_latency=0.0, gamma=0.5,
                epsilon=(("all-reduce", 0.8),))
    m = c.logical_mesh((4,))
    base = 1e-9 * 2 * 3 / 4 * 1e6
    assert m.all_reduce(1e6, [0]) == pytest.approx(base * 0.8)
    assert m.all_reduce(1e6, [0], backward=True) == pytest.approx(base * 0.8 * 0.5)
    assert m.all_gather(1e6, [0]) == pytest.approx(1e-9 * 3 / 4 * 1e6)
    with pytest.raises(ClusterError, match="gamma"):
        Cluster("t", 1, 4, 1e9, 1e12, 1e9, 1e8, gamma=0.0)


def test_compute_time_roofline_parts():
    c = Cluster("t", 1, 8, 1e9, 100e12, 1e9, 1e9, compute_efficiency=0.5, memory_bandwidth=1e12)
    assert c.compute_time(100e12, devices=2) == pytest.approx(1.0)
    assert c.flop_time("matmul", 50e12, "float32") == pytest.approx(1.0)  # no curve: peak x eff
    assert c.memory_time(2e12) == pytest.approx(2.0)
    assert Cluster("t", 1, 8, 1e9, 1e12, 1e9, 1e9).memory_time(1e9) == 0.0  # no bandwidth given
    c2 = Cluster("t", 1, 8, 1e9, 1e12, 1e9, 1e9, launch_overhead=1e-4, arg_overhead=1e-5)
    assert c2.step_overhead(10) == pytest.approx(2e-4)


# ---- measured tables --------------------------------------------------------------------------

def test_fit_line_and_group_geometry():
    a, b = fit_line([1e3, 1e4, 1e5, 1e6], [1e-4 + 1e-9 * x for x in (1e3, 1e4, 1e5, 1e6)])
    assert (a, b) == (pytest.approx(1e-4), pytest.approx(1e-9))
    assert fit_line([1.0, 2.0], [5.0, 5.0]) == (pytest.approx(5.0), pytest.approx(0.0, abs=1e-12))
    assert canonical_group([2, 4], [4, 1]) == ((8, 1),)
    assert canonical_group([4], [2]) == ((4, 2),)
    assert canonical_group([2, 2], [4, 1]) == ((2, 1), (2, 4))  # not one run of devices


def test_collective_table_interpolates_inside_and_fits_outside():
    t = CollectiveTable.from_measurements("all-reduce", [(8, 1)], [1e6, 1e3, 1e4],
                                          [3e-3, 2e-4, 3e-4])
    assert t.nbytes == (1e3, 1e4, 1e6) and t.size == 8
    assert t.time(1e3) == pytest.approx(2e-4)
    assert t.time(5.5e3) == pytest.approx(2.5e-4)  # halfway between the first two points
    # outside: the fit alpha + beta B, scaled to meet the nearest measured point
    a, b = t.alpha, t.beta
    assert t.time(4e6) == pytest.approx(3e-3 * (a + b * 4e6) / (a + b * 1e6))
    assert t.time(10.0) == pytest.approx(2e-4 * (a + b * 10) / (a + b * 1e3))
    # noisy measurements are made non-decreasing; the interpolation is monotone
    noisy = CollectiveTable.from_measurements("all-gather", [(4, 1)], [1e3, 1e4, 1e5],
                                              [3e-4, 2e-4, 5e-4])
    assert noisy.seconds == (3e-4, 3e-4, 5e-4)
    sizes = [10 ** (k / 4) for k in range(4, 32)]
    times = [noisy.time(s) for s in sizes]
    assert times == sorted(times)


def test_throughput_curve_is_an_efficiency_by_size():
    c = ThroughputCurve.from_measurements("matmul", "float32", [1e6, 1e7, 1e8, 1e9],
                                          [2e-5, 1.1e-4, 1.01e-3, 1.001e-2])
    assert c.peak == pytest.approx(1e11, rel=0.02)
    assert c.time(1e8) == pytest.approx(1.01e-3)
    assert c.efficiency(1e6, 1e11) < c.efficiency(1e8, 1e11) <= 1.0


def _measured(**kw):
    tables = (
        CollectiveTable("all-reduce", ((8, 1),), (1e3, 1e6), (2e-4, 2e-3), 1.9e-4, 1.8e-9),
        CollectiveTable("all-reduce", ((4, 1),), (1e3, 1e6), (1e-4, 1e-3), 0.9e-4, 0.9e-9),
        CollectiveTable("all-reduce", ((2, 4),), (1e3, 1e6), (5e-5, 6e-4), 4.5e-5, 0.55e-9),
        CollectiveTable("all-gather", ((8, 1),), (1e3, 1e6), (1e-4, 1e-3), 0.9e-4, 0.9e-9),
        CollectiveTable("send-recv", ((8, 1),), (1e3, 1e6), (1e-4, 4e-4), 1e-4, 3e-10),
    )
    curves = (ThroughputCurve("matmul", "float32", (1e6, 1e9), (1e-4, 1e-1), 1e10, 0.0),)
    return Cluster("local", 1, 8, 2**30, 1e10, 1e9, 1e9, compute_efficiency=1.0,
                   memory_bandwidth=1e9, op_overhead=2e-6, launch_overhead=1e-4,
                   arg_overhead=1e-5, curves=curves, collectives=tables,
                   profiled="2026-11-25T12:00:00", platform="cpu", device_kind="cpu", **kw)


def test_measured_cluster_looks_up_tables_by_group():
    c = _measured()
    m = c.logical_mesh((2, 4))  # axis 0: 2 devices 4 apart; axis 1: 4 neighbours
    assert m.collective_time("all-reduce", 1e3, [1]) == pytest.approx(1e-4)
    assert m.collective_time("all-reduce", 1e3, [0]) == pytest.approx(5e-5)
    # both axes form the 8-device group, measured as one
    assert m.collective_time("all-reduce", 1e3, [0, 1]) == pytest.approx(2e-4)
    # the latency part is the table's fitted alpha; the rest is the transfer
    assert m.collective_time("all-reduce", 1e6, [1], latency=False) == pytest.approx(1e-3 - 0.9e-4)
    # a kind or group never measured falls back to the alpha-beta formula of the link
    assert m.collective_time("all-to-all", 1e3, [1]) == pytest.approx(
        m.alpha[1] + m.beta[1] * 3 / 4 * 1e3)
    # the mesh's per-axis link: the all-gather table's fit, per byte moved
    m8 = c.logical_mesh((1, 8))
    assert m8.alpha[1] == pytest.approx(0.9e-4) and m8.beta[1] == pytest.approx(0.9e-9 / (7 / 8))
    assert send_recv_time(c, 1e3, cross_node=False) == pytest.approx(1e-4)
    assert c.flop_time("matmul", 1e6, "bfloat16") == pytest.approx(1e-4)  # float32's curve
    assert c.flop_time("conv", 1e9, "float32") == pytest.approx(1e-1)  # matmul's curve
    assert c.describe_profile() == "measured profile of 8 x cpu (cpu) on 2026-11-25 12:00 UTC"


def test_json_round_trip_and_files(tmp_path):
    c = _measured(quick=True)
    assert Cluster.from_json(c.to_json()) == c
    path = tmp_path / "cluster.json"
    c.to_json(path)
    assert json.loads(path.read_text())["schema"] == "autoplan.cluster"
    assert Cluster.parse(str(path)) == c
    assert Cluster.parse(f"{path}:2").nodes == 2
    assert Cluster.from_json(path).describe_profile().startswith("measured quick profile")
    # a cluster dict written before profiles existed still reads
    old = {k: v for k, v in Cluster.preset("p3.16xlarge").to_dict().items()
           if k not in ("memory_bandwidth", "op_overhead", "launch_overhead", "arg_overhead",
                        "curves", "collectives", "profiled", "platform", "quick")}
    assert Cluster.from_dict(old).memory_bandwidth == 0.0
    with pytest.raises(ClusterError, match="unknown field"):
        Cluster.from_dict({**old, "warp_drive": 1})
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ClusterError, match="not valid JSON"):
        Cluster.parse(str(tmp_path / "bad.json"))
    (tmp_path / "plan.json").write_text(json.dumps({"schema": "autoplan.plan"}))
    with pytest.raises(ClusterError, match="not an autoplan cluster"):
        Cluster.from_json(tmp_path / "plan.json")


@pytest.mark.parametrize("name, kind, bandwidth", [
    ("nvidia-h100-80gb-1.json", "NVIDIA H100 80GB HBM3", (2e12, 3.5e12)),  # HBM3
    ("nvidia-h200-1.json", "NVIDIA H200", (3e12, 4.8e12)),  # HBM3e
])
def test_the_recorded_gpu_profiles_cost_plans(name, kind, bandwidth):
    """docs/profiles holds profiles measured on an NVIDIA H100 and an H200 (``autoplan
    profile``, full): each reads on any machine and a search costs plans on it, faster than on
    the emulated CPU devices."""
    from pathlib import Path

    import autoplan
    from autoplan import models

    path = Path(__file__).resolve().parents[1] / "docs" / "profiles" / name
    gpu = Cluster.parse(str(path))
    assert (gpu.platform, gpu.device_kind, gpu.num_devices) == ("gpu", kind, 1)
    assert gpu.profiled and not gpu.quick
    # the streaming bandwidth, measured past the last-level cache (50 MB on both)
    assert bandwidth[0] < gpu.memory_bandwidth < bandwidth[1]
    assert gpu.compute_time(1e13) < 1e13 / 300e12  # TF32 matmuls: above 300 TFLOP/s when large
    # a step big enough that compute, not the launch, decides (shapes only: nothing allocated)
    w = models.get("gpt", "tiny", batch=8, seq_len=512, hidden=1024, heads=16, layers=2)
    on_gpu = autoplan.search(w, gpu, pipeline=False, cache=False).best
    on_cpu = autoplan.search(w, "cpu:1", pipeline=False, cache=False).best
    assert kind in on_gpu.summary()
    assert on_gpu.predicted.step_time * 20 < on_cpu.predicted.step_time
