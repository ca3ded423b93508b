"""Time to build the plan figures and the HTML report for a synthetic 96-layer GPT-like plan.

The plan: GPT-3-sized layers (hidden 12288, 96 heads), 8 pipeline stages of 12 layers, each on
one p3.16xlarge host as a 2x4 mesh (Megatron-style specs: batch over x, heads/MLP over y),
~600 forward dot operators, 1F1B with 32 micro-batches (512 events), 6 plans to compare and a
98-layer graph. Target: every figure together in under 2 s on 2 cores.
Run: .venv/bin/python benchmarks/viz.py
"""

from __future__ import annotations

import platform
import statistics
import time

from autoplan._cluster import Cluster
from autoplan._plan import (
    Comm,
    InputSpec,
    OpSharding,
    Plan,
    Predicted,
    Schedule,
    Stage,
    TensorSharding,
)
from autoplan.viz import (
    compare_figure,
    graph_figure,
    report_html,
    sharding_figure,
    stage_figure,
    timeline_figure,
)

__all__ = ["gpt_plan", "gpt_layers", "variants", "one_f_one_b", "main"]

X, Y = ("x",), ("y",)


def one_f_one_b(fwd: list[float], bwd: list[float], m: int) -> list[tuple]:
    """Earliest-start 1F1B events ``(start, end, mesh, microbatch, stage, kind)``."""
    S = len(fwd)
    orders = []
    for j in range(S):
        w = min(S - j - 1, m)
        order = [(b, "forward") for b in range(w)]
        f, b = w, 0
        while f < m:
            order += [(f, "forward"), (b, "backward")]
            f, b = f + 1, b + 1
        orders.append(order + [(k, "backward") for k in range(b, m)])
    done: dict = {}
    pos, free, events = [0] * S, [0.0] * S, []
    while any(pos[j] < len(orders[j]) for j in range(S)):
        for j in range(S):
            while pos[j] < len(orders[j]):
                mb, kind = orders[j][pos[j]]
                if kind == "forward":
                    dep = 0.0 if j == 0 else done.get((mb, j - 1, kind))
                else:
                    dep = done.get((mb, j, "forward")) if j == S - 1 else done.get((mb, j + 1, kind))
                if dep is None:
                    break
                start = max(free[j], dep)
                done[(mb, j, kind)] = free[j] = start + (fwd[j] if kind == "forward" else bwd[j])
                events.append((start, free[j], j, mb, j, kind))
                pos[j] += 1
    return sorted(events)


def _t(name: str, role: str, shape: tuple[int, ...], spec: tuple) -> TensorSharding:
    return TensorSharding(name, role, shape, "bfloat16", spec)


def gpt_plan(layers: int = 96, stages: int = 8, microbatches: int = 32, hidden: int = 12288,
             seq: int = 2048, batch: int = 8) -> Plan:
    """A synthetic Megatron-style pipeline plan for a GPT-like model."""
    cluster = Cluster.preset("p3.16xlarge", stages)
    per = layers // stages
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
                             submesh=(1, 8), device_ids=tuple(range(8 * s, 8 * s + 8)), mesh_shape=(2, 4),
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


def main(repeat: int = 3) -> None:
    plan = gpt_plan()
    plans = variants(plan)
    graph = gpt_layers()
    n_ops = len(plan.ops)
    cases = [("sharding_figure", lambda: sharding_figure(plan)),
             ("stage_figure", lambda: stage_figure(plan)),
             ("timeline_figure", lambda: timeline_figure(plan)),
             ("compare_figure", lambda: compare_figure(plans, highlight=0)),
             ("graph_figure", lambda: graph_figure(graph))]
    print(f"machine: {platform.machine()} {platform.processor() or ''}, python {platform.python_version()}")
    print(f"plan: {plan.describe()}; {n_ops} op shardings, {len(plan.schedule.events)} events, "
          f"{len(plans)} plans compared; median of {repeat}")
    print(f"{'figure':<18} {'traces':>7} {'build s':>8} {'to_json s':>10} {'JSON MB':>8}")
    total = 0.0
    for name, fn in cases:
        dt, fig = _time(fn, repeat)
        tj, js = _time(fig.to_json, 1)
        total += dt
        print(f"{name:<18} {len(fig.data):>7} {dt:>8.3f} {tj:>10.3f} {len(js) / 1e6:>8.2f}")
    print(f"{'all figures':<18} {'':>7} {total:>8.3f}   (target < 2 s)")
    dt, text = _time(lambda: report_html(plans, graph=graph), 1)
    print(f"{'report_html':<18} {'':>7} {dt:>8.3f}   ({len(text) / 1e6:.1f} MB, plotly.js inline)")


if __name__ == "__main__":
    main()
