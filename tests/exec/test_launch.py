"""Multi-process launches through jax.distributed on the devices attached (here no accelerator, so
emulated CPU devices): a 2 x 4 device run of tiny GPT that matches single-device execution after
a taken coordinator port is retried; crashed and hung workers that take the launch down, with
their last lines, found long before the timeout; every listening socket on loopback; plans made
for another workload refused before any worker starts; workloads that build different data in
each process stopped."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
from exec_cases import FAST, plan, workload
from exec_plans import data_parallel_plan
from launch_cases import address_text, is_loopback, launch_folders, listening_addresses, wait_gone

from autoplan import LaunchError, PlanMismatchError, models
from autoplan.exec import _launch, describe_workload, launch


def test_proc_addresses_are_decoded():
    assert address_text("0100007F:1F90") == "127.0.0.1:8080"
    assert address_text("0000000000000000FFFF00000100007F:9C40") == "127.0.0.1:40000"
    assert address_text("00000000000000000000000001000000:0016") == "::1:22"
    assert address_text("00000000000000000000000000000000:0016") == ":::22"
    assert not is_loopback(":::22") and is_loopback("::1:22") and not is_loopback("0.0.0.0:80")


def test_two_processes_of_four_devices_run_tiny_gpt_and_a_taken_port_is_retried(tmp_path,
                                                                                 monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this launcher's and its workers'
    with socket.socket() as taken:  # another program holds the port the launch tries first
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = plan("gpt", "tp")  # a (2, 4) mesh: "x" spans the two processes
        handle = launch(p, workload("gpt"), steps=2, timeout=200, compiler_options=FAST, port=port,
                        env={"TMPDIR": str(tmp_path)})
        # no accelerator attached: the devices are emulated, 2 processes of 4 by default
        assert (handle.layout.platform, handle.num_processes, handle.layout.devices_per_process) == \
            ("cpu", 2, 4)
        seen = []
        while not handle.done:
            seen += handle.poll()
            time.sleep(0.2)
        result = handle.wait(timeout=30)
    seen += handle.poll()
    assert result.matched is True
    assert result.ports == handle.ports and handle.ports[0] == port and len(handle.ports) == 2
    retry = [e for e in result.events if e["event"] == "retry"]
    assert len(retry) == 1 and retry[0]["reason"] == f"coordinator port {port} was taken"
    failed_try = [e for e in result.events if e.get("attempt") == 0 and e["event"] == "error"]
    assert failed_try and failed_try[0]["type"] == "CoordinatorPortTaken"
    assert set(result.losses) == {0, 1} and all(len(v) == 2 for v in result.losses.values())
    assert result.losses[0] == pytest.approx(result.losses[1], rel=1e-6)
    assert result.loss[1] < result.loss[0]
    last = [e for e in result.events if e.get("attempt") == 1]
    steps = [e for e in last if e["event"] == "step"]
    assert {(e["process"], e["step"]) for e in steps} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    starts = [e for e in last if e["event"] == "start"]
    assert all(e["devices"] == 8 and e["local_devices"] == 4 for e in starts)
    assert {e["coordinator_bind"] for e in starts} == {f"127.0.0.1:{handle.ports[1]}", None}
    loaded = [e for e in last if e["event"] == "loaded"]
    assert len(loaded) == 2 and loaded[0]["digest"] == loaded[1]["digest"]
    assert all(e["devices"] == 8 for e in result.done.values())
    beats = handle.heartbeats()
    assert set(beats) == {0, 1} and all("phase" in b and "progress" in b for b in beats.values())
    assert not any(e["event"] == "heartbeat" for e in seen)  # heartbeats are kept apart
    assert wait_gone(handle.pids, 5)
    assert launch_folders(tmp_path) == set()  # nothing written to disk


def test_a_taken_port_with_no_retries_left_fails_the_launch_with_the_workers_last_lines():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        handle = launch(plan("mlp", "dp"), workload("mlp"), steps=1, timeout=120, port=port,
                        port_retries=0, platform="cpu")
        with pytest.raises(LaunchError) as info:
            handle.wait()
    msg = str(info.value)
    assert f"reported CoordinatorPortTaken: coordinator port {port} on 127.0.0.1 is taken" in msg
    assert "[worker 0]" in msg and "[worker 1]" in msg
    assert handle.ports == [port]
    assert wait_gone(handle.pids, 5)


def test_a_crashed_worker_fails_the_launch_at_once_with_every_workers_last_lines():
    t0 = time.monotonic()
    handle = launch(plan("mlp", "dp"), {"model": "mlp", "size": "tiny"}, 2, 4, steps=3,
                    timeout=120, env={"AUTOPLAN_TEST_CRASH_AT_STEP": "1"}, compiler_options=FAST)
    with pytest.raises(LaunchError) as info:
        handle.wait()
    assert time.monotonic() - t0 < 60  # noticed at once, not at the timeout
    msg = str(info.value)
    assert "[worker 1]" in msg and "[worker 0]" in msg  # every worker's last stderr lines
    assert "worker 1 exited with status 17" in msg and "injected crash before step 1" in msg
    assert handle.done and all(rc is not None for rc in handle.returncodes())
    assert wait_gone(handle.pids, 5)
    with pytest.raises(LaunchError):  # the failure sticks
        handle.wait()


def test_a_hung_worker_fails_the_launch_within_the_limit_and_every_socket_is_on_loopback():
    t0 = time.monotonic()
    handle = launch(plan("mlp", "dp"), {"model": "mlp", "size": "tiny"}, steps=3, timeout=240,
                    hang_timeout=8, env={"AUTOPLAN_TEST_HANG_AT_STEP": "1"},
                    compiler_options=FAST)
    # while the job runs (worker 1 hangs after step 0), look at what the workers listen on
    while len([e for e in handle.events if e["event"] == "step"]) < 2 and not handle.done:
        time.sleep(0.2)
    addresses = {pid: listening_addresses(pid) for pid in handle.pids}
    with pytest.raises(LaunchError) as info:
        handle.wait()
    elapsed = time.monotonic() - t0
    # the coordination service (process 0) and the CPU collectives (both) listen, on loopback only
    assert len(addresses[handle.pids[0]]) >= 2 and len(addresses[handle.pids[1]]) >= 1, addresses
    assert all(is_loopback(a) for addrs in addresses.values() for a in addrs), addresses
    msg = str(info.value)
    assert elapsed < 90 < 240  # within the hang limit (plus start-up), far from the timeout
    assert "no worker made progress for 8 s (the limit: hang_timeout=8 s)" in msg
    assert "worker 1 in phase 'running' after step 0" in msg and "_maybe_fail" in msg
    assert "injected hang before step 1" in msg
    assert wait_gone(handle.pids, 5)


def test_a_plan_made_for_another_workload_is_refused_before_any_worker_starts(monkeypatch):
    started = []
    monkeypatch.setattr(_launch, "LaunchHandle", lambda *a, **k: started.append(a))
    p = plan("mlp", "dp")
    # a workload object: traced here; a spec: traced by the preflight probe
    for other in (models.get("mlp", "tiny", hidden=32), {"model": "gpt", "size": "tiny"},
                  {"model": "mlp", "size": "tiny", "layers": 2}):
        with pytest.raises(PlanMismatchError, match="No worker was started") as info:
            launch(p, other)
        assert f"fingerprint {p.fingerprint}" in str(info.value)
    assert "--set layers=2" in str(info.value)
    assert started == []


def test_bad_launch_arguments_are_refused_before_anything_starts():
    p = plan("mlp", "dp")
    with pytest.raises(PlanMismatchError, match="2 x 2 = 4"):
        launch(p, {"model": "mlp"}, num_processes=2, devices_per_process=2)
    for kwargs, message in [({"steps": 0}, "steps should be a positive integer"),
                            ({"timeout": -1}, "timeout should be a positive number"),
                            ({"hang_timeout": 3}, "above twice the heartbeat"),
                            ({"port": 70000}, "TCP port number"),
                            ({"platform": "fpga"}, "platform should be one of")]:
        with pytest.raises(LaunchError, match=message):
            launch(p, {"model": "mlp"}, **kwargs)
    import types

    built_here = types.SimpleNamespace(fn=lambda w, x: (x @ w).sum(), args=(1.0, 2.0))
    with pytest.raises(LaunchError, match="cannot be sent to worker processes"):
        launch(p, built_here)


def test_workloads_are_described_by_their_spec():
    assert describe_workload(models.get("gpt", "tiny")) == {"model": "gpt", "size": "tiny"}
    spec = describe_workload(models.get("gpt", "tiny", layers=3, heads=2))
    assert spec == {"model": "gpt", "size": "tiny", "layers": 3, "heads": 2}
    assert describe_workload("mypkg.train:workload") == {"model": "mypkg.train:workload"}
    with pytest.raises(LaunchError, match="cannot be sent"):
        describe_workload(lambda x: x)


def test_workers_that_build_different_data_stop_the_launch(tmp_path, monkeypatch):
    (tmp_path / "unseeded.py").write_text(textwrap.dedent("""
        import types
        import numpy as np
        import jax.numpy as jnp

        def workload():
            rng = np.random.default_rng()   # no seed: every process draws other numbers
            w = jnp.asarray(rng.normal(size=(8, 4)), jnp.float32)
            x = jnp.asarray(rng.normal(size=(16, 8)), jnp.float32)
            return types.SimpleNamespace(fn=lambda w, x: jnp.tanh(x @ w).sum(), args=(w, x))
        """))
    monkeypatch.chdir(tmp_path)  # the module is found through the current directory
    monkeypatch.setattr(sys, "path", list(sys.path))
    from autoplan.tracing._loader import load_workload

    wl = load_workload("unseeded:workload")
    with pytest.raises(LaunchError) as info:
        launch(data_parallel_plan(wl), "unseeded:workload", steps=1, timeout=120,
               compiler_options=FAST).wait()
    assert "the workers built different arrays" in str(info.value)
    assert "seed every random generator" in str(info.value)
    sys.modules.pop("unseeded", None)


def test_workers_are_stopped_when_the_launching_interpreter_exits(tmp_path):
    plan("mlp", "dp").to_json(str(tmp_path / "plan.json"))
    script = (
        "import sys\n"
        "from autoplan.exec import launch\n"
        f"h = launch({str(tmp_path / 'plan.json')!r}, {{'model': 'mlp'}}, platform='cpu',\n"
        "           env={'AUTOPLAN_TEST_HANG_AT_STEP': '0'}, hang_timeout=600)\n"
        "print(*h.pids, flush=True)\n"
        "sys.exit(0)  # no wait(): the atexit hook must take the workers down\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr
    pids = [int(x) for x in out.stdout.split()]
    assert len(pids) == 2
    assert wait_gone(pids, 10)
