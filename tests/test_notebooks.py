"""The notebooks in notebooks/ run top to bottom in a fresh ``python3`` kernel without an error.

Each notebook asserts its own claims (the Wide-ResNet reading, the launch matching single-device
results), so a failing claim fails here too. Executed with nbclient, as ``jupyter nbconvert
--execute`` would; the outputs are not written back.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

# (found, not imported: nbformat, nbclient and ipykernel take seconds to import, paid by every
# pytest worker that collects this module, while one runs it)
_MISSING = [m for m in ("nbformat", "nbclient", "ipykernel") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"not installed: {_MISSING}")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}
CELL_TIMEOUT = 1200  # seconds per cell: a search or a launch on 2 shared CPU cores


def ensure_python3_kernel() -> None:
    """Install this interpreter's ipykernel as kernel ``python3`` in its prefix if it is not."""
    if not (Path(sys.prefix) / "share" / "jupyter" / "kernels" / "python3" / "kernel.json").exists():
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3"],
                       check=True, capture_output=True)


@pytest.fixture(scope="module")
def kernel():
    ensure_python3_kernel()
    return "python3"


def execute(path: Path, kernel_name: str):
    import nbclient  # noqa: PLC0415
    import nbformat  # noqa: PLC0415

    nb = nbformat.read(path, as_version=4)
    # the kernel inherits JAX_PLATFORMS=cpu from the root conftest.py
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name=kernel_name,
                                     allow_errors=False, store_widget_state=False,
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return nb


def text_of(cell) -> str:
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append(o.get("text", ""))
        elif "data" in o:
            out.append(o["data"].get("text/plain", ""))
            out.append(o["data"].get("text/html", ""))
    return "".join(out)


NAMES = ["01_explore.ipynb", "02_wide_resnet.ipynb", "03_launch.ipynb"]


@pytest.mark.parametrize("name", NAMES)
def test_notebook_metadata(name):
    import nbformat  # noqa: PLC0415

    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec") == KERNELSPEC  # without it JupyterLab asks for a kernel
    first = nb.cells[0]
    assert first.cell_type == "code"
    assert 'jax.config.update("jax_num_cpu_devices", 8)' in first.source
    assert "set_notebook_renderer()" in first.source
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit notebooks without outputs"


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(name, kernel):
    t0 = time.perf_counter()
    nb = execute(NOTEBOOKS / name, kernel)
    seconds = time.perf_counter() - t0
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.outputs if o.get("output_type") == "error"]
    assert not errors
    everything = "\n".join(text_of(c) for c in code)
    if name == "01_explore.ipynb":
        assert "baseline" in everything and "step ms" in everything  # the result's table
        assert "Plotly.newPlot" in everything  # the static comparison figure
        widget_views = [o for c in code for o in c.outputs
                        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
        assert widget_views, "the explorer was not displayed"
        # after the widget, its static snapshot for front ends without the kernel: the search's
        # last state (the explorer writes it into the output as it changes)
        snapshot = next(text_of(c) for c in code if "class='autoplan-static'" in text_of(c))
        assert "\u2605 best" in snapshot and "where the step time goes" in snapshot
    elif name == "02_wide_resnet.ipynb":
        assert "Operator sharding of wide_resnet" in everything
    elif name == "03_launch.ipynb":
        assert "matched single-device results: True" in everything
    print(f"{name}: {seconds:.1f} s")
