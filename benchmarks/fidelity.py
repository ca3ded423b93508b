"""Predictions against the hardware: do the cost model's rankings match measured step times?

For every zoo model (and a plain-JAX train step written here, not from the zoo) at two sizes
(``tiny``, and ``large``: big enough that compute is not negligible on the attached devices),
for each cluster profile (the uncalibrated ``cpu`` preset, and the devices measured by
``autoplan.profile()``):

1. search plans with ``autoplan.search`` (intra-operator candidates on every logical mesh,
   pipeline candidates, baselines), ranked by predicted step time;
2. run the top ``--top`` (8) with ``autoplan.exec.run`` for ``--steps`` (6) steps each, after the
   executor's warm-up step, taking the median step;
3. print every plan's predicted and measured step time, then per model: Spearman's rho between
   predicted and measured times, the **regret** (measured time of the predicted-best plan /
   measured best - 1), the **MRR** of the measured best in the predicted order, and the median
   ``|predicted / measured - 1|``; and over models: the median regret, median rho, mean MRR and
   median error, against the targets (profiled cluster: median regret <= 10%, rho >= 0.8,
   MRR >= 0.9, median error <= 25%).

Plans whose measured times are within 5% of each other are **tied** (emulated devices sharing two
cores measure with a few percent of noise): ranks for rho average over tied plans (a run of plans
each within 5% of the next is one tie), the MRR counts the first predicted plan among those
within 5% of the measured best, and a regret of 5% or less is reported as a tie. A plan measured
in both clusters' top lists is run once (same layout, same program).

Each model runs in its own worker process, which writes every measurement as it finishes: a
plan that aborts its process (XLA's CPU collectives abort after a 40 s rendezvous timeout) is
recorded as failed and the worker restarts after it, so the benchmark always finishes. Numbers
are for the machine it runs on: run it on a quiet machine for the figures in
``docs/benchmarks.md``.

Usage::

    .venv/bin/python benchmarks/fidelity.py [--models gpt mlp user_mlp] [--sizes tiny large]
        [--clusters preset profile] [--profile cluster.json | --quick-profile]
        [--top 8] [--steps 6] [--batch-scales 0.5 1] [--json results.json]

On the CPU platform (the default) it runs on ``--devices`` (8) emulated devices against the
``cpu`` preset; on accelerators (``JAX_PLATFORMS=cuda``) on the attached devices against
``--preset`` (e.g. ``dgx-h100``, with as many devices per node as are attached).

**One device** (one GPU, or ``--devices 1``; ``--single-device`` asks for it anywhere): there is
no sharding to choose, so the candidates are what one device can vary: the step as written and
rematerialised (``remat=True``; not for ``user_mlp``), each with its gradient accumulated over 1,
2, 4 and 8 micro-batches (``autoplan.search(..., pipeline=True, microbatches=k)``), ranked by
predicted step time; ``--batch-scales`` runs each model at several batches. ``--sizes accel``
sizes the models for one GPU (compute dominates the step). ``benchmarks/accelerator.sh`` runs
this with ``autoplan profile`` and two launches.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
#: the workers' environment: this process only looks at the devices (and profiles them when no
#: ``--profile`` is given), so on a GPU it must not take the memory JAX preallocates by default
WORKER_ENV = dict(os.environ)
if "--worker" not in sys.argv:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

DEVICES = 8  # emulated CPU devices (on accelerators: the attached ones)
#: the ``large`` size of each model: compute not negligible on 8 emulated CPU devices
LARGE: dict[str, dict[str, Any]] = {
    "gpt": dict(batch=16, seq_len=64, hidden=128, layers=4, heads=4, vocab=1024),
    "moe": dict(batch=16, seq_len=64, hidden=128, layers=4, heads=4, vocab=1024),
    "wide_resnet": dict(batch=32, channels=16),
    "unet": dict(batch=16, image=32, channels=16),
    "two_tower": dict(batch=512, embed_dim=64),
    "mlp": dict(batch=256, features=256, hidden=512, layers=4),
    "user_mlp": dict(batch=256, features=256, hidden=1024),
}
#: the ``accel`` size: compute dominates a step on one modern GPU (H100: tens of milliseconds)
ACCEL: dict[str, dict[str, Any]] = {
    "gpt": dict(batch=16, seq_len=512, hidden=1024, layers=8, heads=16, vocab=8192),
    "moe": dict(batch=16, seq_len=512, hidden=1024, layers=4, heads=16, vocab=8192),
    "wide_resnet": dict(batch=64, image=32, channels=32),
    "unet": dict(batch=32, image=64, channels=32),
    "two_tower": dict(batch=8192, embed_dim=128),
    "mlp": dict(batch=2048, features=1024, hidden=4096, layers=4),
    "user_mlp": dict(batch=8192, features=1024, hidden=4096),
}
SIZES = {"large": LARGE, "accel": ACCEL}
USER_TINY = dict(batch=32, features=32, hidden=64)
#: one device: the gradient-accumulation counts tried (each with remat off and on)
ACCUMULATION = (1, 2, 4, 8)
TIE = 0.05
TARGETS = {"regret": 0.10, "rho": 0.8, "mrr": 0.9, "error": 0.25}


# ---------------------------------------------------------------------------------------------
# a user's own train step (plain JAX, no zoo)
# ---------------------------------------------------------------------------------------------

class UserStep:
    """A two-hidden-layer MLP regression with momentum SGD, written in plain JAX the way a user
    would: ``train_step(params, opt_state, batch) -> (loss, params, opt_state)``."""

    name = "user_mlp"
    arg_kinds = ("parameter", "optimizer_state", "batch")

    def __init__(self, batch: int, features: int, hidden: int, seed: int = 0):
        import numpy as np  # noqa: PLC0415

        rng = np.random.default_rng(seed)

        def w(*shape):
            return (rng.normal(size=shape) / math.sqrt(shape[0])).astype(np.float32)

        params = {"w1": w(features, hidden), "b1": np.zeros(hidden, np.float32),
                  "w2": w(hidden, hidden), "b2": np.zeros(hidden, np.float32),
                  "w3": w(hidden, 1)}
        momentum = {k: np.zeros_like(v) for k, v in params.items()}
        data = {"x": rng.normal(size=(batch, features)).astype(np.float32),
                "y": rng.normal(size=(batch, 1)).astype(np.float32)}
        self.args = (params, momentum, data)
        self.config = {"batch": batch, "features": features, "hidden": hidden}

    @staticmethod
    def fn(params, momentum, data):
        import jax  # noqa: PLC0415
        import jax.numpy as jnp  # noqa: PLC0415

        def loss_fn(p):
            h = jax.nn.gelu(data["x"] @ p["w1"] + p["b1"])
            h = jax.nn.gelu(h @ p["w2"] + p["b2"])
            return jnp.mean((h @ p["w3"] - data["y"]) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        momentum = jax.tree.map(lambda m, g: 0.9 * m + g, momentum, grads)
        params = jax.tree.map(lambda p, m: p - 1e-3 * m, params, momentum)
        return loss, params, momentum


def _config(name: str, size: str, **over: Any) -> dict[str, Any]:
    """The config fields ``size`` sets for ``name`` (on top of the zoo's ``tiny``), and ``over``."""
    return {**(USER_TINY if size == "tiny" and name == "user_mlp" else {}),
            **SIZES.get(size, {}).get(name, {}), **over}


def workload(name: str, size: str, **over: Any) -> Any:
    """The model ``name`` at ``size`` (``tiny``, ``large`` or ``accel``), with ``over`` (batch,
    remat) on top; the plain-JAX ``user_mlp`` has no remat."""
    config = _config(name, size, **over)
    if name == "user_mlp":
        config.pop("remat", None)
        return UserStep(**config)
    from autoplan import models  # noqa: PLC0415

    return models.get(name, "tiny", abstract=False, **config)


# ---------------------------------------------------------------------------------------------
# metrics
# ---------------------------------------------------------------------------------------------

def tie_ranks(values: list[float], tie: float = TIE) -> list[float]:
    """Ranks (1 = smallest) where a run of values each within ``tie`` of the next shares the
    average rank of the run."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and values[order[end]] <= values[order[end - 1]] * (1 + tie):
            end += 1
        avg = (start + 1 + end) / 2
        for i in order[start:end]:
            ranks[i] = avg
        start = end
    return ranks


def spearman(pred: list[float], meas: list[float], tie: float = TIE) -> float:
    """Spearman's rho: Pearson's correlation of the ranks (measured ranks tie-aware)."""
    if len(pred) < 2:
        return math.nan
    a, b = tie_ranks(pred, 0.0), tie_ranks(meas, tie)
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    va = sum((x - ma) ** 2 for x in a)
    vb = sum((y - mb) ** 2 for y in b)
    return cov / math.sqrt(va * vb) if va > 0 and vb > 0 else (1.0 if va == vb == 0 else 0.0)


def regret(pred: list[float], meas: list[float]) -> float:
    """Measured time of the predicted-best plan over the measured best, minus 1."""
    best_pred = min(range(len(pred)), key=lambda i: pred[i])
    return meas[best_pred] / min(meas) - 1


def mrr(pred: list[float], meas: list[float], tie: float = TIE) -> float:
    """1 / (the predicted rank of the first plan within ``tie`` of the measured best)."""
    best = min(meas)
    order = sorted(range(len(pred)), key=lambda i: pred[i])
    for rank, i in enumerate(order, 1):
        if meas[i] <= best * (1 + tie):
            return 1.0 / rank
    return 0.0


def error(pred: list[float], meas: list[float]) -> float:
    """Median |predicted / measured - 1|."""
    return statistics.median(abs(p / m - 1) for p, m in zip(pred, meas))


# ---------------------------------------------------------------------------------------------
# the worker: one model at one size, every cluster
# ---------------------------------------------------------------------------------------------

def plan_key(plan: Any) -> str:
    """What makes two plans the same program (the cluster they were costed on aside)."""
    stages = [(s.device_ids, s.mesh_shape, s.layer_range,
               sorted((o.op, tuple(t.spec for t in o.tensors)) for o in s.ops)) for s in plan.stages]
    inputs = sorted((i.name, i.spec, i.stage) for i in plan.inputs)
    return json.dumps([stages, inputs, plan.schedule.kind, plan.schedule.microbatches], default=str)


def _devices(n: int) -> None:
    """Emulate ``n`` CPU devices when JAX runs on the CPU (before its backend starts)."""
    import jax  # noqa: PLC0415

    if os.environ.get("JAX_PLATFORMS", "cpu") == "cpu":
        jax.config.update("jax_num_cpu_devices", n)


def base_batch(name: str, size: str) -> int:
    """The global batch of ``name`` at ``size``."""
    config = _config(name, size)
    if "batch" in config:  # (always, for user_mlp)
        return config["batch"]
    from autoplan import models  # noqa: PLC0415

    return models.get(name, "tiny").config["batch"]


def single_device_plans(args: argparse.Namespace, cluster: Any) -> list[tuple[Any, dict]]:
    """One device: the candidates are the step as it is and with remat, each with its gradient
    accumulated over 1, 2, 4 and 8 micro-batches (``autoplan.search`` with ``pipeline=True`` and
    that many micro-batches gives the one-stage plan), ranked by predicted step time."""
    import autoplan  # noqa: PLC0415

    found = []
    for remat in ((False,) if args.model == "user_mlp" else (False, True)):
        wl = workload(args.model, args.size, **_over(args, remat))
        batch = wl.config["batch"]
        for mb in ACCUMULATION:
            if batch % mb:
                continue
            # (timing only: Wide-ResNet's batch norm, the two-tower's in-batch negatives and
            # MoE's groups mix examples, which micro-batching changes; their times still count)
            options = (dict(pipeline=True, microbatches=mb, allow_microbatching_mixed=True)
                       if mb > 1 else dict(pipeline=False))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = autoplan.search(wl, cluster, time_limit=args.time_limit, cache=False,
                                      baselines=False, **options)
            plans = [p for p in res.plans if p.schedule.microbatches == mb]
            if plans:
                found.append((plans[0], {"remat": remat}))
    return sorted(found, key=lambda e: e[0].predicted.step_time)


def _over(args: argparse.Namespace, remat: bool | None = None) -> dict[str, Any]:
    over: dict[str, Any] = {} if args.batch is None else {"batch": args.batch}
    if remat is not None:
        over["remat"] = remat
    return over


def worker(args: argparse.Namespace) -> None:
    _devices(args.devices)
    import autoplan  # noqa: PLC0415
    from autoplan import Cluster, Plan  # noqa: PLC0415
    from autoplan.exec import run  # noqa: PLC0415

    out = open(args.out, "a", buffering=1)  # noqa: SIM115 - one line per result, flushed
    plans_file = args.out + ".plans.json"
    if os.path.exists(plans_file):  # a restart after a plan aborted the process
        with open(plans_file) as f:
            saved = json.load(f)
        entries = [(e["cluster"], e["rank"], Plan.from_dict(e["plan"]), e["variant"])
                   for e in saved]
    else:
        entries = []
        for name, path in args.cluster:
            cluster = Cluster.parse(path)
            t0 = time.perf_counter()
            if args.single_device:
                found = single_device_plans(args, cluster)
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    res = autoplan.search(workload(args.model, args.size, **_over(args)), cluster,
                                          time_limit=args.time_limit)
                found = [(p, {}) for p in res.plans]
            seconds = time.perf_counter() - t0
            out.write(json.dumps({"event": "search", "cluster": name, "seconds": seconds,
                                  "plans": len(found)}) + "\n")
            for rank, (p, variant) in enumerate(found[: args.top]):
                entries.append((name, rank, p, variant))
        with open(plans_file, "w") as f:
            json.dump([{"cluster": c, "rank": r, "plan": p.to_dict(), "variant": v}
                       for c, r, p, v in entries], f)
    workloads: dict[bool | None, Any] = {}
    done = set()
    if os.path.exists(args.out):
        with open(args.out) as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("event") in ("measured", "failed", "started"):
                    done.add(rec["key"])
    for name, rank, plan, variant in entries:
        key = plan_key(plan)
        remat = variant.get("remat")
        label = ("remat" if remat else "no remat") if args.single_device else plan.label
        out.write(json.dumps({"event": "plan", "cluster": name, "rank": rank, "key": key,
                              "label": label, "layout": plan.describe(),
                              "predicted": plan.predicted.step_time}) + "\n")
        if key in done:
            continue
        done.add(key)
        out.write(json.dumps({"event": "started", "key": key}) + "\n")
        if remat not in workloads:
            workloads[remat] = workload(args.model, args.size, **_over(args, remat))
        try:
            rep = run(plan, workloads[remat], steps=args.steps, check=False)
            out.write(json.dumps({"event": "measured", "key": key, "measured": rep.step_time,
                                  "steps": rep.step_times, "compile": rep.compile_time}) + "\n")
        except Exception as err:  # a plan the executor cannot run: recorded, the others go on
            out.write(json.dumps({"event": "failed", "key": key,
                                  "error": f"{type(err).__name__}: {str(err)[:300]}"}) + "\n")
    out.write(json.dumps({"event": "done"}) + "\n")


# ---------------------------------------------------------------------------------------------
# the parent: workers, tables
# ---------------------------------------------------------------------------------------------

def run_model(model: str, size: str, batch: int | None, clusters: list[tuple[str, str]],
              args: argparse.Namespace, tmp: str) -> list[dict]:
    """Run the worker (restarting it after a plan that aborts it) and return its records."""
    out = os.path.join(tmp, f"{model}-{size}-{batch}.jsonl")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--model", model, "--size", size,
           "--out", out, "--top", str(args.top), "--steps", str(args.steps),
           "--time-limit", str(args.time_limit), "--devices", str(args.devices)]
    if batch is not None:
        cmd += ["--batch", str(batch)]
    if args.single_device:
        cmd.append("--single-device")
    for name, path in clusters:
        cmd += ["--cluster", name, path]
    for attempt in range(args.top * len(clusters) + 1):
        why = "aborted the process"
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                  env=WORKER_ENV)
            tail = (proc.stderr or "").strip().splitlines()[-3:]
            ok = proc.returncode == 0
        except subprocess.TimeoutExpired:  # the worker's whole time (searches and runs) ran out
            why = "still running when the worker's --timeout ran out"
            ok, tail = False, [f"{args.timeout:.0f} s"]
        records = _read(out)
        if ok or any(r.get("event") == "done" for r in records):
            return records
        started = [r["key"] for r in records if r.get("event") == "started"]
        finished = {r["key"] for r in records if r.get("event") in ("measured", "failed")}
        pending = [k for k in started if k not in finished]
        if not pending:  # died before any plan (the search itself): give up on this model
            print(f"  {model} {size}: worker failed: {' | '.join(tail)}", flush=True)
            return records
        with open(out, "a") as f:
            for k in pending:
                f.write(json.dumps({"event": "failed", "key": k,
                                    "error": f"{why}: " + " | ".join(tail)}) + "\n")
        print(f"  {model} {size}: a plan {why} ({' | '.join(tail)[-160:]}); "
              f"restarting after it (attempt {attempt + 2})", flush=True)
    return _read(out)


def _read(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def summarise(model: str, size: str, records: list[dict], clusters: list[str]) -> list[dict]:
    measured = {r["key"]: r["measured"] for r in records if r.get("event") == "measured"}
    failed = {r["key"]: r["error"] for r in records if r.get("event") == "failed"}
    rows = []
    for cluster in clusters:
        plans = [r for r in records if r.get("event") == "plan" and r["cluster"] == cluster]
        seen, uniq = set(), []
        for p in sorted(plans, key=lambda r: r["rank"]):
            if (p["rank"], p["key"]) not in seen:
                seen.add((p["rank"], p["key"]))
                uniq.append(p)
        print(f"\n{model} {size} on {cluster}:")
        print(f"  {'#':>2} {'label':<26} {'layout':<44} {'predicted':>11} {'measured':>11} "
              f"{'pred/meas':>9}")
        pred, meas = [], []
        for p in uniq:
            m = measured.get(p["key"])
            tag = (f"{m * 1e3:>9.2f}ms" if m is not None else
                   ("  failed: " + failed.get(p["key"], "not run")[:60]))
            ratio = f"{p['predicted'] / m:>9.2f}" if m else ""
            print(f"  {p['rank']:>2} {p['label'][:26]:<26} {p['layout'][:44]:<44} "
                  f"{p['predicted'] * 1e3:>9.2f}ms {tag} {ratio}")
            if m:
                pred.append(p["predicted"])
                meas.append(m)
        if len(meas) < 2:
            print("  (fewer than two plans measured: no ranking metrics)")
            continue
        row = {"model": model, "size": size, "cluster": cluster, "plans": len(meas),
               "rho": spearman(pred, meas), "regret": regret(pred, meas), "mrr": mrr(pred, meas),
               "error": error(pred, meas)}
        rows.append(row)
        tie = " (tie: within 5%)" if row["regret"] <= TIE else ""
        print(f"  rho {row['rho']:.2f}, regret {row['regret'] * 100:.1f}%{tie}, MRR "
              f"{row['mrr']:.2f}, median |error| {row['error'] * 100:.0f}% over {len(meas)} plans")
    return rows


def report(rows: list[dict], clusters: list[str]) -> None:
    print("\nsummary (ties: measured within 5%)")
    print(f"  {'model':<12} {'size':<10} {'cluster':<8} {'plans':>5} {'rho':>6} {'regret':>8} "
          f"{'MRR':>5} {'|error|':>8}")
    for r in rows:
        print(f"  {r['model']:<12} {r['size']:<10} {r['cluster']:<8} {r['plans']:>5} "
              f"{r['rho']:>6.2f} {r['regret'] * 100:>7.1f}% {r['mrr']:>5.2f} "
              f"{r['error'] * 100:>7.0f}%")
    for cluster in clusters:
        rs = [r for r in rows if r["cluster"] == cluster]
        if not rs:
            continue
        agg = {"regret": statistics.median(r["regret"] for r in rs),
               "rho": statistics.median(r["rho"] for r in rs if not math.isnan(r["rho"])),
               "mrr": statistics.fmean(r["mrr"] for r in rs),
               "error": statistics.median(r["error"] for r in rs)}
        met = {"regret": agg["regret"] <= TARGETS["regret"], "rho": agg["rho"] >= TARGETS["rho"],
               "mrr": agg["mrr"] >= TARGETS["mrr"], "error": agg["error"] <= TARGETS["error"]}
        print(f"  {cluster}: median regret {agg['regret'] * 100:.1f}% "
              f"({'met' if met['regret'] else 'missed'}: <= 10%), median rho {agg['rho']:.2f} "
              f"({'met' if met['rho'] else 'missed'}: >= 0.8), mean MRR {agg['mrr']:.2f} "
              f"({'met' if met['mrr'] else 'missed'}: >= 0.9), median |error| "
              f"{agg['error'] * 100:.0f}% ({'met' if met['error'] else 'missed'}: <= 25%) "
              f"over {len(rs)} model/size pairs")
    users = [r for r in rows if r["model"] == "user_mlp" and r["cluster"] == "profile"]
    for r in users:
        print(f"  user's plain-JAX step ({r['size']}): the predicted-best plan measures "
              f"{r['regret'] * 100:.1f}% above the best of the top candidates "
              f"({'met' if r['regret'] <= 0.10 else 'missed'}: within 10%)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=None,
                    help="zoo models and/or user_mlp (default: all of them)")
    ap.add_argument("--sizes", nargs="*", default=["tiny", "large"],
                    choices=["tiny", "large", "accel"],
                    help="accel: sized for one GPU (compute dominates the step)")
    ap.add_argument("--batch-scales", nargs="*", type=float, default=None,
                    help="run each model at these multiples of its size's batch (default 1)")
    ap.add_argument("--single-device", action="store_true",
                    help="the candidates of one device: remat off/on x 1, 2, 4, 8 accumulated "
                         "micro-batches (the default when one device is attached)")
    ap.add_argument("--clusters", nargs="*", default=["preset", "profile"],
                    help="'preset' (the uncalibrated datasheet preset) and/or 'profile' (measured)")
    ap.add_argument("--preset", default=None,
                    help="the datasheet preset (default cpu on the CPU platform, else dgx-h100)")
    ap.add_argument("--devices", type=int, default=DEVICES,
                    help="emulated devices on the CPU platform (default 8)")
    ap.add_argument("--profile", default=None, help="a cluster.json to use as the measured profile")
    ap.add_argument("--quick-profile", action="store_true", help="profile with quick=True")
    ap.add_argument("--save-profile", default=None, help="write the measured profile here")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--time-limit", type=float, default=30.0, help="seconds per ILP")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per worker")
    ap.add_argument("--json", default=None, help="write every record and metric here")
    # worker mode (internal)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--size", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--cluster", nargs=2, action="append", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return

    _devices(args.devices)
    import jax  # noqa: PLC0415

    from autoplan import Cluster, models  # noqa: PLC0415
    from autoplan.costs._cluster import profile  # noqa: PLC0415

    names = args.models or sorted(models.list_models()) + ["user_mlp"]
    tmp = tempfile.mkdtemp(prefix="autoplan-fidelity-")
    platform = jax.devices()[0].platform
    n = len(jax.devices())
    if n != args.devices and platform == "cpu":
        ap.error(f"--devices {args.devices}: JAX already runs {n} devices")
    args.devices = n
    args.single_device = args.single_device or n == 1
    clusters: list[tuple[str, str]] = []
    for c in args.clusters:
        if c == "preset":
            name = args.preset or ("cpu" if platform == "cpu" else "dgx-h100")
            preset = Cluster.preset(name, 1, devices_per_node=n)
            path = os.path.join(tmp, "preset.json")
            preset.to_json(path)
            clusters.append((name, path))
        elif c == "profile":
            if args.profile:
                measured = Cluster.from_json(args.profile)
            else:
                t0 = time.perf_counter()
                measured = profile(quick=args.quick_profile, progress=True)
                print(f"profiled the {n} devices in {time.perf_counter() - t0:.1f} s")
            path = args.save_profile or os.path.join(tmp, "cluster.json")
            measured.to_json(path)
            print(measured.summary())
            clusters.append(("profile", path))
        else:
            ap.error(f"--clusters: 'preset' or 'profile', got {c!r}")
    print(f"fidelity: {len(names)} models x {args.sizes}, top {args.top} plans, {args.steps} "
          f"steps each, on {n} {platform} devices ({jax.devices()[0].device_kind}); load "
          f"average {os.getloadavg()[0]:.1f}; started {time.strftime('%Y-%m-%d %H:%M')}")
    rows, everything = [], {}
    for name in names:
        for size in args.sizes:
            for scale in args.batch_scales or [None]:
                batch = None if scale is None else max(1, round(base_batch(name, size) * scale))
                t0 = time.perf_counter()
                records = run_model(name, size, batch, clusters, args, tmp)
                label = size if batch is None else f"{size} b{batch}"
                everything[f"{name}/{label}"] = records
                rows += summarise(name, label, records, [c for c, _ in clusters])
                print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
    report(rows, [c for c, _ in clusters])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "records": everything}, f, indent=1)


if __name__ == "__main__":
    main()
