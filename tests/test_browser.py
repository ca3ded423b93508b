"""The explorer in a real browser: JupyterLab serving a copy of notebooks/, driven by headless
Chromium through Playwright.

Opens ``01_explore.ipynb``, runs every cell, waits for the explorer's search, switches the
candidate and checks that the page's plotly figures changed in place, selects a stage and checks
the highlight, clicks Launch and waits for the finished run's loss and its single-device check.
Screenshots go to ``artifacts/browser/``; with ``AUTOPLAN_UPDATE_DOCS=1`` (or when missing) they
are copied to ``docs/img/explorer.png`` and ``docs/img/explorer-pipeline.png`` for the docs.
Skipped only when Debian's Chromium (``/usr/bin/chromium``) is missing; CI installs it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts" / "browser"
DOCS_IMG = ROOT / "docs" / "img"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SEARCH_TIMEOUT = 900  # ms below are * 1000
LAUNCH_TIMEOUT = 900

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"Debian's Chromium is not installed ({CHROMIUM} is missing); "
                              "install it with 'apt-get install -y chromium' (.ci/run does)"),
]


def ensure_python3_kernel() -> None:
    """Install this interpreter's ipykernel as kernel ``python3`` in its prefix if it is not."""
    if not (Path(sys.prefix) / "share" / "jupyter" / "kernels" / "python3" / "kernel.json").exists():
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3"],
                       check=True, capture_output=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, method: str = "GET", timeout: float = 5.0):
    req = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
    return json.loads(body) if body else None


def stop(proc: subprocess.Popen, base: str | None) -> None:
    """Shut down the server's kernels (they run in their own sessions), then the server's group."""
    if proc.poll() is None and base is not None:
        try:
            for k in http(f"{base}/api/kernels"):
                http(f"{base}/api/kernels/{k['id']}", method="DELETE", timeout=30)
        except Exception:  # noqa: BLE001 - the server may already be gone; killed below
            pass
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            pass


@pytest.fixture
def jupyterlab(tmp_path):
    """A JupyterLab server on 127.0.0.1 serving a temporary copy of notebooks/; yields its URL."""
    ensure_python3_kernel()
    root = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", root)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    # fresh user settings: render every cell (no windowing, so off-screen outputs are in the
    # DOM), and no "get notified about news?" toast
    settings = tmp_path / "settings"
    for plugin, values in (("notebook-extension/tracker", {"windowingMode": "none"}),
                           ("apputils-extension/notification", {"fetchNews": "false"})):
        f = settings / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(values))
    port = free_port()
    jupyter = Path(sys.executable).with_name("jupyter")
    cmd = [str(jupyter), "lab"] if jupyter.exists() else [sys.executable, "-m", "jupyterlab"]
    cmd += ["--no-browser", "--ip=127.0.0.1", f"--port={port}", "--ServerApp.token=",
            "--ServerApp.password=", "--LabApp.expose_app_in_browser=True",
            f"--ServerApp.root_dir={root}", f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
            f"--LabApp.user_settings_dir={settings}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    log = open(ARTIFACTS / "jupyterlab.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {proc.returncode}:\n"
                                   f"{(ARTIFACTS / 'jupyterlab.log').read_text()[-3000:]}")
            try:
                http(f"{base}/api/status", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        yield base
    finally:
        stop(proc, base)
        log.close()


@pytest.fixture
def page():
    from playwright.sync_api import sync_playwright  # noqa: PLC0415

    with sync_playwright() as pw:
        profile = Path(os.environ.get("TMPDIR", "/tmp")) / f"autoplan-chromium-{os.getpid()}-{time.time_ns()}"
        ctx = pw.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1500, "height": 1100})
        try:
            pg = ctx.new_page()
            console: list[str] = []
            pg.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            pg.console_messages = console  # type: ignore[attr-defined]
            yield pg
        finally:
            ctx.close()
            shutil.rmtree(profile, ignore_errors=True)


FIGS_JS = """() => Array.from(document.querySelectorAll('.autoplan-explorer .js-plotly-plot')).map(el => ({
    title: (el.layout && el.layout.title && el.layout.title.text) || '',
    n: (el.data || []).length,
    data: JSON.stringify((el.data || []).map(t => [t.type, t.name, t.x, t.y, t.fillcolor, t.meta,
                                                 t.marker && t.marker.symbol])),
    dimmed: (el.data || []).filter(t => t.opacity !== undefined && t.opacity < 1).length,
    highlights: ((el.layout && el.layout.shapes) || []).filter(s => s.name === 'highlight').length,
    y0: (el.data && el.data[0] && el.data[0].y) ? Array.from(el.data[0].y) : []}))"""

KERNEL_IDLE_JS = """() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
    return !!k && k.status === 'idle'; }"""


ALL_RAN_JS = """() => { const cells = window.jupyterapp.shell.currentWidget.content.model.cells;
    for (let i = 0; i < cells.length; i++) {
        const c = cells.get(i);
        if (c.type === 'code' && !c.executionCount) return false; }
    return true; }"""

OUTPUTS_JS = """() => { const cells = window.jupyterapp.shell.currentWidget.content.model.cells, out = [];
    for (let i = 0; i < cells.length; i++) {
        const c = cells.get(i);
        if (c.type === 'code') out.push(JSON.stringify(c.outputs.toJSON()).slice(0, 20000)); }
    return out; }"""


def figures(page) -> dict[str, dict]:
    out = {}
    for f in page.evaluate(FIGS_JS):
        for key, prefix in (("sharding", "Operator sharding"), ("stage", "Stages on the cluster"),
                            ("timeline", "Pipeline timeline"), ("compare", "Comparing"),
                            ("launch", "launch")):
            if f["title"].startswith(prefix):
                out[key] = f
    return out


def explorer_text(page) -> str:
    return page.locator(".autoplan-explorer").inner_text()


def dropdown(page, description: str):
    return page.locator(".autoplan-explorer .widget-dropdown",
                        has=page.locator("label", has_text=description)).locator("select")


def shoot(page, name: str, docs_copy: Path) -> None:
    """Screenshot the whole explorer on a viewport tall enough to hold it; copy it for the docs."""
    size = page.viewport_size
    height = page.evaluate("() => document.querySelector('.autoplan-explorer').scrollHeight")
    page.set_viewport_size({"width": size["width"], "height": int(height) + 400})
    page.wait_for_timeout(1500)
    page.locator(".autoplan-explorer").scroll_into_view_if_needed()
    shot = ARTIFACTS / name
    page.locator(".autoplan-explorer").screenshot(path=str(shot))
    assert shot.stat().st_size > 50_000
    if os.environ.get("AUTOPLAN_UPDATE_DOCS") == "1" or not docs_copy.exists():
        # the docs' copy is tracked by git: refreshed on request only, so test runs leave the
        # work tree clean (AUTOPLAN_UPDATE_DOCS=1 pytest tests/test_browser.py)
        docs_copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, docs_copy)
    page.set_viewport_size(size)
    page.wait_for_timeout(500)


def test_explorer_in_jupyterlab(jupyterlab, page):
    t0 = time.monotonic()
    timings = {}
    try:
        page.goto(f"{jupyterlab}/lab/tree/01_explore.ipynb")
        page.wait_for_function("() => window.jupyterapp && document.querySelector('.jp-Notebook')",
                               timeout=180_000)
        page.wait_for_function(KERNEL_IDLE_JS, timeout=180_000)  # no kernel dialog: kernelspec set
        timings["lab ready"] = time.monotonic() - t0
        page.evaluate("window.jupyterapp.commands.execute('application:toggle-left-area')")
        page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_selector(".autoplan-explorer", timeout=180_000)
        page.wait_for_function(
            "() => document.querySelector('.autoplan-explorer').innerText.includes('plans for gpt (tiny) on cpu:8')",
            timeout=SEARCH_TIMEOUT * 1000)
        timings["search done"] = time.monotonic() - t0
        # the rest of the notebook (table, static comparison) ran and the kernel is free again
        page.wait_for_function(KERNEL_IDLE_JS, timeout=300_000)
        page.wait_for_function(ALL_RAN_JS, timeout=60_000)
        outputs = page.evaluate(OUTPUTS_JS)
        assert "step ms" in outputs[2] and "baseline" in outputs[2], outputs[2][:2000]
        assert not any("Traceback" in o for o in outputs), outputs
        assert "failed" not in explorer_text(page)

        before = figures(page)
        assert set(before) == {"sharding", "stage", "timeline", "compare", "launch"}, before.keys()
        n_plots = page.locator(".autoplan-explorer .js-plotly-plot").count()
        assert n_plots == 5
        # switch to another candidate: a pipeline plan when there is one
        select = dropdown(page, "candidate")
        # (ipywidgets writes option labels with non-breaking spaces)
        options = [o.replace("\xa0", " ") for o in select.locator("option").all_inner_texts()]
        assert len(options) >= 3 and any("baseline" in o for o in options), options
        k = next((i for i, o in enumerate(options) if "stages (" in o), None) or next(
            i for i, o in enumerate(options[1:], 1) if o.split(":", 1)[1] != options[0].split(":", 1)[1])
        target = options[k]
        select.select_option(index=k)
        label = target.split(". ", 1)[1].split(":", 1)[0]
        page.wait_for_function(
            """(label) => Array.from(document.querySelectorAll('.autoplan-explorer .js-plotly-plot'))
                 .some(el => el.layout && el.layout.title && el.layout.title.text.startsWith('Operator sharding')
                             && el.layout.title.text.includes('[' + label + ']'))
                 && document.querySelector('.autoplan-explorer').innerText.includes('plan [' + label + ']')""",
            arg=label, timeout=120_000)
        page.wait_for_timeout(1500)  # let the other figures' updates land too
        after = figures(page)
        assert page.locator(".autoplan-explorer .js-plotly-plot").count() == n_plots  # updated in place
        assert after["sharding"]["data"] != before["sharding"]["data"]
        assert f"[{label}]" in after["sharding"]["title"]
        if "stages (" in target:
            assert after["stage"]["data"] != before["stage"]["data"]
            assert after["timeline"]["title"] != before["timeline"]["title"]
            assert after["timeline"]["n"] > before["timeline"]["n"]
        assert after["compare"]["data"] != before["compare"]["data"]  # the star moved
        timings["candidate changed"] = time.monotonic() - t0

        # select the last stage (or a layer) with the layer dropdown: the other views highlight it
        focus = dropdown(page, "layer")
        choices = [c.replace("\xa0", " ") for c in focus.locator("option").all_inner_texts()]
        focus.select_option(index=max(i for i, c in enumerate(choices) if c.startswith("stage ")))
        page.wait_for_function(
            """() => Array.from(document.querySelectorAll('.autoplan-explorer .js-plotly-plot'))
                 .some(el => ((el.layout && el.layout.shapes) || []).some(s => s.name === 'highlight'))""",
            timeout=60_000)
        if "stages (" in target:
            # the timeline's update is its own message after the sharding view's: wait for it
            page.wait_for_function(
                """() => Array.from(document.querySelectorAll('.autoplan-explorer .js-plotly-plot'))
                     .some(el => el.layout && el.layout.title && el.layout.title.text
                                 && el.layout.title.text.startsWith('Pipeline timeline')
                                 && (el.data || []).some(t => t.opacity !== undefined && t.opacity < 1))""",
                timeout=60_000)
        lit = figures(page)
        assert lit["sharding"]["highlights"] >= 1
        assert "selected stage" in explorer_text(page)
        if "stages (" in target:
            assert lit["sharding"]["dimmed"] > 0 and lit["timeline"]["dimmed"] > 0

        shoot(page, "explore_pipeline.png", DOCS_IMG / "explorer-pipeline.png")

        # back to the best plan (intra-operator: autoplan.exec runs it on 2 processes x 4 devices),
        # select one of its layers, and launch it
        select.select_option(index=0)
        best = options[0].split(". ", 1)[1].split(":", 1)[0]
        page.wait_for_function(
            """(label) => Array.from(document.querySelectorAll('.autoplan-explorer .js-plotly-plot'))
                 .some(el => el.layout && el.layout.title && el.layout.title.text.startsWith('Operator sharding')
                             && el.layout.title.text.includes('[' + label + ']'))""",
            arg=best, timeout=120_000)
        choices = [c.replace("\xa0", " ") for c in focus.locator("option").all_inner_texts()]
        focus.select_option(index=next(i for i, c in enumerate(choices) if "layers_0" in c))
        page.wait_for_function("() => document.querySelector('.autoplan-explorer').innerText"
                               ".includes('selected layer')", timeout=60_000)
        assert figures(page)["sharding"]["dimmed"] > 0
        page.locator(".autoplan-explorer button", has_text="Launch").click()
        page.wait_for_function(
            "() => document.querySelector('.autoplan-explorer').innerText.includes('launch finished')"
            " || document.querySelector('.autoplan-explorer').innerText.includes('launch failed')",
            timeout=LAUNCH_TIMEOUT * 1000)
        page.wait_for_timeout(1500)
        timings["launch done"] = time.monotonic() - t0
        text = explorer_text(page)
        assert "launch failed" not in text, text[-3000:]
        result = page.locator(".autoplan-launch-result").inner_text()
        assert "2 processes x 4 emulated CPU devices" in result, result
        assert "final loss" in result and "matched single-device results" in result, result
        loss = float(result.split("final loss", 1)[1].split(";", 1)[0])
        assert 0 < loss < 20
        assert len(figures(page)["launch"]["y0"]) == 5  # the loss curve of the default 5 steps
        table = page.locator(".autoplan-launch-table").inner_text()
        assert f"{loss:.6f}" in table
        shoot(page, "explore.png", DOCS_IMG / "explorer.png")
    finally:
        try:
            page.screenshot(path=str(ARTIFACTS / "last_page.png"))
        except Exception:  # noqa: BLE001 - best effort for debugging
            pass
        (ARTIFACTS / "console.log").write_text("\n".join(getattr(page, "console_messages", [])))
        (ARTIFACTS / "timings.json").write_text(json.dumps(timings, indent=1))
