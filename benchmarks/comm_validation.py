"""Predicted communication versus the collectives XLA compiled, per collective kind.

For every zoo model at its ``tiny`` size and at a medium size (overrides below), plans come from
the search (``autoplan.search(..., pipeline=False)`` on ``--cluster``, ``cpu:8`` by default or a
measured profile: the best candidate, with the baselines the search returns), or, when the search
is not available, the hand-made tensor-parallel plan of ``tests/exec/exec_plans.py``; the
hand-made data-parallel plan (``handmade-dp``: predicted = one all-reduce of every gradient) is
added as a check of the byte accounting itself. Each plan is compiled by the executor for 8
emulated CPU devices (``run(steps=0)``: compile only) and its HLO parsed. The executor pins the
plan's heavy operators and both ends of every resharding, so the compiled collectives are the
planned ones; the cost model describes them as XLA compiles them (one all-gather over all the
axes a tensor leaves, an all-to-all only for a dimension's whole sharding moving, one all-reduce
per summed dimension, a resharding shared by its readers counted once). Target: every plan's
total within 10% (the ``ok`` column).

Bytes are per device and step, ``B`` of the cost model (reduced size for all-reduce, gathered size
for all-gather, size before scattering for reduce-scatter, each device's buffer for all-to-all). The known CPU difference is mapped
explicitly: XLA's CPU backend has no reduce-scatter and emits an all-reduce whose result only
feeds a dynamic-slice; the column ``compiled`` counts those as reduce-scatter (what a GPU runs),
``as compiled`` shows them as the all-reduces the CPU runs, and ``ar+ds`` counts them.

Usage::

    .venv/bin/python benchmarks/comm_validation.py [--models gpt mlp] [--sizes tiny medium]
        [--mesh 2x4] [--cluster cpu:8 | cluster.json] [--time-limit 30]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import autoplan  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "exec"))
from exec_plans import data_parallel_plan, tensor_parallel_plan  # noqa: E402

from autoplan import models  # noqa: E402
from autoplan.exec import run  # noqa: E402
from autoplan.exec._hlo import KINDS  # noqa: E402

MEDIUM = {
    "gpt": dict(batch=16, seq_len=64, hidden=128, layers=4, heads=4, vocab=1024),
    "moe": dict(batch=16, seq_len=64, hidden=128, layers=4, heads=4, vocab=1024),
    "wide_resnet": dict(batch=16, channels=16),
    "unet": dict(batch=16, image=32, channels=16),
    "two_tower": dict(batch=64, embed_dim=32),
    "mlp": dict(batch=64, features=128, hidden=256, layers=4),
}
FAST = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}  # the HLO (and its collectives) is the same


def plans_for(wl, mesh: tuple[int, int] | None, time_limit: float, cluster: str = "cpu:8") -> list:
    """Searched plans (best candidate and baselines), else the hand-made ones."""
    if hasattr(autoplan, "search"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = autoplan.search(wl, autoplan.Cluster.parse(cluster), pipeline=False,
                                  mesh_shape=mesh, time_limit=time_limit)
        searched = [res.best] + [p for p in res.baselines if not p.is_pipeline]
    else:
        searched = [tensor_parallel_plan(wl, mesh=mesh or (2, 4))]
    # a data-parallel plan whose prediction is exact by construction: one all-reduce of every
    # gradient (the check of the byte accounting itself)
    return searched + [data_parallel_plan(wl)]


def fmt(n: float) -> str:
    return "-" if not n else f"{n / 1024:.1f}K"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=sorted(models.list_models()))
    ap.add_argument("--sizes", nargs="*", default=["tiny", "medium"])
    ap.add_argument("--mesh", default=None, help="logical mesh, e.g. 2x4 (default: searched)")
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--cluster", default="cpu:8",
                    help="cluster the plans are searched on: a preset or a cluster.json")
    args = ap.parse_args()
    mesh = tuple(int(x) for x in args.mesh.split("x")) if args.mesh else None
    header = (f"{'model':<12} {'size':<7} {'plan':<26} {'collective':<15} {'predicted':>10} "
              f"{'compiled':>10} {'as compiled':>11} {'ratio':>6} {'ar+ds':>5}")
    print(header)
    print("-" * len(header))
    totals = []
    for name in args.models:
        for size in args.sizes:
            overrides = MEDIUM.get(name, {}) if size == "medium" else {}
            wl = models.get(name, "tiny", abstract=False, **overrides)
            t0 = time.perf_counter()
            try:
                plans = plans_for(wl, mesh, args.time_limit, args.cluster)
            except Exception as err:  # report and go on with the next model
                print(f"{name:<12} {size:<7} search failed: {type(err).__name__}: {err}")
                continue
            t_search = time.perf_counter() - t0
            for p in plans:
                rep = run(p, wl, steps=0, check=False, compiler_options=FAST)
                ards = sum(1 for _n, _s, c, _t in rep.collectives if c.equivalent != c.kind)
                kinds = [k for k in list(KINDS) + ["send-recv"]
                         if rep.predicted_comm_bytes.get(k) or rep.comm_bytes.get(k)
                         or rep.comm_bytes_raw.get(k)]
                label = p.label.replace("baseline: ", "b:")[:26]
                for i, k in enumerate(kinds or ["(none)"]):
                    pr, co = rep.predicted_comm_bytes.get(k, 0.0), rep.comm_bytes.get(k, 0.0)
                    raw = rep.comm_bytes_raw.get(k, 0.0)
                    ratio = f"{co / pr:.2f}" if pr and co else ("-" if not pr and not co else "n/a")
                    print(f"{name if i == 0 else '':<12} {size if i == 0 else '':<7} "
                          f"{label if i == 0 else '':<26} {k:<15} {fmt(pr):>10} {fmt(co):>10} "
                          f"{fmt(raw):>11} {ratio:>6} {ards if i == 0 else '':>5}")
                pt = sum(rep.predicted_comm_bytes.values())
                ct = sum(rep.comm_bytes.values())
                totals.append((name, size, p.label, pt, ct))
            print(f"{'':<12} {'':<7} (search {t_search:.1f} s)")
    print()
    print("totals per plan (all kinds): predicted / compiled; ok = within 10%")
    missed = 0
    for name, size, label, pt, ct in totals:
        r = f"{ct / pt:.2f}" if pt and ct else "-"
        ok = abs(ct - pt) <= 0.10 * max(pt, ct) or abs(ct - pt) <= 1024
        missed += not ok
        print(f"  {name:<12} {size:<7} {label:<28} {fmt(pt):>10} {fmt(ct):>10}  x{r:<5} "
              f"{'ok' if ok else 'MISSED'}")
    print(f"{len(totals) - missed} of {len(totals)} plans within 10%")


if __name__ == "__main__":
    main()
