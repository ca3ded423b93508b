"""Cyclic garbage collection paused while a search runs.

A search allocates hundreds of thousands of small objects (strategies, spec tuples, ILP rows) and
keeps most of them until it returns; the cyclic collector would walk them all again and again
for nothing (a quarter of a 96-layer folded search). Reference counting still frees everything
acyclic at once; the collector resumes, as it was, when the search returns or raises.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)


def gc_paused(fn: F) -> F:
    """Decorate ``fn`` to run with the cyclic garbage collector disabled (nesting is safe)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()

    return wrapper  # type: ignore[return-value]
