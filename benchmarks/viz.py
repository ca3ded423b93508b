"""The cost of showing plans: figures at scale, the Explorer in a kernel, saved notebook sizes.

1. Figures (``figures``): a synthetic 96-layer GPT-like plan (GPT-3-sized layers, 8 pipeline
   stages of 12 layers, each on one p3.16xlarge host as a 2x4 mesh, Megatron-style specs, ~600
   forward dot operators, 1F1B with 32 micro-batches), 6 plans to compare and a 98-layer graph;
   the same layers on 1,024 devices (128 hosts, 16 stages on 8x8 meshes) with 128
   micro-batches. Target: every figure of a plan together in under 2 s on 2 cores.
2. The Explorer in a kernel (``kernel``): a fresh ``python3`` kernel runs the setup cell, then
   the cell ``ex = Explorer(model="gpt", size="tiny", cluster="cpu:8"); ex``; the time from the
   execute request to the kernel's idle reply is what a user waits before the next cell runs
   (the search itself continues in the background). Target: 1 s or less. Also the size of the
   messages the display sent (the widgets' state, and plotly.js once).
3. Saved notebooks (``notebooks``): each notebook in ``notebooks/`` run top to bottom with
   nbclient, its widget state stored as JupyterLab's "save widget state" does, and written to
   disk: its size. Target: under 1.5 MB with an Explorer and its figures.

Run on a quiet machine: .venv/bin/python benchmarks/viz.py [figures] [kernel] [notebooks]
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import astuple
from pathlib import Path

from autoplan.costs._cluster import Cluster
from autoplan.plans._plan import (
    Comm,
    InputSpec,
    OpSharding,
    Plan,
    Predicted,
    Schedule,
    Stage,
    TensorSharding,
)
from autoplan.plans._schedule import schedule_events
from autoplan.viz import (
    compare_figure,
    graph_figure,
    memory_figure,
    report_html,
    sharding_figure,
    stage_figure,
    timeline_figure,
)

__all__ = ["gpt_plan", "gpt_layers", "variants", "one_f_one_b", "main", "kernel_return",
           "notebook_sizes"]

ROOT = Path(__file__).resolve().parents[1]

X, Y = ("x",), ("y",)


def one_f_one_b(fwd: list[float], bwd: list[float], m: int) -> list[tuple]:
    """Earliest-start 1F1B events ``(start, end, mesh, microbatch, stage, kind)``."""
    return sorted(astuple(e) for e in schedule_events("1f1b", len(fwd), m, fwd, bwd))


def _t(name: str, role: str, shape: tuple[int, ...], spec: tuple) -> TensorSharding:
    return TensorSharding(name, role, shape, "bfloat16", spec)


def gpt_plan(layers: int = 96, stages: int = 8, microbatches: int = 32, hidden: int = 12288,
             seq: int = 2048, batch: int = 8, hosts_per_stage: int = 1) -> Plan:
    """A synthetic Megatron-style pipeline plan for a GPT-like model; each stage on
    ``hosts_per_stage`` p3.16xlarge hosts (8 devices each): a 2x4 mesh on one host, a
    ``hosts x 8`` mesh on several."""
    cluster = Cluster.preset("p3.16xlarge", stages * hosts_per_stage)
    per = layers // stages
    ndev = 8 * hosts_per_stage
    mesh = (2, 4) if hosts_per_stage == 1 else (ndev // 8, 8)
    h, tok = hidden, batch * seq
    st_list = []
    # the token batch: its leading dimension is what the micro-batches split
    inputs = [InputSpec(2, "batch", "['tokens']", "batch", (batch * microbatches, seq), "int32",
                        (None, None), 0)]
    op_id = 0
    for s in range(stages):
        ops = []
        names = tuple(f"layer{i}" for i in range(s * per, (s + 1) * per))
        for lay in names:
            p = f"params['{lay}']"
            shapes = [
                ("qkv", (tok, h), (h, 3 * h), (tok, 3 * h), (None, Y), (X, Y)),
                ("scores", (batch, 96, seq, 128), (batch, 96, 128, seq), (batch, 96, seq, seq),
                 (X, Y, None, None), (X, Y, None, None)),
                ("attn_v", (batch, 96, seq, seq), (batch, 96, seq, 128), (batch, 96, seq, 128),
                 (X, Y, None, None), (X, Y, None, None)),
                ("out", (tok, h), (h, h), (tok, h), (Y, None), (X, None)),
                ("fc1", (tok, h), (h, 4 * h), (tok, 4 * h), (None, Y), (X, Y)),
                ("fc2", (tok, 4 * h), (4 * h, h), (tok, h), (Y, None), (X, None)),
            ]
            for name, a, w, o, wspec, ospec in shapes:
                in_spec = (X,) + (None,) * (len(a) - 1) if name not in ("out", "fc2") else (X, Y)
                if len(w) == 2:
                    wname = f"{p}['{name}']['kernel']"
                    inputs.append(InputSpec(0, "params", f"['{lay}']['{name}']['kernel']", "parameter",
                                            w, "bfloat16", wspec, s))
                else:
                    wname = f"%{op_id}.rhs"
                ops.append(OpSharding(
                    op=op_id, primitive="dot_general", scope=f"gpt/{lay}/{name}", layer=lay,
                    role="forward", strategy="Megatron", flops=2.0 * tok * w[-1] * a[-1],
                    tensors=(_t(f"%{op_id}.lhs", "input", a, in_spec), _t(wname, "weight", w, wspec),
                             _t(f"%{op_id}", "output", o, ospec)),
                    comm=(Comm("all-reduce", tok * h * 2 / 2, ("y",), 1e-3),) if name in ("out", "fc2") else ()))
                op_id += 1
        st_list.append(Stage(index=s, layers=names, layer_range=(s * per, (s + 1) * per),
                             submesh_shape=(hosts_per_stage, 8), device_ids=tuple(range(ndev * s, ndev * (s + 1))),
                             mesh_shape=mesh,
                             axis_names=("x", "y"), ops=tuple(ops), forward_time=0.05 + 0.002 * s,
                             backward_time=0.1 + 0.004 * s, memory=12e9))
    fwd = [s.forward_time for s in st_list]
    bwd = [s.backward_time for s in st_list]
    events = one_f_one_b(fwd, bwd, microbatches)
    step = max(e[1] for e in events)
    busy = sum(e[1] - e[0] for e in events)
    pred = Predicted(step_time=step, throughput=batch * microbatches / step, memory_per_device=12e9,
                     compute_time=busy / stages, comm_time=0.2 * step,
                     comm_time_by_kind={"all-reduce": 0.15 * step, "send-recv": 0.05 * step},
                     bubble_fraction=1 - busy / (stages * step), mfu=0.4)
    return Plan(model=f"gpt-{layers}L", fingerprint="0" * 16, cluster=cluster, stages=tuple(st_list),
                inputs=tuple(inputs),
                schedule=Schedule("1f1b", microbatches, stages, events=tuple(events)), predicted=pred)


def variants(plan: Plan) -> list[Plan]:
    """The plan and five alternatives with other labels and predictions."""
    out = [plan]
    for k, (label, ts, ms) in enumerate([("data-parallel", 1.6, 1.3), ("megatron", 1.2, 0.8),
                                         ("zero-3", 1.9, 0.5), ("gpipe", 1.1, 1.2),
                                         ("alpa", 1.05, 0.9)]):
        p = plan.predicted
        out.append(plan.with_(label=label, predicted=Predicted(
            step_time=p.step_time * ts, throughput=p.throughput / ts,
            memory_per_device=p.memory_per_device * ms, compute_time=p.compute_time,
            comm_time=p.comm_time * ts, comm_time_by_kind={"all-reduce": 0.1 * k * p.step_time,
                                                           "all-gather": 0.05 * k * p.step_time},
            bubble_fraction=p.bubble_fraction / (k + 1))))
    return out


def gpt_layers(layers: int = 96) -> dict:
    """The condensed graph's input: embed, ``layers`` blocks of one class, the head."""
    lay = [{"name": "embed", "flops": 1e11, "ops": 4, "class": None}]
    lay += [{"name": f"layer{i}", "flops": 5e13, "ops": 60, "class": 0} for i in range(layers)]
    lay.append({"name": "head", "flops": 2e12, "ops": 6, "class": 1})
    return {"layers": lay, "segments": list(range(1, layers + 1, max(1, layers // 8))),
            "critical": list(range(1, layers + 1, max(1, layers // 8))), "fold_ratio": float(layers)}


def _time(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _figure_table(title: str, plan: Plan, repeat: int) -> None:
    plans = variants(plan)
    graph = gpt_layers()
    cases = [("sharding_figure", lambda: sharding_figure(plan)),
             ("sharding (drill-down)", lambda: sharding_figure(plan, layer="layer7")),
             ("stage_figure", lambda: stage_figure(plan)),
             ("memory_figure", lambda: memory_figure(plan)),
             ("timeline_figure", lambda: timeline_figure(plan)),
             ("compare_figure", lambda: compare_figure(plans, highlight=0)),
             ("graph_figure", lambda: graph_figure(graph))]
    print(f"\nplan: {title}: {plan.describe()[:60]}; {len(plan.ops)} op shardings, "
          f"{len(plan.schedule.events)} events, {len(plans)} plans compared; median of {repeat}")
    print(f"{'figure':<22} {'traces':>7} {'build s':>8} {'to_json s':>10} {'JSON MB':>8}")
    total = 0.0
    for name, fn in cases:
        dt, fig = _time(fn, repeat)
        tj, js = _time(fig.to_json, 1)
        total += dt
        print(f"{name:<22} {len(fig.data):>7} {dt:>8.3f} {tj:>10.3f} {len(js) / 1e6:>8.2f}")
    print(f"{'all figures':<22} {'':>7} {total:>8.3f}   (target < 2 s)")
    dt, text = _time(lambda: report_html(plans, graph=graph), 1)
    print(f"{'report_html':<22} {'':>7} {dt:>8.3f}   ({len(text) / 1e6:.1f} MB, plotly.js inline)")


def figures(repeat: int = 3) -> None:
    """Build time, trace count and JSON size of every figure of two synthetic plans."""
    _figure_table("96 layers, 8 stages x 8 devices, 32 micro-batches", gpt_plan(), repeat)
    _figure_table("96 layers, 16 stages x 64 devices (1,024), 128 micro-batches",
                  gpt_plan(stages=16, microbatches=128, hosts_per_stage=8), repeat)


SETUP = ("import jax\njax.config.update('jax_num_cpu_devices', 8)\nimport autoplan\n"
         "import autoplan.viz\nfrom autoplan.viz import Explorer\nautoplan.viz.set_notebook_renderer()")
SHOW = 'ex = Explorer(model="gpt", size="tiny", cluster="cpu:8")\nex'


def kernel_return(repeat: int = 3, timeout: float = 600.0) -> list[dict]:
    """Per fresh kernel: the seconds from the request to run ``SHOW`` to the kernel's reply
    (``ex = Explorer(...); ex``: construct, display, start the search), and the bytes of the
    messages it sent while doing so."""
    from jupyter_client.manager import start_new_kernel  # noqa: PLC0415

    rows = []
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    for _ in range(repeat):
        km, kc = start_new_kernel(kernel_name="python3", env=env, cwd=str(ROOT / "notebooks"))
        try:
            kc.execute_interactive(SETUP, timeout=timeout, output_hook=lambda m: None)
            sent: list[int] = []

            def hook(msg: dict, sent: list[int] = sent) -> None:
                sent.append(len(json.dumps(msg["content"], default=str))
                            + sum(len(b) for b in msg.get("buffers") or []))

            t0 = time.perf_counter()
            reply = kc.execute_interactive(SHOW, timeout=timeout, output_hook=hook)
            dt = time.perf_counter() - t0
            assert reply["content"]["status"] == "ok", reply["content"]
            # the search goes on in the kernel: wait for it so the next kernel starts on a quiet CPU
            kc.execute_interactive("ex.wait_idle(900)", timeout=timeout, output_hook=lambda m: None)
            rows.append({"seconds": dt, "messages": len(sent), "bytes": sum(sent)})
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    return rows


def notebook_sizes(names: list[str] | None = None, timeout: int = 1200) -> list[tuple[str, int, int]]:
    """``(notebook, bytes saved, bytes of widget state)`` for each notebook, run with nbclient
    and saved with its widget state, as JupyterLab saves it."""
    import nbclient  # noqa: PLC0415
    import nbformat  # noqa: PLC0415

    out = []
    folder = ROOT / "notebooks"
    for name in names or sorted(p.name for p in folder.glob("*.ipynb")):
        nb = nbformat.read(folder / name, as_version=4)
        client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                         store_widget_state=True,
                                         resources={"metadata": {"path": str(folder)}})
        client.execute(env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)})
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            nbformat.write(nb, path)
            size = path.stat().st_size
        state = len(json.dumps(nb.metadata.get("widgets", {})))
        out.append((name, size, state))
    return out


def main(parts: list[str]) -> None:
    print(f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}; {time.strftime('%Y-%m-%d %H:%M')}")
    if "figures" in parts:
        figures()
    if "kernel" in parts:
        rows = kernel_return()
        print(f"\nExplorer displayed in a fresh kernel ({len(rows)} kernels): seconds to the reply")
        for r in rows:
            print(f"  {r['seconds']:.3f} s, {r['messages']} messages, {r['bytes'] / 1e6:.2f} MB sent")
        print(f"  median {statistics.median(r['seconds'] for r in rows):.3f} s   (target <= 1 s)")
    if "notebooks" in parts:
        print(f"\n{'saved notebook':<24} {'MB':>6} {'widget state MB':>16}   (target < 1.5 MB)")
        for name, size, state in notebook_sizes():
            print(f"{name:<24} {size / 1e6:>6.2f} {state / 1e6:>16.2f}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["figures", "kernel", "notebooks"])
