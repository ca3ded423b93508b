"""The main job behind ``make demo``, on 8 emulated CPU devices.

1. trace a zoo model's training step and print its graph summary;
2. show the cost model's view of one collective on a real cluster preset;
3. search plans for Wide-ResNet and GPT on emulated clusters and write the HTML report;
4. run the chosen plan on 8 emulated CPU devices with the equivalence check.

"""

from __future__ import annotations

import os
import sys
import time
import warnings

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

    return plan_report_run(out_dir)


def plan_report_run(out_dir: str = "artifacts") -> int:
    """Steps 3-4: search, write the reports and the plan, run the chosen plans."""
    import autoplan
    from autoplan import models
    from autoplan.exec import run as run_plan
    from autoplan.viz import report_html

    os.makedirs(out_dir, exist_ok=True)
    warnings.simplefilter("ignore")

    print("\n== 3a. search: Wide-ResNet on 2 x p3.16xlarge (16 V100s), intra-operator, mesh 2x8")
    wrn = models.get("wide_resnet", size="tiny", batch=64)
    t0 = time.perf_counter()
    wres = autoplan.search(wrn, "p3.16xlarge:2", pipeline=False, mesh_shape=(2, 8))
    print(wres.table())
    print(f"  searched in {time.perf_counter() - t0:.1f} s")

    print("\n== 3b. search: GPT on 8 emulated CPU devices (intra-operator and pipeline plans)")
    gpt = models.get("gpt", size="tiny", batch=16)
    t0 = time.perf_counter()
    gres = autoplan.search(gpt, "cpu:8", microbatches=4)
    print(gres.table())
    print(f"  searched in {time.perf_counter() - t0:.1f} s")
    best = gres.best
    print()
    print(best.summary())

    report = os.path.join(out_dir, "report.html")
    report_html(gres.plans, path=report, title="autoplan: GPT (tiny) on 8 emulated CPU devices")
    wrn_report = os.path.join(out_dir, "wide_resnet_report.html")
    report_html(wres.plans, path=wrn_report, title="autoplan: Wide-ResNet on 16 V100s")
    best.to_json(os.path.join(out_dir, "plan.json"))

    print("\n== 4. run the chosen plan on 8 emulated CPU devices, checked against one device")
    rep = run_plan(best, gpt.concrete(), steps=3, check=True)
    print(rep.summary())
    pipe = next((p for p in gres.plans if p.is_pipeline and not p.label.startswith("baseline")), None)
    if pipe is not None:
        print(f"\n   and the best pipeline candidate ({pipe.describe()}):")
        prep = run_plan(pipe, gpt.concrete(), steps=2, check=True)
        print(prep.summary())
    print(f"\nreports: {os.path.abspath(report)}\n         {os.path.abspath(wrn_report)}")
    print(f"plan   : {os.path.abspath(os.path.join(out_dir, 'plan.json'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
