"""Search speed where users meet it: the public calls, cold, baselines included.

Each case runs in a fresh Python process (imports, tracing and worker start-up included, the plan
cache off), ``--repeat`` times (default 3), and the best and median wall times are printed beside
what the search reports of itself (``stats["trace_seconds"]`` and ``stats["search_seconds"]``):

* ``autoplan.search(graph, p3.16xlarge, pipeline=False, mesh_shape=(2, 4), level="folded")`` on
  GPT d=1024, S=1024, batch 16 with 24 and 96 layers, the graph traced beforehand (target: 96
  layers <= 1.5x 24 layers);
* ``autoplan.search(gpt 175B, p3.16xlarge:2, pipeline=False, mesh_shape=(2, 8))``, baselines
  included, the graph traced beforehand (target <= 3 s); and the same call given the workload,
  so that it traces too (``jax.make_jaxpr`` of the 96-layer step alone takes about 2 s here);
* the CLI ``autoplan plan gpt --size 39B --set remat=true --set dtype=float16 --cluster
  p3.16xlarge:8`` (target <= 15 s wall);
* the CLI ``autoplan plan gpt --size 175B --cluster dgx-h100:128`` (target <= 12 s wall);
* the Explorer on the 39B workload above (``Explorer(workload=..., cluster="p3.16xlarge:8")``,
  driven through the calls its widgets make): its first search, a what-if pin on the best
  intra-operator candidate (``select``, ``set_pin_target`` and ``what_if``: the position
  embedding replicated, re-solved, selected and compared), and the
  memory budget set to 12 GiB in its box and Search pressed (target <= 2 s each), then to 11
  GiB, each run with an empty plan cache of its own.

Targets are issue 43's (the 39B command <= 5 s; an older 15 s target of the 39B command and 40 s
of 175B were this file's until 2026-11-30).

autoplan's modules are byte-compiled before the runs, as they are in an installed package.

Run: .venv/bin/python benchmarks/public_calls.py [--repeat 3] [--only NAME]
"""

import argparse
import compileall
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_API = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
t0 = time.perf_counter()
import autoplan
from autoplan import models
kind, layers = sys.argv[1], int(sys.argv[2])
if kind == "folded":
    g = autoplan.trace(models.get("gpt", size="125M", layers=layers, hidden=1024, heads=16,
                                  seq_len=1024, batch=16))
    t1 = time.perf_counter()
    res = autoplan.search(g, autoplan.Cluster.preset("p3.16xlarge"), pipeline=False,
                          mesh_shape=(2, 4), level="folded", cache=False)
else:  # GPT-3 175B: traced beforehand ("175B"), or traced inside the call ("175B-workload")
    w = models.get("gpt", size="175B")
    g = autoplan.trace(w) if kind == "175B" else w
    t1 = time.perf_counter()
    res = autoplan.search(g, "p3.16xlarge:2", pipeline=False, mesh_shape=(2, 8), cache=False)
t2 = time.perf_counter()
print(json.dumps({"call": t2 - t1, "before": t1 - t0, "trace": res.stats.get("trace_seconds", 0.0),
                  "search": res.stats.get("search_seconds", 0.0), "ops": res.stats["operators"],
                  "plans": len(res.plans), "best": res.best.label,
                  "workers": res.stats.get("workers")}))
"""

_EXPLORER = r"""
import json, time, warnings
warnings.simplefilter("ignore")
t0 = time.perf_counter()
from autoplan import models
from autoplan.viz import Explorer
ex = Explorer(workload=models.get("gpt", size="39B", remat=True, dtype="float16"),
              cluster="p3.16xlarge:8")
ex.wait_idle()
t1 = time.perf_counter()
# the best intra-operator candidate (pins apply to those), as a user picks it in the list
k = next(i for i, p in enumerate(ex.plans) if not p.is_pipeline and p.label == "autoplan")
name = next(s.name for s in ex.select(k).inputs if s.name.endswith("['wpe']"))
ex.set_pin_target(name)
ok = ex.what_if(name, (None, None))
ex.wait_idle()
t2 = time.perf_counter()
ex._budget.value = "12 GiB"
ex.search()
ex.wait_idle()
t3 = time.perf_counter()
status = ex._status.value[:120]
ex._budget.value = "11 GiB"
ex.search()
ex.wait_idle()
t4 = time.perf_counter()
print(json.dumps({"first": t1 - t0, "what_if": t2 - t1, "budget": t3 - t2, "call": t3 - t2,
                  "budget_again": t4 - t3, "what_if_ok": bool(ok), "status": status}))
"""

CASES = {
    "folded-24": ("api", ["folded", "24"], "public folded search, GPT d=1024 L=24, 2x4"),
    "folded-96": ("api", ["folded", "96"], "public folded search, GPT d=1024 L=96, 2x4"),
    "175B-2x8": ("api", ["175B", "0"], "public search GPT-3 175B, p3.16xlarge:2, mesh 2x8"),
    "175B-2x8-traced-inside": ("api", ["175B-workload", "0"],
                               "  the same from the workload (trace inside)"),
    "cli-39B": ("cli", ["plan", "gpt", "--size", "39B", "--set", "remat=true", "--set",
                        "dtype=float16", "--cluster", "p3.16xlarge:8", "--no-cache"],
                "autoplan plan gpt 39B remat fp16 p3.16xlarge:8"),
    "cli-175B-h100": ("cli", ["plan", "gpt", "--size", "175B", "--cluster", "dgx-h100:128",
                              "--no-cache"], "autoplan plan gpt 175B dgx-h100:128"),
    "explorer-39B": ("explorer", [], "Explorer, 39B: memory budget changed, Search"),
}

#: wall-time targets of single calls (best of the cold runs), seconds (issue 43's)
TARGETS = {"175B-2x8": 3.0, "cli-39B": 5.0, "cli-175B-h100": 12.0, "explorer-39B": 2.0}


def run_once(kind: str, argv: list[str]) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    t0 = time.perf_counter()
    if kind == "explorer":  # (no cache: a plan cache of its own, empty, for every run)
        env["AUTOPLAN_CACHE_DIR"] = tempfile.mkdtemp(prefix="autoplan-bench-cache-")
    if kind in ("api", "explorer"):
        code = _API if kind == "api" else _EXPLORER
        out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                             cwd=ROOT, env=env, check=True).stdout
        wall = time.perf_counter() - t0
        return {"wall": wall, **json.loads(out.strip().splitlines()[-1])}
    out = subprocess.run([sys.executable, "-m", "autoplan.cli", *argv], capture_output=True,
                         text=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - t0
    if out.returncode not in (0, 2):  # 2: the best plan does not fit (said, not an error here)
        raise RuntimeError(out.stderr[-2000:])
    took = [ln for ln in out.stdout.splitlines() if ln.startswith("search took")]
    return {"wall": wall, "call": wall, "reported": took[-1] if took else "",
            "best": next((ln for ln in out.stdout.splitlines() if ln.startswith("best")), "")}


def report(names: list[str], repeat: int = 3) -> tuple[dict[str, float], dict[str, float]]:
    """Run the cases ``names`` (keys of :data:`CASES`) ``repeat`` times each, cold, and print a
    row per case and the folded ratio against its target; returns the best and median times.
    (``benchmarks/search_scaling.py`` and ``benchmarks/pipeline.py`` print their public calls
    with it.)"""
    # an installed package carries its byte-compiled modules; a checkout run with
    # PYTHONDONTWRITEBYTECODE would otherwise compile autoplan again in every process (~0.5 s)
    compileall.compile_dir(ROOT / "autoplan", quiet=1)
    print(f"{'public call (cold, fresh process)':<50} {'best s':>8} {'median s':>9}  target; "
          "details")
    best, median = {}, {}
    for name in names:
        kind, argv, label = CASES[name]
        runs = [run_once(kind, argv) for _ in range(repeat)]
        key = "wall" if kind == "cli" else "call"
        times = [r[key] for r in runs]
        best[name] = min(times)
        median[name] = statistics.median(times)
        last = runs[-1]
        if kind == "api":
            detail = (f"ops {last['ops']}, search_seconds {last['search']:.2f}, trace "
                      f"{last['trace']:.2f}, workers {last['workers']}, process wall "
                      f"{min(r['wall'] for r in runs):.2f}")
        elif kind == "explorer":
            detail = ("first search (imports included) " + ", ".join(f"{r['first']:.1f}" for r in runs)
                      + " s; what-if pin " + ", ".join(f"{r['what_if']:.2f}" for r in runs)
                      + " s (target 2 s); then 11 GiB " + ", ".join(f"{r['budget_again']:.2f}" for r in runs)
                      + f" s; status: {last['status']}")
        else:
            detail = last["reported"]
        target = TARGETS.get(name)
        goal = "" if target is None else (
            f"<= {target:g} s {'met' if best[name] <= target else 'MISSED'}; ")
        print(f"{label:<50} {min(times):>8.2f} {statistics.median(times):>9.2f}  {goal}{detail}",
              flush=True)
    if "folded-24" in best and "folded-96" in best:
        ratio = best["folded-96"] / best["folded-24"]
        print(f"\npublic folded search, 96 layers / 24 layers: {ratio:.2f} of the best runs "
              f"(target <= 1.5: {'met' if ratio <= 1.5 else 'MISSED'}), "
              f"{median['folded-96'] / median['folded-24']:.2f} of the medians")
    return best, median


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", action="append", choices=sorted(CASES))
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python "
          f"{platform.python_version()}; {time.strftime('%Y-%m-%d')}")
    report(args.only or list(CASES), args.repeat)


if __name__ == "__main__":
    main()
