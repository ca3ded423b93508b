"""The executor's overhead: its step time against a hand-written ``jax.jit`` with the same
shardings, and the pipeline executor's step time against its schedule's ideal.

1. Intra-operator plans (the hand-made data- and tensor-parallel plans of
   ``tests/exec/exec_plans.py`` on 8 emulated CPU devices). ``executor`` is ``autoplan.exec.run``
   (the step re-evaluated operator by operator inside one ``jax.jit``, with the plan's sharding
   constraints); ``no constraints`` is the same with the plan's operator shardings removed, so
   its difference from ``hand jit`` is the interpreter's own cost (none is expected: XLA compiles
   the same operations); ``hand jit`` is ``jax.jit(workload.fn, in_shardings=...,
   out_shardings=...)`` from the plan's ``named_shardings``. Medians over ``--steps`` steps after
   a warm-up; all three run the same steps from the same inputs.
2. Pipeline plans (two stages on devices 0-3 and 4-7, GPipe and 1F1B, 2 and 4 micro-batches).
   ``measured`` is the executor's step; ``serial`` the sum of its task times (each task timed
   alone); ``ideal`` the schedule's makespan with those task times and free communication,
   plus the prologue and update tasks. On this machine the 8 "devices" share two CPU cores, so
   stages cannot overlap as they would on real accelerators: expect ``measured`` near ``serial``.

Usage::

    .venv/bin/python benchmarks/exec_overhead.py [--steps 5] [--models gpt mlp]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
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
from autoplan.exec._pipeline import place  # noqa: E402

SIZES = {
    "gpt": [("tiny", {}), ("medium", dict(batch=16, seq_len=64, hidden=128, layers=4, heads=4,
                                          vocab=1024))],
    "mlp": [("tiny", {}), ("medium", dict(batch=64, features=128, hidden=256, layers=4))],
}


def hand_jit_time(plan, wl, steps: int) -> float:
    """Median step time of ``jax.jit(wl.fn)`` with the plan's input and output shardings."""
    mesh = plan.mesh()
    sh = plan.named_shardings(mesh, like=wl.args)
    f = jax.jit(wl.fn, in_shardings=tuple(sh),
                out_shardings=(NamedSharding(mesh, PartitionSpec()), sh[0], sh[1]))
    args = tuple(jax.tree.map(lambda x, s: place(jax.device_get(x), s), a, s_)
                 for a, s_ in zip(wl.args, sh))
    compiled = f.lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss, p, o = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
        args = (p, o, args[2])
    return statistics.median(times)


def intra(models_: list[str], steps: int) -> None:
    print("1. intra-operator plans: executor versus hand-written jax.jit (ms per step, median)")
    head = (f"  {'model':<6} {'size':<7} {'plan':<12} {'executor':>9} {'no constr.':>10} "
            f"{'hand jit':>9} {'exec/hand':>9} {'interp/hand':>11}")
    print(head)
    for name in models_:
        for size, over in SIZES.get(name, [("tiny", {})]):
            wl = models.get(name, "tiny", abstract=False, **over)
            g = traced(wl)
            for p in (data_parallel_plan(wl, g), tensor_parallel_plan(wl, g)):
                bare = dataclasses.replace(p, stages=tuple(dataclasses.replace(s, ops=())
                                                           for s in p.stages))
                ex = run(p, wl, steps=steps, check=False).step_time
                nc = run(bare, wl, steps=steps, check=False).step_time
                hj = hand_jit_time(p, wl, steps)
                print(f"  {name:<6} {size:<7} {p.label:<12} {ex * 1e3:>9.2f} {nc * 1e3:>10.2f} "
                      f"{hj * 1e3:>9.2f} {ex / hj:>9.2f} {nc / hj:>11.2f}")


def pipelines(models_: list[str], steps: int) -> None:
    print()
    print("2. pipeline plans (2 stages x 4 devices): executor versus the schedule's ideal (ms)")
    print(f"  {'model':<6} {'size':<7} {'schedule':<8} {'mb':>3} {'measured':>9} {'serial':>8} "
          f"{'ideal':>8} {'meas/ideal':>10} {'send-recv':>10}")
    for name in models_:
        for size, over in SIZES.get(name, [("tiny", {})]):
            wl = models.get(name, "tiny", abstract=False, **over)
            g = traced(wl)
            for schedule in ("gpipe", "1f1b"):
                for mb in (2, 4):
                    p = pipeline_plan(wl, g, schedule=schedule, microbatches=mb)
                    rep = run(p, wl, steps=steps, check=False)
                    serial = sum(rep.pipeline["task_times"].get(f"{ph}[{s}]", 0.0) *
                                 (mb if ph in ("forward", "backward") else 1)
                                 for ph in ("prologue", "forward", "backward", "update")
                                 for s in range(2))
                    ideal = rep.pipeline["ideal_time"]
                    print(f"  {name:<6} {size:<7} {schedule:<8} {mb:>3} {rep.step_time * 1e3:>9.2f} "
                          f"{serial * 1e3:>8.2f} {ideal * 1e3:>8.2f} "
                          f"{rep.step_time / ideal:>10.2f} "
                          f"{rep.comm_bytes.get('send-recv', 0) / 1024:>9.1f}K")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--models", nargs="*", default=["gpt", "mlp"])
    args = ap.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        intra(args.models, args.steps)
        pipelines(args.models, args.steps)


if __name__ == "__main__":
    main()
