"""autoplan's predictions beside Alpa's published measurements on p3.16xlarge (8 x V100 16 GB per
node, NVLink inside, 25 Gbps between nodes).

Every configuration Alpa published on p3.16xlarge with a measured throughput for both systems'
comparison (GPT 2.6B-39B, GShard MoE 10B, Wide-ResNet 2B, at Alpa's GPU counts) is searched with
``autoplan.search`` on the ``p3.16xlarge`` datasheet preset alone: no profile, no per-model
setting of the cost model. The settings are Alpa's (its Table 4 and benchmark suites): global
batch 1024 (Wide-ResNet 1536), every layer rematerialised; GPT and MoE in fp16 (GPT with an fp32
master copy and Adam moments, MoE with its Adam state in fp16, as ``benchmarks/pipeline.py``);
Wide-ResNet in **fp32**, as Alpa ran it.

Sources of the measured side:

* Alpa's throughput: the alpa repository, ``osdi22_artifact/results_e2e.tsv`` (rows
  ``parax.auto``; ``megatron`` for Megatron-LM), plotted as the paper's end-to-end figure
  (Zheng et al., OSDI'22, Figure 7); TFLOPS per GPU count the rematerialised forward.
* Step time = FLOPs / (TFLOPS x GPUs) with Alpa's own FLOP counts: GPT
  ``96 B S H^2 L (1 + S/(6H)) + 6 B S H V`` (its formula with remat); MoE
  :func:`autoplan.models.moe.alpa_flops` x 4/3 (``compute_moe_tflops`` with the recomputed
  forward); Wide-ResNet's step (44.8 s) as issue 41's table gives it from Alpa's count (XLA's
  cost analysis of its executable, which is not reproduced here).
* Alpa's plans: ``benchmark/alpa/suite_auto_gpt.py``, ``suite_auto_moe.py`` and
  ``suite_wresnet.py`` ("search solutions found for p3.16xlarge"), as issue 41 quotes them.

The second table mirrors Alpa's comparisons: autoplan's best plan against each baseline computed
with the same cost model (``SearchResult.baselines`` of ``autoplan.search(...,
baselines="paper")``): Megatron-LM's TP x PP x DP grid (its best),
ZeRO-2, ZeRO-3, intra-operator only (autoplan's own best plan without pipelining) and
inter-operator only (one device per stage). For GPT it also gives Alpa's measured speed-up over
Megatron-LM from the same artifact.

``--tiny`` runs one row per model at the zoo's tiny size on 2 GPUs (a few seconds; the suite's
``tests/test_paper_alpa.py`` runs it).

Run: .venv/bin/python benchmarks/paper_alpa.py [--tiny] [--only gpt|moe|wide_resnet]
"""

from __future__ import annotations

import argparse
import math
import platform
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import autoplan
from autoplan import models

RESULTS = "alpa repository, osdi22_artifact/results_e2e.tsv"
SETUP = {"remat": True, "dtype": "float16", "master_weights": "float32"}


@dataclass(frozen=True)
class Config:
    """One published configuration: the model, Alpa's GPU count and settings, and what Alpa
    published for it."""

    model: str
    size: str
    gpus: int
    settings: dict[str, Any]
    alpa_plan: str
    alpa_tflops: float  # per GPU, parax.auto
    megatron_tflops: float | None = None  # per GPU, megatron
    step: float | None = None  # a measured step given directly (Wide-ResNet)
    notes: tuple[str, ...] = field(default=())

    @property
    def name(self) -> str:
        return f"{ {'gpt': 'GPT', 'moe': 'MoE', 'wide_resnet': 'WRN'}[self.model]} {self.size}"


CONFIGS = [
    Config("gpt", "2.6B", 8, {}, "3 stages", 61.61, 50.44),
    Config("gpt", "6.7B", 16, {}, "2 x (1,8)", 60.0, 56.59),
    Config("gpt", "15B", 32, {}, "4 x (1,8)", 59.9, 58.24),
    Config("gpt", "39B", 64, {}, "16 x (1,4)", 57.0, 57.84),
    Config("moe", "10B", 16, {"master_weights": "none"}, "2 x (1,8)", 45.36),
    Config("wide_resnet", "2B", 8, {"dtype": "float32", "master_weights": "none"},
           "2 x 8 blocks on (1,4), 24 micro-batches", 8.04, step=44.8),
]


def alpa_flops(cfg: Config, config: dict) -> float | None:
    """Alpa's FLOP count of one step with rematerialisation (None where it is not reproduced)."""
    if cfg.model == "gpt":
        b, s, h, n, v = (config[k] for k in ("batch", "seq_len", "hidden", "layers", "vocab"))
        return 96 * b * s * h * h * n * (1 + s / (6 * h)) + 6 * b * s * h * v
    if cfg.model == "moe":
        return models.moe.alpa_flops(config) * 4 / 3
    return None


def measured_step(cfg: Config, config: dict, tflops: float | None) -> float | None:
    """Alpa's measured step time (seconds) at ``tflops`` per GPU."""
    if tflops is None:
        return None
    flops = alpa_flops(cfg, config)
    if flops is None:
        return cfg.step if tflops == cfg.alpa_tflops else None
    return flops / (tflops * 1e12 * cfg.gpus)


def cluster_for(gpus: int, preset: str = "p3.16xlarge") -> autoplan.Cluster:
    if gpus <= 8:
        return autoplan.Cluster.preset(preset, 1, devices_per_node=gpus)
    return autoplan.Cluster.preset(preset, gpus // 8)


def layout(p: autoplan.Plan) -> str:
    """A plan's stages as ``layers submesh->logical mesh``, equal neighbours folded."""
    if not p.is_pipeline:
        mesh = "x".join(map(str, p.stages[0].mesh_shape)) if p.stages else "?"
        return f"one stage, mesh {mesh}"
    parts = [f"{s.layer_range[1] - s.layer_range[0]}L {s.submesh_shape[0]}x{s.submesh_shape[1]}"
             f"->{'x'.join(map(str, s.mesh_shape))}" for s in p.stages]
    out: list[list[Any]] = []
    for part in parts:
        if out and out[-1][1] == part:
            out[-1][0] += 1
        else:
            out.append([1, part])
    return "; ".join(part if n == 1 else f"{n} x {part}" for n, part in out)


@dataclass
class Row:
    cfg: Config
    result: autoplan.SearchResult
    seconds: float
    measured: float | None

    @property
    def best(self) -> autoplan.Plan:
        return self.result.best

    @property
    def ratio(self) -> float | None:
        return self.best.predicted.step_time / self.measured if self.measured else None


def run(cfg: Config, tiny: bool = False, baselines: bool = True) -> Row:
    """Search one configuration (at the zoo's tiny size on 2 GPUs with ``tiny``)."""
    settings = {**SETUP, **cfg.settings}
    wl = models.get(cfg.model, "tiny" if tiny else cfg.size, **settings)
    cluster = cluster_for(2 if tiny else cfg.gpus)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # (MoE's token groups and Wide-ResNet's batch norm mix examples across the batch; Alpa
        # micro-batches them all the same, so the comparison accepts the change)
        res = autoplan.search(wl, cluster, baselines="paper" if baselines else False,
                              cache=False, allow_microbatching_mixed=True)
    seconds = time.perf_counter() - t0
    return Row(cfg, res, seconds, None if tiny else measured_step(cfg, wl.config, cfg.alpa_tflops))


def _fmt(x: float | None, unit: str = " s", digits: int = 1) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    if unit == " s" and x < 1:
        return f"{x * 1e3:.3g} ms"
    return f"{x:.{digits}f}{unit}"


def paper_table(rows: list[Row]) -> list[str]:
    out = ["| config | GPUs | dtype | Alpa's plan | autoplan's plan | micro-batches | predicted step "
           "| Alpa measured | predicted / measured | memory/device | search |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r.best
        dtype = {**SETUP, **r.cfg.settings}["dtype"]
        out.append(f"| {r.cfg.name} | {p.cluster.num_devices} | {dtype} | {r.cfg.alpa_plan} | "
                   f"{layout(p)} | {p.schedule.microbatches if p.is_pipeline else '-'} | "
                   f"{_fmt(p.predicted.step_time)} | {_fmt(r.measured)} | "
                   f"{_fmt(r.ratio, '', 2)} | {p.predicted.memory_per_device / 2**30:.1f} GiB | "
                   f"{r.seconds:.0f} s |")
    return out


def intra_only(res: autoplan.SearchResult) -> autoplan.Plan | None:
    """autoplan's best plan without pipelining (Alpa's intra-operator-only ablation): the
    fastest that fits the device, else the fastest."""
    plans = [p for p in res.candidates if not p.is_pipeline]
    return min(plans, key=lambda p: (p.predicted.memory_per_device > p.cluster.device_memory,
                                     p.predicted.step_time), default=None)


MEGATRON = "baseline: Megatron TP x PP"
BASELINES = (("Megatron TP x PP (best of grid)", MEGATRON),
             ("ZeRO-2", "baseline: ZeRO-2"), ("ZeRO-3", "baseline: ZeRO-3"),
             ("intra-op only", None), ("inter-op only", "baseline: inter-op only"))


def baseline(res: autoplan.SearchResult, label: str) -> autoplan.Plan | None:
    """The search's baseline plan of ``label`` (None where it has none)."""
    return next((b for b in res.baselines if b.label == label), None)


def baseline_table(rows: list[Row]) -> list[str]:
    """autoplan's best against each baseline: its predicted step and autoplan's speed-up over it
    (``OOM`` where the baseline does not fit the device, ``-`` where it does not apply)."""
    head = " | ".join(name for name, _ in BASELINES)
    out = [f"| config | autoplan | {head} | Alpa over Megatron, measured "
           "| Megatron predicted / measured |",
           "|" + "---|" * (4 + len(BASELINES))]
    for r in rows:
        best = r.best.predicted.step_time
        cells = []
        for _, label in BASELINES:
            p = intra_only(r.result) if label is None else baseline(r.result, label)
            if p is None:
                cells.append("-")
                continue
            t = p.predicted.step_time
            oom = p.predicted.memory_per_device > p.cluster.device_memory
            cells.append(f"{_fmt(t)} ({'OOM' if oom else f'{t / best:.2f}x'})")
        mega = measured_step(r.cfg, _config(r), r.cfg.megatron_tflops) if r.measured else None
        alpa = r.measured
        cells.append(f"{mega / alpa:.2f}x" if mega and alpa else "-")
        ratio = megatron_ratio(r, mega)
        cells.append("-" if ratio is None else f"{ratio:.2f}")
        out.append(f"| {r.cfg.name} | {_fmt(best)} | " + " | ".join(cells) + " |")
    return out


def megatron_ratio(r: Row, measured: float | None) -> float | None:
    """The like-for-like check of the cost model on a second system: the predicted step of
    Megatron-LM's best grid layout (the :data:`MEGATRON` baseline plan) over Megatron-LM's
    measured step on the same configuration (``measured``; None where the artifact has none).
    Alpa's measured step is of Alpa's own plan, not autoplan's; this one compares layouts of one
    family on both sides."""
    mega = baseline(r.result, MEGATRON)
    if mega is None or not measured:
        return None
    return mega.predicted.step_time / measured


def _config(r: Row) -> dict:
    return models.get(r.cfg.model, r.cfg.size).config


def configs(tiny: bool = False, only: str | None = None) -> list[Config]:
    """The configurations to run: every one, or at tiny size one per model."""
    out = [c for c in CONFIGS if only in (None, c.model)]
    if tiny:
        out = list({c.model: c for c in reversed(out)}.values())[::-1]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="the zoo's tiny sizes on 2 GPUs")
    ap.add_argument("--only", default=None, choices=["gpt", "moe", "wide_resnet"])
    ap.add_argument("--no-baselines", action="store_true")
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}; cluster preset: "
          f"{autoplan.Cluster.preset('p3.16xlarge').describe_profile()}")
    rows = []
    for cfg in configs(args.tiny, args.only):
        rows.append(run(cfg, tiny=args.tiny, baselines=not args.no_baselines))
        print(paper_table(rows[-1:])[-1], flush=True)
    print()
    print("\n".join(paper_table(rows)))
    if not args.no_baselines:
        print()
        print("\n".join(baseline_table(rows)))
    print(f"\nsources: {RESULTS}; step = Alpa's FLOPs / (TFLOPS x GPUs); plans from Alpa's "
          "benchmark suites")


if __name__ == "__main__":
    main()
