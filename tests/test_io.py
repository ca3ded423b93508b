"""Output files: checked before work, written atomically, never left partial."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap

import pytest

from autoplan import OutputError
from autoplan._io import atomic_write_bytes, atomic_write_text, check_output_path, same_file

ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}


def _leftovers(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.endswith(".tmp") or ".autoplan-probe-" in n)


def test_atomic_write_replaces_and_keeps_the_mode(tmp_path):
    path = tmp_path / "out.json"
    atomic_write_text(path, "first")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # a new file: the usual mode
    path.chmod(0o640)
    atomic_write_text(path, "second")
    assert path.read_text() == "second" and stat.S_IMODE(path.stat().st_mode) == 0o640
    assert _leftovers(tmp_path) == []


def test_a_symbolic_link_is_written_through(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    atomic_write_text(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_special_files_are_written_in_place():
    atomic_write_bytes(os.devnull, b"anything")  # /dev/null stays /dev/null
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


@pytest.mark.parametrize("fail_in", ["fsync", "replace"])
@pytest.mark.parametrize("error", [KeyboardInterrupt, OSError])
def test_an_interrupted_write_keeps_the_old_file(tmp_path, monkeypatch, fail_in, error):
    path = tmp_path / "plan.json"
    path.write_text("the good plan")

    def boom(*args, **kwargs):
        raise error(28, "No space left on device") if error is OSError else error()

    monkeypatch.setattr(os, fail_in, boom)
    with pytest.raises(OutputError if error is OSError else KeyboardInterrupt) as info:
        atomic_write_text(path, "x" * 100_000)
    monkeypatch.undo()
    assert path.read_text() == "the good plan"
    assert _leftovers(tmp_path) == []
    if error is OSError:
        assert "No space left on device" in str(info.value) and "unchanged" in str(info.value)


def test_a_file_size_limit_keeps_the_old_plan(tmp_path):
    # a full disk, simulated with ulimit -f: the write fails with EFBIG part-way through
    path = tmp_path / "plan.json"
    path.write_text('{"old": "plan"}')
    code = textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        from autoplan import OutputError
        from autoplan._io import atomic_write_text
        try:
            atomic_write_text({str(path)!r}, "y" * 1_000_000)
        except OutputError as err:
            print("refused:", err)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=ENV)
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout and "File too large" in out.stdout
    assert path.read_text() == '{"old": "plan"}'
    assert _leftovers(tmp_path) == []


def test_a_killed_writer_leaves_the_old_or_the_new_file_whole(tmp_path):
    # SIGKILL at a random moment of a large write: the target is never partial
    path = tmp_path / "big.json"
    old = b"o" * 1000
    path.write_bytes(old)
    code = (f"from autoplan._io import atomic_write_bytes\n"
            f"import sys\nsys.stdout.write('go\\n'); sys.stdout.flush()\n"
            f"for _ in range(50):\n    atomic_write_bytes({str(path)!r}, b'n' * 20_000_000)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=ENV)
    assert proc.stdout.readline() == b"go\n"
    proc.kill()
    proc.wait(timeout=60)
    data = path.read_bytes()
    assert data == old or data == b"n" * 20_000_000


def test_check_output_path_refuses_before_any_work(tmp_path):
    with pytest.raises(OutputError, match="does not exist"):
        check_output_path(tmp_path / "no" / "such" / "plan.json", what="-o path")
    with pytest.raises(OutputError, match="is a folder"):
        check_output_path(tmp_path)
    with pytest.raises(OutputError, match="cannot create files in the folder"):
        check_output_path("/proc/plan.json")  # not writable, even for root
    with pytest.raises(OutputError, match="non-empty file path"):
        check_output_path("")
    with pytest.raises(OutputError, match="should be a file path"):
        check_output_path(3)  # type: ignore[arg-type]
    assert check_output_path(tmp_path / "fine.json") == str(tmp_path / "fine.json")
    assert _leftovers(tmp_path) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write read-only files and folders")
def test_read_only_outputs_are_refused(tmp_path):
    ro = tmp_path / "ro.json"
    ro.write_text("{}")
    ro.chmod(0o444)
    with pytest.raises(OutputError, match="read-only"):
        check_output_path(ro)
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    with pytest.raises(OutputError, match="cannot create files"):
        check_output_path(folder / "p.json")


def test_the_output_may_not_be_an_input(tmp_path):
    plan = tmp_path / "victim.json"
    plan.write_text("{}")
    link = tmp_path / "alias.json"
    link.symlink_to(plan)
    hard = tmp_path / "hard.json"
    os.link(plan, hard)
    for out in (plan, link, hard, tmp_path / "." / "victim.json"):
        with pytest.raises(OutputError, match="is the input file"):
            check_output_path(out, inputs=[str(plan)])
        assert same_file(out, plan)
    assert check_output_path(tmp_path / "other.json", inputs=[str(plan)])
