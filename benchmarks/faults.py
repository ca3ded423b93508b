"""The fault table: bad inputs and faults tried as a user would, each classified automatically.

Every case runs in its own subprocess (the ``autoplan`` command line, or a few lines of Python
for the library), in its own folder and ``TMPDIR``, with a timeout; some get a signal (Ctrl-C,
SIGTERM, SIGHUP, SIGKILL) at a set moment, or have a worker killed. The verdict is computed, not
written by hand, from what the process left:

* **hang**: still running at the case's timeout (then killed with its process group);
* **traceback**: ``Traceback (most recent call last)`` on stderr or stdout;
* **process abort**: ended by a signal nobody sent it (SIGABRT, SIGSEGV: a crash inside XLA);
* **data lost**: a file that had to survive changed or vanished, or an output that had to stay
  unwritten exists;
* **left behind**: a process started by the case (found by a marker in its environment, so
  worker processes in their own sessions are found too) still alive after the command ended
  (10 s of grace for launches), or a ``autoplan-launch-*`` folder left in the case's ``TMPDIR``;
* otherwise, by what the case expects: **clear error** (a non-zero exit status, an
  ``autoplan: error:`` or ``autoplan: interrupted`` line, and the words the message must hold),
  **warned fallback** (exit 0 with a warning holding those words), **ok** (a valid input or a
  fault handled without a word to say), or **silently accepted** / **unclear error** when the
  outcome is not the expected one.

Usage::

    python benchmarks/faults.py                          # every case; prints the table and counts
    python benchmarks/faults.py --only launch            # cases whose group or name matches
    python benchmarks/faults.py --markdown docs/faults.md  # also rewrite the table in that page

The counts to keep at 0: traceback, hang, process abort, data lost, left behind, silently accepted,
unclear error.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
READY = "autoplan-faults: ready"
# the command line, announcing on stderr when its ``main`` is about to run (for signal cases)
CLI_READY = (f"import sys, autoplan.cli; sys.stderr.write({READY + chr(10)!r}); sys.stderr.flush(); "
             "sys.exit(autoplan.cli.main(sys.argv[1:]))")
# a user's script calling the library: an AutoplanError is printed the way a user would read it
API = """
import sys, warnings
warnings.simplefilter("always")
import jax
jax.config.update("jax_num_cpu_devices", 8)
import autoplan
from autoplan.models import get
try:
{body}
except autoplan.AutoplanError as err:
    print(f"autoplan: error: {{type(err).__name__}}: {{err}}", file=sys.stderr)
    sys.exit(2)
"""
VERDICTS = ("clear error", "warned fallback", "ok", "traceback", "hang", "process abort",
            "data lost", "left behind", "exposure", "silently accepted", "unclear error")
BAD = VERDICTS[3:]


@dataclass
class Case:
    """One bad input or fault.

    Attributes:
        name: short id; ``group`` the family; ``what`` the input or fault, for the table.
        argv: ``autoplan`` arguments (``{dir}`` is the case's folder), or ``code`` Python to run.
        expect: ``"error"``, ``"warning"``, ``"ok"``, ``"interrupted"`` or ``"killed"``.
        words: what the message must hold (a clear error names the problem and the fix).
        setup: makes the case's input files (gets the fixtures and the folder).
        keep: files that must be unchanged afterwards; ``absent``: files that must not exist.
        signal_at: ``(trigger, delay, signal)``: after ``"ready"`` (the CLI's main started),
            ``"workers"`` (launch workers are running) or ``"start"``, wait ``delay`` s, send it.
        to_worker: send the signal to launch worker 1 instead of the command.
        limit: ``ulimit -f`` in KiB for the command (a full disk), when set.
        close_stdout: close the command's stdout at once (a reader that went away).
        ok_status: exit statuses that count as success for ``expect="ok"``.
        grace: seconds the case's processes get to end after the command ended (default 10 for
            launches, else 0.5).
        stdin: run ``code`` as a script read from standard input (``python - <<EOF``).
        private: globs (in the case's folder) of files and folders that must be open to nobody
            but the user afterwards; ``planted``: files whose existence means planted code ran.
            Either failing is an **exposure**.
    """

    name: str
    group: str
    what: str
    argv: list[str] | None = None
    code: str | None = None
    expect: str = "error"
    words: tuple[str, ...] = ()
    setup: Callable[[dict[str, Path], Path], None] | None = None
    keep: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    signal_at: tuple[str, float, int] | None = None
    to_worker: bool = False
    limit: int | None = None
    close_stdout: bool = False
    ok_status: tuple[int, ...] = (0,)
    timeout: float = 300.0
    grace: float | None = None
    stdin: bool = False
    private: tuple[str, ...] = ()
    planted: tuple[str, ...] = ()


@dataclass
class Outcome:
    case: Case
    status: int | None
    seconds: float
    stdout: str
    stderr: str
    hang: bool = False
    changed: list[str] = field(default_factory=list)
    orphans: int = 0
    folders: int = 0
    exposed: list[str] = field(default_factory=list)
    signalled: bool = False
    marker: str = ""
    verdicts: list[str] = field(default_factory=list)
    seen: str = ""


# ---- fixtures and their mutations ---------------------------------------------------------------
def make_fixtures(folder: Path) -> dict[str, Path]:
    """Valid plans made once: an intra-operator plan of the tiny MLP on a 2x4 mesh of cpu:8 and
    a pipeline plan of the tiny GPT."""
    code = f"""
import warnings, jax
jax.config.update("jax_num_cpu_devices", 8)
warnings.simplefilter("ignore")
import autoplan
from autoplan.models import get
autoplan.plan(get("mlp", "tiny"), "cpu:8", pipeline=False, level="exhaustive", mesh_shape=(2, 4),
              baselines=False).to_json({str(folder / "mlp.json")!r})
autoplan.search(get("gpt", "tiny"), "cpu:8", pipeline=True, baselines=False).best.to_json(
    {str(folder / "gpt_pipe.json")!r})
"""
    subprocess.run([PY, "-c", code], check=True, env=_env({}), timeout=600)
    return {"mlp": folder / "mlp.json", "pipe": folder / "gpt_pipe.json"}


def plan_file(name: str, mutate: Callable[[dict], Any] | None = None, source: str = "mlp"):
    """Setup: the fixture ``source`` written as ``name``, changed by ``mutate``."""
    def setup(fx: dict[str, Path], work: Path) -> None:
        d = json.loads(fx[source].read_text())
        if mutate is not None:
            mutate(d)
        (work / name).write_text(json.dumps(d))
    return setup


def raw_file(name: str, data: Callable[[dict[str, Path]], bytes] | bytes):
    def setup(fx: dict[str, Path], work: Path) -> None:
        (work / name).write_bytes(data(fx) if callable(data) else data)
    return setup


def both(*setups):
    def setup(fx: dict[str, Path], work: Path) -> None:
        for s in setups:
            s(fx, work)
    return setup


def symlink(name: str, target: str):
    def setup(fx: dict[str, Path], work: Path) -> None:
        (work / name).symlink_to(work / target)
    return setup


def _put(d: dict, path: str, value: Any) -> None:
    keys = [int(k) if k.isdigit() else k for k in re.split(r"[.\[\]]+", path) if k]
    for k in keys[:-1]:
        d = d[k]
    if value is _DROP:
        del d[keys[-1]]
    else:
        d[keys[-1]] = value


_DROP = object()


def setting(path: str, value: Any):
    return lambda d: _put(d, path, value)


def first_spec_axis(axis: str):
    def mutate(d: dict) -> None:
        i = next(i for i in d["inputs"] if i["shape"])
        i["spec"] = [[axis]] + [None] * (len(i["shape"]) - 1)
    return mutate


def undividable_spec(d: dict) -> None:
    i = next(i for i in d["inputs"] if len(i["shape"]) == 2)
    i["shape"] = [6, i["shape"][1]]
    i["spec"] = [["x", "y"], None]  # 8 devices do not divide 6


def overlapping_layers(d: dict) -> None:
    s0, s1 = d["stages"][0], d["stages"][1]
    s0["layers"] = s0["layers"] + ["one_more"]
    s0["layer_range"] = [s0["layer_range"][0], s1["layer_range"][0] + 1]


def dropped_task(d: dict) -> None:
    row = d["schedule"]["table"][0]
    row[0] = None


# ---- the cases --------------------------------------------------------------------------------
def cases() -> list[Case]:
    SIGINT, SIGTERM, SIGHUP, SIGKILL = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL)
    plan_fix = ["plan", "mlp", "--pipeline", "no", "--level", "exhaustive"]
    launch = ["launch", "plan.json", "--model", "mlp", "--num-processes", "2",
              "--devices-per-process", "4", "--steps", "3", "--timeout", "120"]
    big_search = ["plan", "gpt", "--size", "1.3B", "-o", "keep.json"]
    out: list[Case] = []

    def add(*args, **kw):
        out.append(Case(*args, **kw))

    # plan files read by show / report / launch
    g = "plan file"
    add("pf-not-utf8", g, "plan file with non-UTF-8 bytes (`show`)", ["show", "p.json"],
        words=("not UTF-8",), setup=raw_file("p.json", lambda fx: fx["mlp"].read_bytes().replace(
            b'"mlp"', b'"caf\xe9"')))
    add("pf-empty", g, "empty plan file", ["show", "p.json"], words=("empty",), setup=raw_file("p.json", b""))
    add("pf-truncated", g, "plan file cut in half", ["show", "p.json"], words=("not valid JSON",),
        setup=raw_file("p.json", lambda fx: fx["mlp"].read_bytes()[: len(fx["mlp"].read_bytes()) // 2]))
    add("pf-text", g, "a text file, not JSON", ["show", "p.json"], words=("not valid JSON",),
        setup=raw_file("p.json", b"hello, world\n"))
    add("pf-array", g, "JSON that is not an object", ["show", "p.json"], words=("not an autoplan plan",),
        setup=raw_file("p.json", b"[1, 2, 3]"))
    add("pf-schema", g, "another tool's JSON (`schema` differs)", ["show", "p.json"],
        words=("not an autoplan plan",), setup=plan_file("p.json", setting("schema", "other")))
    add("pf-version", g, "`schema_version` 99", ["show", "p.json"], words=("schema_version should be 1",),
        setup=plan_file("p.json", setting("schema_version", 99)))
    add("pf-mesh", g, "stage `mesh_shape` [64, 64] on an 8-device plan (`show`)", ["show", "p.json"],
        words=("stages[0].mesh_shape", "[64, 64]"), setup=plan_file("p.json", setting("stages[0].mesh_shape", [64, 64])))
    add("pf-mesh-report", g, "stage `mesh_shape` [64, 64] (`report`)", ["report", "p.json", "-o", "r.html"],
        words=("stages[0].mesh_shape",), absent=("r.html",),
        setup=plan_file("p.json", setting("stages[0].mesh_shape", [64, 64])))
    add("pf-device", g, "device id 99 on an 8-device cluster", ["show", "p.json"],
        words=("stages[0].device_ids[3]", "below 8"), setup=plan_file("p.json", setting("stages[0].device_ids[3]", 99)))
    add("pf-device-twice", g, "a device in two pipeline stages", ["show", "p.json"],
        words=("stages[1].device_ids[0]", "not used by stages[0]"),
        setup=plan_file("p.json", setting("stages[1].device_ids[0]", 0), source="pipe"))
    add("pf-axis", g, "a spec naming mesh axis `z` on an (x, y) mesh", ["show", "p.json"],
        words=("inputs[0].spec[0][0]", "mesh axis"), setup=plan_file("p.json", first_spec_axis("z")))
    add("pf-divide", g, "a spec splitting a dimension of 6 over 8 devices", ["show", "p.json"],
        words=("divisor of dimension 0 (size 6)",), setup=plan_file("p.json", undividable_spec))
    add("pf-layers", g, "two pipeline stages holding the same layer", ["show", "p.json"],
        words=("layer_range", "one stage"), setup=plan_file("p.json", overlapping_layers, source="pipe"))
    add("pf-microbatches", g, "3 micro-batches for a batch of 8", ["show", "p.json"],
        words=("schedule.microbatches", "divisor of the batch 8"),
        setup=plan_file("p.json", setting("schedule.microbatches", 3), source="pipe"))
    add("pf-table", g, "a schedule table missing a task", ["show", "p.json"], words=("schedule.table",),
        setup=plan_file("p.json", dropped_task, source="pipe"))
    add("pf-missing", g, "a stage without `mesh_shape`", ["show", "p.json"],
        words=("stages[0].mesh_shape is missing",), setup=plan_file("p.json", setting("stages[0].mesh_shape", _DROP)))
    add("pf-type", g, "`cluster.nodes` = \"eight\"", ["show", "p.json"], words=("cluster.nodes",),
        setup=plan_file("p.json", setting("cluster.nodes", "eight")))
    add("pf-nan", g, "`NaN` predicted step time", ["show", "p.json"], words=("predicted.step_time", "finite"),
        setup=plan_file("p.json", setting("predicted.step_time", float("nan"))))
    add("pf-no-file", g, "a plan path that does not exist", ["show", "nothere.json"],
        words=("cannot read plan file",))
    add("pf-folder", g, "a folder given as the plan", ["show", "."], words=("cannot read plan file",))
    add("pf-bom", g, "a valid plan saved with a UTF-8 byte-order mark", ["show", "p.json"], expect="ok",
        setup=raw_file("p.json", lambda fx: b"\xef\xbb\xbf" + fx["mlp"].read_bytes()))
    add("pf-launch", g, "launching a plan file with a [64, 64] mesh", ["launch", "p.json", "--model", "mlp"],
        words=("stages[0].mesh_shape",), setup=plan_file("p.json", setting("stages[0].mesh_shape", [64, 64])))

    # outputs
    g = "outputs"
    add("out-no-folder", g, "`plan -o /no/such/dir/p.json` (checked before the search)",
        ["plan", "gpt", "--size", "1.3B", "-o", "/no/such/dir/p.json"], words=("does not exist",), timeout=60)
    add("out-unwritable", g, "`plan -o` into an unwritable folder (`/proc`)", plan_fix + ["-o", "/proc/p.json"],
        words=("cannot create files",))
    add("out-folder", g, "`plan -o` naming a folder", plan_fix + ["-o", "."], words=("is a folder",))
    add("out-same", g, "`report victim.json -o victim.json`", ["report", "victim.json", "-o", "victim.json"],
        words=("is the input file",), setup=plan_file("victim.json"), keep=("victim.json",))
    add("out-link", g, "`report victim.json -o link` (a symlink to the input)",
        ["report", "victim.json", "-o", "link.json"], words=("is the input file",),
        setup=both(plan_file("victim.json"), symlink("link.json", "victim.json")), keep=("victim.json",))
    add("out-full-plan", g, "disk full while writing a plan (`ulimit -f 8`) over a good one",
        plan_fix + ["-o", "good.json"], words=("File too large", "unchanged"), limit=8,
        setup=raw_file("good.json", b'{"a good": "file"}\n'), keep=("good.json",))
    add("out-full-report", g, "disk full while writing a report (`ulimit -f 64`)",
        ["report", "plan.json", "-o", "good.html"], words=("File too large",), limit=64,
        setup=both(plan_file("plan.json"), raw_file("good.html", b"<html>the good report</html>")),
        keep=("good.html", "plan.json"))
    for sig in (SIGINT, SIGTERM, SIGHUP):
        name = signal.Signals(sig).name
        add(f"out-{name.lower()}", g, f"{name} during `plan gpt --size 1.3B -o keep.json`", big_search,
            expect="interrupted", words=(f"interrupted by {name}", "keep.json was not written"),
            setup=raw_file("keep.json", b'{"the": "good plan"}\n'), keep=("keep.json",),
            signal_at=("ready", 1.0, sig))
    add("out-sigint-early", g, "Ctrl-C 1 s after `autoplan plan` starts (while JAX loads)", big_search,
        expect="interrupted", words=("interrupted by SIGINT", "keep.json was not written"),
        setup=raw_file("keep.json", b'{"the": "good plan"}\n'), keep=("keep.json",),
        signal_at=("start", 1.0, SIGINT))
    add("out-pipe", g, "`show plan.json --specs` into a reader that went away (`| head`)",
        ["show", "plan.json", "--specs"], expect="ok", ok_status=(0, 141), close_stdout=True,
        setup=plan_file("plan.json"))

    # search and options
    g = "search"
    add("s-budget", g, "`autoplan.search(w, \"cpu:8\", memory_budget=1.0)`",
        code=API.format(body='    autoplan.search(get("mlp", "tiny"), "cpu:8", memory_budget=1.0)'),
        words=("InfeasiblePlanError", "memory budget", "the least any"))
    add("s-no-fit-175b", g, "`plan gpt --size 175B --cluster cpu:8` (no plan fits 2 GiB devices)",
        ["plan", "gpt", "--size", "175B", "--cluster", "cpu:8", "-o", "big.json"],
        words=("no candidate plan fits", "the least any candidate needs", "--allow-no-fit"),
        absent=("big.json",), timeout=900)
    add("s-no-fit-kept", g, "the same (one layer) with `--allow-no-fit`",
        ["plan", "gpt", "--size", "175B", "--set", "layers=1", "--cluster", "cpu:8", "--pipeline", "no",
         "--allow-no-fit", "-o", "big.json"], expect="warning", words=("no candidate plan fits", "kept as asked"))
    add("s-no-fit-api", g, "`autoplan.search` where no plan fits (library)",
        code=API.format(body='    autoplan.search(get("gpt", "175B", layers=1), "cpu:8", pipeline=False)'),
        expect="warning", words=("PlanDoesNotFitWarning", "least any candidate needs"))
    add("s-remat-yes", g, "`--set remat=yes`", ["plan", "gpt", "--set", "remat=yes"],
        words=("--set remat=true",))
    add("s-remat-fix", g, "`--set remat=true`, the fix the message gives", ["trace", "gpt", "--set", "remat=true"],
        expect="ok")
    add("s-mesh-3d", g, "`mesh_shape=(2, 2, 2)` (three mesh axes)",
        code=API.format(body='    print(autoplan.plan(get("mlp", "tiny"), "cpu:8", pipeline=False, '
                             'mesh_shape=(2, 2, 2)).describe())'), expect="ok")
    add("s-mesh-pipeline", g, "`--mesh 2x4 --pipeline yes`", ["plan", "mlp", "--mesh", "2x4", "--pipeline", "yes"],
        words=("--mesh 2x4", "would be ignored"))
    add("s-pipeline-no", g, "`--pipeline no --microbatches 4 --schedule gpipe`",
        ["plan", "mlp", "--pipeline", "no", "--microbatches", "4", "--schedule", "gpipe"],
        words=("--microbatches 4", "would be ignored"))
    add("s-cpu-colon", g, "`--cluster cpu:` (no device count)", ["plan", "mlp", "--cluster", "cpu:"],
        words=("positive device count",))
    add("s-batch-6", g, "a batch of 6 on 8 devices", ["plan", "mlp", "--batch", "6", "--pipeline", "no"],
        expect="warning", words=("batch of 6 does not divide over the 8 devices",))
    add("s-mesh-syntax", g, "`--mesh 2x`", ["plan", "mlp", "--mesh", "2x"], words=("--mesh should be",))
    add("s-mesh-size", g, "`--mesh 3x3` on 8 devices", ["plan", "mlp", "--mesh", "3x3"], words=("9 devices",))
    add("s-model", g, "unknown model", ["plan", "nosuchmodel"], words=("nosuchmodel",))
    add("s-size", g, "unknown size `--size 7T`", ["trace", "gpt", "--size", "7T"], words=("7T",))
    add("s-set-key", g, "unknown config key `--set colour=red`", ["trace", "gpt", "--set", "colour=red"],
        words=("colour",))
    add("s-set-form", g, "`--set layers` (no value)", ["trace", "gpt", "--set", "layers"], words=("KEY=VALUE",))
    add("s-cluster-zero", g, "`--cluster p3.16xlarge:0`", ["plan", "mlp", "--cluster", "p3.16xlarge:0"],
        words=("positive node count",))
    add("s-cluster-name", g, "unknown preset `--cluster nosuch:2`", ["plan", "mlp", "--cluster", "nosuch:2"],
        words=("unknown preset",))
    add("s-batch-zero", g, "`--batch 0`", ["plan", "mlp", "--batch", "0"], words=("batch",))
    add("s-mb-zero", g, "`--microbatches 0`", ["plan", "mlp", "--pipeline", "yes", "--microbatches", "0"],
        words=("microbatches",))
    add("s-mb-split", g, "`--microbatches 3` for a batch of 8", ["plan", "gpt", "--pipeline", "yes",
        "--microbatches", "3"], words=("should divide the batch", "Got 3"))
    add("s-level", g, "`--level fast` (not a level)", ["plan", "mlp", "--level", "fast"], words=("--level",))

    # launches (the launcher's own hardening is tested by its tests; this is what a user sees)
    g = "launch"
    add("l-valid", g, "a valid 2-process launch (for reference)", launch, expect="ok",
        setup=plan_file("plan.json"))
    add("l-devices", g, "3 processes x 4 devices for an 8-device plan",
        ["launch", "plan.json", "--model", "mlp", "--num-processes", "3"],
        words=("8 emulated CPU devices", "num_processes=3"),
        setup=plan_file("plan.json"))
    add("l-model", g, "a plan for the MLP launched as GPT", launch[:3] + ["gpt"] + launch[4:],
        words=("made for model",), setup=plan_file("plan.json"))
    add("l-set", g, "a plan launched with a changed `--set hidden=128`", launch + ["--set", "hidden=128"],
        words=("made for model",), setup=plan_file("plan.json"))
    add("l-pipeline", g, "a pipeline plan launched on 2 processes (stages across processes)",
        ["launch", "plan.json", "--model", "gpt"], expect="ok", setup=plan_file("plan.json", source="pipe"))
    add("l-dead", g, "a worker that dies (exit 17) before step 1", launch, words=("exited with status 17",),
        env={"AUTOPLAN_TEST_CRASH_AT_STEP": "1"}, setup=plan_file("plan.json"))
    add("l-hung", g, "a worker that hangs at step 1 (`--timeout 60`)", launch[:-2] + ["--timeout", "60"],
        words=("worker",), env={"AUTOPLAN_TEST_HANG_AT_STEP": "1"}, setup=plan_file("plan.json"),
        timeout=240)
    add("l-killed", g, "a worker killed with SIGKILL", launch + ["--steps", "200"],
        words=("worker 1",), setup=plan_file("plan.json"), signal_at=("workers", 4.0, SIGKILL),
        to_worker=True)
    add("l-port", g, "the coordinator's port already taken",
        code=("import socket, sys\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
              "import autoplan.exec._launch as L\nL.free_port = lambda: s.getsockname()[1]\n"
              "import autoplan.cli\nsys.exit(autoplan.cli.main(['launch', 'plan.json', '--model', "
              "'mlp', '--timeout', '120']))\n"),
        expect="error", words=("port",), setup=plan_file("plan.json"))
    for sig in (SIGINT, SIGTERM, SIGHUP):
        name = signal.Signals(sig).name
        add(f"l-{name.lower()}", g, f"{name} to the launcher", launch[:-4] + ["--steps", "20000"],
            expect="interrupted", words=(f"interrupted by {name}",), setup=plan_file("plan.json"),
            signal_at=("workers", 4.0, sig))
    add("l-sigkill", g, "SIGKILL to the launcher", launch[:-4] + ["--steps", "20000"], expect="killed",
        setup=plan_file("plan.json"), signal_at=("workers", 4.0, SIGKILL))

    # the executor in the user's own process (a notebook kernel must survive)
    g = "executor"
    add("x-accumulate", g, "gradient accumulation (1 stage, 2 micro-batches) run in-process",
        code=API.format(body=(
            '    plan = autoplan.Plan.from_json("plan.json")\n'
            '    from autoplan.exec import run\n'
            '    rep = run(plan, get("mlp", "tiny", abstract=False), steps=2, check=True)\n'
            '    print(rep.equivalence.matched)')),
        expect="ok", setup=plan_file("plan.json", lambda d: d["schedule"].update(kind="1f1b", microbatches=2)))
    add("x-accumulate-64", g, "gradient accumulation over 64 micro-batches on 8 devices, in-process",
        code=API.format(body=(
            '    from dataclasses import replace\n'
            '    from autoplan.exec import run\n'
            '    plan = autoplan.plan(get("mlp", "tiny", batch=64), "cpu:8", pipeline=False, '
            'mesh_shape=(2, 4), level="exhaustive", baselines=False)\n'
            '    plan = plan.with_(schedule=replace(plan.schedule, kind="1f1b", microbatches=64))\n'
            '    rep = run(plan, get("mlp", "tiny", batch=64, abstract=False), steps=1, check=True)\n'
            '    print(rep.equivalence.matched)')), expect="ok")

    # PRNG keys in a user's step (a dropout step whose key is its fourth argument)
    g = "keys"
    dropout = (
        '    import jax.numpy as jnp\n'
        '    def step(params, opt_state, batch, key):\n'
        '        def loss(p):\n'
        '            h = jnp.tanh(batch @ p)\n'
        '            return jnp.mean(jnp.where(jax.random.bernoulli(key, 0.9, h.shape), h, 0.) ** 2)\n'
        '        l, g = jax.value_and_grad(loss)(params)\n'
        '        return l, params - 0.1 * g, opt_state\n'
        '    args = (jnp.ones((8, 8)), jnp.zeros(()), jnp.ones((16, 8)), jax.random.key(0))\n')
    add("k-dropout", g, "a dropout step (typed key argument) planned and run intra-operator",
        code=API.format(body=dropout + (
            '    w = autoplan.Workload(step, args)\n'
            '    from autoplan.exec import run\n'
            '    plan = autoplan.search(w, "cpu:8", pipeline=False).best\n'
            '    print(w.arg_kinds[3], run(plan, w, steps=3).equivalence.matched)')), expect="ok")
    add("k-kind-batch", g, "a key argument given the kind `batch`",
        code=API.format(body=dropout + (
            '    autoplan.Workload(step, args, arg_kinds=("parameter", "optimizer_state", '
            '"batch", "batch"))')),
        words=("holds PRNG keys", "should be 'key'", "Got arg_kinds[3] = 'batch'", "Fix:"))
    add("k-kind-key", g, "a float argument given the kind `key`",
        code=API.format(body=dropout + (
            '    autoplan.Workload(step, args, arg_kinds=("parameter", "optimizer_state", '
            '"key", "key"))')),
        words=("should hold PRNG keys", "float32", "Fix:"))
    add("k-accumulate", g, "gradient accumulation (2 micro-batches) of a dropout step, run in-process",
        code=API.format(body=dropout + (
            '    from dataclasses import replace\n'
            '    from autoplan.exec import run\n'
            '    w = autoplan.Workload(step, args)\n'
            '    plan = autoplan.search(w, "cpu:8", pipeline=False).best\n'
            '    plan = plan.with_(schedule=replace(plan.schedule, kind="1f1b", microbatches=2))\n'
            '    rep = run(plan, w, steps=1)\n'
            '    print("draws random numbers per micro-batch" in plan.summary(), rep.equivalence.matched)')),
        expect="ok")
    # a user's own signature: labels apart from the inputs, parameters under a short name
    labelled = (
        '    import jax.numpy as jnp\n'
        '    def step(p, x, y, key):\n'
        '        def loss(p):\n'
        '            h = jnp.tanh(x @ p)\n'
        '            h = jnp.where(jax.random.bernoulli(key, 0.9, h.shape), h / 0.9, 0.)\n'
        '            return jnp.mean((h - y) ** 2)\n'
        '        l, g = jax.value_and_grad(loss)(p)\n'
        '        return l, p - 0.1 * g\n'
        '    args = (jnp.ones((8, 8)) / 8, jnp.ones((16, 8)), jnp.zeros((16, 8)), jax.random.key(0))\n')
    add("k-labels-apart", g, "a step `(p, x, y, key)`: labels apart from the inputs, planned with "
        "micro-batches and run", code=API.format(body=labelled + (
            '    w = autoplan.Workload(step, args)\n'
            '    from autoplan.exec import run\n'
            '    res = autoplan.search(w, "cpu:8", pipeline=True, baselines=False)\n'
            '    plan = next(p for p in res.plans if p.schedule.microbatches > 1)\n'
            '    print(w.arg_kinds, run(plan, w, steps=2).equivalence.matched)')), expect="ok")
    add("k-fixed-batch", g, "a step that writes its batch size in (`x.reshape(16, -1)`), searched",
        code=API.format(body=labelled.replace("h = jnp.tanh(x @ p)",
                                              "h = jnp.tanh(x.reshape(16, -1) @ p)") + (
            '    print(autoplan.search(autoplan.Workload(step, args), "cpu:8").best.describe())')),
        expect="warning", words=("could not be traced at micro-batch size", "JAX said", "Fix:"))
    add("k-batch-scalar", g, "a batch dict that carries its example count (a scalar `n`), searched",
        code=API.format(body=(
            '    import jax.numpy as jnp\n'
            '    def step(params, batch):\n'
            '        def loss(p):\n'
            '            return jnp.sum((jnp.tanh(batch["x"] @ p) - batch["y"]) ** 2) / batch["n"]\n'
            '        l, g = jax.value_and_grad(loss)(params)\n'
            '        return l, params - 0.1 * g\n'
            '    batch = {"x": jnp.ones((16, 8)), "y": jnp.zeros((16, 8)), "n": 16.0}\n'
            '    w = autoplan.Workload(step, (jnp.ones((8, 8)) / 8, batch))\n'
            '    print(autoplan.search(w, "cpu:8").best.describe())')),
        expect="warning", words=("batch['n'] (of kind 'batch') has shape ()", "Fix:"))
    out += file_and_process_cases()
    out += cluster_option_plan_cases()
    return out


# ---- files, the cache, processes and start-up signals (the third round) -----------------------
WORKLOAD_PY = """from autoplan.models import get


def workload(**kw):
    return get("mlp", "tiny", **kw)
"""


def text_file(name: str, text: str):
    def setup(fx: dict[str, Path], work: Path) -> None:
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    return setup


def cluster_file(name: str):
    """Setup: the cluster record of the MLP fixture, as a profile file (``--cluster name``)."""
    def setup(fx: dict[str, Path], work: Path) -> None:
        d = json.loads(fx["mlp"].read_text())["cluster"]
        (work / name).write_text(json.dumps({"schema": "autoplan.cluster", **d}))
    return setup


def fifo(name: str):
    def setup(fx: dict[str, Path], work: Path) -> None:
        os.mkfifo(work / name)
    return setup


def hardlink(name: str, target: str):
    def setup(fx: dict[str, Path], work: Path) -> None:
        os.link(work / target, work / name)
    return setup


def sparse_file(name: str, size: int):
    """Setup: a file of ``size`` bytes that takes no disk space (a hole)."""
    def setup(fx: dict[str, Path], work: Path) -> None:
        with open(work / name, "wb") as f:
            f.truncate(size)
    return setup


# two plan searches of the MLP with the plan cache in the case's folder; ``between`` changes the
# cache in between (``entries``: the stored entries)
CACHE_TWICE = """
import glob, hashlib, os, pickle, sys
os.environ["AUTOPLAN_CACHE_DIR"] = "cache"
{before}
import autoplan.cli
argv = ["plan", "mlp", "--pipeline", "no", "--level", "exhaustive", "--mesh", "2x4"]
status = autoplan.cli.main(argv)
if status:
    sys.exit(status)
entries = glob.glob("cache/search/*.entry")
{between}
sys.exit(autoplan.cli.main(argv))
"""
PLANT = """
class Planted:
    def __reduce__(self):
        return (os.mkdir, ("PLANTED",))
payload = pickle.dumps(Planted())
for e in entries:
    with open(e, "wb") as f:
        f.write(f"autoplan-search-cache {fmt} {digest(payload)}\\n".encode() + payload)
"""
SEARCH_ON_STDIN = """
import warnings
warnings.simplefilter("always")
import jax
jax.config.update("jax_num_cpu_devices", 8)
import autoplan
from autoplan.models import get
result = autoplan.search(get("gpt", "tiny"), "cpu:8", workers=2, cache=False)
print(result.best.label)
"""


def file_and_process_cases() -> list[Case]:
    """Outputs against every input, pipes and devices, the plan cache's privacy, the search's
    worker processes, and signals while the command starts."""
    SIGINT, SIGTERM, SIGKILL = signal.SIGINT, signal.SIGTERM, signal.SIGKILL
    plan_fix = ["plan", "mlp", "--pipeline", "no", "--level", "exhaustive"]
    big_search = ["plan", "gpt", "--size", "1.3B", "-o", "keep.json"]
    keep = raw_file("keep.json", b'{"the": "good plan"}\n')
    out: list[Case] = []

    def add(*args, **kw):
        out.append(Case(*args, **kw))

    # no output replaces an input: -o and --report against every file the command reads
    g = "inputs"
    add("in-cluster-o", g, "`plan mlp --cluster c.json -o c.json` (the profile replaced by a plan)",
        plan_fix + ["--cluster", "c.json", "-o", "c.json"], words=("the cluster file", "Fix:"),
        setup=cluster_file("c.json"), keep=("c.json",))
    add("in-cluster-report", g, "`--cluster c.json:2 --report c.json`",
        plan_fix + ["--cluster", "c.json:2", "--report", "c.json"], words=("the cluster file",),
        setup=cluster_file("c.json"), keep=("c.json",))
    add("in-cluster-link", g, "`-o link.json`, a symbolic link to the cluster file",
        plan_fix + ["--cluster", "c.json", "-o", "link.json"], words=("the cluster file",),
        setup=both(cluster_file("c.json"), symlink("link.json", "c.json")), keep=("c.json",))
    add("in-o-report", g, "`-o x.json --report x.json` (the report written over the plan)",
        plan_fix + ["-o", "x.json", "--report", "x.json"], words=("same file as -o",),
        setup=raw_file("x.json", b'{"the": "good plan"}\n'), keep=("x.json",))
    add("in-o-report-hard", g, "`-o x.json --report h.json`, a hard link to x.json",
        plan_fix + ["-o", "x.json", "--report", "h.json"], words=("same file as -o",),
        setup=both(raw_file("x.json", b'{"the": "good plan"}\n'), hardlink("h.json", "x.json")),
        keep=("x.json",))
    add("in-o-report-dots", g, "`-o x.json --report sub/../x.json`",
        plan_fix + ["-o", "x.json", "--report", "sub/../x.json"], words=("same file as -o",),
        setup=both(raw_file("x.json", b'{"the": "good plan"}\n'), text_file("sub/.keep", "")),
        keep=("x.json",))
    add("in-wl-module", g, "`plan wls:workload -o wls.py` (the user's own source)",
        ["plan", "wls:workload", "-o", "wls.py"], words=("a source file of the workload",),
        setup=text_file("wls.py", WORKLOAD_PY), keep=("wls.py",))
    add("in-wl-package", g, "`plan pkg.train:workload -o pkg/__init__.py`",
        ["plan", "pkg.train:workload", "-o", "pkg/__init__.py"], words=("a source file of the workload",),
        setup=both(text_file("pkg/__init__.py", "# the package\n"), text_file("pkg/train.py", WORKLOAD_PY)),
        keep=("pkg/__init__.py", "pkg/train.py"))
    add("in-wl-sibling", g, "`plan pkg.train:workload --report pkg/util.py` (a module beside it)",
        ["plan", "pkg.train:workload", "--report", "pkg/util.py"], words=("a source file of the workload",),
        setup=both(text_file("pkg/__init__.py", ""), text_file("pkg/util.py", "X = 1\n"),
                   text_file("pkg/train.py", WORKLOAD_PY)), keep=("pkg/util.py",))
    add("in-report-wl", g, "`report wls:workload -o wls.py`", ["report", "wls:workload", "-o", "wls.py"],
        words=("a source file of the workload",), setup=text_file("wls.py", WORKLOAD_PY), keep=("wls.py",))
    add("in-report-hard", g, "`report p.json -o h.json`, a hard link to the plan",
        ["report", "p.json", "-o", "h.json"], words=("is the input file",),
        setup=both(plan_file("p.json"), hardlink("h.json", "p.json")), keep=("p.json",))
    add("in-o-empty", g, "`plan mlp -o ''`", plan_fix + ["-o", ""], words=("non-empty file path",))
    add("in-report-empty", g, "`plan mlp --report ''`", plan_fix + ["--report", ""],
        words=("non-empty file path",))
    add("in-profile-empty", g, "`profile -o ''`", ["profile", "-o", ""], words=("non-empty file path",))
    add("in-name-245", g, "a legal 245-character `-o` name (its temporary name is longer)",
        plan_fix + ["-o", "p" * 240 + ".json"], expect="ok")
    add("in-name-256", g, "a 256-character `-o` name (refused before the search)",
        ["plan", "gpt", "--size", "1.3B", "-o", "p" * 251 + ".json"], words=("256 bytes long", "shorter"),
        timeout=60)

    # nothing waits on what is not a regular file
    g = "special files"
    add("sp-show-fifo", g, "`show fifo` (a named pipe nobody writes)", ["show", "fifo"],
        words=("named pipe",), setup=fifo("fifo"), timeout=60)
    add("sp-show-zero", g, "`show /dev/zero`", ["show", "/dev/zero"], words=("character device",), timeout=60)
    add("sp-show-tty", g, "`show /dev/tty`", ["show", "/dev/tty"], words=("/dev/tty",), timeout=60)
    add("sp-out-fifo", g, "`plan -o fifo`", plan_fix + ["-o", "fifo"], words=("named pipe",),
        setup=fifo("fifo"), timeout=60)
    add("sp-report-zero", g, "`plan --report /dev/zero`", plan_fix + ["--report", "/dev/zero"],
        words=("character device",), timeout=60)
    add("sp-cluster-fifo", g, "`--cluster fifo`", plan_fix + ["--cluster", "fifo"], words=("named pipe",),
        setup=fifo("fifo"), timeout=60)
    add("sp-cluster-zero", g, "`--cluster /dev/zero`", plan_fix + ["--cluster", "/dev/zero"],
        words=("character device",), timeout=60)
    add("sp-report-src-fifo", g, "`report fifo -o r.html`", ["report", "fifo", "-o", "r.html"],
        words=("named pipe",), setup=fifo("fifo"), absent=("r.html",), timeout=60)
    add("sp-launch-fifo", g, "`launch fifo --model mlp`", ["launch", "fifo", "--model", "mlp"],
        words=("named pipe",), setup=fifo("fifo"), timeout=60)
    add("sp-huge-plan", g, "a 300 MB plan file (read only after a size check)", ["show", "big.json"],
        words=("more than the",), setup=sparse_file("big.json", 300 * 2**20), timeout=60)
    add("sp-dev-null", g, "`plan -o /dev/null` (discard the plan)", plan_fix + ["-o", "/dev/null"],
        expect="ok")
    add("sp-preset-file", g, "a file named `cpu:8` beside `--cluster cpu:8`",
        plan_fix + ["--cluster", "cpu:8"], expect="warning", words=("the preset is used",),
        setup=raw_file("cpu:8", b"not a cluster"))

    # the plan cache: private, and it runs no planted code
    g = "cache"
    private = ("cache", "cache/search", "cache/search/*")
    add("c-umask", g, "`plan` under `umask 000` (cache folders and entries)",
        code=CACHE_TWICE.format(before="os.umask(0)", between=""), expect="ok", private=private)
    add("c-planted", g, "an entry replaced by a pickle with a valid checksum header",
        code=CACHE_TWICE.format(before="", between=(
            "from autoplan._cache import FORMAT as fmt\n"
            "digest = lambda b: hashlib.sha256(b).hexdigest()\n" + PLANT)),
        expect="ok", planted=("PLANTED",), private=private)
    add("c-planted-v1", g, "the same in the old format (a checksum header, format 1)",
        code=CACHE_TWICE.format(before="", between=(
            "fmt = 1\ndigest = lambda b: hashlib.sha256(b).hexdigest()\n" + PLANT)),
        expect="ok", planted=("PLANTED",))
    add("c-fifo", g, "a named pipe in place of a cache entry",
        code=CACHE_TWICE.format(before="", between="for e in entries:\n    os.unlink(e)\n    os.mkfifo(e)"),
        expect="ok", private=private, timeout=120)
    add("c-zero", g, "a symbolic link to `/dev/zero` in place of a cache entry",
        code=CACHE_TWICE.format(before="", between="for e in entries:\n    os.unlink(e)\n    os.symlink('/dev/zero', e)"),
        expect="ok", private=private, timeout=120)
    add("c-world-writable", g, "a cache entry made writable by everyone",
        code=CACHE_TWICE.format(before="", between="for e in entries:\n    os.chmod(e, 0o666)"),
        expect="ok", private=private)
    add("c-open-folder", g, "the cache's entry folder opened to everyone (`chmod 777`)",
        code=CACHE_TWICE.format(before="", between="os.chmod('cache/search', 0o777)"),
        expect="ok", private=private)
    add("c-key-readable", g, "the cache's key made readable by everyone",
        code=CACHE_TWICE.format(before="", between="os.chmod('cache/search/key', 0o644)"),
        expect="ok", private=private)

    # processes: the search's workers end with the command, and start only where they can work
    g = "processes"
    add("p-kill9", g, "`kill -9` of `plan gpt --size 1.3B --workers 2` while its workers run",
        ["plan", "gpt", "--size", "1.3B", "--workers", "2", "--no-cache"], expect="killed",
        signal_at=("children", 1.0, SIGKILL), grace=10.0)
    add("p-sigterm", g, "SIGTERM to `plan gpt --size 1.3B --workers 2` while its workers run",
        ["plan", "gpt", "--size", "1.3B", "--workers", "2", "--no-cache"], expect="interrupted",
        words=("interrupted by SIGTERM",), signal_at=("children", 1.0, SIGTERM), grace=5.0)
    add("p-stdin", g, "a search with workers from a script on standard input (`python - <<EOF`)",
        code=SEARCH_ON_STDIN, stdin=True, expect="warning", words=("standard input", "save the script"))
    add("p-shadow-cli", g, "a `queue.py` in the working folder (`python -m autoplan.cli plan mlp`)",
        plan_fix, words=("queue.py", "shadows a module of Python's standard library"),
        setup=text_file("queue.py", "# the user's own queue\n"))
    # (the folder goes behind the standard library once the workload's module is imported: the
    # search and its workers then import the real queue)
    add("p-shadow-workers", g, "a `queue.py` beside the user's workload, searched with `--workers 2`",
        ["plan", "wls:workload", "--pipeline", "no", "--workers", "2", "--no-cache"], expect="ok",
        env={"PYTHONSAFEPATH": "1"},
        setup=both(text_file("queue.py", "# the user's own queue\n"), text_file("wls.py", WORKLOAD_PY)))
    add("p-workers-64", g, "`--workers 64` on a machine with fewer cores", plan_fix + ["--workers", "64"],
        expect="warning", words=("--workers 64 is more than the",))

    # signals while the command starts (JAX importing): one line and 128 + the signal
    g = "start-up"
    for delay, sig in ((0.6, SIGTERM), (1.0, SIGINT), (1.4, SIGTERM), (1.8, SIGINT), (2.2, SIGTERM),
                       (2.6, SIGINT)):
        name = signal.Signals(sig).name
        add(f"su-{name.lower()}-{delay}", g, f"{name} {delay} s after `plan gpt --size 1.3B` starts",
            big_search, expect="interrupted", words=(f"interrupted by {name}", "keep.json was not written"),
            setup=keep, keep=("keep.json",), signal_at=("ready", delay, sig))
    for delay in (0.3, 1.0, 1.8):
        add(f"su-launch-{delay}", g, f"SIGTERM {delay} s after `autoplan launch` starts",
            ["launch", "plan.json", "--model", "mlp", "--steps", "3"], expect="interrupted",
            words=("interrupted by SIGTERM",), setup=plan_file("plan.json"),
            signal_at=("ready", delay, SIGTERM), grace=10.0)
    return out


# ---- clusters, options, contradicting plans and non-finite numbers ----------------------------
#: a user's module whose workload is the tiny MLP with an infinite input: NaN at every step
NAN_MODULE = b"""
import numpy as np
import autoplan
from autoplan.models import get


def workload(abstract=True, seed=0):
    wl = get("mlp", "tiny", abstract=abstract, seed=seed)
    if abstract:
        return wl
    params, opt_state, batch = wl.args
    x = np.array(batch["x"])
    x[0, 0] = np.inf
    return autoplan.Workload(wl.fn, (params, opt_state, {**batch, "x": x}), name=wl.name,
                             config=wl.config)
"""
#: a user's module whose workload function never returns
HANG_MODULE = b"import time\n\n\ndef workload():\n    time.sleep(3600)\n"


def _shape_changed(d: dict) -> None:
    i = next(i for i in d["inputs"] if i["kind"] == "parameter" and len(i["shape"]) == 2)
    i["shape"] = [i["shape"][0], i["shape"][1] * 2]


def _dtype_changed(d: dict) -> None:
    next(i for i in d["inputs"] if i["kind"] == "parameter")["dtype"] = "bfloat16"


def _param_as_batch(d: dict) -> None:
    next(i for i in d["inputs"] if i["kind"] == "parameter")["kind"] = "batch"


def _stages_swapped(d: dict) -> None:
    s0, s1 = d["stages"][0], d["stages"][1]
    s0["layers"], s1["layers"] = s1["layers"], s0["layers"]


def _on_gpus(d: dict) -> None:
    d["cluster"].update(name="p3.16xlarge", device_kind="V100-SXM2-16GB")


def cluster_option_plan_cases() -> list[Case]:
    """Cases of issue 40's items 5-8: one device cap, options checked before any work, plans
    that contradict themselves or the workload, non-finite numbers, the launcher's probe."""
    out: list[Case] = []

    def add(*args, **kw):
        out.append(Case(*args, **kw))

    def api(body: str) -> str:
        return API.format(body="\n".join("    " + ln for ln in body.splitlines()))

    launch = ["launch", "plan.json", "--model", "mlp", "--steps", "2", "--timeout", "120"]
    mlp_plan = "plan = autoplan.plan(get('mlp', 'tiny'), 'cpu:8', pipeline=False, baselines=False)"

    g = "devices"
    add("d-search-huge", g, "`plan mlp --cluster p3.16xlarge:100000` (800,000 devices)",
        ["plan", "mlp", "--cluster", "p3.16xlarge:100000"], words=("at most 65,536 devices",
                                                                   "p3.16xlarge:8192"), timeout=60)
    add("d-cpu-digits", g, "`--cluster cpu:99999999999999999999`",
        ["plan", "mlp", "--cluster", "cpu:99999999999999999999"],
        words=("at most 1,048,576 devices",), timeout=60)
    add("d-nodes-cap", g, "`--cluster p3.16xlarge:200000` (past the 2^20 cap)",
        ["plan", "mlp", "--cluster", "p3.16xlarge:200000"], words=("at most 1,048,576",), timeout=60)
    add("d-preset", g, "`Cluster.preset(\"p3.16xlarge\", 2**18)`",
        code=api("autoplan.Cluster.preset('p3.16xlarge', 2**18)"), words=("at most 1,048,576",))
    add("d-search-api", g, "`autoplan.search(w, \"cpu:70000\")`",
        code=api("autoplan.search(get('mlp', 'tiny'), 'cpu:70000')"),
        words=("at most 65,536 devices",))
    add("d-plan-file", g, "a plan file whose `cluster.nodes` is 2^20 (8 devices per node)",
        ["show", "p.json"], words=("cluster.nodes", "1,048,576"),
        setup=plan_file("p.json", lambda d: d["cluster"].update(nodes=2**20)))

    g = "options"
    for name, kw, words in (("neg", "rtol=-1", "rtol should be a finite number >= 0"),
                            ("nan", "rtol=float('nan')", "Got nan"),
                            ("str", "atol='1e-6'", "atol should be"),
                            ("flag", "check='yes'", "check should be True or False")):
        add(f"o-run-{name}", g, f"`exec.run(..., {kw})`",
            code=api(f"{mlp_plan}\nautoplan.exec.run(plan, get('mlp', 'tiny', abstract=False), "
                     f"{kw})"), words=(words,))
    for name, kw, words in (("budget-bool", "memory_budget=True", "True is not a byte count"),
                            ("budget-str", "memory_budget='1GB'", "memory_budget=2**30"),
                            ("mesh-str", "mesh_shape='2x4'", "mesh_shape=(2, 4)"),
                            ("progress", "progress=5", "progress should be None or a function")):
        add(f"o-search-{name}", g, f"`autoplan.search(w, {kw})`",
            code=api(f"autoplan.search(get('mlp', 'tiny'), 'cpu:8', {kw})"), words=(words,))
    add("o-cache-abc", g, "`AUTOPLAN_CACHE_MAX_BYTES=abc autoplan plan mlp`", ["plan", "mlp"],
        env={"AUTOPLAN_CACHE_MAX_BYTES": "abc"}, words=("AUTOPLAN_CACHE_MAX_BYTES should be", "'abc'"))
    add("o-cache-zero", g, "`AUTOPLAN_CACHE_MAX_BYTES=0` (documented: store nothing)",
        code=api("import os\nos.environ['AUTOPLAN_CACHE_DIR'] = os.path.abspath('cache')\n"
                 "os.environ['AUTOPLAN_CACHE_MAX_BYTES'] = '0'\n"
                 "r = autoplan.search(get('mlp', 'tiny'), 'cpu:8', pipeline=False, baselines=False)\n"
                 "print(r.stats['cache'], sorted(os.walk('cache'))[-1][2] if os.path.isdir('cache') "
                 "else [])"), expect="ok")
    for call, words in (("autoplan.algorithms.cones(None)", "cones: graph should be an autoplan.OpGraph"),
                        ("autoplan.algorithms.mine(None)", "mine: graph should be"),
                        ("autoplan.algorithms.group_layers(get('mlp', 'tiny'))", "trace it first"),
                        ("autoplan.algorithms.solve_ilp(autoplan.trace(get('mlp', 'tiny')), None)",
                         "solve_ilp: mesh should be")):
        add(f"o-algo-{call.split('(')[0].split('.')[-1]}", g, f"`{call}`", code=api(call),
            words=(words,))
    add("o-platform-note", g, "a `p3.16xlarge:1` plan launched on emulated CPUs",
        launch, expect="warning", words=("made for p3.16xlarge:1", "emulated CPU"),
        setup=plan_file("plan.json", _on_gpus))

    g = "contradiction"
    edits = (("shape", "an input's shape changed", _shape_changed, "mlp", "fingerprint should be"),
             ("dtype", "an input's dtype changed", _dtype_changed, "mlp", "fingerprint should be"),
             ("kind", "a parameter marked `kind: batch`", _param_as_batch, "mlp",
              "kind should be 'parameter'"),
             ("dpn", "`devices_per_node` 16 on an 8-device plan",
              lambda d: d["cluster"].update(devices_per_node=16), "mlp",
              "cluster.devices_per_node should be"),
             ("swap", "stage names swapped against their `layer_range`", _stages_swapped, "pipe",
              "stages[0].layers should be"),
             ("gpipe", "`schedule.kind` \"gpipe\" over a 1F1B table",
              lambda d: d["schedule"].update(kind="gpipe"), "pipe", "schedule.kind should be"))
    for name, what, edit, source, words in edits:
        model = "mlp" if source == "mlp" else "gpt"
        add(f"c-show-{name}", g, f"`show`: {what}", ["show", "p.json"], expect="warning",
            words=(words,), setup=plan_file("p.json", edit, source=source))
        add(f"c-launch-{name}", g, f"`launch`: {what}", ["launch", "p.json", "--model", model],
            words=("contradicts itself", words), setup=plan_file("p.json", edit, source=source))
    add("c-report", g, "`report` of a plan whose input shape changed", ["report", "p.json", "-o",
        "r.html"], expect="warning", words=("fingerprint should be",),
        setup=plan_file("p.json", _shape_changed))
    add("c-model", g, "`launch`: `model` changed to another zoo model",
        ["launch", "p.json", "--model", "mlp"], words=("contradicts the workload",
                                                       "model should be 'mlp'"),
        setup=plan_file("p.json", setting("model", "gpt")))
    add("c-config", g, "`launch`: `config.hidden` changed", ["launch", "p.json", "--model", "mlp"],
        words=("contradicts the workload", "config.hidden should be 64"),
        setup=plan_file("p.json", setting("config.hidden", 128)))
    add("c-run", g, "`exec.run` of a plan whose input shape changed",
        code=api("plan = autoplan.Plan.from_json('p.json')\n"
                 "autoplan.exec.run(plan, get('mlp', 'tiny', abstract=False))"),
        words=("PlanFileError", "contradicts itself", "fingerprint"),
        setup=plan_file("p.json", _shape_changed))

    g = "numbers"
    nan_setup = both(plan_file("plan.json", setting("model", "nanwl:workload")),
                     raw_file("nanwl.py", NAN_MODULE))
    add("n-launch-nan", g, "`launch` of a workload whose loss is NaN at every step (an inf input)",
        ["launch", "plan.json", "--model", "nanwl:workload", "--timeout", "120"],
        words=("not finite", "the loss is nan", "the model's numbers", "--allow-nonfinite"),
        setup=nan_setup)
    add("n-launch-allowed", g, "the same with `--allow-nonfinite`",
        ["launch", "plan.json", "--model", "nanwl:workload", "--timeout", "120",
         "--allow-nonfinite"], expect="warning", words=("Kept as asked",), setup=nan_setup)
    add("n-run-nan", g, "`exec.run` with a batch holding inf",
        code=api("import nanwl\nplan = autoplan.Plan.from_json('plan.json')\n"
                 "autoplan.exec.run(plan, nanwl.workload(abstract=False), steps=2)"),
        words=("NonFiniteError", "step 0 (of 2)", "batch['x'] (1 inf)", "the model's numbers"),
        setup=both(plan_file("plan.json"), raw_file("nanwl.py", NAN_MODULE)))
    add("n-run-unchecked", g, "`exec.run(..., check=False)` with a batch holding inf",
        code=api("import nanwl\nplan = autoplan.Plan.from_json('plan.json')\n"
                 "autoplan.exec.run(plan, nanwl.workload(abstract=False), check=False)"),
        words=("NonFiniteError", "One device gives the loss nan"),
        setup=both(plan_file("plan.json"), raw_file("nanwl.py", NAN_MODULE)))
    add("n-run-allowed", g, "`exec.run(..., allow_nonfinite=True)`",
        code=api("import nanwl\nplan = autoplan.Plan.from_json('plan.json')\n"
                 "r = autoplan.exec.run(plan, nanwl.workload(abstract=False), allow_nonfinite=True)\n"
                 "print(r.losses, bool(r.nonfinite))"), expect="ok",
        setup=both(plan_file("plan.json"), raw_file("nanwl.py", NAN_MODULE)))

    g = "probe"
    add("p-timeout-1", g, "`launch --timeout 1` (shorter than the preflight: importing JAX alone takes longer)",
        launch[:-1] + ["1"], words=("ran out in the preflight", "raise timeout="),
        setup=plan_file("plan.json"))
    add("p-hang", g, "a workload function that never returns (`--timeout 70`)",
        ["launch", "plan.json", "--model", "hang:workload", "--timeout", "70"],
        words=("the preflight hung", "loading the workload"),
        setup=both(plan_file("plan.json", setting("model", "hang:workload")),
                   raw_file("hang.py", HANG_MODULE)), timeout=150)
    add("p-cuda", g, "`launch --platform cuda` on a machine without a GPU",
        launch + ["--platform", "cuda"], words=("found no devices for cuda", "Fix:"),
        setup=plan_file("plan.json"))
    return out


# ---- running ----------------------------------------------------------------------------------
def _env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["JAX_PLATFORMS"] = "cpu"
    env.update(extra)
    return env


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if not path.is_symlink() else "link"
    except OSError:
        return None


def _marked(marker: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose environment holds ``marker``."""
    found = []
    needle = f"AUTOPLAN_FAULT_CASE={marker}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read():
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # a zombie is no longer running
        except OSError:
            continue
        found.append((int(entry), cmd))
    return found


def _workers(marker: str) -> list[tuple[int, str]]:
    return [(p, c) for p, c in _marked(marker) if "autoplan.exec._worker" in c]


def run_case(case: Case, fx: dict[str, Path], root: Path) -> Outcome:
    work = root / case.name
    tmp = work / "tmp"
    tmp.mkdir(parents=True)
    if case.setup is not None:
        case.setup(fx, work)
    before = {k: _digest(work / k) for k in case.keep}
    marker = uuid.uuid4().hex
    env = _env({"TMPDIR": str(tmp), "AUTOPLAN_FAULT_CASE": marker, **case.env})
    if case.code is not None and case.stdin:
        cmd = [PY, "-"]
    elif case.code is not None:
        cmd = [PY, "-c", case.code]
    elif case.signal_at and case.signal_at[0] == "ready":
        cmd = [PY, "-c", CLI_READY, *case.argv]
    else:
        cmd = [PY, "-m", "autoplan.cli", *case.argv]
    if case.limit is not None:
        cmd = ["bash", "-c", f"ulimit -f {case.limit}; exec \"$@\"", "bash", *cmd]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=work, env=env,
                            stdin=subprocess.PIPE if case.stdin else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    if case.stdin:
        proc.stdin.write(case.code.encode())
        proc.stdin.close()
    out_lines: list[bytes] = []
    err_lines: list[bytes] = []
    ready = threading.Event()

    def read(stream, sink, watch):
        for line in iter(stream.readline, b""):
            sink.append(line)
            if watch and line.decode(errors="replace").strip() == READY:
                ready.set()

    threads = [threading.Thread(target=read, args=(proc.stderr, err_lines, True), daemon=True)]
    if case.close_stdout:
        proc.stdout.close()
    else:
        threads.append(threading.Thread(target=read, args=(proc.stdout, out_lines, False), daemon=True))
    for t in threads:
        t.start()
    signalled = False
    if case.signal_at is not None:
        trigger, delay, sig = case.signal_at
        deadline = t0 + min(case.timeout, 120)
        if trigger == "ready":
            ready.wait(max(0.0, deadline - time.monotonic()))
        elif trigger == "workers":
            while time.monotonic() < deadline and proc.poll() is None and len(_workers(marker)) < 2:
                time.sleep(0.2)
        elif trigger == "children":  # the command, a search worker and multiprocessing's tracker
            while time.monotonic() < deadline and proc.poll() is None and len(_marked(marker)) < 3:
                time.sleep(0.1)
        time.sleep(delay)
        if proc.poll() is None:
            if case.to_worker:
                victims = [p for p, c in _workers(marker) if "--process-id 1" in c]
                for p in victims[:1]:
                    os.kill(p, sig)
                    signalled = True
            else:
                os.kill(proc.pid, sig)
                signalled = True
    hang = False
    try:
        proc.wait(timeout=max(1.0, case.timeout - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        hang = True
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    seconds = time.monotonic() - t0
    # processes left behind (they may hold the command's pipes: the readers are joined after): launch workers get a grace period to notice their launcher's end
    grace = case.grace if case.grace is not None else 10.0 if case.group == "launch" else 0.5
    end = time.monotonic() + grace
    while _marked(marker) and time.monotonic() < end:
        time.sleep(0.25)
    left = _marked(marker)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    end = time.monotonic() + 5.0
    while left and _marked(marker) and time.monotonic() < end:  # until the kills have landed
        time.sleep(0.05)
    for t in threads:
        t.join(timeout=5)
    folders = [p for p in tmp.iterdir() if p.name.startswith("autoplan-launch-")]
    changed = [k for k, v in before.items() if _digest(work / k) != v]
    changed += [f"{k} (written)" for k in case.absent if (work / k).exists()]
    exposed = [f"{p.relative_to(work)} is {oct(stat.S_IMODE(p.lstat().st_mode))}"
               for pattern in case.private for p in sorted(work.glob(pattern))
               if stat.S_IMODE(p.lstat().st_mode) & 0o077]
    exposed += [f"planted code ran ({k} made)" for k in case.planted if (work / k).exists()]
    status = proc.returncode
    res = Outcome(case, status, seconds, b"".join(out_lines).decode(errors="replace"),
                  b"".join(err_lines).decode(errors="replace"), hang=hang, changed=changed,
                  orphans=len(left), folders=len(folders), signalled=signalled, marker=marker,
                  exposed=exposed)
    classify(res)
    return res


# ---- verdicts ---------------------------------------------------------------------------------
_ERROR_LINE = re.compile(r"^autoplan(?: [\w-]+)?: (?:error|interrupted)\b.*$", re.M)
_WARNING_LINE = re.compile(r"^(?:autoplan: warning: .*|.*\w+Warning: .*)$", re.M)


def classify(res: Outcome) -> None:
    """Fill ``res.verdicts`` (every problem found, or the one expected outcome) and ``res.seen``."""
    case, err = res.case, res.stderr.replace(READY + "\n", "")
    v: list[str] = []
    killed_by_us = res.signalled and case.signal_at is not None and case.signal_at[2] == signal.SIGKILL \
        and not case.to_worker
    if res.hang:
        v.append("hang")
    if "Traceback (most recent call last)" in err or "Traceback (most recent call last)" in res.stdout:
        v.append("traceback")
    if res.status is not None and res.status < 0 and not killed_by_us:
        v.append("process abort")
    if res.changed:
        v.append("data lost")
    if res.orphans or res.folders:
        v.append("left behind")
    if res.exposed:
        v.append("exposure")
    error = _ERROR_LINE.search(err)
    warning = _WARNING_LINE.search(err)
    has_words = all(w in err for w in case.words)
    if not v:
        if case.expect in ("error", "interrupted"):
            if res.status == 0:
                v.append("silently accepted")
            elif error and has_words and (case.expect == "error" or res.status == 128 + case.signal_at[2]):
                v.append("clear error")
            else:
                v.append("unclear error")
        elif case.expect == "warning":
            if res.status == 0 and warning and has_words:
                v.append("warned fallback")
            elif res.status == 0:
                v.append("silently accepted")
            else:
                v.append("unclear error")
        elif case.expect == "killed":
            v.append("ok" if killed_by_us else "unclear error")
        else:
            v.append("ok" if res.status in case.ok_status else "unclear error")
    res.verdicts = v
    if "traceback" in v:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        res.seen = "traceback: " + (lines[-1] if lines else "")
    elif error:
        res.seen = error.group(0)
    elif warning:
        res.seen = warning.group(0).strip()
    elif case.expect == "killed":
        res.seen = "(killed; nothing printed)"
    else:
        last = [ln for ln in res.stdout.splitlines() if ln.strip()]
        res.seen = f"exit {res.status}" + (f": {last[-1].strip()}" if last else "")
    if res.orphans or res.folders:
        res.seen += f" [left behind: {res.orphans} process(es), {res.folders} launch folder(s)]"
    if res.changed:
        res.seen += f" [changed: {', '.join(res.changed)}]"
    if res.exposed:
        res.seen += f" [exposed: {', '.join(res.exposed)}]"


def counts(results: list[Outcome]) -> dict[str, int]:
    c = collections.Counter(v for r in results for v in r.verdicts)
    return {"tried": len(results), **{k: c.get(k, 0) for k in VERDICTS}}


# ---- output -----------------------------------------------------------------------------------
def _cell(text: str, n: int = 170) -> str:
    text = " ".join(text.split())
    text = text if len(text) <= n else text[: n - 3] + "..."
    return text.replace("|", "\\|")


def markdown(results: list[Outcome], machine: str) -> str:
    c = counts(results)
    lines = [f"Run of `python benchmarks/faults.py` on {machine}.", "",
             "| count | cases |", "|---|---|"]
    for k, n in c.items():
        target = " (target 0)" if k in BAD else ""
        lines.append(f"| {k}{target} | {n} |")
    lines += ["", "| # | group | bad input or fault | what the user sees | exit | s | verdict |",
              "|---|---|---|---|---|---|---|"]
    for k, r in enumerate(results, 1):
        lines.append(f"| {k} | {r.case.group} | {_cell(r.case.what, 90)} | `{_cell(r.seen, 320)}` | "
                     f"{r.status} | {r.seconds:.1f} | {', '.join(r.verdicts)} |")
    return "\n".join(lines) + "\n"


def update_page(path: Path, table: str) -> None:
    text = path.read_text() if path.exists() else ""
    begin, end = "<!-- faults:begin -->", "<!-- faults:end -->"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{begin}\n{table}{end}{tail}"
    else:
        text = f"{text}\n{begin}\n{table}{end}\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=None, help="regular expression over case names and groups")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--markdown", default=None, help="rewrite the table between the markers of this page")
    ap.add_argument("--keep", action="store_true", help="keep the cases' folders")
    args = ap.parse_args(argv)
    todo = [c for c in cases() if not args.only or re.search(args.only, f"{c.group} {c.name}")]
    if args.list:
        for c in todo:
            print(f"{c.name:<18} {c.group:<10} {c.expect:<12} {c.what}")
        return 0
    root = Path(tempfile.mkdtemp(prefix="autoplan-faults-"))
    try:
        fx = make_fixtures(root)
        results = []
        print(f"{'#':>3}  {'case':<18} {'exit':>5} {'s':>6}  verdict: what the user sees", flush=True)
        for k, case in enumerate(todo, 1):
            r = run_case(case, fx, root)
            results.append(r)
            print(f"{k:>3}  {case.name:<18} {r.status!s:>5} {r.seconds:>6.1f}  {', '.join(r.verdicts)}: "
                  f"{_cell(r.seen, 140)}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    c = counts(results)
    print("\n" + ", ".join(f"{k} {n}" for k, n in c.items()))
    machine = (f"{datetime.date.today().isoformat()}, {platform.machine()} {os.cpu_count()} cores, "
               f"Python {platform.python_version()}, load average "
               f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    if args.markdown:
        update_page(Path(args.markdown), markdown(results, machine))
        print(f"table written to {args.markdown}")
    return 0 if all(c[k] == 0 for k in BAD) else 1


if __name__ == "__main__":
    sys.exit(main())
