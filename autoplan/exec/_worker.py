"""One worker of :func:`autoplan.exec.launch`: ``python -m autoplan.exec._worker ...``.

The worker configures JAX before anything touches a backend (CPU platform, ``K`` emulated
devices, gloo collectives), joins the job with ``jax.distributed.initialize`` (explicit
coordinator arguments, or none when SLURM or Open MPI variables are present so JAX detects the
cluster itself), builds the workload from its name/size/overrides (a training step function cannot
be pickled), reads the plan file, runs it over the global devices with :func:`autoplan.exec.run`
(global arrays made with ``jax.make_array_from_callback``; each process checks the shards it holds
against a single-device run computed locally) and streams JSON lines on stdout::

    {"event": "start", "process": i, "devices": 8, "local_devices": 4}
    {"event": "step", "process": i, "step": s, "loss": ..., "step_time": ...}
    {"event": "done", "process": i, "losses": [...], "step_times": [...], "matched": true,
     "executed_on": [plan device numbers of the (sub)meshes it ran programs on], ...}
    {"event": "error", "process": i, "type": "...", "message": "...", "traceback": "..."}

Everything else (JAX and gloo logging, prints) goes to stderr: stdout is reserved for events.

Failure injection for tests: ``AUTOPLAN_TEST_CRASH_AT_STEP=s`` makes process
``AUTOPLAN_TEST_FAIL_PROCESS`` (default the last one) exit with status 17 before step ``s``;
``AUTOPLAN_TEST_HANG_AT_STEP=s`` makes it hang there instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Any, TextIO

__all__ = ["main", "cluster_env_detected"]

CRASH_STATUS = 17


def cluster_env_detected(env: dict[str, str] | None = None) -> bool:
    """True when SLURM or Open MPI variables describe the job (``jax.distributed`` reads them)."""
    env = dict(os.environ if env is None else env)
    slurm = "SLURM_JOB_ID" in env and ("SLURM_NTASKS" in env or "SLURM_STEP_NUM_TASKS" in env)
    ompi = "OMPI_COMM_WORLD_SIZE" in env and "OMPI_COMM_WORLD_RANK" in env
    return slurm or ompi


class _Events:
    """JSON lines on the real stdout; fd 1 itself is pointed at stderr so that nothing else
    (prints, C++ logging) can interleave with the events."""

    def __init__(self) -> None:
        sys.stdout.flush()
        self._out: TextIO = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self.process = -1

    def emit(self, event: str, **fields: Any) -> None:
        rec = {"event": event, "process": self.process, **fields}
        self._out.write(json.dumps(rec, default=_jsonable) + "\n")
        self._out.flush()


def _jsonable(v: Any) -> Any:
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def _maybe_fail(step: int, process: int, num_processes: int) -> None:
    target = int(os.environ.get("AUTOPLAN_TEST_FAIL_PROCESS", num_processes - 1))
    if process != target:
        return
    crash = os.environ.get("AUTOPLAN_TEST_CRASH_AT_STEP")
    if crash is not None and int(crash) == step:
        print(f"autoplan worker {process}: injected crash before step {step}", file=sys.stderr,
              flush=True)
        os._exit(CRASH_STATUS)
    hang = os.environ.get("AUTOPLAN_TEST_HANG_AT_STEP")
    if hang is not None and int(hang) == step:
        print(f"autoplan worker {process}: injected hang before step {step}", file=sys.stderr,
              flush=True)
        while True:
            time.sleep(3600)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m autoplan.exec._worker",
                                description="One worker of autoplan.exec.launch.")
    p.add_argument("--plan", required=True, help="plan JSON file")
    p.add_argument("--workload", required=True,
                   help='JSON: {"model": name, "size": size, **overrides}')
    p.add_argument("--process-id", type=int, default=None)
    p.add_argument("--num-processes", type=int, default=None)
    p.add_argument("--coordinator", default=None, help="host:port of process 0's coordinator")
    p.add_argument("--devices-per-process", type=int, default=None,
                   help="emulated CPU devices of this process")
    p.add_argument("--platform", default="cpu", help="JAX platform ('cpu', 'gpu', ...)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-check", action="store_true", help="skip the single-device comparison")
    p.add_argument("--compiler-options", default=None, help="JSON dict of XLA options")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run one worker; returns the exit status (0 on success, 1 on an error)."""
    events = _Events()
    args = _parse(argv)
    events.process = args.process_id if args.process_id is not None else 0
    try:
        if args.platform:
            os.environ["JAX_PLATFORMS"] = args.platform
        import jax  # noqa: PLC0415 - configured before the backend starts

        if args.platform == "cpu":
            if args.devices_per_process:
                jax.config.update("jax_num_cpu_devices", args.devices_per_process)
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        if args.coordinator is not None:
            jax.distributed.initialize(coordinator_address=args.coordinator,
                                       num_processes=args.num_processes,
                                       process_id=args.process_id)
        elif cluster_env_detected():
            jax.distributed.initialize()
        events.process = jax.process_index()
        nproc = jax.process_count()
        events.emit("start", devices=len(jax.devices()), local_devices=len(jax.local_devices()),
                    pid=os.getpid())

        from autoplan._plan import Plan  # noqa: PLC0415
        from autoplan.exec._run import run  # noqa: PLC0415
        from autoplan.models import get  # noqa: PLC0415

        spec = json.loads(args.workload)
        name, size = spec.pop("model"), spec.pop("size", "tiny")
        workload = get(name, size, abstract=False, seed=args.seed, **spec)
        plan = Plan.from_json(args.plan)
        opts = json.loads(args.compiler_options) if args.compiler_options else None
        _maybe_fail(0, events.process, nproc)

        def on_step(step: int, loss: float, seconds: float) -> None:
            events.emit("step", step=step, loss=loss, step_time=seconds)
            _maybe_fail(step + 1, events.process, nproc)

        report = run(plan, workload, steps=args.steps, check=not args.no_check, on_step=on_step,
                     compiler_options=opts, raise_on_mismatch=False)
        eq = report.equivalence
        index = {d.id: k for k, d in enumerate(jax.devices())}  # the plan's device numbering
        events.emit("done", losses=report.losses, step_times=report.step_times,
                    compile_time=report.compile_time,
                    matched=None if eq is None else eq.matched,
                    max_abs_diff=None if eq is None else eq.max_abs_diff,
                    equivalence=None if eq is None else eq.message,
                    comm_bytes=report.comm_bytes, peak_memory=report.peak_memory,
                    devices=report.num_devices, executed_on=sorted(index[i] for i in report.memory),
                    dispatches=report.pipeline.get("dispatches"))
        sys.stderr.flush()
        return 0
    except BaseException as err:  # report everything, including KeyboardInterrupt
        events.emit("error", type=type(err).__name__, message=str(err),
                    traceback=traceback.format_exc())
        return 1


if __name__ == "__main__":
    sys.exit(main())
