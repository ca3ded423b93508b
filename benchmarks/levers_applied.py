"""The memory levers as the stage executor applies them: what a searched plan with ZeRO and
rematerialised layers holds when it runs, beside the same plan run without its levers.

GPT tiny (4 layers, batch 32) on 8 emulated CPU devices, 4 micro-batches, 1F1B. The memory limit
is half the least memory any plan without levers needs, so the best plan of
``pipeline_search`` shards its optimizer state (ZeRO) and rematerialises layers. Both runs go
through ``autoplan.exec.run`` and are checked against one device. Per stage:

* ``held/mb``: bytes per device its forward task hands to its own backward per micro-batch
  (``report.pipeline["held_bytes"]``, read off the compiled forward's output layouts): what the
  stage keeps per micro-batch in flight;
* ``args``: the largest of the stage's compiled programs' argument bytes per device (the
  parameters, optimizer state and running sums it is handed);
* ``exec``: that program's total (arguments + results + temporaries);
* ``again``: the forward operators its backward runs again per micro-batch;
* ``predicted``: the plan's predicted memory per device of the stage (with its levers; the
  plan without them was not searched, so it has none);
* ``step`` the measured step (median of the steps after the first) beside ``predicted step``
  (the ``cpu`` preset's: a datasheet guess for these emulated devices, which share 2 cores).

Usage::

    .venv/bin/python benchmarks/levers_applied.py
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import statistics
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import autoplan  # noqa: E402
from autoplan import models  # noqa: E402
from autoplan.algorithms import pipeline_search  # noqa: E402
from autoplan.exec import run  # noqa: E402

FAST = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


def kib(n: float) -> str:
    return f"{n / 1024:.1f} KiB"


def stage_rows(plan, rep):
    rows = []
    for s in plan.stages:
        devs = list(s.device_ids)
        mem = max((rep.memory[d] for d in devs), key=lambda m: m.total)
        lv = rep.pipeline["levers"].get(s.index)
        rows.append((s.index, rep.pipeline["held_bytes"].get(s.index, 0), mem.argument, mem.total,
                     lv["recomputed"] if lv else 0, s.memory))
    return rows


def main() -> None:
    warnings.simplefilter("ignore")
    wl = models.get("gpt", "tiny", layers=4, batch=32)
    cl = autoplan.Cluster.parse("cpu:8")
    least = min(p.predicted.memory_per_device
                for p in pipeline_search(wl, cl, microbatches=4).plans)
    plan = pipeline_search(wl, cl, microbatches=4, memory_budget=0.5 * least).plans[0]
    plain = plan.with_(stages=tuple(dataclasses.replace(s, zero=0, zero_axes=(), remat_layers=())
                                    for s in plan.stages))
    concrete = models.get("gpt", "tiny", layers=4, batch=32, abstract=False)
    print(f"# {datetime.date.today()} {platform.machine()} {os.cpu_count()} cores, JAX "
          f"{jax.__version__}, 8 emulated CPU devices")
    print(f"plan: {plan.describe()}; memory limit {kib(0.5 * least)} (half of {kib(least)})")
    for s in plan.stages:
        print(f"  stage {s.index}: ZeRO-{s.zero} over {', '.join(s.zero_axes) or '-'}; "
              f"remat {', '.join(s.remat_layers) or '-'}")
    print()
    print("| run | stage | held/mb | args | exec | again | predicted | step (median) | "
          "predicted step | matched |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, p in (("with levers", plan), ("without levers", plain)):
        rep = run(p, concrete, steps=5, compiler_options=FAST)
        step = statistics.median(rep.step_times[1:])
        searched = p is plan  # the plan without its levers was not searched: no predictions
        for i, (s, held, args, total, again, pred) in enumerate(stage_rows(p, rep)):
            predicted = kib(pred) if searched else "-"
            predicted_step = f"{p.predicted.step_time * 1e3:.2f} ms" if searched else "-"
            print(f"| {name if i == 0 else ''} | {s} | {kib(held)} | {kib(args)} | {kib(total)} | "
                  f"{again} | {predicted} | {step * 1e3:.1f} ms | {predicted_step} | "
                  f"{rep.equivalence.matched} |")


if __name__ == "__main__":
    main()
