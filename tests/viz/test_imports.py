"""viz only reads plans: importing it and drawing loads neither autoplan.exec nor autoplan.search."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def test_viz_imports_neither_exec_nor_search():
    code = ("import sys, autoplan.viz\n"
            "print(sorted(m for m in sys.modules if m.startswith(('autoplan.exec', 'autoplan.search'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2], env={"JAX_PLATFORMS": "cpu",
                                                                       "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]"


# the figure and report modules; the explorer widget (the package explorer/) is checked by its
# own tests
FIGURE_MODULES = ("__init__", "_style", "_sharding", "_timeline", "_compare", "_graph_figure", "_report",
                  "_notebook")


def test_figure_modules_do_not_import_exec_or_search():
    src = Path(__file__).resolve().parents[2] / "autoplan" / "viz"
    bad = re.compile(r"^\s*(from|import)\s+(autoplan\.|\.\.)(exec|search)\b", re.M)
    for name in FIGURE_MODULES:
        assert not bad.search((src / f"{name}.py").read_text()), f"{name}.py imports exec or search"
