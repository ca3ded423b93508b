"""Launching a plan on several processes joined by ``jax.distributed``.

:func:`launch` writes the plan to a JSON file, picks a free coordinator port and starts ``N``
worker subprocesses (``python -m autoplan.exec._worker``, see :mod:`autoplan.exec._worker`), each
in its own session (process group) so that it and anything it starts can be killed together. The
workload travels as its name, size and overrides (a training step function cannot be pickled).
Reader threads collect each worker's JSON events (stdout) and its last stderr lines.

The returned :class:`LaunchHandle` is polled (:meth:`LaunchHandle.poll`) or waited on
(:meth:`LaunchHandle.wait`). A worker that exits with an error, reports one, or a launch that
runs past its timeout fails with :class:`~autoplan.LaunchError` carrying every worker's last
stderr lines; every worker is killed first. Workers still running when the interpreter exits are
killed by an ``atexit`` hook: nothing is left behind.

Example:
    >>> handle = launch(plan, {"model": "gpt", "size": "tiny"}, num_processes=2,
    ...                 devices_per_process=4)                      # doctest: +SKIP
    >>> result = handle.wait()                                      # doctest: +SKIP
    >>> result.matched, result.losses[0]                            # doctest: +SKIP
    (True, [5.5323, 5.4183])
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autoplan._errors import LaunchError, PlanMismatchError

__all__ = ["launch", "LaunchHandle", "LaunchResult", "describe_workload", "free_port"]

_STDERR_LINES = 40
_LIVE: weakref.WeakSet[LaunchHandle] = weakref.WeakSet()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def describe_workload(workload: Any) -> dict[str, Any]:
    """``{"model": name, "size": size, **overrides}`` describing a workload for the workers.

    Args:
        workload: such a dict (returned checked), or a :class:`autoplan.models.Workload`; its
            overrides are the config fields that differ from its size's defaults.

    Raises:
        LaunchError: the workload is neither (a plain function cannot be sent to a worker).
    """
    if isinstance(workload, Mapping):
        spec = dict(workload)
        if "model" not in spec:
            raise LaunchError(f"launch: the workload spec should have a 'model' key. Got "
                              f"{sorted(spec)}. Fix: pass {{'model': 'gpt', 'size': 'tiny'}}.")
        spec.setdefault("size", "tiny")
        return _json_ready(spec)
    name, size = getattr(workload, "name", None), getattr(workload, "size", None)
    config = getattr(workload, "config", None)
    if not isinstance(name, str) or not isinstance(size, str) or not isinstance(config, Mapping):
        raise LaunchError(
            f"launch: workload should be a dict {{'model':..., 'size':..., **overrides}} or a "
            f"Workload from autoplan.models.get. Got {type(workload).__name__}. Fix: a function "
            "cannot be sent to worker processes; register the model in the zoo or pass its spec.")
    from autoplan.models import get  # noqa: PLC0415

    default = get(name, size).config
    overrides = {k: v for k, v in config.items() if k in default and default[k] != v}
    return _json_ready({"model": name, "size": size, **overrides})


def _json_ready(spec: dict[str, Any]) -> dict[str, Any]:
    out = {k: list(v) if isinstance(v, tuple) else v for k, v in spec.items()}
    try:
        json.dumps(out)
    except TypeError as err:
        raise LaunchError(f"launch: the workload spec should be JSON values. Got {spec!r} "
                          f"({err}).") from err
    return out


@dataclass
class LaunchResult:
    """The outcome of a successful launch.

    Attributes:
        losses: per process, the loss of every step.
        step_times: per process, seconds per step.
        matched: every process matched single-device execution (None when not checked).
        done: per process, its ``done`` event.
        events: every event received, in order.
        wall_time: seconds from launch to the last worker's exit.
    """

    losses: dict[int, list[float]]
    step_times: dict[int, list[float]]
    matched: bool | None
    done: dict[int, dict[str, Any]]
    events: list[dict[str, Any]] = field(default_factory=list)
    wall_time: float = 0.0

    @property
    def loss(self) -> list[float]:
        """Process 0's losses (every process computes the same ones)."""
        return self.losses.get(0, next(iter(self.losses.values()), []))


class _Worker:
    def __init__(self, index: int, proc: subprocess.Popen, events: queue.Queue):
        self.index = index
        self.proc = proc
        self.stderr: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES)
        self.stdout_other: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES)
        self.threads = [
            threading.Thread(target=self._read_stdout, args=(events,), daemon=True,
                             name=f"autoplan-worker{index}-stdout"),
            threading.Thread(target=self._read_stderr, daemon=True,
                             name=f"autoplan-worker{index}-stderr"),
        ]
        for t in self.threads:
            t.start()

    def _read_stdout(self, events: queue.Queue) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            if line.startswith("{"):
                try:
                    ev = json.loads(line)
                except json.JSONDecodeError:
                    self.stdout_other.append(line)
                    continue
                ev.setdefault("process", self.index)
                ev["worker"] = self.index
                events.put(ev)
            elif line:
                self.stdout_other.append(line)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            line = line.rstrip("\n")
            if line:
                self.stderr.append(line)

    def tail(self, n: int = 12) -> str:
        lines = [ln for ln in self.stderr
                 if not ln.startswith("[Gloo]") and not ln.lstrip().startswith("@ ")][-n:]
        return "\n".join(f"    [worker {self.index}] {ln}" for ln in lines) or \
            f"    [worker {self.index}] (no stderr output)"


class LaunchHandle:
    """A running launch: poll it, wait for it, or cancel it.

    Attributes:
        num_processes: workers started.
        pids: their process ids (each leads its own process group).
        events: every event received so far.
        workdir: the folder holding the plan file (removed when the launch ends).
    """

    def __init__(self, cmds: list[list[str]], env: dict[str, str], timeout: float, workdir: str):
        self.num_processes = len(cmds)
        self.events: list[dict[str, Any]] = []
        self.workdir = workdir
        self.timeout = float(timeout)
        self._queue: queue.Queue = queue.Queue()
        self._t0 = time.monotonic()
        self._deadline = self._t0 + self.timeout
        self._closed = False
        self._result: LaunchResult | None = None
        self._error: LaunchError | None = None
        self._workers: list[_Worker] = []
        _LIVE.add(self)
        try:
            for i, cmd in enumerate(cmds):
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=env, text=True, bufsize=1,
                                        start_new_session=True)
                self._workers.append(_Worker(i, proc, self._queue))
        except OSError as err:
            self.cancel()
            raise LaunchError(f"launch: could not start worker {len(self._workers)}: {err}. Fix: "
                              f"check the Python executable {cmds[0][0]!r}.") from err
        self.pids = [w.proc.pid for w in self._workers]

    # ---- observing ---------------------------------------------------------------------
    def poll(self) -> list[dict[str, Any]]:
        """New events since the last call (never blocks)."""
        new = []
        while True:
            try:
                ev = self._queue.get_nowait()
            except queue.Empty:
                break
            self.events.append(ev)
            new.append(ev)
        return new

    @property
    def done(self) -> bool:
        """Every worker has exited (or the launch was cancelled)."""
        return self._closed or all(w.proc.poll() is not None for w in self._workers)

    def returncodes(self) -> list[int | None]:
        """Each worker's exit status (None while running)."""
        return [w.proc.poll() for w in self._workers]

    def stderr_tail(self, n: int = 12) -> str:
        """Every worker's last ``n`` stderr lines."""
        return "\n".join(w.tail(n) for w in self._workers)

    # ---- waiting -----------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> LaunchResult:
        """Wait until every worker is done.

        Args:
            timeout: seconds to wait at most (never past the launch's own timeout).

        Returns:
            The :class:`LaunchResult`.

        Raises:
            LaunchError: a worker failed, reported an error, or the time ran out; every worker
                has been killed and the message holds their last stderr lines.
        """
        if self._result is not None:
            return self._result
        if self._error is not None:
            raise self._error
        deadline = self._deadline if timeout is None else min(self._deadline, time.monotonic() + timeout)
        while True:
            self.poll()
            err = self._failure()
            if err is not None:
                self._fail(err)
            if all(w.proc.poll() is not None for w in self._workers):
                for w in self._workers:  # drain the readers
                    for t in w.threads:
                        t.join(timeout=2.0)
                self.poll()
                err = self._failure()
                if err is not None:
                    self._fail(err)
                return self._finish()
            if time.monotonic() >= deadline:
                running = [w.index for w in self._workers if w.proc.poll() is None]
                self._fail(f"timed out after {time.monotonic() - self._t0:.1f} s with worker(s) "
                           f"{running} still running (a hang, or a timeout too short for the "
                           "model: raise timeout=)")
            time.sleep(0.05)

    def _failure(self) -> str | None:
        """Every failure seen so far (exits first: an error a worker reports is often the
        consequence of a peer that died), or None."""
        why = []
        for w in self._workers:
            rc = w.proc.poll()
            if rc is not None and rc != 0:
                how = f"signal {-rc}" if rc < 0 else f"status {rc}"
                why.append(f"worker {w.index} exited with {how}")
        for ev in self.events:
            if ev.get("event") == "error":
                msg = str(ev.get("message", "")).strip().splitlines()
                why.append(f"worker {ev.get('worker')} (process {ev.get('process')}) reported "
                           f"{ev.get('type')}: {msg[0] if msg else ''}")
        return "; ".join(why) if why else None

    def _fail(self, why: str) -> None:
        self.cancel()
        codes = ", ".join(f"worker {w.index}: {w.proc.returncode}" for w in self._workers)
        self._error = LaunchError(
            f"launch of {self.num_processes} workers failed: {why}. Every worker was killed "
            f"(exit statuses {codes}). Last stderr lines:\n{self.stderr_tail()}")
        raise self._error

    def _finish(self) -> LaunchResult:
        done = {ev["process"]: ev for ev in self.events if ev.get("event") == "done"}
        if len(done) != self.num_processes:
            missing = sorted(set(range(self.num_processes)) - set(done))
            self._fail(f"worker(s) for process(es) {missing} exited without reporting 'done'")
        losses = {p: list(ev.get("losses", [])) for p, ev in done.items()}
        times = {p: list(ev.get("step_times", [])) for p, ev in done.items()}
        flags = [ev.get("matched") for ev in done.values()]
        matched = None if all(f is None for f in flags) else all(bool(f) for f in flags)
        self._result = LaunchResult(losses, times, matched, done, list(self.events),
                                    time.monotonic() - self._t0)
        self._close()
        return self._result

    # ---- stopping ----------------------------------------------------------------------
    def cancel(self) -> None:
        """Kill every worker's process group (SIGTERM, then SIGKILL) and clean up."""
        for w in self._workers:
            _signal_group(w.proc, signal.SIGTERM)
        end = time.monotonic() + 1.0  # JAX catches SIGTERM (preemption notice): keep it short
        for w in self._workers:
            try:
                w.proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for w in self._workers:
            _signal_group(w.proc, signal.SIGKILL)  # the group may hold children too
            try:
                w.proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
                pass
        for w in self._workers:
            for t in w.threads:
                t.join(timeout=2.0)
        self.poll()
        self._close()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w in self._workers:
            if any(t.is_alive() for t in w.threads):
                continue  # a reader still blocked in read(): closing would wait for its lock
            for stream in (w.proc.stdout, w.proc.stderr):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:  # pragma: no cover
                        pass
        shutil.rmtree(self.workdir, ignore_errors=True)
        _LIVE.discard(self)

    def __enter__(self) -> LaunchHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._closed:
            self.cancel()

    def __repr__(self) -> str:
        state = "done" if self.done else "running"
        return f"LaunchHandle({self.num_processes} workers, {state}, {len(self.events)} events)"


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the worker leads its own session/group
    except (ProcessLookupError, PermissionError):
        pass


@atexit.register
def _kill_all() -> None:
    for h in list(_LIVE):
        try:
            h.cancel()
        except Exception:  # pragma: no cover - best effort at exit
            pass


def launch(plan: Any, workload_spec: Any, num_processes: int = 2, devices_per_process: int = 4,
           steps: int = 2, timeout: float = 120.0, check: bool = True, *,
           env: Mapping[str, str] | None = None, platform: str = "cpu", python: str | None = None,
           seed: int = 0, compiler_options: Mapping[str, Any] | None = None) -> LaunchHandle:
    """Start ``num_processes`` workers that run ``plan`` together through ``jax.distributed``.

    Args:
        plan: a :class:`~autoplan.Plan` or the path of a plan JSON file.
        workload_spec: ``{"model": name, "size": size, **overrides}`` or a
            :class:`autoplan.models.Workload` (sent as its name, size and overrides).
        num_processes: worker processes ``N``.
        devices_per_process: devices of each (``jax_num_cpu_devices`` on CPU); ``N K`` must equal
            the plan's device count.
        steps: training steps.
        timeout: seconds the whole launch may take; past it every worker is killed.
        check: each worker compares its shards with a single-device run computed locally.
        env: extra environment variables for the workers.
        platform: the JAX platform of the workers (``"cpu"``).
        python: the Python executable (default this one).
        seed: PRNG seed of the workload's arrays (the same in every worker).
        compiler_options: XLA options for the workers' compilations.

    Returns:
        A :class:`LaunchHandle`; call ``.wait()`` for the :class:`LaunchResult`.

    Raises:
        PlanMismatchError: ``num_processes * devices_per_process`` differs from the plan's device
            count (checked before anything starts).
        LaunchError: the workload cannot be described to a worker, or a worker cannot start.
    """
    from autoplan._plan import Plan  # noqa: PLC0415

    if not isinstance(plan, Plan):
        plan = Plan.from_json(str(plan))
    for name, v in (("num_processes", num_processes), ("devices_per_process", devices_per_process),
                    ("steps", steps)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise LaunchError(f"launch: {name} should be a positive integer. Got {v!r}.")
    if num_processes * devices_per_process != plan.num_devices:
        raise PlanMismatchError(
            f"launch: the plan uses {plan.num_devices} devices but num_processes x "
            f"devices_per_process = {num_processes} x {devices_per_process} = "
            f"{num_processes * devices_per_process}. Fix: choose them so the product is "
            f"{plan.num_devices}, or make a plan for that many devices.")
    spec = describe_workload(workload_spec)
    workdir = tempfile.mkdtemp(prefix="autoplan-launch-")
    plan_path = os.path.join(workdir, "plan.json")
    plan.to_json(plan_path)
    port = free_port()
    exe = python or sys.executable
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    wenv = dict(os.environ)
    wenv.update(env or {})
    wenv["PYTHONPATH"] = root + (os.pathsep + wenv["PYTHONPATH"] if wenv.get("PYTHONPATH") else "")
    wenv["PYTHONUNBUFFERED"] = "1"
    if platform:
        wenv["JAX_PLATFORMS"] = platform
    cmds = []
    for i in range(num_processes):
        cmd = [exe, "-m", "autoplan.exec._worker", "--plan", plan_path,
               "--workload", json.dumps(spec), "--process-id", str(i),
               "--num-processes", str(num_processes), "--coordinator", f"127.0.0.1:{port}",
               "--devices-per-process", str(devices_per_process), "--platform", platform,
               "--steps", str(steps), "--seed", str(seed)]
        if not check:
            cmd.append("--no-check")
        if compiler_options:
            cmd += ["--compiler-options", json.dumps(dict(compiler_options))]
        cmds.append(cmd)
    return LaunchHandle(cmds, wenv, timeout, workdir)

