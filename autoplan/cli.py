"""The ``autoplan`` command line.

    autoplan models                                   list workloads and sizes
    autoplan profile -o cluster.json                  measure the attached devices (a cluster file)
    autoplan trace gpt --size 1.3B                    trace a train step, print its graph summary
    autoplan plan gpt --size 39B --cluster p3.16xlarge:8 -o plan.json
    autoplan plan mypkg.train:workload --cluster cpu:8 -o plan.json    a user's own workload
    autoplan plan gpt --cluster cluster.json          plan with the measured profile
    autoplan show plan.json                           print a plan file's summary
    autoplan plan gpt --cluster cpu:8 --report report.html    the search's HTML report too
    autoplan report plan.json -o report.html          self-contained HTML report of plan files
    autoplan report gpt --size tiny --cluster cpu:8 -o report.html   ... of a search: every plan
    autoplan launch plan.json --model gpt --size tiny  run it on the devices attached
    autoplan launch plan.json --model gpt --print-command slurm      the srun line for a cluster

A workload is a zoo name (``autoplan models``) or ``module:function`` (see
``autoplan.tracing._loader``): the function is imported from the current directory or ``PYTHONPATH``
and called with the ``--set KEY=VALUE`` items (and ``--size``/``--batch`` when given) as keyword
arguments.

Every command ends in one of these exit statuses, with one line on stderr for an error (a failed
launch adds its workers' last stderr lines below it):

* 0: done.
* 1: an unexpected internal error (one line naming the exception; ``--debug`` prints the
  traceback), or a launch whose results did not match single-device execution.
* 2: bad input or an impossible request (an :class:`~autoplan.AutoplanError`: the message says
  what was wrong, the value and the fix), or a usage error.
* 128 + the signal number when interrupted: 130 for Ctrl-C (SIGINT), 143 for SIGTERM, 129 for
  SIGHUP. An interrupted command writes no output file: ``-o`` is written only when the command
  completed, and atomically (a temporary file renamed over it), so the file that was there before
  stays whole.

Output paths are checked before any work starts (an existing, writable folder; not a folder; a
name the file system allows; a regular file or a new one; not one of the files the command
reads: plan files, the cluster's profile file, the workload's source files; not the other
output), so a long search is never lost to a typo in ``-o`` and no output replaces an input.
"""

from __future__ import annotations

import argparse
import ast
import atexit
import json
import os
import select
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from autoplan.plans._plan import LEVELS

from . import _signals
from ._errors import AutoplanError, InfeasiblePlanError, SearchError

__all__ = ["main", "run"]

_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class _Interrupted(KeyboardInterrupt):
    """Raised by the command line's signal handler (SIGINT, SIGTERM, SIGHUP)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _Run:
    """The state of one :func:`main` call: the first signal received, if any, and the files
    written."""

    signum: int | None = None
    written: list[str]

    def __init__(self) -> None:
        self.written = []

    def handler(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        if _signals.unsafe(frame):  # under an extension module's start-up: raised after it
            _signals.redeliver(signum)
            return
        raise _Interrupted(signum)

    def check(self, *_: Any) -> None:
        """Raise if a signal came, even one whose exception was swallowed where it landed (in a
        garbage-collection callback, say): an interrupted command writes nothing."""
        if self.signum is not None:
            raise _Interrupted(self.signum)


_RUN = _Run()


def _write_when_complete(path: str, write: Callable[[], None]) -> None:
    """Run ``write`` (of ``path``) only when no signal has come: the last step of every writing
    command."""
    _RUN.check()
    write()
    _RUN.written.append(path)


def _overrides(items: Sequence[str] | None) -> dict:
    """``--set KEY=VALUE`` pairs: VALUE is read as JSON (``true``, ``[64, 32]``) or a Python literal
    (``True``, ``(64, 32)``), else kept as a string."""
    out = {}
    for item in items or ():
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise AutoplanError(f"--set expects KEY=VALUE. Got {item!r}. Fix: e.g. --set layers=4.")
        try:
            out[key] = json.loads(val)
        except (json.JSONDecodeError, RecursionError, ValueError):
            try:
                out[key] = ast.literal_eval(val)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
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


def _output_path(path: str, *inputs: str, example: str = "plan.json") -> str:
    from ._io import check_output_path  # noqa: PLC0415

    return check_output_path(path, what="-o path", inputs=inputs, example=example)


def _cluster_file(spec: str | None) -> str | None:
    """The profile file ``--cluster`` reads, if it names one (:func:`autoplan.costs._cluster.profile_file`)."""
    if not spec:
        return None
    from autoplan.costs._cluster import profile_file  # noqa: PLC0415

    found = profile_file(spec)
    return None if found is None else found[0]


def _inputs(args: argparse.Namespace, plans: Sequence[str] = ()) -> list[tuple[str, str]]:
    """``(what, path)`` of every file the command reads: plan files, the cluster's profile file,
    the workload's source files."""
    from autoplan.tracing._loader import source_files  # noqa: PLC0415

    found = [("the plan file", p) for p in plans]
    cluster = _cluster_file(getattr(args, "cluster", None))
    if cluster is not None:
        found.append(("the cluster file", cluster))
    found += [("a source file of the workload", f)
              for f in source_files(getattr(args, "model", None))]
    return found


def _check_outputs(args: argparse.Namespace, outputs: Sequence[tuple[str, str | None, str]],
                   plans: Sequence[str] = ()) -> None:
    """Every output path checked before any work: writable, a regular file or a new one, no
    input of the command (a plan, the cluster file, the workload's source), and no two the same."""
    from ._io import check_outputs  # noqa: PLC0415

    check_outputs(outputs, _inputs(args, plans))


def _mesh_shape(text: str) -> tuple[int, ...]:
    parts = text.lower().split("x")
    if not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise SearchError(f"--mesh should be positive sizes joined by 'x', e.g. 2x4. Got {text!r}. "
                          "Fix: write the logical mesh as AxB (or AxBxC).")
    return tuple(int(p) for p in parts)


def _check_plan_options(args: argparse.Namespace) -> None:
    """Refuse bad ``--workers`` and options that the chosen ``--pipeline`` would ignore, before
    anything runs."""
    if args.workers is not None and args.workers < 1:
        raise SearchError(f"--workers should be a positive integer. Got {args.workers}. Fix: "
                          "--workers 1 to search in one process, or leave it out to use every CPU.")
    if args.workers is not None:
        from .search._parallel import cpu_count  # noqa: PLC0415

        cpus = cpu_count()
        if args.workers > cpus:
            print(f"autoplan: warning: --workers {args.workers} is more than the {cpus} CPU"
                  f"{'s' if cpus != 1 else ''} this process may use; {cpus} process"
                  f"{'es' if cpus != 1 else ''} will search (more would only take turns on them). "
                  f"Fix: --workers {cpus} or fewer, or leave it out.", file=sys.stderr)
            args.workers = cpus
    if args.mesh and args.pipeline == "yes":
        raise SearchError(f"--mesh {args.mesh} sets the logical mesh of intra-operator plans, but "
                          "--pipeline yes makes pipeline plans only (each stage's mesh is searched), "
                          "so it would be ignored. Fix: drop --mesh, or use --pipeline no (or auto).")
    if args.pipeline == "no":
        given = [f"{flag} {val}" for flag, val in (
            ("--microbatches", args.microbatches), ("--schedule", args.schedule),
            ("--submesh-hosts", args.submesh_hosts), ("--num-layers", args.num_layers),
            ("--stage-algorithm", args.stage_algorithm)) if val is not None]
        if getattr(args, "no_memory_levers", False):
            given.append("--no-memory-levers")
        if given:
            raise SearchError(f"{', '.join(given)} set{'s' if len(given) == 1 else ''} pipeline plans, "
                              "but --pipeline no makes intra-operator plans only, so "
                              f"{'it' if len(given) == 1 else 'they'} would be ignored. Fix: drop "
                              f"{'it' if len(given) == 1 else 'them'}, or use --pipeline yes (or auto).")


def _spec(args) -> dict:
    """The workload spec of the model arguments: ``{"model": ..., size, batch, overrides}``."""
    from autoplan.tracing._loader import parse_spec  # noqa: PLC0415

    overrides = _overrides(args.set)
    for key in ("model", "size", "batch"):
        if key in overrides:
            raise AutoplanError(f"--set {key}=... is not a config field. Got --set "
                                f"{key}={overrides[key]!r}. Fix: use "
                                f"{'the model argument' if key == 'model' else '--' + key}.")
    return parse_spec(args.model, size=args.size, batch=args.batch, **overrides)


def _workload(args, abstract=True):
    from autoplan.tracing._loader import load_workload  # noqa: PLC0415

    return load_workload(_spec(args), abstract=abstract)


def cmd_models(args) -> int:
    from . import models  # noqa: PLC0415

    for name, sizes in models.list_models().items():
        print(f"{name:<12} {', '.join(sizes)}")
    return 0


def cmd_profile(args) -> int:
    # paths and options first, before JAX starts: a typo costs no profile
    if args.output is not None:
        _output_path(args.output, example="cluster.json")
    if args.refresh and not args.cache:
        raise AutoplanError("--refresh profiles again instead of reading the cache, so it needs "
                            "--cache. Got --refresh alone. Fix: add --cache, or drop --refresh (a "
                            "profile without --cache is always measured).")
    if args.cpu_devices is not None:
        if args.cpu_devices <= 0:
            raise AutoplanError(f"--cpu-devices should be a positive integer. Got "
                                f"{args.cpu_devices}. Fix: e.g. --cpu-devices 8.")
        import jax  # noqa: PLC0415

        try:
            jax.config.update("jax_num_cpu_devices", args.cpu_devices)
        except RuntimeError as err:  # the backend already started (in a notebook, say)
            raise AutoplanError(f"--cpu-devices: JAX's backend has already started, so the number "
                                f"of CPU devices is fixed ({err}). Fix: run 'autoplan profile' in a "
                                "fresh process.") from err
    from autoplan.costs._cluster import Cluster, profile  # noqa: PLC0415

    t0 = time.perf_counter()
    if args.cache:
        cluster = Cluster.detect(quick=args.quick, progress=not args.no_progress,
                                 refresh=args.refresh)
    else:
        cluster = profile(quick=args.quick, progress=not args.no_progress)
    dt = time.perf_counter() - t0
    print(cluster.summary())
    print(f"\nprofiled in {dt:.1f} s")
    if args.output is not None:
        _write_when_complete(args.output, lambda: cluster.to_json(args.output))
        print(f"cluster written to {args.output} (use it with --cluster {args.output})")
    return 0


def cmd_trace(args) -> int:
    from autoplan.tracing._trace import trace  # noqa: PLC0415

    wl = _workload(args)
    t0 = time.perf_counter()
    g = trace(wl)
    dt = time.perf_counter() - t0
    print(g.summary())
    print(f"  traced in      : {dt:.2f} s")
    return 0


def _search(args):
    """The search the plan options ask for (checked before anything is traced): ``(result,
    seconds)``; a best plan that does not fit is left to the caller (warnings silenced)."""
    _check_plan_options(args)
    kw = {"level": args.level, "pipeline": {"auto": "auto", "yes": True, "no": False}[args.pipeline],
          "schedule": args.schedule or "1f1b", "microbatches": args.microbatches,
          "submesh_hosts": args.submesh_hosts or "auto", "num_layers": args.num_layers,
          "stage_algorithm": args.stage_algorithm or "auto", "progress": _RUN.check,
          "workers": args.workers, "cache": not args.no_cache,
          "allow_microbatching_mixed": getattr(args, "allow_microbatching_mixed", False),
          "memory_levers": not getattr(args, "no_memory_levers", False)}
    if args.mesh:
        kw["mesh_shape"] = _mesh_shape(args.mesh)
    from autoplan.costs._cluster import Cluster  # noqa: PLC0415

    cluster = Cluster.parse(args.cluster)
    from .search._api import PlanDoesNotFitWarning, search  # noqa: PLC0415

    wl = _workload(args)
    t0 = time.perf_counter()
    # (the search pauses the cyclic collector and, when it returns, moves what it kept to the
    # oldest generation without a walk: see autoplan/_gc.py)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanDoesNotFitWarning)  # said by the caller, or not
        result = search(wl, cluster, **kw)
    return result, time.perf_counter() - t0


def cmd_plan(args) -> int:
    # options and paths first, before JAX is imported or anything traced: a typo costs no search
    _check_outputs(args, [("-o path", args.output, "plan.json"),
                          ("--report path", args.report, "report.html")])
    from .search._api import no_fit_message  # noqa: PLC0415

    result, dt = _search(args)
    print(result.table())
    for note in result.notes:
        print(f"note: {note}")
    print()
    print(result.best.summary())
    print(f"\nsearch took {dt:.2f} s"
          + (" (from the plan cache; --no-cache searches again)"
             if result.stats.get("cache") == "hit" else ""))
    why = no_fit_message(result.best, result.plans)
    if why is not None and not args.allow_no_fit:
        least = min(p.predicted.memory_per_device for p in result.plans)
        raise InfeasiblePlanError(f"{why}; or pass --allow-no-fit to keep this plan anyway"
                                  + (f" (nothing was written to {args.output})" if args.output else "")
                                  + ".", least)
    if why is not None:
        print(f"autoplan: warning: {why}; kept as asked (--allow-no-fit).", file=sys.stderr)
    if args.output is not None:
        _write_when_complete(args.output, lambda: result.best.to_json(args.output))
        print(f"plan written to {args.output}")
    if args.report is not None:
        _write_report(args.report, result)
        print(f"report of {len(result.plans)} plans written to {args.report}")
    return 0


def _write_report(path: str, plans: Any) -> None:
    from ._io import atomic_write_text  # noqa: PLC0415
    from .viz import report_html  # noqa: PLC0415

    page = report_html(plans)
    _write_when_complete(path, lambda: atomic_write_text(path, page))


def cmd_show(args) -> int:
    from autoplan.plans._plan import Plan  # noqa: PLC0415

    plan = Plan.from_json(args.plan)
    print(plan.summary())
    if args.specs:
        for i in plan.inputs:
            print(f"  {i.name:<60} {i.kind:<16} {str(i.spec.to_pspec())}")
    return 0


def cmd_report(args) -> int:
    # (a pipe or a device is a file here, so that reading it refuses it by name)
    files = [s for s in args.source if os.path.exists(s) and not os.path.isdir(s)]
    if files and len(files) == len(args.source):
        _check_outputs(args, [("-o path", args.output, "report.html")], plans=files)
        from autoplan.plans._plan import Plan  # noqa: PLC0415

        plans = [Plan.from_json(f) for f in files]
        _write_report(args.output, plans)
        what = f"{len(plans)} plan file{'s' if len(plans) != 1 else ''}"
    elif len(args.source) == 1 and not args.source[0].endswith(".json"):
        args.model = args.source[0]
        _check_outputs(args, [("-o path", args.output, "report.html")])
        result, dt = _search(args)
        print(result.table())
        _write_report(args.output, result)
        what = f"a search of {args.model} ({len(result.plans)} plans, {dt:.1f} s)"
    else:
        missing = next(s for s in args.source if not os.path.isfile(s))
        raise AutoplanError(f"report: the sources should be plan files (written by 'autoplan plan "
                            f"-o') or one workload to search. Got {missing!r}, which is not a "
                            "file. Fix: check the path, or pass a zoo name or module:function "
                            "alone.")
    print(f"report of {what} written to {args.output}")
    return 0


def _print_launch_result(plan: Any, result: Any, steps: int) -> None:
    print(f"launch of [{plan.label}] {plan.describe()}: {result.layout}, {steps} step(s) in "
          f"{result.wall_time:.1f} s")
    for proc in sorted(result.losses):
        losses = ", ".join(f"{v:.6f}" for v in result.losses[proc])
        times = ", ".join(f"{t * 1e3:.1f}" for t in result.step_times.get(proc, []))
        print(f"  process {proc}: losses {losses}   step ms {times}")
    print(f"  predicted step time {plan.predicted.step_time * 1e3:.3f} ms on {plan.cluster.spec} "
          f"({plan.cluster.describe_profile()}); "
          f"{'matched' if result.matched else 'DID NOT match'} single-device results", flush=True)


def cmd_launch(args) -> int:
    from autoplan.plans._plan import Plan  # noqa: PLC0415
    from autoplan.plans._plan_check import PlanContradictionWarning  # noqa: PLC0415

    from .exec import _launch  # noqa: PLC0415
    from .exec._layout import cluster_command  # noqa: PLC0415

    with warnings.catch_warnings():  # launch refuses a plan that contradicts itself: said once
        warnings.simplefilter("ignore", PlanContradictionWarning)
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
        # (until the last line is printed: a signal while the result is reported says so too)
        with _launch.raise_on_signals():
            handle = _launch.launch(
                args.plan, spec, num_processes=args.num_processes,
                devices_per_process=args.devices_per_process, steps=args.steps,
                timeout=args.timeout, platform=args.platform, per_host=args.per_host,
                seed=args.seed, hang_timeout=args.hang_timeout, port=args.port,
                allow_nonfinite=args.allow_nonfinite)
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
            _print_launch_result(plan, result, args.steps)
            if result.nonfinite:
                print(f"autoplan: warning: the numbers are not finite at {result.nonfinite} "
                      "Kept as asked (--allow-nonfinite).", file=sys.stderr)
    except (KeyboardInterrupt, _launch.LaunchInterrupted) as err:
        if handle is not None:
            handle.cancel()
        signum = getattr(err, "signum", signal.SIGINT)
        print(f"autoplan: interrupted by {signal.Signals(signum).name}; every worker of the "
              "launch was stopped.", file=sys.stderr)
        return 128 + int(signum)
    return 0 if result.matched else 1


def _model_args(sp: argparse.ArgumentParser, flag: bool = False) -> None:
    """The workload arguments: the model (positional, or ``--model`` when ``flag``), its size,
    batch and config overrides."""
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


def _search_args(sp: argparse.ArgumentParser) -> None:
    """The search options shared by ``plan`` and ``report``."""
    sp.add_argument("--cluster", default="cpu:8",
                    help="preset[:nodes] (p3.16xlarge:8), a profile file from 'autoplan "
                         "profile -o' (cluster.json), or 'local' (the attached devices, "
                         "profiled once and cached); default cpu:8")
    sp.add_argument("--level", default="auto",
                    choices=list(LEVELS),
                    help="search level (default auto: exhaustive where it is the fast path, "
                         "else folded)")
    sp.add_argument("--pipeline", default="auto", choices=["auto", "yes", "no"])
    sp.add_argument("--schedule", default=None,
                    choices=["1f1b", "gpipe", "interleaved", "zb-h1", "auto"],
                    help="pipeline schedule (default 1f1b; interleaved: v virtual stages per "
                         "mesh; zb-h1: backward split into input and weight gradients; "
                         "auto: the best of 1f1b, zb-h1 and interleaved for each layout)")
    sp.add_argument("--microbatches", type=_microbatches, default=None, metavar="auto|N",
                    help="micro-batches of pipeline plans: auto (searched, the default) or a "
                         "count dividing the batch")
    sp.add_argument("--num-layers", type=int, default=None, metavar="N",
                    help="layers the pipeline search clusters the operators into (default: "
                         "one per named scope, at most 64)")
    sp.add_argument("--stage-algorithm", default=None, choices=["auto", "dp", "ilp"],
                    help="pipeline stages: dp (Alpa's stage DP), ilp (TePDist's DAG stage "
                         "ILP), auto (the ILP when the layer graph is not a chain; the default)")
    sp.add_argument("--submesh-hosts", default=None, choices=["auto", "all", "pow2"],
                    help="multi-host stage submeshes: all (Alpa's 2..N hosts), pow2 (2, 4, 8, "
                         "... and N hosts), auto (all up to 16 hosts; the default)")
    sp.add_argument("--mesh", default=None, help="logical mesh for an intra-op plan, e.g. 2x4")
    sp.add_argument("--workers", type=int, default=None,
                    help="processes solving independent searches at once (default: every CPU "
                         "for large graphs; 1: this process alone)")
    sp.add_argument("--no-cache", action="store_true",
                    help="search even when the plan cache holds this search, and store nothing")
    sp.add_argument("--allow-microbatching-mixed", action="store_true",
                    help="search micro-batched plans (gradient accumulation, pipelines) even "
                         "for a loss that mixes examples across the batch (batch norm, "
                         "in-batch negatives), whose value micro-batching changes")
    sp.add_argument("--no-memory-levers", action="store_true",
                    help="pipeline stages that do not fit get no ZeRO level or "
                         "rematerialised layers")


def _profile_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``profile`` command's arguments."""
    sp = sub.add_parser("profile", help="measure the attached devices: compute, memory, overheads "
                        "and collectives (a cluster file for --cluster)")
    sp.add_argument("-o", "--output", default=None, help="write the cluster as JSON (cluster.json)")
    sp.add_argument("--quick", action="store_true", help="fewer sizes (well under a minute)")
    sp.add_argument("--no-progress", action="store_true", help="no progress bar")
    sp.add_argument("--cache", action="store_true",
                    help="use (and fill) the profile cache of Cluster.detect / --cluster local")
    sp.add_argument("--refresh", action="store_true", help="with --cache: profile again")
    sp.add_argument("--cpu-devices", type=int, default=None, metavar="N",
                    help="on the CPU platform, emulate N devices (jax_num_cpu_devices), e.g. 8")
    sp.set_defaults(func=cmd_profile)


def _plan_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``plan`` command's arguments."""
    sp = sub.add_parser("plan", help="search plans for a workload on a cluster")
    _model_args(sp)
    _search_args(sp)
    sp.add_argument("-o", "--output", default=None, help="write the best plan as JSON")
    sp.add_argument("--report", default=None, metavar="PATH",
                    help="write the search's self-contained HTML report (every plan and their "
                         "comparison)")
    sp.add_argument("--allow-no-fit", action="store_true",
                    help="keep (and write) the best plan even when no candidate fits in the "
                         "devices' memory (otherwise an error, exit status 2)")
    sp.set_defaults(func=cmd_plan)


def _report_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``report`` command's arguments."""
    sp = sub.add_parser("report", help="write a self-contained HTML report of plan files, or of a "
                                       "search of a workload (every plan and their comparison)")
    sp.add_argument("source", nargs="+",
                    help="plan files written by 'autoplan plan -o' (the first is the chosen one), "
                         "or one workload (zoo name or module:function) to search")
    sp.add_argument("--size", default=None, help="(a workload) model size")
    sp.add_argument("--batch", type=int, default=None, help="(a workload) global batch")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="(a workload) override a config field or pass a keyword argument")
    _search_args(sp)
    sp.add_argument("-o", "--output", default="report.html")
    sp.set_defaults(func=cmd_report)


def _launch_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``launch`` command's arguments."""
    sp = sub.add_parser("launch", help="run a plan on the devices attached (workers joined by "
                                       "jax.distributed), or print the command for a cluster")
    sp.add_argument("plan")
    _model_args(sp, flag=True)
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
    sp.add_argument("--allow-nonfinite", action="store_true",
                    help="accept a run whose loss or gradients are NaN or infinite (otherwise an "
                         "error, exit status 2, saying whether one device computes the same)")
    sp.set_defaults(func=cmd_launch)


def build_parser() -> argparse.ArgumentParser:
    """The ``autoplan`` command's parser: its sub-commands, and ``--debug`` before or after one."""
    p = argparse.ArgumentParser(prog="autoplan", description="Auto-parallel planner for JAX training steps.")
    p.add_argument("--debug", action="store_true",
                   help="print the full traceback of an error (also accepted after the command)")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("models", help="list workloads and sizes").set_defaults(func=cmd_models)
    _profile_parser(sub)

    sp = sub.add_parser("trace", help="trace a workload's train step and print its graph")
    _model_args(sp)
    sp.set_defaults(func=cmd_trace)

    _plan_parser(sub)

    sp = sub.add_parser("show", help="print a plan file")
    sp.add_argument("plan")
    sp.add_argument("--specs", action="store_true", help="list every input's PartitionSpec")
    sp.set_defaults(func=cmd_show)

    _report_parser(sub)
    _launch_parser(sub)

    for command in sub.choices.values():  # --debug after the command name too
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="print the full traceback of an error")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit status (see the module docstring).

    No traceback reaches the user: an :class:`~autoplan.AutoplanError` is one line (status 2), an
    unexpected exception one line naming it with a hint to rerun with ``--debug`` (status 1),
    SIGINT, SIGTERM and SIGHUP one line (status 128 + the signal). Warnings are one line each.
    """
    # the handlers first: a signal while the arguments are read is one line too
    debug = "--debug" in (sys.argv[1:] if argv is None else list(argv))
    _RUN.signum, _RUN.written = None, []
    restore = _install_handlers(debug)
    args: argparse.Namespace | None = None
    try:
        args = build_parser().parse_args(argv)
        status = int(args.func(args) or 0)
        if status < 128:  # 128 + signal: the command reported its own interruption
            _RUN.check()
        return status
    except KeyboardInterrupt as err:  # ours, or raised before our handler was installed
        return _interrupted(_signum(err), args)
    except AutoplanError as err:
        signum = _interruption(err)
        if signum is not None:
            return _interrupted(signum, args)
        if debug:
            traceback.print_exc()
        print(f"autoplan: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError as err:  # the reader of stdout went away (``autoplan show p | head``)?
        if _stdout_broken():
            return 128 + 13
        return _internal_error(err, debug)
    except Exception as err:  # noqa: BLE001 - the one place where every error becomes one line
        signum = _interruption(err)
        if signum is not None:
            return _interrupted(signum, args)
        return _internal_error(err, debug)
    finally:
        restore()


def _wrapped_interrupt(err: BaseException) -> KeyboardInterrupt | None:
    """The interruption an exception was raised from, if any: Python wraps some exceptions in
    others (a signal landing while a class body is made raises ``RuntimeError: Error calling
    __set_name__``, from the interruption), and such an error is the signal, not a bug."""
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def _interruption(err: BaseException) -> int | None:
    """The signal an error stands for, if it is an interruption's: raised from one (see
    :func:`_wrapped_interrupt`), or raised after a signal came, whatever the code it unwound
    through made of it (JAX's tracing turns an exception raised in a traced function into its
    own error, with the interruption in its message only); None for an error of its own."""
    interrupt = _wrapped_interrupt(err)
    if interrupt is not None:
        return _signum(interrupt)
    return _RUN.signum


def _signum(interrupt: KeyboardInterrupt) -> int:
    """The signal an interruption stands for: our handler's, else the first one received, else
    SIGINT (Python's own ``KeyboardInterrupt``)."""
    return getattr(interrupt, "signum", None) or _RUN.signum or signal.SIGINT


def _interrupted(signum: int, args: argparse.Namespace | None) -> int:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    if _RUN.written:
        what = f"; {', '.join(_RUN.written)} had been written in full"
    elif getattr(args, "output", None):
        what = f"; {args.output} was not written"
    else:
        what = ""
    print(f"autoplan: interrupted by {name}{what}.", file=sys.stderr)
    return 128 + int(signum)


def _internal_error(err: BaseException, debug: bool) -> int:
    if debug:
        traceback.print_exception(err)
    if isinstance(err, ImportError):  # a 'queue.py' of the user's in the current folder?
        from autoplan.tracing._loader import shadowed_stdlib  # noqa: PLC0415

        shadows = shadowed_stdlib()
        if shadows:
            listed = ", ".join(f"{path} (the module {name!r})" for name, path in shadows[:3])
            print(f"autoplan: error: a file on sys.path shadows a module of Python's standard "
                  f"library, so Python imported it in place of the real one: {listed}. Got "
                  f"{type(err).__name__}: {str(err)[:200]}. Fix: rename it (and remove its "
                  "__pycache__ copy), or run from another folder.", file=sys.stderr)
            return 2
    first = (str(err).strip().splitlines() or [""])[0][:300].rstrip(".")
    print(f"autoplan: internal error: {type(err).__name__}: {first}. This is a bug or an input "
          "autoplan does not handle; rerun with --debug for the traceback.", file=sys.stderr)
    return 1


def _stdout_broken() -> bool:
    """Whether stdout is a pipe whose reader went away (poll says POLLERR); if so stdout is
    pointed at /dev/null, so that the interpreter's last flush cannot fail again."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        if not any(ev & select.POLLERR for _, ev in poller.poll(0)):
            return False
        os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
    except (AttributeError, OSError, ValueError):  # no poll() here, or no real stdout
        return False
    return True


def _install_handlers(debug: bool) -> Callable[[], None]:
    """Signals, warnings and unraisable exceptions as one line each, for one command; returns
    the function that puts everything back (``main`` may run inside a test or a notebook)."""
    saved: list[tuple[int, Any]] = []
    if threading.current_thread() is threading.main_thread():
        for sig in _SIGNALS:
            try:
                saved.append((sig, signal.signal(sig, _RUN.handler)))
            except (OSError, ValueError):  # pragma: no cover - a signal this platform lacks
                pass
    old_show, old_hook, old_thread_hook = warnings.showwarning, sys.unraisablehook, threading.excepthook

    def show(message, category, filename, lineno, file=None, line=None):
        text = str(message).strip().replace("\n", " ")
        print(f"autoplan: warning: {text}" + (f" ({category.__name__})" if debug else ""), file=sys.stderr)

    def unraisable(u: Any) -> None:
        if isinstance(u.exc_value, KeyboardInterrupt):
            # a signal that landed in a finaliser or a garbage-collection callback (JAX has
            # one), where its exception is swallowed: _RUN.signum records it, and it is sent
            # again to land where it ends the command
            if _RUN.signum is not None:
                _signals.redeliver(_RUN.signum)
            return
        if debug:
            old_hook(u)
            return
        print(f"autoplan: warning: ignored {type(u.exc_value).__name__} in {u.object!r:.60}: "
              f"{str(u.exc_value)[:200]}", file=sys.stderr)

    def in_thread(t: Any) -> None:
        if debug:
            old_thread_hook(t)
            return
        print(f"autoplan: warning: {t.exc_type.__name__} in thread "
              f"{getattr(t.thread, 'name', '?')}: {str(t.exc_value)[:200]}", file=sys.stderr)

    warnings.showwarning = show
    sys.unraisablehook = unraisable
    threading.excepthook = in_thread

    def restore() -> None:
        _signals.disarm()
        for sig, old in saved:
            signal.signal(sig, old)
        warnings.showwarning, sys.unraisablehook = old_show, old_hook
        threading.excepthook = old_thread_hook

    return restore


def run() -> None:
    """The ``autoplan`` command: :func:`main`, then the process ends at once.

    Its output is flushed, the search's idle worker processes are ended and every ``atexit``
    function runs (a launch's workers are ended there), but the interpreter does not free the
    search's objects one by one on the way out: after planning a large model that teardown took
    seconds (3.7 s after ``autoplan plan gpt --size 39B``), with nothing left to write.
    """
    status = main()
    _end_process(status)


def _end_process(status: int) -> None:
    """Flush, end the search's workers, run the ``atexit`` functions, and exit with ``status``
    without the interpreter's teardown (where this Python lacks ``atexit._run_exitfuncs``, the
    ordinary exit)."""
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if run_exitfuncs is None:  # pragma: no cover - every CPython has it
        sys.exit(status)
    parallel = sys.modules.get("autoplan.search._parallel")
    if parallel is not None:
        parallel.shutdown(kill=True)  # idle workers are ended, not waited for
    run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing more can be said
            pass
    os._exit(status)


if __name__ == "__main__":
    run()
