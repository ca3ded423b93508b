"""Cyclic garbage collection paused while a search or a trace runs in the main thread.

A search allocates hundreds of thousands of small objects (strategies, spec tuples, ILP rows) and
keeps most of them until it returns; the cyclic collector would walk them all again and again
for nothing (a quarter of a 96-layer folded search). A trace is the same: ``jax.make_jaxpr``
keeps every traced equation until the jaxpr is done, and the graph keeps every operator (the
collector took a third of GPT-3 175B's 4.2 s trace, for 4 MiB more peak memory without it).
Reference counting still frees everything acyclic at once; cycles are left to the collector once
it resumes.

The collector is one per process, so the pause is scoped with care:

* it applies only to a search called from the main thread, where the caller waits for it; a
  search in another thread leaves the collector alone, since the user's own code may keep
  running beside it and would otherwise lose cyclic collection for the search's whole
  duration. The Explorer's background searches and what-ifs are the exception: they pause it
  explicitly (:func:`paused`), since the notebook waits for them (the collector took 4.5 s of
  a 13 s memory-budget change on GPT 39B, walking the traced step and the layer plans kept
  across searches);
* nested or overlapping paused calls (in any threads) share one pause: the collector is
  disabled when the first starts and restored when the last returns or raises, to the state it
  had before, so a collector the user disabled stays disabled;
* when the outermost call restores the collector, what the pause made and kept is moved to the
  oldest generation at once, without a walk (``gc.freeze()`` then ``gc.unfreeze()``: two list
  splices). Left in the young generation, the first allocation after the call would make the
  caller's next statement walk it all (0.12 s after tracing GPT-3 175B's 38,860 operators, 0.07 s
  after a folded search of 96 layers), and walk it again in the middle generation; a collection
  of the young and middle generations at the end costs the same walk, and finds nothing: a trace
  and a search leave no cyclic garbage (tested), since reference counting frees what they drop.
  Cycles a call does leave (a user's step function may make some; an error's traceback) are
  collected with the oldest generation. Where the user has frozen objects of their own
  (``gc.freeze()``), the young and middle generations are collected instead, so that those stay
  frozen.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

F = TypeVar("F", bound=Callable)

_depth = 0
_was_enabled = False
_lock = threading.Lock()  # (the pause is the process's: threads that pause share it)


def _pause(any_thread: bool = False) -> bool:
    """Start (or join) the pause; False when this thread does not pause the collector (a thread
    other than the main one, unless ``any_thread``)."""
    global _depth, _was_enabled
    if not any_thread and threading.current_thread() is not threading.main_thread():
        return False
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    return True


def _resume() -> None:
    global _depth
    with _lock:
        _depth -= 1
        if _depth == 0 and _was_enabled:
            gc.enable()
            if gc.get_freeze_count():
                gc.collect(1)
            else:  # every tracked object to the oldest generation (see the module docstring)
                gc.freeze()
                gc.unfreeze()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The pause, from whichever thread enters it (the Explorer's background searches, which
    the notebook waits for); shared with every other pause, restored when the last ends."""
    _pause(any_thread=True)
    try:
        yield
    finally:
        _resume()


def gc_paused(fn: F) -> F:
    """Decorate ``fn`` to run with the cyclic garbage collector disabled when it is called from
    the main thread (nesting is safe; other threads run it with the collector as it is)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        paused = _pause()
        try:
            return fn(*args, **kwargs)
        finally:
            if paused:
                _resume()

    return wrapper  # type: ignore[return-value]
