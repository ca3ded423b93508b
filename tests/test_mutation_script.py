"""benchmarks/mutation.py, the check that the tests can fail: its list of mutations cannot rot
when code moves (every snippet occurs exactly once in its file, every named test exists), and
one mutation run end to end is reported killed."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "mutation.py"


def script_module():
    spec = importlib.util.spec_from_file_location("mutation_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (its dataclass looks its module up there)
    spec.loader.exec_module(mod)
    return mod


def run_script(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_every_listed_snippet_occurs_once_and_every_named_test_exists():
    r = run_script("--list")
    assert r.returncode == 0, r.stdout + r.stderr
    listed = [line.split("\t") for line in r.stdout.splitlines()]
    mutations = script_module().MUTATIONS
    assert [row[0] for row in listed] == [m.name for m in mutations]
    assert len(mutations) >= 20 and len({m.name for m in mutations}) == len(mutations)
    for m in mutations:
        text = (ROOT / m.file).read_text()
        assert m.file.startswith("autoplan/"), m.name
        assert text.count(m.original) == 1, (m.name, m.file)
        assert m.mutated != m.original and text.replace(m.original, m.mutated) != text
        for t in m.tests:
            path, _, test = t.partition("::")
            assert (ROOT / path).is_file(), (m.name, path)
            if test:
                assert f"def {test.split('[')[0]}(" in (ROOT / path).read_text(), (m.name, t)


def test_a_moved_snippet_is_refused_by_name(tmp_path):
    mod = script_module()
    m = mod.MUTATIONS[0]
    moved = mod.Mutation(m.name, m.file, m.original + "  # not in the file", m.mutated, m.tests,
                         m.breaks)
    try:
        mod.check_snippet(moved)
    except SystemExit as err:
        assert m.name in str(err) and "0 times" in str(err)
    else:
        raise AssertionError("a snippet missing from its file was accepted")


def test_one_mutation_end_to_end_is_killed():
    r = run_script("--only", "remat-closure-stops")
    assert r.returncode == 0, r.stdout + r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("| remat-closure-stops "))
    assert "| killed (by `tests/exec/test_levers_applied.py::" in row
    assert "1 of 1 killed" in r.stdout
