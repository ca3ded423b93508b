"""The main job behind ``make demo``, on 8 emulated CPU devices.

1. trace a zoo model's training step and print its graph summary;
2. show the cost model's view of one collective on a real cluster preset;
3. search plans for Wide-ResNet and GPT on emulated clusters and write the HTML report;
4. run the chosen plan on 8 emulated CPU devices with the equivalence check.

Steps 3-4 run when the search, viz and exec packages are installed with autoplan (they are).
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main(out_dir: str = "artifacts") -> int:
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    import autoplan
    from autoplan import models

    print("== 1. trace: GPT 1.3B (abstract arguments, nothing allocated)")
    wl = models.get("gpt", size="1.3B")
    t0 = time.perf_counter()
    graph = autoplan.trace(wl)
    print(graph.summary())
    print(f"  traced in      : {time.perf_counter() - t0:.2f} s")

    print("\n== 2. cost model: all-reduce of one layer's gradients (H=2048: 12.H^2 fp32 values)")
    cluster = autoplan.Cluster.parse("p3.16xlarge:2")
    mesh = cluster.logical_mesh((2, 8))
    nbytes = 12 * 2048**2 * 4
    for axes, what in (((1,), "inside a node (NVLink)"), ((0,), "across nodes (25 Gbps)"),
                       ((0, 1), "all 16 devices, hierarchical")):
        t = mesh.all_reduce(nbytes, axes)
        print(f"  mesh axes {axes!s:<7} {what:<30}: {t * 1e3:8.3f} ms for {nbytes / 2**20:.0f} MiB")

    try:
        from autoplan import _demo_full  # noqa: PLC0415
    except ImportError:
        return 0
    return _demo_full.run(out_dir)


if __name__ == "__main__":
    sys.exit(main())
