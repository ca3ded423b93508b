"""Launching a plan on worker processes joined by ``jax.distributed``, on the devices attached.

:func:`launch` checks everything it can before a worker starts, then supervises the workers:

1. **Preflight.** The workload is named by a spec (:mod:`autoplan.tracing._loader`: a zoo model with
   its size and overrides, or a user's ``module:function``) because a training step cannot be
   sent to another process. A probe subprocess (:mod:`autoplan.exec._probe`) finds the
   attached devices (a notebook kernel that already started JAX is not disturbed) and traces
   the workload abstractly: a plan whose fingerprint differs (another model, a changed
   ``--set``) is refused with :class:`~autoplan.PlanMismatchError` before any worker starts.
2. **Layout** (:func:`autoplan.exec._layout.choose_layout`): one worker per GPU (or one per host
   with all its GPUs), one per TPU host, or emulated CPU devices when no accelerator is
   attached; the counts default from the plan and the devices. A plan that needs more devices
   than are attached is refused with the ``srun``/``mpirun`` lines that run it on a cluster.
3. **Workers** (:mod:`autoplan.exec._worker`), each in a process group of its own. Each
   gets the plan as the first line of its stdin and keeps that pipe: when the launcher exits,
   however it dies (SIGKILL included), the pipe closes and the worker ends itself and its group
   within a second. (Linux's ``PR_SET_PDEATHSIG`` would fire when the *thread* that started
   the worker ends, and the Explorer launches from a background thread; a pipe follows the
   process, and works beyond Linux.) Nothing is written to disk. The workers' module search path is this
   process's (``sys.path`` and the current directory), so a user's module imports there too.
   Everything listens on 127.0.0.1 only: the ``jax.distributed`` coordination service and the
   CPU collectives.
4. **Supervision**, in a background thread: each worker's JSON events (stdout) and last stderr
   lines are collected. The launch fails, with every worker killed and their last lines in a
   :class:`~autoplan.LaunchError`, when a worker exits with an error or reports one, when the
   workers built different data (their argument digests differ), when no worker has made
   progress for the hang limit (heartbeats every ``heartbeat`` seconds say whether a worker's
   main thread moves; the limit is ``hang_timeout``, by default
   ``max(HANG_FLOOR, HANG_FACTOR x the slowest step seen)``, see :class:`Watchdog`), or at
   ``timeout``. A coordinator
   port found taken is retried on another port (``port_retries`` times).

Example (not run as a doctest: it starts one worker process per GPU of a machine that has
them, and reads a plan file and a user's module):

    >>> handle = launch("plan.json", "mypkg.train:workload")          # doctest: +SKIP
    >>> handle.layout.describe()                                        # doctest: +SKIP
    '8 processes x 1 GPU (NVIDIA H100 80GB HBM3, cuda)'
    >>> result = handle.wait()                                          # doctest: +SKIP
    >>> result.matched, result.loss                                     # doctest: +SKIP
    (True, [5.5323, 5.4183])
"""

from __future__ import annotations

import atexit
import collections
import json
import math
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from autoplan import _signals
from autoplan._errors import LaunchError, NonFiniteError, PlanMismatchError
from autoplan._memo import per_owner
from autoplan.exec._layout import (
    CLUSTER_KINDS,
    WorkerLayout,
    choose_layout,
    cluster_command,
    local_worker_command,
    worker_pythonpath,
)
from autoplan.exec._probe import DeviceInfo, preflight
from autoplan.tracing._loader import workload_spec
from autoplan.tracing._workload import Workload

__all__ = ["launch", "LaunchHandle", "LaunchResult", "LaunchInterrupted", "describe_workload",
           "free_port", "spec_arguments", "raise_on_signals", "Watchdog", "HANG_FLOOR",
           "HANG_FACTOR"]

_STDERR_LINES = 40
#: the hang limit's floor, seconds: time for the first steps before any is measured
HANG_FLOOR = 60.0
#: the hang limit is at least this many times the slowest step seen
HANG_FACTOR = 5.0
_LIVE: weakref.WeakSet[LaunchHandle] = weakref.WeakSet()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def describe_workload(workload: Any) -> dict[str, Any]:
    """The JSON spec that rebuilds ``workload`` in a worker: ``{"model": name, **kwargs}``.

    Args:
        workload: a spec (zoo name, ``"module:function"`` or dict), or an
            :class:`autoplan.Workload` from the zoo (its name, size and the config fields that
            differ from the size's defaults) or loaded from ``"module:function"``.

    Raises:
        LaunchError: a workload built in this process only (a function cannot be sent to a
            worker process).
    """
    try:
        spec = workload_spec(workload)
    except Exception as err:
        raise LaunchError(f"launch: the workload spec is not valid: {err}") from err
    if spec is None:
        raise LaunchError(
            f"launch: a {type(workload).__name__} built in this process cannot be sent to worker "
            "processes (a function cannot be pickled). Fix: define a function that returns it in "
            "a module and pass 'module:function' (e.g. 'mypkg.train:workload'), or a zoo spec "
            "such as {'model': 'gpt', 'size': 'tiny'}.")
    return spec


def spec_arguments(spec: Mapping[str, Any]) -> str:
    """The CLI form of a workload spec: ``gpt --size tiny --set layers=3``."""
    parts = [str(spec["model"])]
    for k, v in spec.items():
        if k == "model":
            continue
        if k in ("size", "batch"):
            parts.append(f"--{k} {v}")
        else:
            parts.append(f"--set {k}={json.dumps(v, separators=(',', ':'))}")
    return " ".join(parts)


@dataclass
class LaunchResult:
    """The outcome of a successful launch.

    Attributes:
        losses: per process, the loss of every step.
        step_times: per process, seconds per step.
        matched: every process matched single-device execution (None when not checked).
        done: per process, its ``done`` event.
        events: every event received, in order (heartbeats excepted).
        wall_time: seconds from launch to the last worker's exit.
        layout: how the workers ran, e.g. ``"2 processes x 4 emulated CPU devices"``.
        ports: the coordinator ports tried, the last one used.
        nonfinite: empty, or (a launch with ``allow_nonfinite=True``) what was NaN or infinite,
            as the first process that saw it says, with whether one device computes the same.
    """

    losses: dict[int, list[float]]
    step_times: dict[int, list[float]]
    matched: bool | None
    done: dict[int, dict[str, Any]]
    events: list[dict[str, Any]] = field(default_factory=list)
    wall_time: float = 0.0
    layout: str = ""
    ports: list[int] = field(default_factory=list)
    nonfinite: str = ""

    @property
    def loss(self) -> list[float]:
        """Process 0's losses (every process computes the same ones)."""
        return self.losses.get(0, next(iter(self.losses.values()), []))


class Watchdog:
    """Finds a hung launch from the workers' heartbeats.

    A worker *progresses* when it sends any event other than a heartbeat, or a heartbeat whose
    ``progress`` counter moved or that says it is compiling. The launch is hung when none of
    the running workers has progressed for :attr:`limit` seconds: in SPMD every worker waits
    for the slowest, so one worker stuck (in a collective, a deadlock, an endless step) stalls
    them all, while one that is still compiling or computing keeps the launch alive.

    Args:
        workers: number of workers.
        now: the start time (``time.monotonic()``).
        hang_timeout: a fixed limit in seconds; None: ``max(floor, factor x slowest step)``,
            times ``check_scale`` for a worker in its ``checking`` phase.
        floor, factor: the default limit's terms.
        check_scale: the plan's device count: the single-device reference of the equivalence
            check does every device's work on one device, so its steps may take that much
            longer than the sharded ones.
    """

    def __init__(self, workers: int, now: float, hang_timeout: float | None = None,
                 floor: float = HANG_FLOOR, factor: float = HANG_FACTOR,
                 check_scale: int = 1) -> None:
        self.fixed = hang_timeout
        self.floor, self.factor = floor, factor
        self.check_scale = max(1, int(check_scale))
        self.last = [now] * workers
        self.counter: list[Any] = [None] * workers
        self.beat: list[dict[str, Any]] = [{} for _ in range(workers)]
        self.slowest = 0.0

    @property
    def limit(self) -> float:
        """Seconds without progress that make a hang."""
        if self.fixed is not None:
            return float(self.fixed)
        return max(self.floor, self.factor * self.slowest)

    def see(self, ev: Mapping[str, Any], now: float) -> None:
        """Account for one event of worker ``ev["worker"]``."""
        w = int(ev["worker"])
        if ev.get("event") == "heartbeat":
            moved = ev.get("progress") != self.counter[w] or bool(ev.get("compiling"))
            self.counter[w] = ev.get("progress")
            self.beat[w] = dict(ev)
            if moved:
                self.last[w] = now
            return
        self.last[w] = now
        if ev.get("event") == "step" and isinstance(ev.get("step_time"), (int, float)):
            self.slowest = max(self.slowest, float(ev["step_time"]))

    def limit_of(self, worker: int) -> float:
        """The limit for one worker: :attr:`limit`, scaled while it checks (default limit)."""
        if self.fixed is None and self.beat[worker].get("phase") == "checking":
            return self.limit * self.check_scale
        return self.limit

    def where(self, now: float, running: list[int]) -> str:
        """What each running worker did last: its phase, its last step, how long without
        progress and where its main thread is (from its last heartbeat)."""
        parts = []
        for w in running:
            b = self.beat[w]
            step = b.get("step")
            at = f" after step {step}" if step is not None else ""
            where = b.get("stack") or ([b["where"]] if b.get("where") else [])
            parts.append(f"worker {w} in phase {b.get('phase', 'starting')!r}{at}, no progress for "
                         f"{now - self.last[w]:.0f} s"
                         + (", at " + " <- ".join(where) if where else ""))
        return "; ".join(parts)

    def stalled(self, now: float, running: list[int]) -> str | None:
        """Why the launch is hung, or None."""
        limit = self.limit
        if not running or any(now - self.last[w] < self.limit_of(w) for w in running):
            return None
        how = (f"hang_timeout={self.fixed:g} s" if self.fixed is not None else
               f"max({self.floor:g} s, {self.factor:g} x the slowest step "
               f"{self.slowest * 1e3:.1f} ms)")
        return (f"no worker made progress for {limit:.0f} s (the limit: {how}): "
                + self.where(now, running) + ". A hang (a collective waiting for a peer, a deadlock), or "
                "a step or compilation longer than the limit: then raise hang_timeout= "
                "(--hang-timeout)")


class _Worker:
    def __init__(self, index: int, attempt: int, proc: subprocess.Popen, events: queue.Queue,
                 plan_text: str):
        self.index = index
        self.attempt = attempt
        self.proc = proc
        self.stderr: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES)
        self.stdout_other: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES)
        self.threads = [
            threading.Thread(target=self._read_stdout, args=(events,), daemon=True,
                             name=f"autoplan-worker{index}-stdout"),
            threading.Thread(target=self._read_stderr, daemon=True,
                             name=f"autoplan-worker{index}-stderr"),
            threading.Thread(target=self._send_plan, args=(plan_text,), daemon=True,
                             name=f"autoplan-worker{index}-plan"),
        ]
        for t in self.threads:
            t.start()

    def _send_plan(self, text: str) -> None:
        """The plan as the first line on the worker's stdin; the pipe then stays open (its
        closing tells the worker the launcher is gone)."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(text + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):  # the worker died first: its exit status says why
            pass

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
                if not isinstance(ev, dict):
                    continue
                ev.setdefault("process", self.index)
                ev["worker"] = self.index
                ev["attempt"] = self.attempt
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

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is None:
                continue
            if stream is not self.proc.stdin and any(t.is_alive() for t in self.threads[:2]):
                continue  # a reader still blocked in read(): closing would wait for its lock
            try:
                stream.close()
            except (OSError, ValueError):
                pass


class LaunchHandle:
    """A running launch: poll it, wait for it, or cancel it.

    A supervisor thread watches the workers whether or not anyone polls: failures, hangs, a
    taken coordinator port and the timeout are handled as they happen.

    Attributes:
        layout: the :class:`~autoplan.exec._layout.WorkerLayout` (platform, counts).
        num_processes: workers started.
        pids: their process ids (each leads its own process group); a retry on another port
            starts new ones.
        events: every event received so far (heartbeats excepted; see :meth:`heartbeats`).
        ports: the coordinator ports tried so far, the current one last.
        spec: the workload spec the workers load.
    """

    def __init__(self, plan_text: str, spec: Mapping[str, Any], layout: WorkerLayout,
                 env: Mapping[str, str], *, steps: int, seed: int, check: bool, python: str | None,
                 compiler_options: Mapping[str, Any] | None, timeout: float,
                 hang_timeout: float | None, heartbeat: float, port: int | None,
                 port_retries: int, allow_nonfinite: bool = False) -> None:
        self.layout = layout
        self.num_processes = layout.num_processes
        self.spec = dict(spec)
        self.events: list[dict[str, Any]] = []
        self.ports: list[int] = []
        self.timeout = float(timeout)
        self._plan_text = plan_text
        self._env = dict(env)
        self._args = dict(steps=steps, seed=seed, check=check, python=python or sys.executable,
                          compiler_options=compiler_options, heartbeat=heartbeat)
        self._hang_timeout = hang_timeout
        self._allow_nonfinite = allow_nonfinite
        self._retries_left = port_retries
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.RLock()
        self._cursor = 0
        self._beats: dict[int, dict[str, Any]] = {}
        self._t0 = time.monotonic()
        self._deadline = self._t0 + self.timeout
        self._finished = threading.Event()
        self._stop = threading.Event()
        self._closed = False
        self._result: LaunchResult | None = None
        self._error: LaunchError | None = None
        self._workers: list[_Worker] = []
        self._attempt = 0
        self._digests: dict[int, str] = {}
        _LIVE.add(self)
        try:
            self._spawn(port if port is not None else free_port())
        except BaseException:
            self._kill_workers()
            self._close()
            raise
        self._watchdog = self._new_watchdog()
        self._supervisor = threading.Thread(target=self._supervise, daemon=True,
                                            name="autoplan-launch-supervisor")
        self._supervisor.start()

    # ---- starting ----------------------------------------------------------------------
    def _new_watchdog(self) -> Watchdog:
        lay = self.layout
        return Watchdog(self.num_processes, time.monotonic(), self._hang_timeout,
                        check_scale=lay.num_processes * lay.devices_per_process)

    def _command(self, index: int, port: int) -> list[str]:
        a = self._args
        return local_worker_command(self.layout, index, port, self.spec, steps=a["steps"],
                                    seed=a["seed"], check=a["check"], python=a["python"],
                                    compiler_options=a["compiler_options"],
                                    heartbeat=a["heartbeat"])

    def _spawn(self, port: int) -> None:
        self.ports.append(port)
        workers = []
        for i in range(self.num_processes):
            cmd = self._command(i, port)
            env = {**self._env, **self.layout.env(i, self._env)}
            try:
                proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=env, text=True, bufsize=1,
                                        start_new_session=True)
            except OSError as err:
                self._workers = workers
                raise LaunchError(f"launch: could not start worker {i}: {err}. Fix: check the "
                                  f"Python executable {cmd[0]!r}.") from err
            workers.append(_Worker(i, self._attempt, proc, self._queue, self._plan_text))
            self._workers = workers
        self.pids = [w.proc.pid for w in workers]

    # ---- observing ---------------------------------------------------------------------
    def poll(self) -> list[dict[str, Any]]:
        """New events since the last call (never blocks)."""
        with self._lock:
            new = self.events[self._cursor:]
            self._cursor = len(self.events)
            return list(new)

    def heartbeats(self) -> dict[int, dict[str, Any]]:
        """Each worker's last heartbeat (phase, step, where its main thread is)."""
        with self._lock:
            return {w: dict(b) for w, b in self._beats.items()}

    @property
    def done(self) -> bool:
        """The launch is over: every worker finished, or the launch failed or was cancelled."""
        return self._finished.is_set()

    def returncodes(self) -> list[int | None]:
        """Each worker's exit status (None while running)."""
        return [w.proc.poll() for w in self._workers]

    def stderr_tail(self, n: int = 12) -> str:
        """Every worker's last ``n`` stderr lines."""
        return "\n".join(w.tail(n) for w in self._workers)

    # ---- supervising -------------------------------------------------------------------
    def _take_events(self) -> None:
        now = time.monotonic()
        while True:
            try:
                ev = self._queue.get_nowait()
            except queue.Empty:
                return
            if ev.get("attempt") != self._attempt:
                continue  # a worker of a retried attempt, already killed
            self._watchdog.see(ev, now)
            with self._lock:
                if ev.get("event") == "heartbeat":
                    self._beats[ev["worker"]] = ev
                else:
                    self.events.append(ev)
            if ev.get("event") == "loaded" and isinstance(ev.get("digest"), str):
                self._digests[ev["worker"]] = ev["digest"]

    def _supervise(self) -> None:
        try:
            while not self._stop.is_set():
                self._take_events()
                why = self._failure()
                if why is not None:
                    self._drain_exited()  # the exited worker's own report, before judging
                    why = self._failure() or why
                    if self._port_taken() and self._retries_left > 0:
                        self._retry()
                        continue
                    self._fail(why)
                    return
                if all(w.proc.poll() is not None for w in self._workers):
                    for w in self._workers:  # drain the readers
                        for t in w.threads[:2]:
                            t.join(timeout=2.0)
                    self._take_events()
                    why = self._failure()
                    if why is not None:
                        self._fail(why)
                    else:
                        self._finish()
                    return
                now = time.monotonic()
                running = [w.index for w in self._workers if w.proc.poll() is None]
                hung = self._watchdog.stalled(now, running)
                if hung is not None:
                    self._fail(hung)
                    return
                if now >= self._deadline:
                    self._fail(f"timed out after {now - self._t0:.1f} s with worker(s) {running} "
                               f"still running ({self._watchdog.where(now, running)}): a hang, "
                               "or a timeout too short for the model: raise timeout=")
                    return
                self._stop.wait(0.05)
        except BaseException as err:  # pragma: no cover - a bug in supervision: never hang
            self._fail(f"the launch supervisor failed: {type(err).__name__}: {err}")

    def _drain_exited(self) -> None:
        """Read what the exited workers wrote to the end (their error events and last lines)."""
        for w in self._workers:
            if w.proc.poll() is not None:
                for t in w.threads[:2]:
                    t.join(timeout=2.0)
        self._take_events()

    def _current_events(self) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e.get("attempt") == self._attempt]

    def _failure(self) -> str | None:
        """Every failure seen so far (exits first: an error a worker reports is often the
        consequence of a peer that died), or None."""
        why = []
        for w in self._workers:
            rc = w.proc.poll()
            if rc is not None and rc != 0:
                how = f"signal {-rc}" if rc < 0 else f"status {rc}"
                why.append(f"worker {w.index} exited with {how}")
        for ev in self._current_events():
            if ev.get("event") == "error":
                msg = str(ev.get("message", "")).strip().splitlines()
                why.append(f"worker {ev.get('worker')} (process {ev.get('process')}) reported "
                           f"{ev.get('type')}: {msg[0] if msg else ''}")
        if len(self._digests) == self.num_processes and len(set(self._digests.values())) > 1:
            why.append(
                "the workers built different arrays for the workload (argument digests "
                f"{dict(sorted(self._digests.items()))}): every process must build the same "
                "data. Fix: seed every random generator in the workload function (use its seed "
                "argument)")
        return "; ".join(why) if why else None

    def _port_taken(self) -> bool:
        return any(e.get("event") == "error" and e.get("type") == "CoordinatorPortTaken"
                   for e in self._current_events())

    def _retry(self) -> None:
        old = self.ports[-1]
        self._kill_workers()
        for w in self._workers:
            w.close()
        self._attempt += 1
        self._retries_left -= 1
        self._digests = {}
        port = free_port()
        with self._lock:
            self.events.append({"event": "retry", "reason": f"coordinator port {old} was taken",
                                "port": port, "attempt": self._attempt})
            self._beats = {}
        self._spawn(port)
        self._watchdog = self._new_watchdog()

    def _fail(self, why: str) -> None:
        self._kill_workers()
        codes = ", ".join(f"worker {w.index}: {w.proc.returncode}" for w in self._workers)
        self._error = LaunchError(
            f"launch of {self.num_processes} workers ({self.layout.describe()}) failed: {why}. "
            f"Every worker was stopped (exit statuses {codes}). Last stderr lines:\n"
            f"{self.stderr_tail()}")
        self._close()

    def _finish(self) -> None:
        done = {ev["process"]: ev for ev in self._current_events() if ev.get("event") == "done"}
        if len(done) != self.num_processes:
            missing = sorted(set(range(self.num_processes)) - set(done))
            self._fail(f"worker(s) for process(es) {missing} exited without reporting 'done'")
            return
        losses = {p: list(ev.get("losses", [])) for p, ev in done.items()}
        times = {p: list(ev.get("step_times", [])) for p, ev in done.items()}
        flags = [ev.get("matched") for ev in done.values()]
        matched = None if all(f is None for f in flags) else all(bool(f) for f in flags)
        nonfinite = next((f"process {p}: {ev['nonfinite']}" for p, ev in sorted(done.items())
                          if ev.get("nonfinite")), "")
        if nonfinite and not self._allow_nonfinite:
            self._error = NonFiniteError(
                f"launch of {self.num_processes} workers ({self.layout.describe()}): the numbers "
                f"are not finite at {nonfinite} Fix: find where the model overflows (a learning "
                "rate too high, the log of 0, an input holding inf), or pass "
                "allow_nonfinite=True (--allow-nonfinite) to accept the run.")
            self._close()
            return
        self._result = LaunchResult(losses, times, matched, done, list(self.events),
                                    time.monotonic() - self._t0, self.layout.describe(),
                                    list(self.ports), nonfinite)
        self._close()

    # ---- waiting -----------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> LaunchResult:
        """Wait until the launch is over.

        Args:
            timeout: seconds to wait at most (never past the launch's own timeout); when they
                pass first, the launch is stopped as timed out.

        Returns:
            The :class:`LaunchResult`.

        Raises:
            LaunchError: a worker failed, reported an error, hung, or the time ran out; every
                worker has been killed and the message holds their last stderr lines.
            NonFiniteError: the workers finished, but a loss or gradient is NaN or infinite
                (and the launch was not made with ``allow_nonfinite=True``).
            KeyboardInterrupt: interrupted while waiting; the workers are stopped first.
        """
        try:
            if timeout is None:
                while not self._finished.wait(0.2):
                    pass
            elif not self._finished.wait(max(0.0, timeout)):
                self._stop.set()
                self._supervisor.join()
                if not self._finished.is_set():
                    running = [w.index for w in self._workers if w.proc.poll() is None]
                    self._fail(f"timed out after {time.monotonic() - self._t0:.1f} s (wait's "
                               f"timeout={timeout:g}) with worker(s) {running} still running")
        except BaseException:
            if not self._finished.is_set():
                self.cancel()
            raise
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    # ---- stopping ----------------------------------------------------------------------
    def _kill_workers(self) -> None:
        """Each worker's process group: SIGTERM, then SIGKILL; their output drained."""
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
            for t in w.threads[:2]:
                t.join(timeout=2.0)

    def cancel(self) -> None:
        """Stop every worker (SIGTERM to its process group, then SIGKILL) and clean up; a
        launch cancelled before it finished raises ``LaunchError("...cancelled...")`` from
        :meth:`wait`."""
        self._stop.set()
        sup = getattr(self, "_supervisor", None)
        if sup is not None and sup is not threading.current_thread():
            sup.join(timeout=30.0)
        if not self._finished.is_set():
            self._fail("cancelled")
        self._kill_workers()
        self._close()

    def _close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for w in self._workers:
            w.close()
        _LIVE.discard(self)
        self._finished.set()

    def __enter__(self) -> LaunchHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._finished.is_set():
            self.cancel()

    def __repr__(self) -> str:
        state = ("failed" if self._error else "done") if self.done else "running"
        return (f"LaunchHandle({self.layout.describe()}, {state}, {len(self.events)} events)")


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the worker heads a process group of its own
    except (ProcessLookupError, PermissionError):
        pass


@atexit.register
def _kill_all() -> None:
    for h in list(_LIVE):
        try:
            h.cancel()
        except Exception:  # pragma: no cover - best effort at exit
            pass


# ---- signals ---------------------------------------------------------------------------------
class LaunchInterrupted(BaseException):
    """SIGTERM or SIGHUP arrived (see :func:`raise_on_signals`); ``signum`` says which.

    A ``BaseException``, as ``KeyboardInterrupt`` is, so that ``except Exception`` does not
    swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def raise_on_signals(signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Within the block, the signals raise :class:`LaunchInterrupted` in the main thread (as
    SIGINT raises ``KeyboardInterrupt``), so ``finally`` blocks and cancellation run; the old
    handlers come back after. Outside the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if _signals.unsafe(frame):  # never through an extension module's start-up: raised after
            _signals.redeliver(signum)
            return
        raise LaunchInterrupted(signum)

    old = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# ---- the entry point --------------------------------------------------------------------------
def _plan_of(plan: Any) -> tuple[Any, str | None]:
    from autoplan.plans._plan import Plan  # noqa: PLC0415

    if isinstance(plan, Plan):
        return plan, None
    if isinstance(plan, (str, os.PathLike)):
        from autoplan.plans._plan_check import PlanContradictionWarning  # noqa: PLC0415

        with warnings.catch_warnings():  # a contradiction is refused below: said once, as an error
            warnings.simplefilter("ignore", PlanContradictionWarning)
            return Plan.from_json(os.fspath(plan)), os.fspath(plan)
    raise LaunchError(f"launch: plan should be an autoplan Plan or the path of a plan file. Got "
                      f"{type(plan).__name__}. Fix: pass result.best or 'plan.json'.")


@per_owner
def _fingerprint_here(workload: Workload) -> tuple[str, Any]:
    """The fingerprint and :class:`~autoplan.plans._plan_check.WorkloadView` of a workload object
    (one with a spec: a zoo or ``module:function`` :class:`~autoplan.Workload`); once per
    workload object."""
    from autoplan.plans._plan_check import WorkloadView  # noqa: PLC0415
    from autoplan.tracing._trace import trace  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = trace(workload)
    return graph.fingerprint, WorkloadView.of(graph, workload.config)


def _cluster_hint(plan: Any, plan_path: str | None, spec: Mapping[str, Any]) -> str:
    if plan_path is None:
        return ("Run it on a cluster: write the plan (plan.to_json('plan.json')) and run 'autoplan "
                f"launch plan.json --model {spec_arguments(spec)} --print-command slurm' (or "
                "mpi) for the command.")
    lines = []
    for kind in CLUSTER_KINDS:
        try:
            cmd = cluster_command(kind, plan_path, spec, plan.num_devices,
                                  plan.cluster.devices_per_node)
        except LaunchError:  # devices that do not spread over whole nodes: say how to ask
            cmd = (f"autoplan launch {plan_path} --model {spec_arguments(spec)} --print-command "
                   f"{kind} --nodes N")
        lines.append(f"  {kind}: {cmd}")
    return "Run it on a cluster, with a path every node reads:\n" + "\n".join(lines) + "\n"


def _check_launch_arguments(steps: Any, timeout: Any, heartbeat: Any, hang_timeout: Any,
                            port: Any) -> None:
    """Refuse :func:`launch`'s numeric arguments that cannot be right, before anything starts."""
    for name, v in (("steps", steps),):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise LaunchError(f"launch: {name} should be a positive integer. Got {v!r}. Fix: "
                              f"{name}=2.")
    for name, v in (("timeout", timeout), ("heartbeat", heartbeat)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise LaunchError(f"launch: {name} should be a positive number of seconds. Got {v!r}.")
    if hang_timeout is not None and (isinstance(hang_timeout, bool) or
                                     not isinstance(hang_timeout, (int, float)) or
                                     not hang_timeout > 2 * heartbeat):
        raise LaunchError(f"launch: hang_timeout should be None or a number of seconds above "
                          f"twice the heartbeat ({2 * heartbeat:g} s). Got {hang_timeout!r}. Fix: "
                          "e.g. hang_timeout=120 for models that compile for minutes.")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool)
                             or not 0 < port < 65536):
        raise LaunchError(f"launch: port should be a TCP port number (1-65535) or None. Got "
                          f"{port!r}.")


def _worker_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """The workers' environment: this process's, then ``env``, with autoplan's folders first on
    ``PYTHONPATH`` and unbuffered output (a worker's last lines reach the report)."""
    wenv = dict(os.environ)
    wenv.update(env or {})
    path = worker_pythonpath()
    wenv["PYTHONPATH"] = os.pathsep.join(
        path + [p for p in wenv.get("PYTHONPATH", "").split(os.pathsep) if p and p not in path])
    wenv["PYTHONUNBUFFERED"] = "1"
    return wenv


def launch(plan: Any, workload: Any, num_processes: int | None = None,
           devices_per_process: int | None = None, steps: int = 2, timeout: float = 120.0,
           check: bool = True, *, env: Mapping[str, str] | None = None,
           platform: str | None = None, per_host: bool = False, python: str | None = None,
           seed: int = 0, compiler_options: Mapping[str, Any] | None = None,
           hang_timeout: float | None = None, heartbeat: float = 2.0, port: int | None = None,
           port_retries: int = 3, allow_nonfinite: bool = False) -> LaunchHandle:
    """Start workers that run ``plan`` together through ``jax.distributed`` on this machine.

    Args:
        plan: a :class:`~autoplan.Plan` or the path of a plan file.
        workload: a spec (a zoo name such as ``"gpt"``, ``"module:function"``, or a dict
            ``{"model": ..., **kwargs}``), or an :class:`autoplan.Workload` from the zoo or
            loaded from ``"module:function"`` (see :mod:`autoplan.tracing._loader`).
        num_processes: worker processes (None: chosen, see :mod:`autoplan.exec._layout`).
        devices_per_process: devices of each (None: chosen); the product must be the plan's
            device count.
        steps: training steps.
        timeout: seconds the whole launch may take (the preflight included); past it every
            worker is killed.
        check: each worker compares its shards with a single-device run computed locally.
        env: extra environment variables for the workers (and the device probe).
        platform: ``"cpu"`` (emulate the devices), ``"gpu"``, ``"cuda"``, ``"rocm"``, ``"tpu"``,
            or None: detect (emulated CPU devices only when no accelerator is attached).
        per_host: GPUs: one worker holding all the GPUs instead of one worker per GPU.
        python: the workers' Python executable (default this one).
        seed: PRNG seed of the workload's arrays (the same in every worker).
        compiler_options: XLA options for the workers' compilations.
        hang_timeout: seconds without progress from any worker that fail the launch (None:
            ``max(HANG_FLOOR, HANG_FACTOR x the slowest step seen)``, times the plan's device
            count while a worker checks against one device).
        heartbeat: seconds between the workers' heartbeats.
        port: the coordinator port to try first (None: a free one).
        port_retries: how many other ports to try when the coordinator port is taken.
        allow_nonfinite: accept a run whose loss or gradients hold NaN or infinity (said in
            ``result.nonfinite``); otherwise :meth:`LaunchHandle.wait` raises
            :class:`~autoplan.NonFiniteError`, which says whether one device computes the same.

    Returns:
        A :class:`LaunchHandle`; call ``.wait()`` for the :class:`LaunchResult`.

    Raises:
        PlanMismatchError: the plan was made for another workload, or ``num_processes x
            devices_per_process`` is not its device count (checked before any worker starts).
        LaunchError: bad arguments, a workload that cannot be sent to a worker, counts that do
            not fit the plan, more devices than attached (the message has the cluster commands),
            or a worker that cannot start.
        ModelError: the workload spec cannot be loaded (reported by the preflight).
    """
    _check_launch_arguments(steps, timeout, heartbeat, hang_timeout, port)
    from autoplan.plans._plan_check import (  # noqa: PLC0415
        PlatformWarning,
        WorkloadView,
        platform_note,
        refuse_contradictions,
    )

    t0 = time.monotonic()
    plan, plan_path = _plan_of(plan)
    refuse_contradictions(plan, "launch")  # before the probe: the plan alone
    if num_processes is not None and devices_per_process is not None:  # before any probe
        choose_layout(plan.num_devices, DeviceInfo("cpu", "cpu", 1, "cpu"), num_processes,
                      devices_per_process)
    spec = describe_workload(workload)
    fingerprint, view = (None, None) if isinstance(workload, (str, Mapping)) else \
        _fingerprint_here(workload)
    if fingerprint is not None:  # (a spec's step is checked by the probe)
        from autoplan.tracing._signature import workload_signature  # noqa: PLC0415

        workload_signature(workload)  # a step no executor can run: refused before any worker
    wenv = _worker_env(env)
    info: DeviceInfo | None = None
    if platform == "cpu":
        info = DeviceInfo("cpu", "cpu", 1, "cpu")
    if info is None or fingerprint is None:
        found, traced = preflight(spec if fingerprint is None else None, platform, env=wenv,
                                  python=python, timeout=timeout)
        info = info or found
        if traced is not None:
            fingerprint = traced["fingerprint"]
            view = WorkloadView.from_dict(traced["view"]) if traced.get("view") else None
    if fingerprint != plan.fingerprint:
        raise PlanMismatchError(
            f"launch: the plan was made for model {plan.model!r} (fingerprint {plan.fingerprint}) "
            f"but the workload {spec_arguments(spec)!r} traces to fingerprint {fingerprint}: its "
            "parameters, optimizer state or batch differ in paths, shapes or dtypes. No worker was "
            "started. Fix: launch the workload (with the --size/--batch/--set) the plan was made "
            f"for, or make a plan for this one: autoplan plan {spec_arguments(spec)} -o plan.json.")
    if view is not None:
        refuse_contradictions(plan, "launch", view)
    layout = choose_layout(plan.num_devices, info, num_processes, devices_per_process,
                           per_host=per_host, env=wenv,
                           cluster_hint=_cluster_hint(plan, plan_path, spec),
                           requested=platform is not None)
    note = platform_note(plan.cluster, layout.platform, plan.num_devices)
    if note is not None:
        warnings.warn(f"launch: {note}.", PlatformWarning, stacklevel=2)
    left = timeout - (time.monotonic() - t0)
    if left <= 0:
        raise LaunchError(
            f"launch: the timeout ({timeout:g} s) ran out in the preflight, before any worker "
            f"started: reading the devices and checking the workload against the plan took "
            f"{time.monotonic() - t0:.1f} s, leaving no time for the workers (the timeout covers "
            "the preflight: starting JAX and tracing the workload take seconds). Fix: raise "
            f"timeout= (--timeout), e.g. {max(300, 2 * math.ceil(timeout))}"
            + (" (the command line's default)." if timeout < 300 else "."))
    return LaunchHandle(plan.to_json(indent=None), spec, layout, wenv, steps=steps, seed=seed,
                        check=check, python=python, compiler_options=compiler_options,
                        timeout=left, hang_timeout=hang_timeout, heartbeat=heartbeat, port=port,
                        port_retries=port_retries, allow_nonfinite=bool(allow_nonfinite))
