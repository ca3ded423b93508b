"""Clusters, logical meshes and the collective cost formulas."""

import pytest

from autoplan import Cluster, ClusterError
from autoplan._cluster import PRESETS, send_recv_time


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


@pytest.mark.parametrize("spec, match", [
    ("p4d:2", "unknown preset 'p4d'"),
    ("p3.16xlarge:0", "positive node count"),
    ("p3.16xlarge:-1", "positive node count"),
    ("p3.16xlarge:two", "'two'"),
    ("p3.16xlarge:2:3", "name:nodes"),
    ("cpu:", "positive device count. Got '' in 'cpu:'"),  # not read as the preset's 8 devices
    ("p3.16xlarge:", "positive node count. Got ''"),
    (42, "name:nodes"),
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


def test_mesh_axes_use_the_right_links():
    c = Cluster.parse("p3.16xlarge:2")
    m = c.logical_mesh((2, 8))
    # axis 1 inside a node: NVLink; axis 0 across nodes: the NIC shared by the 8 column groups
    assert m.beta[1] == pytest.approx(1 / 150e9)
    assert m.beta[0] == pytest.approx(8 / (25e9 / 8))
    assert m.alpha == (c.inter_latency, c.intra_latency)
    one = Cluster.parse("p3.16xlarge:1").logical_mesh((2, 4))
    assert one.beta == (pytest.approx(1 / 150e9),) * 2


def test_collective_formulas_match_hand_values():
    c = Cluster("t", 1, 4, 1e9, 1e12, intra_bandwidth=1e9, inter_bandwidth=1e8,
                intra_latency=1e-5, inter_latency=1e-4)
    m = c.logical_mesh((4,))
    B = 1e6
    assert m.all_gather(B, [0]) == pytest.approx(1e-5 + 1e-9 * 3 / 4 * B)
    assert m.all_reduce(B, [0]) == pytest.approx(1e-5 + 1e-9 * 2 * 3 / 4 * B)
    assert m.reduce_scatter(B, [0]) == pytest.approx(1e-5 + 1e-9 * 3 / 4 * B)
    assert m.all_to_all(B, [0]) == pytest.approx(1e-5 + 1e-9 * 3 / 16 * B)
    assert m.collective_time("send-recv", B, [0]) == pytest.approx(1e-5 + 1e-9 * B)
    assert m.all_reduce(0, [0]) == 0.0
    # two axes: hierarchical, inner axis first, the outer axis sees the scattered bytes
    m2 = Cluster("t", 2, 2, 1e9, 1e12, 1e9, 1e8, 1e-5, 1e-4).logical_mesh((2, 2))
    inner = 1e-5 + 1e-9 * 2 * 0.5 * B
    outer = 1e-4 + (2 / 1e8) * 2 * 0.5 * (B / 2)
    assert m2.all_reduce(B, [0, 1]) == pytest.approx(inner + outer)
    assert send_recv_time(c, B, cross_node=True) == pytest.approx(1e-4 + B / 1e8)


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


def test_compute_time():
    c = Cluster("t", 1, 8, 1e9, 100e12, 1e9, 1e9, compute_efficiency=0.5)
    assert c.compute_time(100e12, devices=2) == pytest.approx(1.0)
