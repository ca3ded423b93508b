"""Warnings raised where the user sees them: at the user's own line, once per message."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterable

__all__ = ["user_stacklevel", "raise_again"]


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning point at the first caller outside autoplan (the
    user's line), counted from the function that calls this one."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("autoplan"):
        frame, level = frame.f_back, level + 1
    return level


def raise_again(recorded: Iterable[tuple[type[Warning], str]]) -> None:
    """Raise recorded warnings (``(category, message)``: from worker processes, or stored with a
    cached result) again at the user's line, each distinct one once."""
    for category, message in dict.fromkeys(recorded):
        warnings.warn(message, category, stacklevel=user_stacklevel())
