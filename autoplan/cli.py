"""The ``autoplan`` command line.

    autoplan models                                   list workloads and sizes
    autoplan trace gpt --size 1.3B                    trace a train step, print its graph summary
    autoplan plan gpt --size 39B --cluster p3.16xlarge:8 -o plan.json
    autoplan plan mypkg.train:workload --cluster cpu:8 -o plan.json    a user's own workload
    autoplan show plan.json                           print a plan file's summary
    autoplan plan gpt --cluster cpu:8 --report report.html    the search's HTML report too
    autoplan report plan.json -o report.html          self-contained HTML report of plan files
    autoplan report gpt --size tiny --cluster cpu:8 -o report.html   ... of a search: every plan
    autoplan launch plan.json --model gpt --size tiny  run it on the devices attached
    autoplan launch plan.json --model gpt --print-command slurm      the srun line for a cluster

A workload is a zoo name (``autoplan models``) or ``module:function`` (see
``autoplan._loader``): the function is imported from the current directory or ``PYTHONPATH``
and called with the ``--set KEY=VALUE`` items (and ``--size``/``--batch`` when given) as keyword
arguments.
"""

from __future__ import annotations

import argparse
import json
import re
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


def _spec(args) -> dict:
    """The workload spec of the model arguments: ``{"model": ..., size, batch, overrides}``."""
    from ._loader import parse_spec  # noqa: PLC0415

    overrides = _overrides(args.set)
    for key in ("model", "size", "batch"):
        if key in overrides:
            raise AutoplanError(f"--set {key}=... is not a config field. Got --set "
                                f"{key}={overrides[key]!r}. Fix: use "
                                f"{'the model argument' if key == 'model' else '--' + key}.")
    return parse_spec(args.model, size=args.size, batch=args.batch, **overrides)


def _workload(args, abstract=True):
    from ._loader import load_workload  # noqa: PLC0415

    return load_workload(_spec(args), abstract=abstract)


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


def _search(args):
    """The search the plan options ask for: ``(result, seconds)``."""
    from ._cluster import Cluster  # noqa: PLC0415
    from .search import search  # noqa: PLC0415

    wl = _workload(args)
    cluster = Cluster.parse(args.cluster)
    kw = {"level": args.level, "pipeline": {"auto": "auto", "yes": True, "no": False}[args.pipeline],
          "schedule": args.schedule, "microbatches": args.microbatches,
          "submesh_hosts": args.submesh_hosts}
    if args.mesh:
        if not re.fullmatch(r"\d+(x\d+)*", args.mesh):
            raise AutoplanError(f"--mesh should be a logical mesh shape such as 2x4. Got "
                                f"{args.mesh!r}.")
        kw["mesh_shape"] = tuple(int(x) for x in args.mesh.split("x"))
    t0 = time.perf_counter()
    result = search(wl, cluster, **kw)
    return result, time.perf_counter() - t0


def cmd_plan(args) -> int:
    result, dt = _search(args)
    print(result.table())
    print()
    print(result.best.summary())
    print(f"\nsearch took {dt:.2f} s")
    if args.output:
        result.best.to_json(args.output)
        print(f"plan written to {args.output}")
    if args.report:
        from .viz import report_html  # noqa: PLC0415

        report_html(result, path=args.report)
        print(f"report of {len(result.plans)} plans written to {args.report}")
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
    import os  # noqa: PLC0415

    from ._plan import Plan  # noqa: PLC0415
    from .viz import report_html  # noqa: PLC0415

    files = [s for s in args.source if os.path.isfile(s)]
    if files and len(files) == len(args.source):
        plans = [Plan.from_json(f) for f in files]
        report_html(plans, path=args.output)
        what = f"{len(plans)} plan file{'s' if len(plans) != 1 else ''}"
    elif len(args.source) == 1 and not args.source[0].endswith(".json"):
        args.model = args.source[0]
        result, dt = _search(args)
        print(result.table())
        report_html(result, path=args.output)
        what = f"a search of {args.model} ({len(result.plans)} plans, {dt:.1f} s)"
    else:
        missing = [s for s in args.source if not os.path.isfile(s)]
        raise AutoplanError(f"report: the sources should be plan files (written by 'autoplan plan "
                            f"-o') or one workload to search. Got {missing[0]!r}, which is not a "
                            "file. Fix: check the path, or pass a zoo name or module:function "
                            "alone.")
    print(f"report of {what} written to {args.output}")
    return 0


def cmd_launch(args) -> int:
    import signal  # noqa: PLC0415

    from ._plan import Plan  # noqa: PLC0415
    from .exec import _launch  # noqa: PLC0415
    from .exec._layout import cluster_command  # noqa: PLC0415

    plan = Plan.from_json(args.plan)
    spec = _spec(args)
    if args.print_command:
        # a plan made for emulated CPU devices runs on CPUs unless told otherwise
        platform = args.platform or ("cpu" if plan.cluster.device_kind == "cpu" else None)
        print(cluster_command(args.print_command, args.plan, spec, plan.num_devices,
                              plan.cluster.devices_per_node, nodes=args.nodes, platform=platform,
                              per_host=args.per_host, steps=args.steps, seed=args.seed))
        return 0
    handle = None
    try:
        # SIGTERM and SIGHUP end the launch as Ctrl-C does: workers stopped, one line, no traceback
        with _launch.raise_on_signals():
            handle = _launch.launch(
                args.plan, spec, num_processes=args.num_processes,
                devices_per_process=args.devices_per_process, steps=args.steps,
                timeout=args.timeout, platform=args.platform, per_host=args.per_host,
                seed=args.seed, hang_timeout=args.hang_timeout, port=args.port)
            print(f"launching [{plan.label}] {plan.describe()} on {handle.layout.describe()}; "
                  f"worker pids {' '.join(map(str, handle.pids))}", flush=True)
            while not handle.done:
                for ev in handle.poll():
                    if ev.get("event") == "step" and ev.get("process") == 0:
                        print(f"  step {ev['step']}: loss {ev['loss']:.6f} "
                              f"({ev['step_time'] * 1e3:.1f} ms)", flush=True)
                    elif ev.get("event") == "retry":
                        print(f"  {ev['reason']}: retrying on port {ev['port']}", flush=True)
                time.sleep(0.1)
            result = handle.wait()
    except (KeyboardInterrupt, _launch.LaunchInterrupted) as err:
        if handle is not None:
            handle.cancel()
        signum = getattr(err, "signum", signal.SIGINT)
        print(f"autoplan: launch interrupted by {signal.Signals(signum).name}; every worker was "
              "stopped", file=sys.stderr)
        return 128 + int(signum)
    print(f"launch of [{plan.label}] {plan.describe()}: {result.layout}, {args.steps} step(s) in "
          f"{result.wall_time:.1f} s")
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

    def model_args(sp, flag=False):
        help_ = ("zoo model name (see 'autoplan models') or module:function, a function "
                 "returning the user's workload (found in the current directory or PYTHONPATH)")
        if flag:
            sp.add_argument("--model", required=True, help=help_)
        else:
            sp.add_argument("model", help=help_)
        sp.add_argument("--size", default=None,
                        help="model size (zoo default tiny; passed to a function as size=)")
        sp.add_argument("--batch", type=int, default=None,
                        help="global batch (default: the size's; passed to a function as batch=)")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a config field (zoo) or pass a keyword argument "
                             "(function), e.g. --set layers=4")

    sp = sub.add_parser("trace", help="trace a workload's train step and print its graph")
    model_args(sp)
    sp.set_defaults(func=cmd_trace)

    def search_args(sp):
        sp.add_argument("--cluster", default="cpu:8",
                        help="preset[:nodes], e.g. p3.16xlarge:8 (default cpu:8)")
        sp.add_argument("--level", default="auto",
                        choices=["auto", "exhaustive", "hierarchical", "folded"],
                        help="search level (default auto: exhaustive where it is the fast path, "
                             "else folded)")
        sp.add_argument("--pipeline", default="auto", choices=["auto", "yes", "no"])
        sp.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
        sp.add_argument("--microbatches", type=int, default=None)
        sp.add_argument("--submesh-hosts", default="auto", choices=["auto", "all", "pow2"],
                        help="multi-host stage submeshes: all (Alpa's 2..N hosts), pow2 (2, 4, 8, "
                             "... and N hosts), auto (all up to 16 hosts)")
        sp.add_argument("--mesh", default=None, help="logical mesh for an intra-op plan, e.g. 2x4")

    sp = sub.add_parser("plan", help="search plans for a workload on a cluster")
    model_args(sp)
    search_args(sp)
    sp.add_argument("-o", "--output", default=None, help="write the best plan as JSON")
    sp.add_argument("--report", default=None, metavar="PATH",
                    help="write the search's self-contained HTML report (every plan and their "
                         "comparison)")
    sp.set_defaults(func=cmd_plan)

    sp = sub.add_parser("show", help="print a plan file")
    sp.add_argument("plan")
    sp.add_argument("--specs", action="store_true", help="list every input's PartitionSpec")
    sp.set_defaults(func=cmd_show)

    sp = sub.add_parser("report", help="write a self-contained HTML report of plan files, or of a "
                                       "search of a workload (every plan and their comparison)")
    sp.add_argument("source", nargs="+",
                    help="plan files written by 'autoplan plan -o' (the first is the chosen one), "
                         "or one workload (zoo name or module:function) to search")
    sp.add_argument("--size", default=None, help="(a workload) model size")
    sp.add_argument("--batch", type=int, default=None, help="(a workload) global batch")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="(a workload) override a config field or pass a keyword argument")
    search_args(sp)
    sp.add_argument("-o", "--output", default="report.html")
    sp.set_defaults(func=cmd_report)

    sp = sub.add_parser("launch", help="run a plan on the devices attached (workers joined by "
                                       "jax.distributed), or print the command for a cluster")
    sp.add_argument("plan")
    model_args(sp, flag=True)
    sp.add_argument("--platform", default=None, choices=["cpu", "gpu", "cuda", "rocm", "tpu"],
                    help="default: detected (emulated CPU devices only when no accelerator is "
                         "attached)")
    sp.add_argument("--num-processes", type=int, default=None,
                    help="default: one per GPU, one per TPU host, or 2 for emulated CPU devices")
    sp.add_argument("--devices-per-process", type=int, default=None,
                    help="default: the plan's devices divided by the processes")
    sp.add_argument("--per-host", action="store_true",
                    help="GPUs: one worker per host holding all its GPUs (default one per GPU)")
    sp.add_argument("--steps", type=int, default=2)
    sp.add_argument("--seed", type=int, default=0, help="PRNG seed of the workload's arrays")
    sp.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole launch")
    sp.add_argument("--hang-timeout", type=float, default=None,
                    help="seconds without progress from any worker that fail the launch "
                         "(default: max(60, 5 x the slowest step))")
    sp.add_argument("--port", type=int, default=None,
                    help="coordinator port to try first (default: a free one; a taken port is "
                         "retried on another)")
    sp.add_argument("--print-command", default=None, choices=["slurm", "mpi"],
                    help="print the srun (SLURM) or mpirun (Open MPI) command that runs the plan "
                         "on a cluster (one worker per GPU, or per node for CPU/TPU or with "
                         "--per-host), and exit")
    sp.add_argument("--nodes", type=int, default=None,
                    help="--print-command: nodes to use (default: as the plan's cluster)")
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
