"""Files, processes and signals under faults: no output replaces an input, nothing waits on a
pipe or a device, the plan cache runs no planted code, search workers die with their parent, and
a signal at any moment of start-up ends the command with its status and one line."""

from __future__ import annotations

import os
import pickle
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path

import pytest

import autoplan
from autoplan import _cache, cli
from autoplan._errors import ClusterError, OutputError, PlanFileError
from autoplan._io import atomic_write_bytes, check_output_path, read_input_bytes
from autoplan.models import get
from autoplan.search import _parallel
from autoplan.tracing._loader import shadowed_stdlib, source_files

ROOT = Path(__file__).resolve().parents[1]
READY = "autoplan-test: ready"
# the command line, announcing on stderr when its ``main`` is about to run
CLI_READY = (f"import sys, autoplan.cli; sys.stderr.write({READY + chr(10)!r}); sys.stderr.flush(); "
             "sys.exit(autoplan.cli.main(sys.argv[1:]))")


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["JAX_PLATFORMS"] = "cpu"
    env.update(extra)
    return env


def _cli(argv, capsys) -> tuple[int, str]:
    status = cli.main(argv)
    return status, capsys.readouterr().err


@pytest.fixture()
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---- no output replaces an input ---------------------------------------------------------------
WORKLOAD = '''from autoplan.models import get


def workload(**kw):
    return get("mlp", "tiny", **kw)
'''


@pytest.mark.parametrize("argv, victim, words", [
    (["plan", "mlp", "--cluster", "c.json", "-o", "c.json"], "c.json", "the cluster file"),
    (["plan", "mlp", "--cluster", "c.json:2", "--report", "c.json"], "c.json", "the cluster file"),
    (["plan", "mlp", "--cluster", "c.json", "-o", "link.json"], "c.json", "the cluster file"),
    (["plan", "wls:workload", "-o", "wls.py"], "wls.py", "a source file of the workload"),
    (["plan", "pkg.train:workload", "-o", "pkg/__init__.py"], "pkg/__init__.py",
     "a source file of the workload"),
    (["plan", "pkg.train:workload", "--report", "pkg/notes.txt"], "pkg/notes.txt",
     "a source file of the workload"),
    (["report", "wls:workload", "-o", "wls.py"], "wls.py", "a source file of the workload"),
    (["report", "p.json", "-o", "hard.json"], "p.json", "the plan file"),
    (["plan", "mlp", "-o", "x.json", "--report", "x.json"], "x.json", "the same file as -o"),
    (["plan", "mlp", "-o", "x.json", "--report", "./sub/../x.json"], "x.json", "the same file as -o"),
])
def test_an_output_never_replaces_an_input(work, capsys, argv, victim, words):
    autoplan.Cluster.preset("cpu", 1, devices_per_node=8).to_json("c.json")
    os.symlink("c.json", "link.json")
    (work / "wls.py").write_text(WORKLOAD)
    (work / "pkg").mkdir()
    (work / "sub").mkdir()
    for name in ("__init__.py", "notes.txt"):
        (work / "pkg" / name).write_text("# the user's own\n")
    (work / "pkg" / "train.py").write_text(WORKLOAD)
    (work / "p.json").write_text("{}")
    os.link("p.json", "hard.json")
    (work / "x.json").write_text("the user's own\n")
    before = (work / victim).read_bytes()
    status, err = _cli(argv, capsys)
    assert status == 2 and "autoplan: error:" in err and words in err and "Fix:" in err, err
    assert (work / victim).read_bytes() == before


def test_an_empty_output_name_is_refused(work, capsys):
    for argv in (["plan", "mlp", "-o", ""], ["plan", "mlp", "--report", ""], ["profile", "-o", ""]):
        status, err = _cli(argv, capsys)
        assert status == 2 and "non-empty file path" in err, (argv, err)


def test_a_name_too_long_is_refused_before_the_search_and_a_long_legal_one_is_written(work, capsys,
                                                                                     monkeypatch):
    def refuse(args):
        raise AssertionError("searched although -o cannot be written")

    monkeypatch.setattr(cli, "_search", refuse)
    status, err = _cli(["plan", "mlp", "-o", "a" * 256], capsys)
    assert status == 2 and "256 bytes long" in err and "shorter" in err
    # a legal 250-byte name: the temporary file beside it must fit the name limit too
    atomic_write_bytes("b" * 250, b"plan")
    assert (work / ("b" * 250)).read_bytes() == b"plan" and len(os.listdir(work)) == 1


def test_workload_source_files_are_found_without_importing(work):
    (work / "pkg").mkdir()
    (work / "pkg" / "__init__.py").write_text("raise SystemExit('imported!')\n")
    (work / "pkg" / "train.py").write_text("raise SystemExit('imported!')\n")
    (work / "pkg" / "data.csv").write_text("1,2\n")
    found = {os.path.relpath(p, work) for p in source_files("pkg.train:workload")}
    assert found == {"pkg/__init__.py", "pkg/train.py", "pkg/data.csv"}
    assert source_files("gpt") == [] and source_files("nosuch.mod:f") == []


# ---- nothing waits on what is not a regular file ------------------------------------------------
def _run(argv, cwd, timeout=60, **env):
    return subprocess.run([sys.executable, "-m", "autoplan.cli", *argv], cwd=cwd, env=_env(**env),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_pipes_and_devices_are_refused_without_waiting(work):
    os.mkfifo("fifo")
    for argv, words in ((["show", "fifo"], "named pipe"), (["show", "/dev/zero"], "character device"),
                        (["plan", "mlp", "-o", "fifo"], "named pipe"),
                        (["plan", "mlp", "--report", "/dev/zero"], "character device"),
                        (["plan", "mlp", "--cluster", "fifo"], "named pipe"),
                        (["report", "fifo", "-o", "r.html"], "named pipe")):
        res = _run(argv, work, timeout=60)  # (a regression waits: the timeout fails the test)
        assert res.returncode == 2 and words in res.stderr and "Traceback" not in res.stderr, \
            (argv, res.stderr)


def test_inputs_are_read_only_when_regular_and_small(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 2000)
    with pytest.raises(OSError, match="more than the 1,000"):
        read_input_bytes(tmp_path / "big", limit=1000)
    assert read_input_bytes(tmp_path / "big", limit=2000) == b"x" * 2000
    with pytest.raises(PlanFileError, match="character device"):
        autoplan.Plan.from_json("/dev/zero")
    with pytest.raises(ClusterError, match="character device"):
        autoplan.Cluster.from_json("/dev/zero")
    with pytest.raises(OutputError, match="character device"):
        check_output_path("/dev/zero")
    with pytest.raises(OutputError, match="character device"):
        atomic_write_bytes("/dev/zero", b"x")
    assert check_output_path(os.devnull) == os.devnull  # the one device an output may be


def test_a_preset_wins_over_a_file_of_the_same_name(work):
    (work / "cpu:8").write_text("{}")
    with pytest.warns(UserWarning, match="the preset is used"):
        assert autoplan.Cluster.parse("cpu:8").num_devices == 8
    with pytest.raises(ClusterError, match="malformed cluster"):  # './cpu:8' reads the file
        autoplan.Cluster.parse("./cpu:8")


# ---- the plan cache is private and runs no planted code ----------------------------------------
def _search(graph):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return autoplan.search(graph, "cpu:8", pipeline=False, workers=1)


@pytest.fixture(scope="module")
def graph():
    return autoplan.trace(get("mlp", "tiny"))


def _entry() -> Path:
    (path,) = (_cache.cache_dir() / "search").glob("*.entry")
    return path


def test_the_cache_is_private_whatever_the_umask(graph):
    old = os.umask(0)
    try:
        assert _search(graph).stats["cache"] == "stored"
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (
        _cache.cache_dir() / "search", _cache.cache_dir() / "search" / "key", _entry())}
    assert set(modes.values()) == {0o700, 0o600}, modes
    assert modes["key"] == 0o600 and modes[_entry().name] == 0o600
    # a cache folder left open to others is narrowed
    os.chmod(_cache.cache_dir() / "search", 0o777)
    assert _search(graph).stats["cache"] == "hit"
    assert stat.S_IMODE((_cache.cache_dir() / "search").stat().st_mode) == 0o700


class _Planted:
    def __reduce__(self):
        return (os.mkdir, (os.path.join(tempfile.gettempdir(), f"autoplan-planted-{os.getpid()}"),))


def test_a_planted_entry_runs_no_code(graph, tmp_path):
    import hashlib

    _search(graph)
    path = _entry()
    marker = Path(tempfile.gettempdir()) / f"autoplan-planted-{os.getpid()}"
    payload = pickle.dumps({"key": path.stem, "plans": [_Planted()], "best": 0, "stats": {}})
    for digest in (hashlib.sha256(payload).hexdigest(), _cache._sign(b"\0" * 32, payload)):
        path.write_bytes(f"autoplan-search-cache {_cache.FORMAT} {digest}\n".encode() + payload)
        assert _search(graph).stats["cache"] == "stored"  # a miss, searched and stored again
        assert not marker.exists()


@pytest.mark.parametrize("kind", ["fifo", "symlink to a device", "writable by others", "folder"])
def test_an_entry_that_is_not_a_private_regular_file_is_a_miss_and_removed(graph, kind):
    first = _search(graph)
    path = _entry()
    if kind == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif kind == "symlink to a device":
        path.unlink()
        path.symlink_to("/dev/zero")
    elif kind == "writable by others":
        os.chmod(path, 0o666)
    else:
        path.unlink()
        path.mkdir()
    signal.alarm(20)  # (a regression waits on the pipe: the alarm ends the test)
    try:
        again = _search(graph)
    finally:
        signal.alarm(0)
    if kind == "folder":  # a folder is never removed, and no entry can be stored in its place
        assert again.stats["cache"] == "not stored" and path.is_dir()
    else:
        assert again.stats["cache"] == "stored" and stat.S_ISREG(path.lstat().st_mode)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert _search(graph).stats["cache"] == "hit"
    assert again.best.describe() == first.best.describe()


def test_a_folder_the_user_named_is_left_as_it_is_and_the_default_one_is_narrowed(
        graph, tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # (a team's folder, open on purpose)
    monkeypatch.setenv("AUTOPLAN_CACHE_DIR", str(shared))
    assert _search(graph).stats["cache"] == "stored"
    assert stat.S_IMODE(shared.stat().st_mode) == 0o777
    assert stat.S_IMODE((shared / "search").stat().st_mode) == 0o700
    monkeypatch.delenv("AUTOPLAN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "autoplan").mkdir(parents=True)
    os.chmod(tmp_path / "xdg" / "autoplan", 0o777)
    assert _search(graph).stats["cache"] == "stored"
    assert stat.S_IMODE((tmp_path / "xdg" / "autoplan").stat().st_mode) == 0o700


def test_a_cache_folder_of_another_user_is_not_used(graph, monkeypatch):
    _search(graph)
    entry = _entry()
    with monkeypatch.context() as m:
        m.setattr(os, "geteuid", lambda: os.getuid() + 12345)  # (as another user sees it)
        assert _cache.load(entry.stem) is None and entry.exists()  # neither read nor removed
        assert _search(graph).stats["cache"] == "not stored"
    assert _search(graph).stats["cache"] == "hit"


def test_a_key_others_can_read_is_replaced(graph):
    _search(graph)
    key = _cache.cache_dir() / "search" / "key"
    old = key.read_bytes()
    os.chmod(key, 0o644)
    assert _search(graph).stats["cache"] == "stored"  # the entry was signed with the old key
    assert key.read_bytes() != old and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert _search(graph).stats["cache"] == "hit"


# ---- processes: workers die with the parent; where they cannot work they are not started ------
def _marked(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if f"AUTOPLAN_TEST_MARK={marker}".encode() not in f.read():
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(entry))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_search_workers_and_their_resource_tracker_die_with_a_killed_parent(tmp_path):
    marker = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-m", "autoplan.cli", "plan", "gpt", "--size", "1.3B",
                             "--workers", "2", "--no-cache"], cwd=tmp_path,
                            env=_env(AUTOPLAN_TEST_MARK=marker), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        end = time.monotonic() + 60
        while len(_marked(marker)) < 3 and time.monotonic() < end:  # it, a worker, the tracker
            time.sleep(0.1)
        assert len(_marked(marker)) >= 3 and proc.poll() is None
        proc.kill()
        proc.wait()
        end = time.monotonic() + 15
        while _marked(marker) and time.monotonic() < end:
            time.sleep(0.1)
        assert _marked(marker) == []
    finally:
        for pid in _marked(marker):
            os.kill(pid, signal.SIGKILL)


def test_a_script_on_standard_input_searches_in_its_own_process(monkeypatch):
    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "__file__", "<stdin>", raising=False)
    monkeypatch.setattr(main, "__spec__", None, raising=False)
    monkeypatch.setattr(_parallel, "_SAID", set())
    assert "standard input" in _parallel.cannot_spawn()
    tasks = [_parallel.Task(os.getpid, None, label=str(k)) for k in range(3)]
    with pytest.warns(_parallel.ParallelWarning, match="no worker processes were started"):
        outs = _parallel.run_tasks(tasks, workers=3)
    assert [o.result() for o in outs] == [os.getpid()] * 3


def test_a_file_shadowing_the_standard_library_is_named(tmp_path, monkeypatch):
    (tmp_path / "queue.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert (("queue", str(tmp_path / "queue.py")) in shadowed_stdlib())
    assert "queue.py" in _parallel.cannot_spawn() and "standard library" in _parallel.cannot_spawn()
    # the command line run from that folder: Python itself imports it; the error names it
    res = _run(["plan", "mlp"], tmp_path, timeout=120)
    assert res.returncode == 2 and "queue.py" in res.stderr and "shadows" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_a_users_queue_py_beside_their_workload_does_not_break_a_search(tmp_path):
    """``autoplan plan wls:workload`` puts the folder on ``sys.path`` to import ``wls``, and then
    behind the standard library: the search imports ``queue`` later (networkx does), and its
    worker processes start from this path."""
    (tmp_path / "queue.py").write_text("# the user's own queue\n")
    (tmp_path / "wls.py").write_text(WORKLOAD)
    res = _run(["plan", "wls:workload", "--pipeline", "no", "--workers", "2", "--no-cache",
                "-o", "p.json"], tmp_path, timeout=180, PYTHONSAFEPATH="1")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "p.json").exists() and "Traceback" not in res.stderr


def test_workers_are_capped_at_the_cpus_with_a_note(capsys, monkeypatch):
    monkeypatch.setattr(_parallel, "cpu_count", lambda: 2)
    status, err = _cli(["plan", "mlp", "--pipeline", "no", "--workers", "64"], capsys)
    assert status == 0 and "--workers 64 is more than the 2 CPUs" in err
    assert _parallel.resolve_workers(64, 10) == 2


# ---- signals at every moment of start-up -------------------------------------------------------
def _signalled_at(delay: float, sig: int, folder: Path) -> tuple[int, str]:
    proc = subprocess.Popen([sys.executable, "-c", CLI_READY, "plan", "gpt", "--size", "1.3B",
                             "-o", "p.json"], cwd=folder, env=_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert proc.stderr.readline().decode().strip() == READY
        time.sleep(delay)
        proc.send_signal(sig)
        return proc.returncode if proc.wait(timeout=120) is None else proc.returncode, \
            proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_signal_at_any_moment_of_start_up_is_one_line_and_its_status(tmp_path):
    """20 moments over the first 4 s after the command's main starts (0.1 s, 0.3 s, ... 3.9 s;
    four commands at a time; a signal before ``main`` runs is Python's): reading arguments, importing JAX (where a signal used to unwind through jaxlib's
    start-up and abort the process), tracing, searching."""
    from concurrent.futures import ThreadPoolExecutor

    moments = [(round(0.1 + 0.2 * k, 1), signal.SIGINT if k % 2 == 0 else signal.SIGTERM) for k in range(20)]
    folders = [tmp_path / str(k) for k in range(20)]
    for f in folders:
        f.mkdir()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda k: _signalled_at(*moments[k], folders[k]), range(20)))
    for (delay, sig), (status, err), folder in zip(moments, results, folders):
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert status == 128 + sig, (delay, sig.name, status, err[-2000:])
        assert len(lines) == 1 and lines[0].startswith(f"autoplan: interrupted by {sig.name}"), \
            (delay, lines[-5:])
        assert not (folder / "p.json").exists()


# ---- the fault table's new verdict: exposure ---------------------------------------------------
@pytest.fixture(scope="module")
def faults():
    import importlib.util

    spec = importlib.util.spec_from_file_location("autoplan_benchmark_faults_files",
                                                  ROOT / "benchmarks" / "faults.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("code, verdict", [
    ("import os; os.mkdir('cache'); os.chmod('cache', 0o777)", "exposure"),
    ("import os; os.mkdir('cache', 0o700); open('cache/key', 'w'); os.chmod('cache/key', 0o644)",
     "exposure"),
    ("import os; os.mkdir('PLANTED')", "exposure"),
    ("import os; os.mkdir('cache', 0o700); os.close(os.open('cache/key', os.O_CREAT, 0o600))", "ok"),
])
def test_a_cache_open_to_others_or_planted_code_is_an_exposure(faults, tmp_path, code, verdict):
    case = faults.Case("synthetic", "test", "a synthetic fault", code=code, expect="ok",
                       private=("cache", "cache/key"), planted=("PLANTED",), timeout=30)
    res = faults.run_case(case, {}, tmp_path)
    assert res.verdicts == [verdict], (res.verdicts, res.seen)


def test_the_new_cases_are_in_the_table(faults):
    cases = faults.file_and_process_cases()
    names = [c.name for c in cases]
    assert len(cases) >= 30 and len(set(names)) == len(names)
    assert set(names) <= {c.name for c in faults.cases()}
    assert {c.group for c in cases} == {"inputs", "special files", "cache", "processes", "start-up"}
    assert all(c.private for c in cases if c.group == "cache" and c.name != "c-planted-v1")


# ---- where a signal may raise -----------------------------------------------------------------
def test_a_signal_is_held_only_under_an_extension_modules_start_up():
    from autoplan import _signals

    assert not _signals.unsafe(sys._getframe())
    # a stack shaped like an extension module's initialisation calling back into Python
    src = "class ExtensionFileLoader:\n    def create_module(self, f):\n        return f()\n"
    ns: dict = {}
    exec(compile(src, "<frozen importlib._bootstrap_external>", "exec"), ns)
    assert ns["ExtensionFileLoader"]().create_module(lambda: _signals.unsafe(sys._getframe()))
    # the same names in another file are not the import machinery
    ns = {}
    exec(compile(src, "mine.py", "exec"), ns)
    assert not ns["ExtensionFileLoader"]().create_module(lambda: _signals.unsafe(sys._getframe()))


def test_a_held_signal_is_sent_again_unless_disarmed():
    from autoplan import _signals

    got = []
    old = signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
    try:
        _signals.redeliver(signal.SIGUSR1)
        end = time.monotonic() + 5
        while not got and time.monotonic() < end:
            time.sleep(0.01)
        assert got == [signal.SIGUSR1]
        _signals.redeliver(signal.SIGUSR1)
        _signals.disarm()
        time.sleep(4 * _signals.RETRY_SECONDS)
        assert got == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, old)
