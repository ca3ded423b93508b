"""Every code block of README.md and docs/*.md runs as written, so the docs cannot drift from the
code.

Each page's ``python`` and ``bash`` blocks run in order in a fresh process of their own (python
blocks share one namespace; bash blocks run line by line through the shell), in an empty folder
that holds the user's workload of docs/getting_started.md as ``mypkg/train.py``, exactly as the
page prints it. A block that cannot run here says why on the line before its fence:
``<!-- not run: the reason -->`` (a SLURM cluster's commands, the set-up commands themselves);
the test reads those reasons and refuses a marker without one.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:<!--\s*not run:(?P<why>[^>]*)-->\s*\n)?```(?P<lang>[\w-]*)\n(?P<code>.*?)```",
                   re.S)


def blocks(page: pathlib.Path) -> list[dict]:
    """The page's python and bash blocks, in order, with the reason any is not run."""
    text = page.read_text()
    out = []
    for m in BLOCK.finditer(text):
        if m.group("lang") not in ("python", "bash"):
            continue
        why = m.group("why")
        out.append({"lang": m.group("lang"), "code": m.group("code"),
                    "line": text[:m.start("code")].count("\n") + 1,
                    "skip": None if why is None else why.strip()})
    return out


def user_workload_source() -> str:
    """The ``mypkg/train.py`` of docs/getting_started.md, as printed there."""
    for b in blocks(ROOT / "docs" / "getting_started.md"):
        if b["lang"] == "python" and "def workload(" in b["code"]:
            return b["code"]
    raise AssertionError("docs/getting_started.md lost its mypkg/train.py example")


# The driver each page runs in: python blocks exec'd in one namespace, bash lines through the
# shell; the first failure names the page's line and ends the run.
DRIVER = r'''
import json, subprocess, sys, traceback


def main():
    page, runs = sys.argv[1], json.load(open(sys.argv[2]))
    namespace = {"__name__": "__docs__"}
    for b in runs:
        print(f"--- {page}:{b['line']} ({b['lang']})", flush=True)
        if b["lang"] == "python":
            try:
                exec(compile(b["code"], f"{page}:{b['line']}", "exec"), namespace)
            except BaseException:
                traceback.print_exc()
                print(f"FAILED {page}:{b['line']}", flush=True)
                sys.exit(1)
            continue
        lines = b["code"].replace("\\\n", " ").splitlines()
        for k, line in enumerate(lines):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            print(f"$ {line}", flush=True)
            rc = subprocess.call(["bash", "-c", line])
            if rc != 0:
                print(f"FAILED {page}:{b['line'] + k} exit {rc}", flush=True)
                sys.exit(1)


if __name__ == "__main__":  # (a search's spawned workers import this file again)
    main()
'''


def test_every_block_is_found_and_every_skip_says_why():
    found = {p.name: blocks(p) for p in PAGES}
    assert sum(len(v) for v in found.values()) >= 15, found.keys()
    for name, bs in found.items():
        for b in bs:
            assert b["skip"] is None or len(b["skip"]) >= 10, (name, b["line"], b["skip"])
    # the markers are read: a page with a skipped block says so right before its fence
    assert any(b["skip"] for b in found["launching.md"])
    assert not any(b["skip"] for b in found["getting_started.md"] if b["lang"] == "python")


@pytest.mark.parametrize("page", [p for p in PAGES if any(b["skip"] is None for b in blocks(p))],
                         ids=lambda p: p.name)
def test_the_page_runs_as_written(page, tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(user_workload_source())
    runs = [b for b in blocks(page) if b["skip"] is None]
    (tmp_path / "blocks.json").write_text(json.dumps(runs))
    (tmp_path / "driver.py").write_text(DRIVER)
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
               PATH=os.pathsep.join([str(pathlib.Path(sys.executable).parent), os.environ["PATH"]]),
               MPLBACKEND="Agg")
    env.pop("JAX_NUM_CPU_DEVICES", None)
    proc = subprocess.run([sys.executable, "driver.py", page.name, "blocks.json"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-6000:], proc.stderr[-6000:])
    assert proc.stdout.count("--- ") == len(runs)
    for b in runs:
        check = OUTPUT_CHECKS.get((page.name, b["lang"]))
        if check is not None:
            check(b["code"], block_output(proc.stdout, page.name, b["line"]))


def block_output(stdout: str, page: str, line: int) -> str:
    """What the block of ``page`` at ``line`` printed (up to the next block's header)."""
    head = f"--- {page}:{line} "
    rest = stdout[stdout.index(head):].split("\n", 1)[1]
    return rest.split("\n--- ", 1)[0]


def _is_nnx_example(code: str) -> bool:
    return "autoplan.Workload(train_step" in code and "nnx.split" in code


def _nnx_example(code: str, out: str) -> None:
    """The Flax NNX example of getting_started.md ("Your own model"): searched, run matched,
    applied in the user's own jax.jit loop (three steps, from a loss of about log(64))."""
    if not _is_nnx_example(code):
        return
    assert "named_shardings()" in code
    assert "matched" in out and "parameter" in out and "optimizer_state" in out, out[-3000:]
    loss = float(out.strip().splitlines()[-1])
    assert 0.0 < loss < 10.0, out[-3000:]


#: checks of what a page's blocks print, beyond running: (page, language) -> check(code, output)
OUTPUT_CHECKS = {("getting_started.md", "python"): _nnx_example}


def test_the_nnx_example_is_checked():
    """The check above finds its block (a page that loses the example fails here)."""
    code = [b for b in blocks(ROOT / "docs" / "getting_started.md") if _is_nnx_example(b["code"])]
    assert len(code) == 1 and code[0]["skip"] is None
    with pytest.raises(AssertionError):
        _nnx_example(code[0]["code"], "matched parameter optimizer_state\n12.5")
    _nnx_example(code[0]["code"], "matched parameter optimizer_state\n4.1")
