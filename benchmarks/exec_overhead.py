"""The executor's overhead: its step time against a hand-written ``jax.jit`` with the same
shardings, the pipeline executor's step against its schedule's ideal, and gradient accumulation
as one scanned program against its micro-batches run as separate programs.

1. Intra-operator plans (the hand-made data- and tensor-parallel plans of
   ``tests/exec/exec_plans.py`` on 8 emulated CPU devices). ``executor`` is
   ``autoplan.exec.run`` (the step re-evaluated operator by operator inside one ``jax.jit``, with
   the plan's sharding constraints); ``hand jit`` is ``jax.jit(workload.fn, in_shardings=...,
   out_shardings=...)`` from the plan's ``named_shardings``. The two are **interleaved**: after
   each executor step, ``run``'s ``on_step`` callback runs and times one hand-written step, so
   both see the same machine load; medians over ``--steps`` (at least 20) steps after a warm-up.
   ``no constr.`` repeats the pair with the plan's operator shardings removed: its ratio is the
   interpreter's own cost (none is expected: XLA compiles the same operations). Target:
   executor / hand jit <= 1.05.
2. Pipeline plans (two stages on devices 0-3 and 4-7, GPipe and 1F1B, 2 and 4 micro-batches).
   ``measured`` is the executor's step (median); ``ideal`` the schedule's makespan with each task
   timed alone and free communication, plus the prologue and update tasks; ``serial`` the sum of
   all task times of a step (the time when stages cannot overlap); ``disp.`` the programs and
   transfers dispatched per step. Target: measured / ideal <= 1.3. The 8 emulated devices share
   the host's cores, so two stages' programs overlap only as far as free cores allow: there
   ``serial`` is the floor, and measured / serial is the executor's own overhead.
3. Gradient accumulation (one stage on all 8 devices, 4 and 16 micro-batches): ``measured`` is the
   one scanned program per step; ``per-task`` the same step's prologue, forwards, backwards and
   update timed alone as separate programs and added up (what dispatching a program per
   micro-batch would cost at best).

Usage::

    .venv/bin/python benchmarks/exec_overhead.py [--steps 30] [--models gpt mlp] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import statistics
import sys
import time
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "exec"))
from exec_plans import (  # noqa: E402
    data_parallel_plan,
    pipeline_plan,
    tensor_parallel_plan,
    traced,
)

from autoplan import models  # noqa: E402
from autoplan.exec import run  # noqa: E402
from autoplan.exec._stages import place  # noqa: E402
from autoplan.plans._plan import Schedule  # noqa: E402

SIZES = {
    "gpt": [("tiny", {}), ("medium", dict(batch=16, seq_len=64, hidden=128, layers=4, heads=4,
                                          vocab=1024))],
    "mlp": [("tiny", {}), ("medium", dict(batch=64, features=128, hidden=256, layers=4))],
}


class HandJit:
    """``jax.jit(wl.fn)`` with the plan's input and output shardings, one timed step at a time."""

    def __init__(self, plan, wl):
        mesh = plan.mesh()
        sh = plan.named_shardings(mesh, like=wl.args)
        f = jax.jit(wl.fn, in_shardings=tuple(sh),
                    out_shardings=(NamedSharding(mesh, PartitionSpec()), sh[0], sh[1]))
        self.args = tuple(jax.tree.map(lambda x, s: place(jax.device_get(x), s), a, s_)
                          for a, s_ in zip(wl.args, sh))
        self.compiled = f.lower(*self.args).compile()
        jax.block_until_ready(self.compiled(*self.args))
        self.times: list[float] = []

    def step(self, *_ignored) -> None:
        t0 = time.perf_counter()
        _loss, p, o = jax.block_until_ready(self.compiled(*self.args))
        self.times.append(time.perf_counter() - t0)
        self.args = (p, o, self.args[2])


def interleaved(plan, wl, steps: int) -> tuple[float, float]:
    """(executor median, hand-written jit median), one step of each in turn."""
    hand = HandJit(plan, wl)
    rep = run(plan, wl, steps=steps, check=False, on_step=hand.step)
    return rep.step_time, statistics.median(hand.times)


def workloads(models_: list[str], quick: bool):
    for name in models_:
        for size, over in SIZES.get(name, [("tiny", {})])[: 1 if quick else None]:
            wl = models.get(name, "tiny", abstract=False, **over)
            yield name, size, wl, traced(wl)


def intra(models_: list[str], steps: int, quick: bool) -> None:
    print("1. intra-operator plans: executor versus hand-written jax.jit, interleaved "
          "(ms per step, median)")
    print(f"  {'model':<6} {'size':<7} {'plan':<12} {'executor':>9} {'hand jit':>9} {'exec/hand':>9}"
          f" {'no constr.':>10} {'hand jit':>9} {'ratio':>6}")
    for name, size, wl, g in workloads(models_, quick):
        for p in (data_parallel_plan(wl, g), tensor_parallel_plan(wl, g)):
            bare = dataclasses.replace(p, stages=tuple(dataclasses.replace(s, ops=())
                                                       for s in p.stages))
            ex, hj = interleaved(p, wl, steps)
            nc, hj2 = interleaved(bare, wl, steps)
            print(f"  {name:<6} {size:<7} {p.label:<12} {ex * 1e3:>9.3f} {hj * 1e3:>9.3f} "
                  f"{ex / hj:>9.3f} {nc * 1e3:>10.3f} {hj2 * 1e3:>9.3f} {nc / hj2:>6.3f}")


def _serial(rep, microbatches: int, stages: int) -> float:
    tt = rep.pipeline["task_times"]
    return sum(tt.get(f"{ph}[{s}]", 0.0) * (microbatches if ph in ("forward", "backward") else 1)
               for ph in ("prologue", "forward", "backward", "update") for s in range(stages))


def pipelines(models_: list[str], steps: int, quick: bool) -> None:
    print()
    print("2. pipeline plans (2 stages x 4 devices): executor versus the schedule's ideal (ms)")
    print(f"  {'model':<6} {'size':<7} {'schedule':<8} {'mb':>3} {'measured':>9} {'ideal':>8} "
          f"{'serial':>8} {'meas/ideal':>10} {'meas/serial':>11} {'disp.':>5}")
    for name, size, wl, g in workloads(models_, quick):
        for schedule in ("gpipe", "1f1b"):
            for mb in (2, 4):
                p = pipeline_plan(wl, g, schedule=schedule, microbatches=mb)
                rep = run(p, wl, steps=steps, check=False)
                ideal, serial = rep.pipeline["ideal_time"], _serial(rep, mb, 2)
                print(f"  {name:<6} {size:<7} {schedule:<8} {mb:>3} {rep.step_time * 1e3:>9.3f} "
                      f"{ideal * 1e3:>8.3f} {serial * 1e3:>8.3f} {rep.step_time / ideal:>10.2f} "
                      f"{rep.step_time / serial:>11.2f} {rep.pipeline['dispatches']:>5}")


def accumulation(models_: list[str], steps: int, quick: bool) -> None:
    print()
    print("3. gradient accumulation (1 stage x 8 devices): one scanned program versus a program "
          "per micro-batch task (ms)")
    print(f"  {'model':<6} {'size':<7} {'mb':>3} {'measured':>9} {'per-task':>9} {'meas/per-task':>13}"
          f" {'disp.':>5}")
    for name, size, wl, g in workloads(models_, quick):
        batch = wl.config["batch"]
        for mb in (4, 16):
            if batch % mb:
                continue
            p = data_parallel_plan(wl, g)
            p = dataclasses.replace(p, schedule=Schedule("1f1b", mb, 1))
            rep = run(p, wl, steps=steps, check=False)
            per_task = _serial(rep, mb, 1)
            print(f"  {name:<6} {size:<7} {mb:>3} {rep.step_time * 1e3:>9.3f} {per_task * 1e3:>9.3f} "
                  f"{rep.step_time / per_task:>13.2f} {rep.pipeline['dispatches']:>5}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="timed steps per measurement (>= 20 "
                    "for the figures)")
    ap.add_argument("--models", nargs="*", default=["gpt", "mlp"])
    ap.add_argument("--quick", action="store_true", help="tiny sizes only (a smoke run)")
    args = ap.parse_args()
    print(f"# {datetime.date.today()} {platform.node()}: {os.cpu_count()} cores, "
          f"{jax.device_count()} emulated {jax.devices()[0].platform} devices, jax {jax.__version__}, "
          f"{args.steps} steps per figure")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        intra(args.models, args.steps, args.quick)
        pipelines(args.models, args.steps, args.quick)
        accumulation(args.models, args.steps, args.quick)


if __name__ == "__main__":
    main()
