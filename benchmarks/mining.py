"""Benchmark: TAPAS subgraph mining (and TePDist segments) on GPT and Wide-ResNet train steps.

Traces abstract training steps (nothing is allocated) and prints, per model, the tracing time,
the operator and GraphNode counts, the mining time with its phases, the classes found (instances
x operators per instance), the fold ratio (operators / operators left to search), and the time
and number of TePDist segments.

Usage::

    .venv/bin/python benchmarks/mining.py            # GPT d=1024 with 12/24/48/96 layers, WRN
    .venv/bin/python benchmarks/mining.py --quick    # GPT 12 layers and Wide-ResNet 250M only
"""

from __future__ import annotations

import argparse
import time
import warnings

import autoplan
from autoplan.models import get
from autoplan.search.fold._cones import segments
from autoplan.search.fold._mine import mine


def run(label: str, workload) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = time.perf_counter()
        graph = autoplan.trace(workload)
        t_trace = time.perf_counter() - t
    result = mine(graph)
    t = time.perf_counter()
    segs = segments(graph, mining=result)
    t_seg = time.perf_counter() - t
    tm = result.timings
    classes = ", ".join(f"{c.count}x{c.size}" for c in result.classes[:6])
    if len(result.classes) > 6:
        classes += f", ... ({len(result.classes)} classes)"
    print(f"{label:<26} ops {len(graph):>6}  GraphNodes {len(result.graphnodes):>6}  "
          f"trace {t_trace:6.2f} s  mine {tm['total']:5.2f} s "
          f"(graphnodes {tm['graphnodes']:.2f}, signatures {tm['signatures']:.2f}, "
          f"grow {tm['grow']:.2f}, verify {tm['verify']:.2f})")
    print(f"{'':<26} classes [{classes}]  unassigned {len(result.unassigned)}  "
          f"fold ratio {result.fold_ratio:.1f}  segments {len(segs)} in {t_seg:.2f} s")
    return {"model": label, "ops": len(graph), "mine_s": tm["total"], "fold": result.fold_ratio}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="GPT 12 layers and Wide-ResNet 250M only")
    args = ap.parse_args()
    layers = [12] if args.quick else [12, 24, 48, 96]
    for n in layers:
        run(f"GPT d=1024 L={n}", get("gpt", "350M", layers=n))
    run("Wide-ResNet 250M (d50)", get("wide_resnet", "250M"))
    if not args.quick:
        run("Wide-ResNet 13B (d101)", get("wide_resnet", "13B"))


if __name__ == "__main__":
    main()
