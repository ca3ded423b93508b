"""The devices attached to this machine, found in a probe subprocess, and the launcher's preflight.

A process that has started JAX cannot look at other platforms (and one that has not should not
start it only to look: on a GPU it would take the memory the workers need), so the launcher asks
a short-lived subprocess, ``python -m autoplan.exec._probe``, started with the workers'
environment. It prints one JSON line: the platform of ``jax.local_devices()`` (``cpu`` when no
accelerator is attached), the runtime ``JAX_PLATFORMS`` names (``cuda``, ``rocm``, ``tpu``,
``cpu``), the number of local devices and their kind; given a workload spec it also loads the
workload abstractly and traces it, and prints the graph's fingerprint, so that a plan made for
another workload is refused before any worker starts. Errors come back as ``{"error": {"type",
"message"}}`` and are raised again in the launcher as the same :class:`~autoplan.AutoplanError`
subclass.

:func:`exit_with_launcher` is shared by the probe and the workers: a thread that reads the
launcher's pipe (the process's stdin) and ends the process when it closes, which the kernel does
when the launcher exits for any reason, SIGKILL included.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from autoplan import _errors
from autoplan._errors import AutoplanError, LaunchError

__all__ = ["DeviceInfo", "detect_devices", "preflight", "exit_with_launcher", "PLATFORMS",
           "LAUNCHER_GONE_STATUS"]

#: ``platform`` values the launcher takes -> what the probe sets ``JAX_PLATFORMS`` to (None: let
#: JAX choose, then require a GPU).
PLATFORMS: dict[str, str | None] = {"cpu": "cpu", "gpu": None, "cuda": "cuda", "rocm": "rocm",
                                    "tpu": "tpu"}
#: exit status of a process that ends because its launcher is gone
LAUNCHER_GONE_STATUS = 75
#: how the probe marks each of its phases on stderr (the time, ``time.time()``, then the phase),
#: so that a probe stopped at the timeout is reported by what it was doing
_PHASE = "autoplan-probe-phase:"


@dataclass(frozen=True)
class DeviceInfo:
    """What JAX finds on this machine.

    Attributes:
        platform: ``"cpu"`` (no accelerator), ``"gpu"`` or ``"tpu"``.
        runtime: what ``JAX_PLATFORMS`` names for it: ``"cpu"``, ``"cuda"``, ``"rocm"``, ``"tpu"``.
        count: local devices of that platform.
        kind: the first device's ``device_kind``.
    """

    platform: str
    runtime: str
    count: int
    kind: str

    @property
    def accelerator(self) -> bool:
        """An accelerator is attached (emulated CPU devices are used only when not)."""
        return self.platform != "cpu"

    def describe(self) -> str:
        if not self.accelerator:
            return "no accelerator attached (CPU)"
        return f"{self.count} {self.platform} device{'s' if self.count != 1 else ''} ({self.kind}, {self.runtime})"


def _check_platform(platform: str | None) -> None:
    if platform is not None and platform not in PLATFORMS:
        raise LaunchError(f"launch: platform should be one of {sorted(PLATFORMS)} or None (detect). "
                          f"Got {platform!r}. Fix: e.g. platform='gpu'.")


def _probe_env(env: Mapping[str, str], platform: str | None) -> dict[str, str]:
    out = dict(env)
    if platform:
        want = PLATFORMS[platform]
        if want:
            out["JAX_PLATFORMS"] = want
        else:  # "gpu": whichever GPU runtime JAX finds, whatever JAX_PLATFORMS said
            out.pop("JAX_PLATFORMS", None)
    out.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # look, do not take GPU memory
    out.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    return out


def preflight(workload: Mapping[str, Any] | None = None, platform: str | None = None, *,
              env: Mapping[str, str] | None = None, python: str | None = None,
              timeout: float = 300.0) -> tuple[DeviceInfo, dict[str, Any] | None]:
    """Run the probe subprocess: the attached devices, and the workload's trace when given.

    Args:
        workload: a JSON workload spec (see :mod:`autoplan.tracing._loader`), or None.
        platform: one of :data:`PLATFORMS` to look at that platform only; None: what JAX picks.
        env: the probe's environment (the workers' one; default ``os.environ``).
        python: the Python executable (default this one).
        timeout: seconds the probe may take.

    Returns:
        ``(DeviceInfo, {"fingerprint": ..., "model": ..., "view": ...} or None)``, the view a
        :meth:`autoplan.plans._plan_check.WorkloadView.to_dict`.

    Raises:
        AutoplanError: the subclass the probe reported (e.g. :class:`~autoplan.ModelError` for a
            workload that cannot be loaded); :class:`~autoplan.LaunchError` when the probe fails
            otherwise, runs out of time, or the platform asked for has no devices.
    """
    _check_platform(platform)
    cmd = [python or sys.executable, "-m", "autoplan.exec._probe", "--launcher-pipe"]
    if platform:
        cmd += ["--platform", platform]
    if workload is not None:
        cmd += ["--workload", json.dumps(dict(workload))]
    penv = _probe_env(os.environ if env is None else env, platform)
    # stdin stays open while the probe runs: it is the pipe the probe exits on when we die
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=penv, text=True, start_new_session=True)
    chunks: dict[str, list[str]] = {"out": [], "err": []}
    readers = [threading.Thread(target=lambda s=s, k=k: chunks[k].append(s.read()), daemon=True)
               for s, k in ((proc.stdout, "out"), (proc.stderr, "err"))]
    for t in readers:
        t.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        for t in readers:
            t.join(timeout=5.0)
        raise LaunchError(_probe_timeout("".join(chunks["err"]), timeout, workload)) from None
    except BaseException:  # an interrupt: the probe goes too
        _kill_group(proc)
        raise
    finally:
        for t in readers:
            t.join(timeout=5.0)
        if proc.stdin is not None:
            proc.stdin.close()
    out, err = "".join(chunks["out"]), "".join(chunks["err"])
    line = next((ln for ln in reversed(out.splitlines()) if ln.startswith("{")), None)
    if line is None:
        tail = "\n".join([ln for ln in err.strip().splitlines() if not ln.startswith(_PHASE)][-12:])
        raise LaunchError(f"launch: the device probe ({' '.join(cmd[:3])}) exited with status "
                          f"{proc.returncode} and no "
                          f"answer. Its last lines:\n{tail}\nFix: check that JAX starts in this "
                          "environment ('python -c \"import jax; print(jax.devices())\"').")
    rec = json.loads(line)
    if "error" in rec:
        e = rec["error"]
        cls = getattr(_errors, str(e.get("type")), None)
        if isinstance(cls, type) and issubclass(cls, AutoplanError):
            raise cls(e.get("message", ""))
        # (the probe's traceback is not repeated: the message names the exception)
        raise LaunchError(f"launch: the device probe failed: {e.get('type')}: {e.get('message')}. "
                          "Fix: check that 'python -c \"import jax; print(jax.devices())\"' works "
                          "in this environment, with the same JAX_PLATFORMS.")
    info = DeviceInfo(**rec["devices"])
    _DETECTED[_cache_key(penv, python)] = info
    return info, rec.get("workload")


_DETECTED: dict[tuple[str, ...], DeviceInfo] = {}


def _probe_timeout(err: str, timeout: float, workload: Mapping[str, Any] | None) -> str:
    """The message of a probe stopped at the timeout: what it was doing (its last phase mark),
    a hang told apart from a timeout too short for the preflight."""
    marks = [ln[len(_PHASE):].strip().split(" ", 1) for ln in err.splitlines()
             if ln.startswith(_PHASE)]
    since, phase = ((float(marks[-1][0]), marks[-1][1]) if marks
                    else (None, "starting Python and importing autoplan and JAX"))
    spent = phase + ("" if since is None else f" for the last {max(0.0, time.time() - since):.1f} s")
    in_workload = phase.startswith(("loading the workload", "tracing the workload"))
    if timeout < 60:
        hang = (" If it still stops there with a longer timeout, the workload's function hangs."
                if in_workload else "")
        return (f"launch: the timeout ({timeout:g} s) ran out in the preflight, before any worker "
                f"started: the device probe was {spent} (the timeout covers the preflight: "
                f"starting JAX and tracing the workload take seconds).{hang} Fix: raise timeout= "
                "(--timeout), e.g. 300 (the command line's default).")
    if in_workload:
        what = json.dumps(dict(workload or {}))
        return (f"launch: the preflight hung: the device probe was {spent} of the timeout "
                f"({timeout:g} s) when it was stopped. The workload {what} does not return: its "
                "function (or the step's tracing) may wait forever (on input, a lock, a network "
                "resource), or need more time than the timeout. Fix: check that the workload "
                "function returns when called alone, or raise timeout= (--timeout).")
    return (f"launch: the device probe did not answer in {timeout:g} s: it was {spent}. Fix: check "
            "that 'python -c \"import jax; print(jax.devices())\"' works in this environment.")


def _cache_key(env: Mapping[str, str], python: str | None) -> tuple[str, ...]:
    names = ("JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
             "TPU_VISIBLE_CHIPS", "JAX_NUM_CPU_DEVICES")
    return (python or sys.executable, *(env.get(n, "\0") for n in names))


def detect_devices(platform: str | None = None, *, env: Mapping[str, str] | None = None,
                   python: str | None = None, timeout: float = 300.0) -> DeviceInfo:
    """The devices attached to this machine (asked once per environment, then remembered).

    Args:
        platform: look at this platform only (one of :data:`PLATFORMS`); None: what JAX picks.
        env: the environment to look in (default ``os.environ``).
        python: the Python executable (default this one).
        timeout: seconds the probe may take.

    Raises:
        LaunchError: the probe failed or the platform has no devices.
    """
    _check_platform(platform)
    penv = _probe_env(os.environ if env is None else env, platform)
    hit = _DETECTED.get(_cache_key(penv, python))
    if hit is not None:
        return hit
    return preflight(None, platform, env=env, python=python, timeout=timeout)[0]


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


# ---- shared by the probe and the workers ----------------------------------------------------
def exit_with_launcher(label: str, fd: int = 0) -> threading.Thread:
    """End this process (and its process group, when it leads one) when the launcher's pipe on
    stdin closes: the launcher exited, however it died.

    Args:
        label: how the process names itself in the one line it writes to stderr.
        fd: the pipe's file descriptor (stdin); read raw, so that no buffered reader's lock is
            held at interpreter exit. Whatever arrives on it is discarded.

    Returns:
        The daemon thread watching the pipe.
    """

    def watch() -> None:
        try:
            while os.read(fd, 4096):
                pass
        except OSError:
            pass
        try:
            sys.stderr.write(f"{label}: the launcher is gone (its pipe closed); exiting\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        if os.getpgrp() == os.getpid():  # a launched worker leads its own group: take it all
            try:
                os.killpg(os.getpid(), signal.SIGKILL)
            except OSError:
                pass
        os._exit(LAUNCHER_GONE_STATUS)

    t = threading.Thread(target=watch, name="autoplan-launcher-pipe", daemon=True)
    t.start()
    return t


def _events_out() -> TextIO:
    """The real stdout for the answer; fd 1 then points at stderr, so that nothing else a
    workload or JAX prints can mix with it."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def main(argv: list[str] | None = None) -> int:
    """The probe: print ``{"devices": {...}, "workload": {...}}`` or ``{"error": {...}}``."""
    p = argparse.ArgumentParser(prog="python -m autoplan.exec._probe",
                                description="Report the attached JAX devices (and trace a workload).")
    p.add_argument("--platform", default=None, choices=sorted(PLATFORMS))
    p.add_argument("--workload", default=None, help="JSON workload spec to trace")
    p.add_argument("--launcher-pipe", action="store_true",
                   help="stdin is the launcher's pipe: exit when it closes")
    args = p.parse_args(argv)
    out = _events_out()
    if args.launcher_pipe:
        exit_with_launcher("autoplan device probe")
    def phase(what: str) -> None:
        sys.stderr.write(f"{_PHASE} {time.time():.2f} {what}\n")
        sys.stderr.flush()

    try:
        phase("importing JAX")
        import jax  # noqa: PLC0415

        phase("looking for devices")
        try:
            devices = jax.local_devices()
        except Exception as err:  # noqa: BLE001 - RuntimeError, or an AssertionError of a plugin
            want = args.platform or "any platform"
            why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise LaunchError(f"launch: JAX found no devices for {want}: {why}. Fix: check the "
                              "driver and the jax plugin for it (e.g. pip install 'jax[cuda12]' "
                              "for --platform cuda), or pass --platform cpu (platform='cpu') to "
                              "emulate devices on the CPU.") from None
        d = devices[0]
        platform = d.platform
        runtime = platform
        if platform == "gpu":
            version = str(getattr(d.client, "platform_version", "")).lower()
            runtime = "rocm" if ("rocm" in version or "hip" in version) else "cuda"
        if args.platform in ("gpu", "cuda", "rocm") and platform != "gpu":
            raise LaunchError(f"launch: platform {args.platform!r} was asked for but JAX finds "
                              f"only {platform} devices here. Fix: install the jax plugin for the "
                              "GPU (e.g. pip install 'jax[cuda12]'), or pass --platform cpu (platform='cpu').")
        rec: dict[str, Any] = {"devices": asdict(DeviceInfo(platform, runtime, len(devices),
                                                            str(getattr(d, "device_kind", platform))))}
        if args.workload is not None:
            from autoplan.tracing._loader import load_workload  # noqa: PLC0415
            from autoplan.tracing._trace import trace  # noqa: PLC0415

            phase("loading the workload (calling its function)")
            wl = load_workload(json.loads(args.workload), abstract=True)
            phase("tracing the workload's step")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                graph = trace(wl)
            from autoplan.plans._plan_check import WorkloadView  # noqa: PLC0415
            from autoplan.tracing._signature import workload_signature  # noqa: PLC0415

            workload_signature(wl)  # a step no executor can run: refused before any worker
            rec["workload"] = {"fingerprint": graph.fingerprint, "model": graph.name,
                               "view": WorkloadView.of(graph, wl.config).to_dict()}
    except AutoplanError as err:
        rec = {"error": {"type": type(err).__name__, "message": str(err)}}
    except Exception as err:  # noqa: BLE001 - reported to the launcher, which raises it
        rec = {"error": {"type": type(err).__name__, "message": str(err),
                         "traceback": traceback.format_exc()}}
    out.write(json.dumps(rec) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
