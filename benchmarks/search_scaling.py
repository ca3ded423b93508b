"""Search time by level as models get deeper, and folded plan quality against exhaustive.

For GPT with 12/24/48/96 layers (d=1024, 16 heads, S=1024, batch 16) on a 2x4 mesh of one
p3.16xlarge, and for MoE and Wide-ResNet, prints the intra-operator search time at each level
(trace excluded) and each plan's predicted step time relative to the exhaustive plan. Then GPT-3
175B folded on a 2x8 mesh (2 x p3.16xlarge).

These rows time the internal ``level_search`` (one mesh, no baselines), in this process: each
search is cold in its analyses (mining and segments included; ``analysis s`` is their part);
folded searches are the median of ``--repeat`` (default 3) runs. The exhaustive ILP is skipped
above ``--max-exhaustive-layers`` (default 24), where it takes minutes.

The targets are measured on the public call, printed last (without ``--quick``), from
``benchmarks/public_calls.py``: ``autoplan.search(graph, p3.16xlarge, pipeline=False,
mesh_shape=(2, 4), level="folded")``, baselines included, each in a fresh process, best of
``--repeat``; 96 layers <= 1.5x 24 layers; GPT-3 175B on 2x8 (p3.16xlarge:2) <= 3 s.

Run: .venv/bin/python benchmarks/search_scaling.py [--quick]
"""

import argparse
import gc
import platform
import statistics
import time
import warnings

import public_calls  # (benchmarks/, beside this script)

import autoplan
from autoplan import models
from autoplan._memo import forget
from autoplan.algorithms import level_search


def timed(graph, cluster, mesh, level, time_limit=600.0, repeat=1):
    """The median of ``repeat`` searches, each cold: the graph's mining and segments (cached per
    graph, as when a search tries several meshes) are recomputed, so each level's time includes
    its own analysis; garbage left by earlier searches is collected before each, untimed."""
    times = []
    for _ in range(repeat):
        forget(graph)
        gc.collect()
        t0 = time.perf_counter()
        res = level_search(graph, cluster, mesh, level=level, time_limit=time_limit)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="12 and 24 layers only")
    ap.add_argument("--max-exhaustive-layers", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=3,
                    help="folded searches are timed this many times (median reported)")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    p3 = autoplan.Cluster.preset("p3.16xlarge")
    print(f"machine: {platform.machine()}, python {platform.python_version()}")
    print(f"{'model':<26} {'ops':>7} {'level':<13} {'search s':>9} {'analysis s':>10} {'ILPs':>5} "
          f"{'classes':>7} {'step ms':>10} {'vs exhaustive':>13}")
    cases = [("gpt", {"layers": n, "hidden": 1024, "heads": 16, "seq_len": 1024, "batch": 16},
              f"GPT d=1024 L={n}", p3, (2, 4)) for n in ((12, 24) if args.quick else (12, 24, 48, 96))]
    cases += [("moe", {"layers": 8, "batch": 16}, "MoE 380M L=8 b=16", p3, (2, 4)),
              ("wide_resnet", {"batch": 64}, "Wide-ResNet 250M b=64", p3, (2, 4))]
    folded_times = {}
    for name, over, label, cluster, mesh in cases:
        size = {"gpt": "125M", "moe": "380M", "wide_resnet": "250M"}[name]
        g = autoplan.trace(models.get(name, size=size, **over))
        ref = None
        for level in ("exhaustive", "hierarchical", "folded"):
            if level == "exhaustive" and over.get("layers", 0) > args.max_exhaustive_layers:
                print(f"{label:<26} {len(g):>7} {level:<13} {'skipped':>9}")
                continue
            dt, res = timed(g, cluster, mesh, level,
                            repeat=args.repeat if level == "folded" else 1)
            step = res.plan.predicted.step_time
            if level == "exhaustive":
                ref = step
            rel = f"{step / ref:>12.4f}x" if ref else f"{'-':>13}"
            ana = res.stats.get("mine_seconds", 0.0) + res.stats.get("segment_seconds", 0.0)
            print(f"{label:<26} {len(g):>7} {level:<13} {dt:>9.2f} {ana:>10.2f} "
                  f"{res.stats.get('ilps_solved', 1):>5} "
                  f"{res.stats.get('unique_classes', '-'):>7} {step * 1e3:>10.3f} {rel}")
            if level == "folded":
                folded_times[label] = dt
    if not args.quick:
        r = folded_times.get("GPT d=1024 L=96", 0) / max(folded_times.get("GPT d=1024 L=24", 1e-9), 1e-9)
        print(f"\ninternal level_search, folded, 96 layers / 24 layers: {r:.2f} (the target is the "
              "public call's, below)")
    g = autoplan.trace(models.get("gpt", size="175B"))
    c2 = autoplan.Cluster.preset("p3.16xlarge", nodes=2)
    dt, res = timed(g, c2, (2, 8), "folded", repeat=args.repeat)
    print(f"internal level_search, GPT-3 175B ({len(g)} ops) folded on 2x8: {dt:.2f} s, "
          f"{res.stats['ilps_solved']} ILPs, {res.stats['unique_classes']} classes, "
          f"step {res.plan.predicted.step_time:.3f} s")
    if not args.quick:
        print()
        public_calls.report(["folded-24", "folded-96", "175B-2x8", "175B-2x8-traced-inside"],
                            args.repeat)


if __name__ == "__main__":
    main()
