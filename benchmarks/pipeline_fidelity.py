"""The pipeline cost model beside the pipeline executor's measurements, on 8 emulated CPU devices.

For pipeline plans the search makes for small zoo models on ``cpu:8`` (the ``cpu`` preset: one
host of 8 emulated devices), each plan is run with ``autoplan.exec.run`` and, per stage, the
predicted forward and backward time of one micro-batch and the per-step work (gradient
synchronisation and optimizer update: the ``update`` event of the plan's schedule) are printed
beside the executor's measured task times (``RunReport.pipeline["task_times"]``: each task timed
alone), then the predicted step beside the measured one. Every run checks the plan against
single-device execution, but for losses that mix examples across the batch (Wide-ResNet's batch
norm, the two-tower's in-batch softmax, MoE's groups), which micro-batching changes.

The emulated devices share the machine's cores, so stages that would overlap on accelerators run
one after another here, and a task's time holds Python dispatch: read the per-task columns
(compute and collectives as modelled) rather than the step. Run on a quiet machine.

Run: .venv/bin/python benchmarks/pipeline_fidelity.py [--steps 3] [--models gpt mlp unet]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import time
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import autoplan  # noqa: E402
from autoplan import models  # noqa: E402
from autoplan.exec import run  # noqa: E402

WORKLOADS = {
    "gpt": dict(size="tiny", layers=4, batch=32, seq_len=64, hidden=128, heads=4),
    "mlp": dict(size="small", batch=64),
    "unet": dict(size="tiny", batch=16),
    "wide_resnet": dict(size="tiny", batch=16),
}


def measured_tasks(report) -> dict[tuple[str, int], float]:
    """``{(phase, stage): seconds}`` from the executor's task times (``"forward[0]"`` ...)."""
    out = {}
    for name, seconds in (report.pipeline or {}).get("task_times", {}).items():
        m = re.fullmatch(r"(\w+)\[(\d+)\]", name)
        if m:
            out[(m.group(1), int(m.group(2)))] = seconds
    return out


def per_step(plan: autoplan.Plan) -> list[float]:
    """Each stage's predicted per-step work: its ``update`` event in the simulated schedule."""
    out = [0.0] * len(plan.stages)
    for start, end, mesh, _mb, _stage, kind in plan.schedule.events:
        if kind == "update":
            out[mesh] = end - start
    return out


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--models", nargs="*", default=list(WORKLOADS))
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--plans", type=int, default=2, help="pipeline plans run per model")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}, jax {jax.__version__}, {time.strftime('%Y-%m-%d')}")
    print("| model | plan | stage | fwd pred | fwd meas | bwd pred | bwd meas | per-step pred | "
          "update meas |")
    print("|---|---|---|---|---|---|---|---|---|")
    steps = []
    for name in args.models:
        kw = dict(WORKLOADS[name])
        size = kw.pop("size")
        wl = models.get(name, size, **kw)
        # (a loss that mixes examples across the batch, such as Wide-ResNet's batch norm,
        # changes under micro-batches: its pipelines are timed, not checked)
        res = autoplan.search(wl, "cpu:8", pipeline=True, baselines=False,
                              microbatches=args.microbatches, allow_microbatching_mixed=True)
        concrete = wl.concrete()
        for plan in [p for p in res.plans if p.is_pipeline][:args.plans]:
            rep = run(plan, concrete, steps=args.steps, check=res.mixing is None)
            tasks = measured_tasks(rep)
            upd = per_step(plan)
            desc = plan.describe().replace("|", ";")  # a table cell
            for s in plan.stages:
                print(f"| {name} | {desc} | {s.index} | {ms(s.forward_time)} | "
                      f"{ms(tasks.get(('forward', s.index)))} | {ms(s.backward_time)} | "
                      f"{ms(tasks.get(('backward', s.index)))} | {ms(upd[s.index])} | "
                      f"{ms(tasks.get(('update', s.index)))} |")
            matched = rep.equivalence.matched if rep.equivalence else None
            steps.append((name, desc, plan.predicted.step_time,
                          statistics.median(rep.step_times), rep.pipeline.get("ideal_time"),
                          matched))
    print()
    print("| model | plan | predicted step | measured step (median) | schedule ideal from task "
          "times | matches one device |")
    print("|---|---|---|---|---|---|")
    for name, desc, pred, meas, ideal, matched in steps:
        print(f"| {name} | {desc} | {ms(pred)} | {ms(meas)} | {ms(ideal)} | {matched} |")


if __name__ == "__main__":
    main()
