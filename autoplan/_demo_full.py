"""Steps 3-4 of ``make demo``: plan, report, run (see :mod:`autoplan.demo`)."""

from __future__ import annotations

import os
import time
import warnings


def run(out_dir: str = "artifacts") -> int:
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
