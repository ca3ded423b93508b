"""Users' own models against the zoo's GPT: search time, ILPs, level chosen and plan quality.

The models are the test suite's user-model matrix (``tests/user_models/user_steps.py``: a Flax
NNX transformer, a Flax linen MLP-Mixer with remat blocks, an Equinox CNN, a plain-JAX CNN with a
``lax.scan`` over residual blocks, an MLP with ``lax.cond`` clipping and a ``while_loop``, each
with an optax optimizer), at benchmark sizes (the NNX transformer as first reported: 4 layers,
d=128, 16 x 32 tokens). Each is searched on 8 emulated CPU devices the way a user calls it,
``autoplan.search(workload, "cpu:8")`` with default options (level ``"auto"``, pipeline plans and
baselines included), cold: a new workload object per run, so nothing traced or mined before is
reused. Printed per model:

* operators, the search's seconds (trace included; the median of ``--repeat`` runs), the ILPs it
  solved (intra-operator searches plus the pipeline search's layer ILPs), the level ``"auto"``
  chose on each logical mesh, the best plan and its predicted step time;
* the predicted step time of the exhaustive intra-operator search (``level="exhaustive"``,
  ``pipeline=False``), and the best plan's ratio to it (target <= 1.01);
* the folded intra-operator search's predicted step time, ILPs and ratio (folding on its own);
* the zoo's GPT (``size="tiny"`` with the number of layers that gives the closest operator count)
  searched the same way, and the ratio of the two search times (target <= 2).

Run on a quiet machine (the figures go to docs/benchmarks.md):

    .venv/bin/python benchmarks/user_models.py [--repeat 3] [--only nnx_transformer,...] [--small]
"""

from __future__ import annotations

import argparse
import gc
import os
import pathlib
import platform
import statistics
import sys
import time
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "user_models"))

import user_steps  # noqa: E402

import autoplan  # noqa: E402
from autoplan import models  # noqa: E402
from autoplan.tracing._trace import forget_shared_traces  # noqa: E402

#: benchmark sizes (``--small``: the test suite's)
SIZES = {
    "nnx_transformer": dict(layers=4, d=128, heads=4, vocab=256, batch=16, seq=32),
    "linen_mixer": dict(blocks=4, hidden=128, batch=16, image=32, patch=4),
    "equinox_cnn": dict(channels=8, blocks=4, image=16, batch=16),
    "scan_cnn": dict(blocks=4, channels=32, image=16, batch=16),
    "control_flow_mlp": dict(layers=4, d=128, batch=32),
}


def search(make, repeat: int, **kw):
    """The median seconds of ``repeat`` cold searches (trace included) and the last result."""
    times, res = [], None
    for _ in range(repeat):
        forget_shared_traces()  # (a zoo workload's trace is shared by the objects of its spec)
        wl = make()
        gc.collect()
        t0 = time.perf_counter()
        res = autoplan.search(wl, "cpu:8", cache=False, **kw)  # cold: no stored result
        times.append(time.perf_counter() - t0)
    return statistics.median(times), res, wl


def ilps(res) -> int:
    return int(res.stats.get("ilps_solved", 0) + res.stats.get("pipeline_layer_solves", 0))


def gpt_like(ops: int):
    """``make()`` of the zoo's GPT tiny with the layer count whose operator count is closest."""
    count = {n: len(autoplan.trace(models.get("gpt", size="tiny", layers=n))) for n in (1, 2)}
    per, base = count[2] - count[1], 2 * count[1] - count[2]
    layers = max(1, round((ops - base) / per))
    return layers, base + per * layers, lambda: models.get("gpt", size="tiny", layers=layers)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3, help="cold searches per model (median)")
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--small", action="store_true", help="the test suite's sizes")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    names = [n for n in user_steps.MAKERS if not args.only or n in args.only.split(",")]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}, jax {jax.__version__}; cpu:8 (8 emulated devices)")
    head = (f"{'model':<18} {'ops':>6} {'search s':>9} {'ILPs':>5} {'level (8x1 4x2 2x4 1x8)':<25} "
            f"{'best plan':<36} {'step ms':>9} {'exh. ms':>9} {'ratio':>6} {'fold ms':>9} "
            f"{'fold ILPs':>9} {'ratio':>6} {'GPT L':>5} {'GPT ops':>7} {'GPT s':>7} {'time x':>6}")
    print(head)
    worst_quality, worst_time = 0.0, 0.0
    for name in names:
        size = {} if args.small else SIZES[name]

        def make(name=name, size=size):
            return user_steps.MAKERS[name](**size)

        dt, res, wl = search(make, args.repeat)
        ops = res.stats["operators"]
        levels = " ".join(v[0] for v in res.stats.get("level_used", {}).values())
        best = res.best
        ex = autoplan.search(wl, "cpu:8", level="exhaustive", pipeline=False, baselines=False)
        fo = autoplan.search(wl, "cpu:8", level="folded", pipeline=False, baselines=False)
        t_best, t_ex = best.predicted.step_time, ex.best.predicted.step_time
        t_fo = fo.best.predicted.step_time
        layers, gpt_ops, make_gpt = gpt_like(ops)
        dt_gpt, _, _ = search(make_gpt, args.repeat)
        worst_quality = max(worst_quality, t_best / t_ex)
        worst_time = max(worst_time, dt / dt_gpt)
        label = f"{best.label}: {best.describe()}"[:36]
        print(f"{name:<18} {ops:>6} {dt:>9.2f} {ilps(res):>5} {levels:<25} {label:<36} "
              f"{t_best * 1e3:>9.4f} {t_ex * 1e3:>9.4f} {t_best / t_ex:>6.3f} {t_fo * 1e3:>9.4f} "
              f"{fo.stats.get('ilps_solved', 0):>9} {t_fo / t_ex:>6.3f} {layers:>5} {gpt_ops:>7} "
              f"{dt_gpt:>7.2f} {dt / dt_gpt:>6.2f}")
    print(f"\nworst best/exhaustive: {worst_quality:.4f} (target <= 1.01); worst search time / "
          f"GPT tiny of similar size: {worst_time:.2f} (target <= 2)")
    print("levels: e = exhaustive, f = folded (level='auto' on each logical mesh)")


if __name__ == "__main__":
    main()
