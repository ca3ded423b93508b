"""Benchmark of the intra-operator ILP: GPT blocks on a 2x4 mesh of a p3.16xlarge.

The workload is PyTorch AutoParallel's own GPT benchmark (measured with it on a 2-core CPU
machine of the same kind: 4 layers 73 s unfolded, 35 s folded): GPT with d=1024, 16
heads, S=1024, batch 16, 1/4/8/24 layers, traced abstractly (a whole training step: forward,
backward and the Adam update); the zoo's GPT adds an embedding and an LM head (vocabulary 51200).
For each size it prints the ILP's variables before merging (Alpa's unmerged formulation: one
strategy variable per operator and input, one edge variable per strategy pair of every tensor
edge) and after (follower merging and edge compression), and the build and solve times.

Reference: PyTorch AutoParallel needs 73 s (4 layers) and 123 s (8 layers) unfolded on this kind
of 2-core machine; the target here is 8 layers in 20 s or less.

Usage::

    .venv/bin/python benchmarks/intra_op.py [--layers 1 4 8 24] [--mesh 2x4] [--time-limit 600]
"""

from __future__ import annotations

import argparse
import time
import warnings

import autoplan
from autoplan.models import get
from autoplan.search.intra._ilp import build_problem, solve_ilp


def run(layers: int, mesh_shape: tuple[int, int], time_limit: float) -> dict:
    """Trace the GPT step with ``layers`` blocks and solve its intra-op ILP; return the figures."""
    wl = get("gpt", "350M", batch=16, hidden=1024, heads=16, seq_len=1024, layers=layers)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = autoplan.trace(wl)
    t_trace = time.perf_counter() - t0
    mesh = autoplan.Cluster.preset("p3.16xlarge").logical_mesh(mesh_shape)
    t1 = time.perf_counter()
    prob = build_problem(graph, mesh)
    sol = solve_ilp(graph, mesh, problem=prob, time_limit=time_limit)
    t_total = time.perf_counter() - t1
    return {
        "layers": layers, "ops": len(graph), "nodes": sol.num_nodes,
        "before": sol.vars_before_merging, "after": sol.vars_after_merging,
        "binaries": sol.num_binaries, "edge_vars": sol.num_edge_vars,
        "trace_s": t_trace, "build_s": sol.build_seconds, "solve_s": sol.solve_seconds,
        "total_s": t_total, "status": sol.status, "step_ms": (sol.compute_time + sol.comm_time) * 1e3,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 4, 8, 24])
    ap.add_argument("--mesh", default="2x4")
    ap.add_argument("--time-limit", type=float, default=600.0)
    args = ap.parse_args(argv)
    shape = tuple(int(x) for x in args.mesh.split("x"))
    head = (f"{'layers':>6} {'ops':>6} {'nodes':>6} {'vars before':>12} {'vars after':>11} "
            f"{'(binary':>8} {'+ edge)':>8} {'trace s':>8} {'build s':>8} {'solve s':>8} "
            f"{'total s':>8} {'status':>8} {'step ms':>8}")
    print(f"GPT d=1024 h=16 S=1024 batch 16 on a {args.mesh} mesh of p3.16xlarge (abstract trace)")
    print(head)
    print("-" * len(head))
    for n in args.layers:
        r = run(n, shape, args.time_limit)
        print(f"{r['layers']:>6} {r['ops']:>6} {r['nodes']:>6} {r['before']:>12,} {r['after']:>11,} "
              f"{r['binaries']:>8,} {r['edge_vars']:>8,} {r['trace_s']:>8.2f} {r['build_s']:>8.2f} "
              f"{r['solve_s']:>8.2f} {r['total_s']:>8.2f} {r['status']:>8} {r['step_ms']:>8.2f}",
              flush=True)
    print("total s = problem build (strategies, merging, costs, LP model) + solve; trace excluded.")


if __name__ == "__main__":
    main()
