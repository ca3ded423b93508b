"""Pipeline planning on Alpa's benchmark suites (p3.16xlarge: 8 x V100 16 GB per node).

For Alpa's GPT suite (350M on 1 GPU up to 39B on 64 GPUs, remat on, global batch 1024) and its
Wide-ResNet suite (250M on 1 GPU up to 13B on 64 GPUs, batch 1536), prints the best plan's stages
(layers per stage, submesh, logical mesh), micro-batches, predicted step time and whether it fits
the devices' memory, with the search time. Then GPT-3 175B on 16 and 128 DGX H100 nodes (128 and
1,024 GPUs).

Targets: `autoplan plan gpt --size 39B --cluster p3.16xlarge:8` in <= 60 s; GPT-3 175B on
dgx-h100:128 in <= 120 s.

Run: .venv/bin/python benchmarks/pipeline.py [--quick] [--only gpt|wide_resnet|175b]
"""

import argparse
import platform
import time
import warnings

import autoplan
from autoplan import models

GPT_SUITE = [("350M", 1), ("760M", 4), ("1.3B", 8), ("2.6B", 16), ("6.7B", 32), ("15B", 64), ("39B", 64)]
WRN_SUITE = [("250M", 1), ("1B", 4), ("2B", 8), ("4B", 16), ("6.8B", 32), ("13B", 64)]


def cluster_for(preset: str, gpus: int) -> autoplan.Cluster:
    if gpus <= 8:
        return autoplan.Cluster.preset(preset, 1, devices_per_node=gpus)
    return autoplan.Cluster.preset(preset, gpus // 8)


def row(name, size, gpus, res, dt):
    p = res.best
    stages = " | ".join(f"{s.layer_range[1] - s.layer_range[0]}L {s.submesh[0]}x{s.submesh[1]}"
                        f"->{'x'.join(map(str, s.mesh_shape))}" for s in p.stages)
    fits = p.predicted.memory_per_device <= p.cluster.device_memory
    print(f"{name:<12} {size:>5} {gpus:>4}  {stages[:60]:<60} {p.schedule.microbatches:>4} "
          f"{p.predicted.step_time:>9.3f} {p.predicted.memory_per_device / 2**30:>8.2f} "
          f"{'yes' if fits else 'NO':>4} {dt:>8.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="the first three of each suite")
    ap.add_argument("--only", default=None)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    print(f"machine: {platform.machine()}, python {platform.python_version()}")
    print(f"{'model':<12} {'size':>5} {'GPUs':>4}  {'stages (layers submesh->logical mesh)':<60} "
          f"{'mb':>4} {'step s':>9} {'mem GiB':>8} {'fits':>4} {'search s':>8}")
    n = 3 if args.quick else None
    if args.only in (None, "gpt"):
        for size, gpus in GPT_SUITE[:n]:
            wl = models.get("gpt", size=size, remat=True, dtype="float16")
            t0 = time.perf_counter()
            res = autoplan.search(wl, cluster_for("p3.16xlarge", gpus), baselines=False)
            row("GPT", size, gpus, res, time.perf_counter() - t0)
    if args.only in (None, "wide_resnet"):
        for size, gpus in WRN_SUITE[:n]:
            wl = models.get("wide_resnet", size=size, dtype="float16")
            t0 = time.perf_counter()
            res = autoplan.search(wl, cluster_for("p3.16xlarge", gpus), baselines=False)
            row("Wide-ResNet", size, gpus, res, time.perf_counter() - t0)
    if args.only in (None, "175b") and not args.quick:
        wl = models.get("gpt", size="175B", remat=True, dtype="bfloat16")
        for nodes in (16, 128):  # 128 and 1,024 H100s; above 16 hosts submesh_hosts="pow2"
            t0 = time.perf_counter()
            res = autoplan.search(wl, f"dgx-h100:{nodes}", baselines=False)
            row("GPT-3", "175B", nodes * 8, res, time.perf_counter() - t0)


if __name__ == "__main__":
    main()
