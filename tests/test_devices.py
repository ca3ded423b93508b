"""Device models of the datasheet presets (autoplan.costs._device_models, Cluster.peak / flop_time)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan import Cluster
from autoplan.costs._cluster import PRESETS
from autoplan.costs._device_models import SATURATION, precision, saturated_time, saturation_from_profiles

PROFILES = Path(__file__).resolve().parents[1] / "docs" / "profiles"
GPU_PRESETS = [n for n, c in PRESETS.items() if c.saturation]


def test_saturation_table_is_what_the_recorded_profiles_give():
    assert saturation_from_profiles(PROFILES) == SATURATION


def test_v100_charges_float32_matmuls_the_float32_rate():
    v100 = Cluster.preset("p3.16xlarge")
    w = 1e12  # a large matmul: saturated
    t32, t16 = v100.flop_time("matmul", w, "float32"), v100.flop_time("matmul", w, "float16")
    assert w / t32 <= 15.7e12 and w / t32 > 0.85 * 15.7e12
    assert w / t16 <= 125e12 and w / t16 > 0.75 * 125e12
    assert t32 > 6 * t16
    # no TF32 and no BF16 tensor cores on Volta: both run at the float32 rate
    assert v100.peak("matmul", "float32") == ("float32", 15.7e12)
    assert v100.peak("matmul", "bfloat16") == ("float32", 15.7e12)
    assert v100.flop_time("conv", w, "float32") > 7 * v100.flop_time("conv", w, "float16")


def test_ampere_and_hopper_run_float32_dots_in_tf32():
    for name, tf32 in (("dgx-h100", 494.7e12), ("dgx-a100", 156e12)):
        c = Cluster.preset(name)
        assert c.peak("matmul", "float32") == ("tf32", tf32)
        assert c.peak("conv", "float32") == ("tf32", tf32)
        # elementwise arithmetic runs on the vector units
        assert c.peak("elementwise", "float32")[0] == "float32"
        assert c.peak("elementwise", "float32")[1] < tf32 / 5
    h100 = Cluster.preset("dgx-h100")
    assert h100.peak("matmul", "float8_e4m3fn") == ("float8", 1978.9e12)
    assert Cluster.preset("dgx-a100").peak("matmul", "float8_e5m2")[0] == "float16"  # no FP8
    assert precision("int8", "matmul", "tf32") == "tf32"


def test_saturation_grows_with_size_towards_the_measured_fraction():
    h100 = Cluster.preset("dgx-h100")
    eff = [w / h100.flop_time("matmul", w, "bfloat16") / 989.4e12 for w in (1e8, 1e10, 1e12)]
    assert eff[0] < eff[1] < eff[2] < 1.0
    assert eff[0] < 0.2 and eff[2] > 0.8
    # the same fraction of each device's peak at the same ideal time: the curve scaled
    v100 = Cluster.preset("p3.16xlarge")
    for w in (1e8, 1e10, 1e12):
        e_h = w / h100.flop_time("matmul", w, "bfloat16") / 989.4e12
        e_v = (w * 125 / 989.4) / v100.flop_time("matmul", w * 125 / 989.4, "float16") / 125e12
        assert e_v == pytest.approx(e_h)
    # streaming kernels: a fraction of the bandwidth, small ones far less
    big, small = h100.memory_time(1e9), h100.memory_time(1e5)
    assert 0.7 < 1e9 / big / 3.35e12 < 0.95 and 1e5 / small / 3.35e12 < 0.1
    assert saturated_time("memory", "", 0.0) == 0.0


@pytest.mark.parametrize("name", GPU_PRESETS)
def test_gpu_presets_name_their_sources(name):
    c = PRESETS[name]
    rates = dict(c.peak_rates)
    assert {"float32", "float16"} <= set(rates) and c.peak_flops in rates.values()
    assert c.training_precision in ("float16", "bfloat16")
    src = dict(c.sources)
    for field in ("peak_rates", "memory_bandwidth", "device_memory", "intra_bandwidth",
                  "inter_bandwidth", "saturation"):
        assert src.get(field), f"{name}: no source for {field}"
    assert ("tf32" in rates) == (c.float32_dot == "tf32")
    again = Cluster.from_json(c.to_json())
    assert again == c and again.flop_time("matmul", 1e11, "float32") == c.flop_time(
        "matmul", 1e11, "float32")


def test_device_model_fields_are_validated():
    from autoplan import ClusterError

    with pytest.raises(ClusterError, match="peak_rates"):
        Cluster("x", 1, 1, 1e9, 1e12, 1e9, 1e9, peak_rates=(("float3", 1e12),))
    with pytest.raises(ClusterError, match="float32_dot"):
        Cluster("x", 1, 1, 1e9, 1e12, 1e9, 1e9, float32_dot="fp32")
    with pytest.raises(ClusterError, match="saturation"):
        Cluster("x", 1, 1, 1e9, 1e12, 1e9, 1e9, saturation="tpu")
    # without a device model every dtype runs at peak_flops x compute_efficiency, as given
    flat = Cluster("x", 1, 1, 1e9, 1e12, 1e9, 1e9, compute_efficiency=0.5)
    assert flat.flop_time("matmul", 1e12, "float32") == pytest.approx(2.0)
    assert flat.flop_time("matmul", 1e12, "float16") == pytest.approx(2.0)
