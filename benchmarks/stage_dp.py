"""Benchmark of Alpa's stage-mesh DP (:func:`autoplan.search.pipeline._stage_dp.stage_dp`).

Random GPT-like stage costs on an 8 x 8 cluster (Alpa's 11 submesh shapes), C = 4 logical
configs, B = 16 micro-batches, L in (16, 32, 64) layers; with and without a memory limit; each
stage also has a per-step cost (gradient synchronisation and update, 30-60% of one micro-batch's
time here), the first stage's charged once, as the pipeline search runs the DP.
Prints the DP time (best of ``--repeat`` runs), the number of ``t_max`` values the DP was run
for, and the number of distinct candidate ``t_max`` values. No brute force is run.

Alpa's own DP: 32 layers, 8 x 8, 11 submeshes x 8 configs takes 138 s (0.42 s in its fast
variant) on a comparable 2-core machine (Alpa's stage-construction code, run there).

Run: ``.venv/bin/python benchmarks/stage_dp.py``
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from autoplan.search.pipeline._stage_dp import stage_dp, submesh_shapes


def costs(L: int, N: int, M: int, C: int, seed: int, penalty: float = 0.6):
    """Layer FLOPs ~ U(0.5, 1.5); a stage on n devices takes work / n * (1 + penalty log2 n) * noise."""
    rng = np.random.default_rng(seed)
    shapes = submesh_shapes(N, M)
    K = len(shapes)
    layer = rng.uniform(0.5, 1.5, L)
    pre = np.concatenate([[0.0], np.cumsum(layer)])
    work = np.maximum(pre[None, 1:] - pre[:-1, None], 0.0)
    sizes = np.array([n * m for n, m in shapes], dtype=float)
    scale = (1 + penalty * np.log2(sizes)) / sizes
    t = work[:, :, None, None] * scale[None, None, :, None] * rng.uniform(1.0, 1.4, (L, L, K, C))
    pm = work[:, :, None, None] / sizes[None, None, :, None] * rng.uniform(0.5, 1.5, (L, L, K, C))
    am = 0.2 * pm
    step = t * rng.uniform(0.3, 0.6, t.shape)
    return t, shapes, pm, am, float(pre[-1] / 20), step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--configs", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=16)
    args = ap.parse_args()
    N = M = 8
    B = args.microbatches
    print(f"stage_dp on {N}x{M} ({len(submesh_shapes(N, M))} submeshes), C={args.configs}, B={B}")
    print(f"{'L':>4} {'memory':>7} {'seconds':>9} {'t_max runs':>11} {'candidates':>11} "
          f"{'stages':>7} {'latency':>9}")
    for L in (16, 32, 64):
        t, shapes, pm, am, dm, step = costs(L, N, M, args.configs, seed=L)
        tc = np.where(np.triu(np.ones((L, L), bool))[:, :, None], t.min(axis=3), np.inf)
        n_cand = np.unique(tc[np.isfinite(tc)]).size
        for mem in (False, True):
            kw = dict(param_mem=pm, act_mem=am, device_memory=dm) if mem else {}
            best = float("inf")
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                r = stage_dp(t, shapes, N, M, B, step_cost=step, **kw)
                best = min(best, time.perf_counter() - t0)
            print(f"{L:>4} {'yes' if mem else 'no':>7} {best:>9.3f} {r.evaluated_t_max:>11} "
                  f"{n_cand:>11} {len(r.stages):>7} {r.total_latency:>9.2f}")


if __name__ == "__main__":
    main()
