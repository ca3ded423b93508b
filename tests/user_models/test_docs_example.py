"""The user-model example of docs/getting_started.md runs as written (searched, run matched,
applied in the user's own jax.jit loop)."""

from __future__ import annotations

import pathlib
import re
import warnings

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "getting_started.md"


def test_the_nnx_example_of_getting_started_runs(capsys):
    text = DOC.read_text()
    section = text[text.index("## Your own model"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "autoplan.Workload(train_step" in code and "named_shardings()" in code
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 - the documented example
    out = capsys.readouterr().out
    assert "matched" in out and "parameter" in out and "optimizer_state" in out
    loss = float(out.strip().splitlines()[-1])
    assert 0.0 < loss < 10.0  # three steps of the user's own loop, from a loss of about log(64)
