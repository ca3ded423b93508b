"""Trace time and operator count for GPT train steps (abstract arguments), and the time to trace
the same step again at an eighth of its batch (what the pipeline search does for a micro-batch
size: the parameters and the optimizer update keep their shapes).

Target: GPT-3 175B (96 layers) traced in under 10 s on 2 cores.
Run: .venv/bin/python benchmarks/tracing.py (not trace.py: a script beside the others named
like a standard-library module, ``trace``, would shadow it for every benchmark, and the searches
would refuse their worker processes)
"""

import platform
import time
import warnings

import autoplan
from autoplan import models


def main() -> None:
    warnings.simplefilter("ignore")
    rows = []
    cases = [("gpt", "1.3B", {}), ("gpt", "15B", {}), ("gpt", "1.3B", {"layers": 48}),
             ("gpt", "1.3B", {"layers": 96}), ("gpt", "175B", {})]
    for name, size, over in cases:
        wl = models.get(name, size=size, **over)
        t0 = time.perf_counter()
        g = autoplan.trace(wl)
        dt = time.perf_counter() - t0
        micro = models.get(name, size=size, **over, batch=max(1, wl.config["batch"] // 8))
        t0 = time.perf_counter()
        autoplan.trace(micro)
        again = time.perf_counter() - t0
        rows.append((f"{name} {size}" + (f" L={over['layers']}" if over else ""),
                     wl.config["layers"], len(g), g.flops, g.param_count, dt, again))
    print(f"machine: {platform.machine()} {platform.processor() or ''}, python {platform.python_version()}")
    print(f"{'model':<22} {'layers':>6} {'operators':>10} {'FLOPs/step':>12} {'params':>16} {'trace s':>8} "
          f"{'batch/8 s':>9}")
    for r in rows:
        print(f"{r[0]:<22} {r[1]:>6} {r[2]:>10} {r[3]:>12.3e} {r[4]:>16,} {r[5]:>8.2f} {r[6]:>9.2f}")


if __name__ == "__main__":
    main()
