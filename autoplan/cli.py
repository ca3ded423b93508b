"""The ``autoplan`` command line.

    autoplan models                                   list workloads and sizes
    autoplan trace gpt --size 1.3B                    trace a train step, print its graph summary
    autoplan plan gpt --size 39B --cluster p3.16xlarge:8 -o plan.json
    autoplan show plan.json                           print a plan file's summary
    autoplan report plan.json -o report.html          self-contained HTML report
    autoplan launch plan.json --model gpt --size tiny --num-processes 2 --devices-per-process 4
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from ._errors import AutoplanError

__all__ = ["main"]


def _overrides(items: Sequence[str] | None) -> dict:
    out = {}
    for item in items or ():
        key, sep, val = item.partition("=")
        if not sep:
            raise AutoplanError(f"--set expects KEY=VALUE. Got {item!r}. Fix: e.g. --set layers=4.")
        try:
            out[key] = json.loads(val)
        except json.JSONDecodeError:
            out[key] = val
    return out


def _microbatches(text: str) -> int | str:
    """``--microbatches``: ``auto`` or a positive integer."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"should be 'auto' or a positive integer. Got {text!r}")
    return value


def _workload(args, abstract=True):
    from . import models  # noqa: PLC0415

    return models.get(args.model, size=args.size, batch=args.batch, abstract=abstract,
                      **_overrides(args.set))


def cmd_models(args) -> int:
    from . import models  # noqa: PLC0415

    for name, sizes in models.list_models().items():
        print(f"{name:<12} {', '.join(sizes)}")
    return 0


def cmd_trace(args) -> int:
    from ._trace import trace  # noqa: PLC0415

    wl = _workload(args)
    t0 = time.perf_counter()
    g = trace(wl)
    dt = time.perf_counter() - t0
    print(g.summary())
    print(f"  traced in      : {dt:.2f} s")
    return 0


def cmd_plan(args) -> int:
    from ._cluster import Cluster  # noqa: PLC0415
    from .search import search  # noqa: PLC0415

    wl = _workload(args)
    cluster = Cluster.parse(args.cluster)
    kw = {"level": args.level, "pipeline": {"auto": "auto", "yes": True, "no": False}[args.pipeline],
          "schedule": args.schedule, "microbatches": args.microbatches,
          "submesh_hosts": args.submesh_hosts, "num_layers": args.num_layers,
          "stage_algorithm": args.stage_algorithm}
    if args.mesh:
        kw["mesh_shape"] = tuple(int(x) for x in args.mesh.split("x"))
    t0 = time.perf_counter()
    result = search(wl, cluster, **kw)
    dt = time.perf_counter() - t0
    print(result.table())
    print()
    print(result.best.summary())
    print(f"\nsearch took {dt:.2f} s")
    if args.output:
        result.best.to_json(args.output)
        print(f"plan written to {args.output}")
    return 0


def cmd_show(args) -> int:
    from ._plan import Plan  # noqa: PLC0415

    plan = Plan.from_json(args.plan)
    print(plan.summary())
    if args.specs:
        for i in plan.inputs:
            from ._plan import spec_to_pspec  # noqa: PLC0415

            print(f"  {i.name:<60} {i.kind:<16} {str(spec_to_pspec(i.spec))}")
    return 0


def cmd_report(args) -> int:
    from ._plan import Plan  # noqa: PLC0415
    from .viz import report_html  # noqa: PLC0415

    plan = Plan.from_json(args.plan)
    report_html(plan, path=args.output)
    print(f"report written to {args.output}")
    return 0


def cmd_launch(args) -> int:
    from ._plan import Plan  # noqa: PLC0415
    from .exec import launch  # noqa: PLC0415

    plan = Plan.from_json(args.plan)
    spec = {"model": args.model, "size": args.size, **_overrides(args.set)}
    if args.batch:
        spec["batch"] = args.batch
    handle = launch(plan, spec, num_processes=args.num_processes,
                    devices_per_process=args.devices_per_process, steps=args.steps,
                    timeout=args.timeout)
    result = handle.wait(args.timeout)
    print(f"launch of [{plan.label}] {plan.describe()}: {args.num_processes} process(es) x "
          f"{args.devices_per_process} device(s), {args.steps} step(s) in {result.wall_time:.1f} s")
    for proc in sorted(result.losses):
        losses = ", ".join(f"{v:.6f}" for v in result.losses[proc])
        times = ", ".join(f"{t * 1e3:.1f}" for t in result.step_times.get(proc, []))
        print(f"  process {proc}: losses {losses}   step ms {times}")
    print(f"  predicted step time {plan.predicted.step_time * 1e3:.3f} ms on {plan.cluster.spec}; "
          f"{'matched' if result.matched else 'DID NOT match'} single-device results")
    return 0 if result.matched else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autoplan", description="Auto-parallel planner for JAX training steps.")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("models", help="list workloads and sizes").set_defaults(func=cmd_models)

    def model_args(sp):
        sp.add_argument("model", help="zoo model name (see 'autoplan models')")
        sp.add_argument("--size", default="tiny", help="model size (default tiny)")
        sp.add_argument("--batch", type=int, default=None, help="global batch (default: the size's)")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a config field, e.g. --set layers=4")

    sp = sub.add_parser("trace", help="trace a zoo model's train step and print its graph")
    model_args(sp)
    sp.set_defaults(func=cmd_trace)

    sp = sub.add_parser("plan", help="search plans for a zoo model on a cluster")
    model_args(sp)
    sp.add_argument("--cluster", default="cpu:8", help="preset[:nodes], e.g. p3.16xlarge:8 (default cpu:8)")
    sp.add_argument("--level", default="folded", choices=["exhaustive", "hierarchical", "folded"])
    sp.add_argument("--pipeline", default="auto", choices=["auto", "yes", "no"])
    sp.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    sp.add_argument("--microbatches", type=_microbatches, default="auto", metavar="auto|N",
                    help="micro-batches of pipeline plans: auto (searched, default) or a count "
                         "dividing the batch")
    sp.add_argument("--num-layers", type=int, default=None, metavar="N",
                    help="layers the pipeline search clusters the operators into (default: one "
                         "per named scope, at most 64)")
    sp.add_argument("--stage-algorithm", default="auto", choices=["auto", "dp", "ilp"],
                    help="pipeline stages: dp (Alpa's stage DP), ilp (TePDist's DAG stage ILP), "
                         "auto (the ILP when the layer graph is not a chain)")
    sp.add_argument("--submesh-hosts", default="auto", choices=["auto", "all", "pow2"],
                    help="multi-host stage submeshes: all (Alpa's 2..N hosts), pow2 (2, 4, 8, ... "
                         "and N hosts), auto (all up to 16 hosts)")
    sp.add_argument("--mesh", default=None, help="logical mesh for an intra-op plan, e.g. 2x4")
    sp.add_argument("-o", "--output", default=None, help="write the best plan as JSON")
    sp.set_defaults(func=cmd_plan)

    sp = sub.add_parser("show", help="print a plan file")
    sp.add_argument("plan")
    sp.add_argument("--specs", action="store_true", help="list every input's PartitionSpec")
    sp.set_defaults(func=cmd_show)

    sp = sub.add_parser("report", help="write a self-contained HTML report of a plan")
    sp.add_argument("plan")
    sp.add_argument("-o", "--output", default="report.html")
    sp.set_defaults(func=cmd_report)

    sp = sub.add_parser("launch", help="run a plan in worker processes through jax.distributed")
    sp.add_argument("plan")
    sp.add_argument("--model", required=True)
    sp.add_argument("--size", default="tiny")
    sp.add_argument("--batch", type=int, default=None)
    sp.add_argument("--set", action="append", metavar="KEY=VALUE")
    sp.add_argument("--num-processes", type=int, default=2)
    sp.add_argument("--devices-per-process", type=int, default=4)
    sp.add_argument("--steps", type=int, default=2)
    sp.add_argument("--timeout", type=float, default=300.0)
    sp.set_defaults(func=cmd_launch)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except AutoplanError as err:
        print(f"autoplan: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
