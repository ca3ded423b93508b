"""Output files: checked before any work, written atomically.

Every file autoplan writes (plans, HTML reports, and every ``-o`` of the command line) goes
through this module, for two guarantees:

* **Checked first.** :func:`check_output_path` refuses, before a search or a report starts, a path
  whose folder is missing or not writable, a path that is a folder, a read-only file, and a path
  that is one of the command's input files (``autoplan report plan.json -o plan.json``), resolving
  symbolic links and hard links (the same file under another name).
* **Atomic.** :func:`atomic_write_bytes` / :func:`atomic_write_text` write a temporary file in the
  target's folder, flush it to disk (``fsync``), then rename it over the target (``os.replace``,
  atomic on POSIX and Windows) and flush the folder entry. An interrupted write (Ctrl-C,
  SIGTERM, a full disk, a file-size limit) leaves the old file as it was, never a partial or empty
  one, and removes the temporary file. A target reached through a symbolic link is written
  through it (the link stays a link); a new file gets the usual permissions (``0o666`` less the
  umask) and a replaced file keeps its own. Special files (``/dev/null``, a named pipe) are
  written in place, since they cannot be renamed over.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterable

from ._errors import OutputError

__all__ = ["check_output_path", "atomic_write_bytes", "atomic_write_text", "same_file"]

PathLike = str | os.PathLike


def _fspath(path: PathLike, what: str) -> str:
    try:
        p = os.fspath(path)
    except TypeError:
        raise OutputError(f"{what} should be a file path (str or os.PathLike). Got "
                          f"{type(path).__name__}: {path!r:.80}. Fix: pass a path such as "
                          "'plan.json'.") from None
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if not p or "\0" in p:
        raise OutputError(f"{what} should be a non-empty file path. Got {p!r}. Fix: pass a path "
                          "such as 'plan.json'.")
    return p


def _is_special(path: str) -> bool:
    """An existing file that is neither regular nor a folder (a device, a named pipe)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def same_file(a: PathLike, b: PathLike) -> bool:
    """True when ``a`` and ``b`` name the same file: equal after resolving symbolic links, or the
    same inode (hard links, bind mounts)."""
    ra, rb = os.path.realpath(os.fspath(a)), os.path.realpath(os.fspath(b))
    if ra == rb:
        return True
    try:
        return os.path.samefile(ra, rb)
    except OSError:
        return False


def check_output_path(path: PathLike, *, what: str = "output file",
                      inputs: Iterable[PathLike] = (), example: str = "plan.json") -> str:
    """Check, before any work, that ``path`` can be written and destroys no input.

    Args:
        path: the output path.
        what: how the message names it (``"-o"``, ``"report path"``).
        inputs: the command's input files; the output may be none of them.
        example: a file name the message suggests when ``path`` is a folder.

    Returns:
        ``path`` as a string.

    Raises:
        OutputError: the folder is missing, not a folder or not writable; ``path`` is a folder
            or a read-only file; or it is one of ``inputs`` (also through a link).
    """
    p = _fspath(path, what)
    for inp in inputs:
        if os.path.exists(os.fspath(inp)) and same_file(p, inp):
            raise OutputError(
                f"{what} {p!r} is the input file {os.fspath(inp)!r}: writing it would destroy the "
                "input before it is used. Fix: choose another output path.")
    real = os.path.realpath(p)
    if os.path.isdir(real):
        raise OutputError(f"{what} {p!r} is a folder. Fix: give a file name inside it, e.g. "
                          f"{os.path.join(p, example)!r}.")
    if _is_special(real):
        return p
    folder = os.path.dirname(real) or "."
    if not os.path.isdir(folder):
        missing = not os.path.exists(folder)
        raise OutputError(
            f"{what} {p!r}: the folder {folder!r} " + ("does not exist" if missing else "is not a folder")
            + ". Fix: create it (mkdir -p) or choose a path in an existing folder.")
    probe = os.path.join(folder, f".autoplan-probe-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as err:
        raise OutputError(f"{what} {p!r}: cannot create files in the folder {folder!r} "
                          f"({err.strerror}). Fix: choose a writable folder.") from None
    os.unlink(probe)
    if os.path.exists(real) and not os.access(real, os.W_OK):
        raise OutputError(f"{what} {p!r} is read-only. Fix: make it writable (chmod u+w) or choose "
                          "another path.")
    return p


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: the old file (if any) or the complete new one,
    never a part of it.

    Raises:
        OutputError: the write failed (the folder is not writable, the disk is full, the file
            size limit is reached); the file at ``path`` is left as it was.
    """
    p = _fspath(path, "output file")
    target = os.path.realpath(p)
    if _is_special(target):
        try:
            with open(target, "wb") as f:
                f.write(data)
        except OSError as err:
            raise OutputError(f"could not write {p!r}: {err.strerror or err}. Fix: check the "
                              "path.") from err
        return
    folder, name = os.path.split(target)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as err:
        raise OutputError(f"could not write {p!r}: cannot create a file in {folder!r} "
                          f"({err.strerror}). Fix: choose an existing, writable folder.") from err
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode))  # a replaced file keeps its mode
        except FileNotFoundError:
            pass
        os.replace(tmp, target)
    except BaseException as err:  # KeyboardInterrupt and SIGTERM too: never leave the temporary
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(err, OSError):
            kept = "the file that was there is unchanged" if os.path.exists(target) else "nothing was written"
            raise OutputError(f"could not write {p!r}: {err.strerror or err} ({kept}). Fix: free disk "
                              "space, raise the file-size limit, or choose another path.") from err
        raise
    _fsync_folder(folder)


def atomic_write_text(path: PathLike, text: str, encoding: str = "utf-8") -> None:
    """:func:`atomic_write_bytes` of ``text`` encoded with ``encoding`` (UTF-8)."""
    atomic_write_bytes(path, text.encode(encoding))


def _fsync_folder(folder: str) -> None:
    """Flush the folder entry of a rename (POSIX); a no-op where folders cannot be opened."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(folder, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
