"""Signals that never land inside an import.

The command line turns SIGINT, SIGTERM and SIGHUP into an exception in the main thread, so that
``finally`` blocks run and no output is half written. An exception raised while a module is
being imported is another matter: JAX's extension modules (nanobind) initialise by calling back
into Python, and an exception thrown through their C++ start-up code ended the process with
``terminate called after throwing an instance of 'nanobind::python_error'`` (SIGABRT, exit 134)
or a segmentation fault (139); NumPy turned one into an ``ImportError`` with its own traceback.

So a handler asks :func:`unsafe` first: when the interrupted frame runs under an extension
module's start-up (a frame of ``ExtensionFileLoader.create_module`` or ``exec_module`` on its
stack: the Python code that a C or C++ module's initialisation imports or calls), the handler
notes the signal and returns, and :func:`redeliver` sends the same signal to the process again a
moment later, until it lands outside, where the handler raises. An exception in a pure-Python
import unwinds as any other (the import machinery removes the half-made module), so the wait is
only as long as the extension's start-up, not the whole import of JAX. The signal is never
lost: a command that ends first checks the noted signal before writing anything.
"""

from __future__ import annotations

import os
import threading
from types import FrameType

__all__ = ["unsafe", "redeliver", "disarm", "RETRY_SECONDS"]

#: the delay before a deferred signal is sent again
RETRY_SECONDS = 0.05
_LOADER_FILE = "<frozen importlib._bootstrap_external>"
_EXTENSION_START = ("ExtensionFileLoader.create_module", "ExtensionFileLoader.exec_module")
_lock = threading.Lock()
_generation = 0


def unsafe(frame: FrameType | None) -> bool:
    """True when ``frame`` (where a signal interrupted the main thread) runs under an extension
    module's initialisation, where an exception would unwind through its C or C++ start-up
    code."""
    depth = 0
    while frame is not None and depth < 10_000:
        code = frame.f_code
        if code.co_filename == _LOADER_FILE and (
                getattr(code, "co_qualname", code.co_name) in _EXTENSION_START):
            return True
        frame = frame.f_back
        depth += 1
    return False


def redeliver(signum: int) -> None:
    """Send ``signum`` to this process again after :data:`RETRY_SECONDS`, unless
    :func:`disarm` is called first (the handler that would receive it was put away)."""
    with _lock:
        generation = _generation

    def again() -> None:
        with _lock:
            if generation != _generation:
                return
        try:
            os.kill(os.getpid(), signum)
        except OSError:  # pragma: no cover - a process may always signal itself
            pass

    timer = threading.Timer(RETRY_SECONDS, again)
    timer.daemon = True
    timer.name = "autoplan-signal-retry"
    timer.start()


def disarm() -> None:
    """Cancel every pending :func:`redeliver` (called when the handlers are restored)."""
    global _generation
    with _lock:
        _generation += 1
