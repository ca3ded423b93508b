"""The datasheet presets: each named cluster's fields, with the source of every number.

A preset is one node of a known machine (``p3.16xlarge``, ``v100-32g-100gbe``, ``dgx-a100``,
``dgx-h100``, ``cpu``): peak FLOP/s per precision, memory, memory bandwidth, link bandwidths and
latencies from the vendors' datasheets, and, for the V100 boards, the NVLink links between the
devices. :data:`PRESET_FIELDS` holds them as plain fields; :mod:`autoplan.costs._cluster` makes
them the :data:`~autoplan.costs._cluster.PRESETS` clusters that ``Cluster.preset`` and
``Cluster.parse`` read.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PRESET_FIELDS", "GiB"]

GiB = 1024**3

_V100 = "NVIDIA Tesla V100 datasheet (SXM2)"
_V100_RATES = (("float64", 7.8e12), ("float32", 15.7e12), ("float16", 125e12))
_V100_SOURCES = (("peak_rates", f"{_V100}: FP64 7.8, FP32 15.7, tensor (FP16) 125 TFLOP/s; no "
                                "TF32 or BF16 (XLA runs float32 dots at the FP32 rate)"),
                 ("memory_bandwidth", f"{_V100}: HBM2 900 GB/s"),
                 ("intra_bandwidth", f"{_V100}: NVLink 300 GB/s per GPU (both directions); "
                                     "150 GB/s used, one direction"),
                 ("saturation", "autoplan.costs._device_models.SATURATION: measured on an H100 and an H200 "
                                "(docs/profiles/), scaled to these peaks"))
#: the NVLink links of an 8 x V100 SXM2 board, the hybrid cube-mesh of NVIDIA's DGX-1 (NVIDIA
#: DGX-1 System Architecture white paper, WP-08437-001: six NVLinks per V100, each 25 GB/s per
#: direction; two fully connected halves 0-3 and 4-7 and links 0-4, 1-5, 2-6, 3-7, some pairs
#: with two links, as its ``nvidia-smi topo -m`` lists them: NV1/NV2 per pair)
_DGX1_NVLINKS = ((0, 1, 1), (0, 2, 1), (0, 3, 2), (0, 4, 2), (1, 2, 2), (1, 3, 1), (1, 5, 2),
                 (2, 3, 2), (2, 6, 1), (3, 7, 1), (4, 5, 1), (4, 6, 1), (4, 7, 2), (5, 6, 2),
                 (5, 7, 1), (6, 7, 2))
_V100_LINKS = {"nvlinks": _DGX1_NVLINKS, "link_bandwidth": 25e9, "pcie_bandwidth": 16e9}
_V100_LINK_SOURCES = (
    ("nvlinks", "NVIDIA DGX-1 System Architecture white paper: hybrid cube-mesh of 8 V100 SXM2 "
                "(the board of p3.16xlarge), 6 NVLinks per GPU"),
    ("link_bandwidth", f"{_V100}: NVLink 2.0, 25 GB/s per link and direction (300 GB/s over "
                       "6 links, both directions)"),
    ("pcie_bandwidth", f"{_V100}: PCIe Gen3 32 GB/s (both directions)"))
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (SXM5, dense rates)"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB, dense rates)"


def _v100_node(memory_gb: int, network_bits: float, inter_latency: float,
               network_source: str) -> dict[str, Any]:
    """The fields of a node of 8 V100 SXM2 (the DGX-1 board: NVLink cube-mesh, 900 GB/s HBM2)
    with ``memory_gb`` GB each, joined to the other nodes by ``network_bits`` bit/s."""
    return dict(
        nodes=1, devices_per_node=8, device_memory=memory_gb * GiB, peak_flops=125e12,
        intra_bandwidth=150e9, inter_bandwidth=network_bits / 8, intra_latency=5e-6,
        inter_latency=inter_latency, device_kind=f"V100-SXM2-{memory_gb}GB",
        memory_bandwidth=900e9, peak_rates=_V100_RATES, saturation="gpu", **_V100_LINKS,
        sources=_V100_SOURCES + _V100_LINK_SOURCES + (
            ("device_memory", f"{_V100}: {memory_gb} GB HBM2"),
            ("inter_bandwidth", network_source)))


#: each preset's :class:`~autoplan.costs._cluster.Cluster` fields but its name (its key), one node
#: (``Cluster.preset`` sets the node count)
PRESET_FIELDS: dict[str, dict[str, Any]] = {
    # AWS p3.16xlarge (Alpa's testbed): 8 x V100 16 GB (900 GB/s HBM2), NVLink, 25 Gbps between
    # nodes.
    "p3.16xlarge": _v100_node(16, 25e9, 3e-5,
                              "AWS EC2 P3 instance types: p3.16xlarge, 25 Gbps network"),
    # TAPAS / TePDist testbed: 8 x V100 32 GB, NVLink, 100 Gbps between nodes.
    "v100-32g-100gbe": _v100_node(32, 100e9, 2e-5,
                                  "TAPAS and TePDist papers' testbed: 100 Gbps between nodes"),
    # NVIDIA DGX A100: 8 x A100 80 GB (2.04 TB/s HBM2e), NVLink 300 GB/s per direction, 8 x 200
    # Gbps InfiniBand.
    "dgx-a100": dict(
        nodes=1, devices_per_node=8, device_memory=80e9, peak_flops=312e12,
        intra_bandwidth=300e9, inter_bandwidth=8 * 200e9 / 8, intra_latency=3e-6,
        inter_latency=1e-5, device_kind="A100-SXM4-80GB", memory_bandwidth=2.039e12,
        peak_rates=(("float64", 9.7e12), ("float32", 19.5e12), ("tf32", 156e12),
                    ("float16", 312e12), ("bfloat16", 312e12)),
        float32_dot="tf32", saturation="gpu",
        sources=(("peak_rates", f"{_A100}: FP64 9.7, FP32 19.5, TF32 156, BF16/FP16 312 "
                                "TFLOP/s; no FP8"),
                 ("memory_bandwidth", f"{_A100}: HBM2e 2,039 GB/s"),
                 ("device_memory", f"{_A100}: 80 GB"),
                 ("intra_bandwidth", f"{_A100}: NVLink 600 GB/s per GPU (both directions)"),
                 ("inter_bandwidth", "NVIDIA DGX A100 datasheet: 8 x 200 Gb/s HDR InfiniBand"),
                 ("float32_dot", "JAX/XLA default matmul precision on Ampere: TF32"),
                 ("saturation", "autoplan.costs._device_models.SATURATION: measured on an H100 and an H200 "
                                "(docs/profiles/), scaled to these peaks"))),
    # NVIDIA DGX H100: 8 x H100 80 GB (3.35 TB/s HBM3), NVLink 450 GB/s per direction, 8 x 400 Gbps
    # InfiniBand.
    "dgx-h100": dict(
        nodes=1, devices_per_node=8, device_memory=80e9, peak_flops=989.4e12,
        intra_bandwidth=450e9, inter_bandwidth=8 * 400e9 / 8, intra_latency=3e-6,
        inter_latency=1e-5, device_kind="H100-SXM5-80GB", memory_bandwidth=3.35e12,
        peak_rates=(("float64", 33.5e12), ("float32", 66.9e12), ("tf32", 494.7e12),
                    ("float16", 989.4e12), ("bfloat16", 989.4e12), ("float8", 1978.9e12)),
        float32_dot="tf32", saturation="gpu",
        sources=(("peak_rates", f"{_H100}: FP64 33.5, FP32 66.9, TF32 494.7, BF16/FP16 989.4, "
                                "FP8 1,978.9 TFLOP/s"),
                 ("memory_bandwidth", f"{_H100}: HBM3 3.35 TB/s"),
                 ("device_memory", f"{_H100}: 80 GB"),
                 ("intra_bandwidth", f"{_H100}: NVLink 900 GB/s per GPU (both directions)"),
                 ("inter_bandwidth", "NVIDIA DGX H100 datasheet: 8 x 400 Gb/s ConnectX-7"),
                 ("float32_dot", "JAX/XLA default matmul precision on Hopper: TF32"),
                 ("saturation", "autoplan.costs._device_models.SATURATION: measured on this device and an "
                                "H200 (docs/profiles/)"))),
    # Emulated CPU devices (jax_num_cpu_devices): one host, shared memory. Uncalibrated round
    # numbers; profile the machine (autoplan.profile) for costs that match it.
    "cpu": dict(nodes=1, devices_per_node=8, device_memory=2 * GiB, peak_flops=5e10,
                intra_bandwidth=5e9, inter_bandwidth=5e9, intra_latency=2e-5,
                inter_latency=2e-5, compute_efficiency=1.0, device_kind="cpu",
                memory_bandwidth=2e10),
}
