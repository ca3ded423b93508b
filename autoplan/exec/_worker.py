"""One worker of :func:`autoplan.exec.launch`: ``python -m autoplan.exec._worker ...``.

The worker configures JAX before anything touches a backend (its platform, ``K`` emulated CPU
devices and gloo collectives when there is no accelerator), joins the job with
``jax.distributed.initialize``, loads the workload from its spec (:mod:`autoplan.tracing._loader`: a zoo
name with overrides, or a user's ``module:function``; a training step cannot be pickled), reads
the plan, runs it over the global devices with :func:`autoplan.exec.run` (each process checks the
shards it holds against a single-device run computed locally) and streams JSON lines on stdout::

    {"event": "heartbeat", "process": i, "phase": "compiling", "step": null, "progress": 17,
     "compiling": true, "where": "jax/_src/compiler.py:362 backend_compile_and_load"}
    {"event": "start", "process": i, "devices": 8, "local_devices": 4, "pid": ...}
    {"event": "loaded", "process": i, "digest": "..."}
    {"event": "step", "process": i, "step": s, "loss": ..., "step_time": ...}
    {"event": "done", "process": i, "losses": [...], "step_times": [...], "matched": true,
     "executed_on": [plan device numbers of the (sub)meshes it ran programs on], ...}
    {"event": "error", "process": i, "type": "...", "message": "...", "traceback": "..."}

Everything else (JAX and gloo logging, prints) goes to stderr: stdout is reserved for events.

Two ways to start:

* **Local** (the launcher): ``--coordinator 127.0.0.1:PORT --process-id i --num-processes N
  --loopback --launcher-pipe --plan - --heartbeat 2``. The plan arrives as the first line on
  stdin, and stdin stays open: when it closes (the launcher died, even by SIGKILL) the worker
  ends itself and its process group (:func:`~autoplan.exec._probe.exit_with_launcher`).
  Everything listens on loopback only: process 0 binds the coordination service to
  ``127.0.0.1:PORT`` (``coordinator_bind_address``; JAX's default is every interface) after
  checking the port is free (a taken port is reported as ``CoordinatorPortTaken``, and the
  launcher retries on another), and the CPU collectives (gloo) listen on 127.0.0.1 (JAX's
  default is the address of the host name). Local launches never auto-detect a cluster.
* **Cluster** (SLURM's ``srun``, Open MPI's ``mpirun``; see :func:`autoplan.exec._layout.
  cluster_command`): no coordinator argument. JAX reads the coordinator, the process count and
  id and the local device from the scheduler's variables; process 0 binds the coordination
  service to the address the scheduler names for it (``JAX_COORDINATOR_BIND_ADDRESS`` or
  ``--bind`` override it; when that name resolves to a loopback address on the node, JAX's
  default, every interface, is kept so that other nodes can reach it).

Progress and hangs: with ``--heartbeat S`` a thread writes a heartbeat every ``S`` seconds. Its
``progress`` counter advances when the phase or step changes and whenever the main thread's
Python frame moved since the last look (it is computing, tracing or lowering); ``compiling`` is
true while the main thread is inside XLA's compiler (JAX's ``compiler.py``). A main thread
blocked in one call (a collective waiting for a peer, a hung step) shows neither: the launcher
fails the launch when no worker progresses for its limit. SIGUSR1 makes the worker write every
thread's Python stack to stderr (the launcher asks for it before killing a hung launch).

Failure injection for tests: ``AUTOPLAN_TEST_CRASH_AT_STEP=s`` makes process
``AUTOPLAN_TEST_FAIL_PROCESS`` (default the last one) exit with status 17 before step ``s``;
``AUTOPLAN_TEST_HANG_AT_STEP=s`` makes it hang there instead.
"""

from __future__ import annotations

import argparse
import errno
import faulthandler
import hashlib
import ipaddress
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from typing import Any, TextIO

from autoplan._errors import LaunchError

__all__ = ["main", "cluster_kind", "data_digest", "CoordinatorPortTaken"]

CRASH_STATUS = 17
_SAMPLE = 0.25  # seconds between looks at the main thread


class CoordinatorPortTaken(LaunchError):
    """Process 0 could not bind the coordinator port (another process holds it)."""


def cluster_kind(env: Mapping[str, str] | None = None) -> str | None:
    """Which scheduler started this process, as JAX's auto-detection reads it.

    Returns:
        ``"slurm"`` (an ``srun`` task: ``SLURM_JOB_ID``, ``SLURM_STEP_NODELIST``,
        ``SLURM_NTASKS``, ``SLURM_PROCID``, ``SLURM_LOCALID``), ``"ompi"`` (Open MPI 4's
        ``mpirun``: ``OMPI_MCA_orte_hnp_uri``), ``"mpi4py"`` (another MPI, e.g. Open MPI 5, where
        JAX needs ``mpi4py`` to find the coordinator), or None (not a cluster task).
    """
    env = os.environ if env is None else env
    if all(v in env for v in ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS",
                              "SLURM_PROCID", "SLURM_LOCALID")):
        return "slurm"
    if "OMPI_MCA_orte_hnp_uri" in env:
        return "ompi"
    if any(v in env for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")):
        return "mpi4py"
    return None


class _Events:
    """JSON lines on the real stdout; fd 1 itself is pointed at stderr so that nothing else
    (prints, C++ logging) can interleave with the events. Thread-safe."""

    def __init__(self) -> None:
        sys.stdout.flush()
        self._out: TextIO = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self._lock = threading.Lock()
        self.process = -1

    def emit(self, event: str, **fields: Any) -> None:
        rec = {"event": event, "process": self.process, **fields}
        line = json.dumps(rec, default=_jsonable) + "\n"
        with self._lock:
            try:
                self._out.write(line)
                self._out.flush()
            except (OSError, ValueError):  # the launcher stopped reading
                pass


def _jsonable(v: Any) -> Any:
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


class _Progress:
    """What the worker is doing, for heartbeats: phase, step, and a counter that advances while
    the main thread makes progress."""

    def __init__(self, events: _Events, interval: float) -> None:
        self.events = events
        self.interval = interval
        self.phase = "starting"
        self.step: int | None = None
        self.counter = 0
        self._main = threading.main_thread().ident
        self._last: tuple[int, int] | None = None
        self._still = 0  # looks in a row at an unmoved main thread
        self._compiling = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if interval > 0:
            self._thread = threading.Thread(target=self._run, name="autoplan-heartbeat",
                                            daemon=True)
            self._thread.start()

    def set(self, phase: str, step: int | None = None) -> None:
        self.phase, self.step = phase, step
        self.counter += 1

    def _look(self) -> Any:
        """Advance the counter if the main thread moved; return its innermost frame."""
        frame = sys._current_frames().get(self._main)
        if frame is None:
            return None
        pos = (id(frame), frame.f_lasti)
        self._compiling = frame.f_code.co_filename.replace(os.sep, "/").endswith(
            "jax/_src/compiler.py")
        if pos != self._last or self._compiling:
            self.counter += 1
            self._still = 0
        else:
            self._still += 1
        self._last = pos
        return frame

    def _run(self) -> None:
        next_beat = 0.0
        while not self._stop.is_set():
            frame = self._look()
            now = time.monotonic()
            if now >= next_beat:
                stack = _stack(frame, 6) if frame is not None else []
                extra = {"stack": stack} if self._still >= 4 else {}  # unmoved for a second
                self.events.emit("heartbeat", phase=self.phase, step=self.step,
                                 progress=self.counter, compiling=self._compiling,
                                 where=stack[0] if stack else "", **extra)
                next_beat = now + self.interval
            self._stop.wait(_SAMPLE)

    def stop(self) -> None:
        """Stop the heartbeats and wait for the thread: no Python thread of ours may still run
        (or run a garbage collection into JAX's callback) while the interpreter shuts down, where
        CPython ends such threads inside whatever native call they are in."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)


def _stack(frame: Any, depth: int) -> list[str]:
    """``file:line function`` of ``frame`` and its callers, innermost first (paths shortened to
    the package)."""
    out = []
    while frame is not None and len(out) < depth:
        name = frame.f_code.co_filename.replace(os.sep, "/")
        if "/autoplan/" in name:
            name = "autoplan/" + name.rsplit("/autoplan/", 1)[1]
        else:
            name = name.rsplit("site-packages/", 1)[-1]
        out.append(f"{name}:{frame.f_lineno} {frame.f_code.co_name}")
        frame = frame.f_back
    return out


def data_digest(args: Any) -> str:
    """A digest of a workload's arguments: every leaf's path, shape and dtype, and a strided
    sample of at most 65,536 of its values (taken on the device, so large arrays are not copied
    to the host). Workers of one launch compare digests: a workload that builds different arrays
    in each process (an unseeded random generator) is caught before it runs."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    h = hashlib.blake2b(digest_size=12)
    for path, leaf in jax.tree_util.tree_flatten_with_path(args)[0]:
        x = leaf
        if hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        shape, dtype = tuple(np.shape(x)), str(getattr(x, "dtype", type(x).__name__))
        h.update(f"{jax.tree_util.keystr(path)}:{shape}:{dtype};".encode())
        size = int(np.prod(shape)) if shape else 1
        stride = max(1, -(-size // 65536))
        flat = jnp.ravel(x)[::stride] if isinstance(x, jax.Array) else np.ravel(np.asarray(x))[::stride]
        h.update(np.ascontiguousarray(np.asarray(flat)).tobytes())
    return h.hexdigest()


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
    p.add_argument("--plan", required=True,
                   help="plan JSON file, or '-' for the first line of stdin")
    p.add_argument("--workload", required=True,
                   help="workload spec: a zoo name, 'module:function', or JSON "
                        '{"model": name, **kwargs}')
    p.add_argument("--process-id", type=int, default=None)
    p.add_argument("--num-processes", type=int, default=None)
    p.add_argument("--coordinator", default=None, help="host:port of process 0's coordinator "
                   "(a local launch); without it the cluster's scheduler variables are read")
    p.add_argument("--bind", default=None, help="address:port process 0's coordinator binds to")
    p.add_argument("--loopback", action="store_true",
                   help="a local launch: CPU collectives listen on 127.0.0.1 only")
    p.add_argument("--launcher-pipe", action="store_true",
                   help="stdin is the launcher's pipe: exit when it closes")
    p.add_argument("--devices-per-process", type=int, default=None,
                   help="emulated CPU devices of this process (CPU), or the local devices it "
                        "uses (accelerators)")
    p.add_argument("--platform", default=None,
                   help="JAX platform ('cpu', 'cuda', 'rocm', 'tpu'); default JAX's choice")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-check", action="store_true", help="skip the single-device comparison")
    p.add_argument("--compiler-options", default=None, help="JSON dict of XLA options")
    p.add_argument("--heartbeat", type=float, default=0.0,
                   help="seconds between heartbeat events (0: none)")
    return p.parse_args(argv)


def _check_port_free(bind: str) -> None:
    host, _, port = bind.rpartition(":")
    host = host.strip("[]")
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, int(port)))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise CoordinatorPortTaken(f"coordinator port {port} on {host} is taken by "
                                           "another process") from err
            raise


def _scheduler_bind(coordinator: str) -> str | None:
    """Where process 0 binds on a cluster: the address the scheduler named for it, when that
    name resolves to a non-loopback address of this node; else None (JAX's default)."""
    host, _, port = coordinator.rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return None
    for info in infos:
        ip = info[4][0]
        if not ipaddress.ip_address(ip.split("%")[0]).is_loopback:
            return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
    return None


def _join(args: argparse.Namespace, jax: Any) -> str | None:
    """``jax.distributed.initialize`` for a local or a cluster launch; returns the coordinator
    bind address of process 0 (None elsewhere or for a single process)."""
    local_ids = None
    if args.platform in ("cuda", "rocm", "gpu") and args.devices_per_process:
        local_ids = list(range(args.devices_per_process))  # one worker with several accelerators
    if args.coordinator is not None:
        bind = None
        if args.process_id == 0:
            bind = args.bind or args.coordinator
            _check_port_free(bind)
        try:
            jax.distributed.initialize(coordinator_address=args.coordinator,
                                       num_processes=args.num_processes,
                                       process_id=args.process_id, local_device_ids=local_ids,
                                       coordinator_bind_address=bind,
                                       cluster_detection_method="deactivate")
        except Exception as err:
            if "Failed to start RPC server" in str(err) or "address already in use" in str(err).lower():
                raise CoordinatorPortTaken(f"the coordination service could not bind {bind}: "
                                           f"{err}") from err
            raise
        return bind
    kind = cluster_kind()
    if kind is None:
        return None
    method = "mpi4py" if kind == "mpi4py" else None
    if method == "mpi4py":
        try:
            import mpi4py  # noqa: F401, PLC0415
        except ImportError as err:
            raise LaunchError(
                "this MPI job has no OMPI_MCA_orte_hnp_uri (Open MPI 5, MPICH, ...), so JAX "
                "finds the coordinator through mpi4py, which is not installed. Fix: pip install "
                "mpi4py on every node, or launch with Open MPI 4's mpirun or SLURM's srun.") from err
    from jax._src import clusters  # noqa: PLC0415 - JAX's own cluster detection

    address, nproc, pid, ids = clusters.ClusterEnv.auto_detect_unset_distributed_params(
        None, None, None, local_ids, method, 300)
    bind = args.bind or os.environ.get("JAX_COORDINATOR_BIND_ADDRESS") or None
    if bind is None and pid == 0 and address is not None:
        bind = _scheduler_bind(address)
    jax.distributed.initialize(coordinator_address=address, num_processes=nproc, process_id=pid,
                               local_device_ids=ids, coordinator_bind_address=bind,
                               cluster_detection_method="deactivate")
    return bind if pid == 0 else None


def _loopback_cpu_collectives() -> None:
    """Start the CPU backend with collectives (gloo) listening on 127.0.0.1 instead of the host
    name's address (JAX has no option for it: the backend factory is swapped for one that passes
    the collectives, then put back, so that the client alone owns them, as in JAX's own path)."""
    import functools  # noqa: PLC0415

    from jax._src import distributed, xla_bridge  # noqa: PLC0415
    from jax._src.lib import _jax  # noqa: PLC0415

    original = xla_bridge._backend_factories["cpu"]
    collectives = _jax.make_gloo_tcp_collectives(
        distributed_client=distributed.global_state.client, hostname="127.0.0.1")
    xla_bridge.register_backend_factory(
        "cpu", functools.partial(xla_bridge.make_cpu_client, collectives=collectives),
        priority=0, fail_quietly=False)
    del collectives
    try:
        xla_bridge.backends()
    finally:
        xla_bridge._backend_factories["cpu"] = original


def _read_plan(args: argparse.Namespace) -> str:
    if args.plan != "-":
        return args.plan
    line = b""
    while not line.endswith(b"\n"):  # raw reads: nothing stays in a buffer the watcher skips
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        line += chunk
    if not line.strip():
        raise LaunchError("the plan should arrive as the first line on stdin, and stdin closed "
                          "first: the launcher is gone.")
    return line.decode()


def main(argv: list[str] | None = None) -> int:
    """Run one worker; returns the exit status (0 on success, 1 on an error)."""
    events = _Events()
    args = _parse(argv)
    events.process = args.process_id if args.process_id is not None else 0
    progress = _Progress(events, args.heartbeat)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    try:
        plan_text = _read_plan(args)  # before watching the pipe: the watcher reads the rest
        if args.launcher_pipe:
            from autoplan.exec._probe import exit_with_launcher  # noqa: PLC0415

            exit_with_launcher(f"autoplan worker {events.process}")
        import jax  # noqa: PLC0415 - configured before the backend starts

        if args.platform:
            jax.config.update("jax_platforms", args.platform)
        if args.platform == "cpu":
            if args.devices_per_process:
                jax.config.update("jax_num_cpu_devices", args.devices_per_process)
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        progress.set("joining")
        bind = _join(args, jax)
        if args.loopback and args.platform == "cpu" and jax.distributed.is_initialized():
            _loopback_cpu_collectives()
        events.process = jax.process_index()
        nproc = jax.process_count()
        events.emit("start", devices=len(jax.devices()), local_devices=len(jax.local_devices()),
                    pid=os.getpid(), coordinator_bind=bind)

        progress.set("loading")
        from autoplan.exec._run import run  # noqa: PLC0415
        from autoplan.plans._plan import Plan  # noqa: PLC0415
        from autoplan.tracing._loader import load_workload  # noqa: PLC0415

        text = args.workload.strip()
        spec = json.loads(text) if text.startswith("{") else text
        workload = load_workload(spec, abstract=False, seed=args.seed)
        events.emit("loaded", digest=data_digest(workload.args))
        plan = Plan.from_json(plan_text)
        opts = json.loads(args.compiler_options) if args.compiler_options else None
        _maybe_fail(0, events.process, nproc)
        progress.set("compiling")

        def on_step(step: int, loss: float, seconds: float) -> None:
            events.emit("step", step=step, loss=loss, step_time=seconds)
            progress.set("running" if step + 1 < args.steps else "checking", step)
            _maybe_fail(step + 1, events.process, nproc)

        # non-finite numbers are reported in the done event: the launcher decides (allow_nonfinite)
        report = run(plan, workload, steps=args.steps, check=not args.no_check, on_step=on_step,
                     compiler_options=opts, raise_on_mismatch=False, allow_nonfinite=True)
        eq = report.equivalence
        progress.set("done")
        index = {d.id: k for k, d in enumerate(jax.devices())}  # the plan's device numbering
        events.emit("done", losses=report.losses, step_times=report.step_times,
                    compile_time=report.compile_time,
                    matched=None if eq is None else eq.matched,
                    max_abs_diff=None if eq is None else eq.max_abs_diff,
                    equivalence=None if eq is None else eq.message,
                    comm_bytes=report.comm_bytes, peak_memory=report.peak_memory,
                    devices=report.num_devices, executed_on=sorted(index[i] for i in report.memory),
                    dispatches=report.pipeline.get("dispatches"), nonfinite=report.nonfinite,
                    levers={str(s): lv for s, lv in report.pipeline.get("levers", {}).items()})
        sys.stderr.flush()
        return 0
    except BaseException as err:  # report everything, including KeyboardInterrupt
        events.emit("error", type=type(err).__name__, message=str(err),
                    traceback=traceback.format_exc())
        return 1
    finally:
        progress.stop()


if __name__ == "__main__":
    sys.exit(main())
