"""docs/explorer.md matches the code: the documented constructor is ``Explorer``'s signature
(names, keyword-only marker and defaults), the figures it names are ``FIGURES`` in order and in
number, and the controls' levels are ``LEVELS`` with the documented default."""

from __future__ import annotations

import inspect
import pathlib
import re

from autoplan.viz._explorer import FIGURES, LEVELS, Explorer

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "explorer.md"
WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def documented_signature(text: str) -> str:
    m = re.search(r"\| `Explorer\((.*?)\)` \|", text)
    assert m, "docs/explorer.md has no Explorer(...) row in its 'From code' table"
    return m.group(1)


def code_signature() -> str:
    out = []
    star = False
    for p in inspect.signature(Explorer).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            out.append("*")
            star = True
        out.append(f"{p.name}={p.default!r}".replace("'", '"'))
    return ", ".join(out)


def test_the_documented_signature_is_the_codes():
    assert documented_signature(DOC.read_text()) == code_signature()


def test_the_documented_figures_are_the_codes():
    text = DOC.read_text()
    m = re.search(r"the (\w+) figures by name \(`PlotView`s\): ((?:`\w+`(?:, )?)+)", text)
    assert m, "docs/explorer.md does not list the figures by name"
    assert m.group(1) == WORDS[len(FIGURES)]
    assert tuple(re.findall(r"`(\w+)`", m.group(2))) == FIGURES
    # no other count of figures or plotly FigureWidgets anywhere on the page
    counts = set(re.findall(r"\b(\w+) (?:figures|views|FigureWidgets)\b", text)) & set(WORDS.values())
    assert counts <= {WORDS[len(FIGURES)]}, counts
    assert "FigureWidget" not in text


def test_the_documented_levels_and_default_are_the_codes():
    text = DOC.read_text()
    m = re.search(r"`level` is the search\s+level \(([^)]*)\)", text)
    assert m
    levels = re.findall(r"`(\w+)`", m.group(1))
    assert set(levels) == set(LEVELS)
    default = inspect.signature(Explorer).parameters["level"].default
    assert f"`{default}`, the default" in m.group(1)
