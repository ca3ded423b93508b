"""Output files: checked before any work, written atomically.

Every file autoplan writes (plans, HTML reports, and every ``-o`` of the command line) goes
through this module, for two guarantees:

* **Checked first.** :func:`check_output_path` refuses, before a search or a report starts, a path
  whose folder is missing or not writable, a path that is a folder, a read-only file, and a path
  that is one of the command's input files (``autoplan report plan.json -o plan.json``), resolving
  symbolic links and hard links (the same file under another name).
* **Inputs are regular files.** :func:`read_input_bytes` reads an input (a plan, a cluster file)
  without ever waiting: a named pipe, a device (``/dev/zero``), a socket or a folder is refused
  before a byte is read, and so is a file larger than :data:`MAX_INPUT_BYTES`. Outputs are held
  to the same rule: writing into a named pipe would wait for a reader forever.
* **Atomic.** :func:`atomic_write_bytes` / :func:`atomic_write_text` write a temporary file in the
  target's folder, flush it to disk (``fsync``), then rename it over the target (``os.replace``,
  atomic on POSIX and Windows) and flush the folder entry. An interrupted write (Ctrl-C,
  SIGTERM, a full disk, a file-size limit) leaves the old file as it was, never a partial or empty
  one, and removes the temporary file. A target reached through a symbolic link is written
  through it (the link stays a link); a new file gets the usual permissions (``0o666`` less the
  umask) and a replaced file keeps its own. The temporary name is cut to fit the folder's
  name limit, so any legal file name can be written. ``/dev/null`` is written in place (the
  one special file an output may be: nothing waits on it).
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

from ._errors import OutputError

__all__ = ["cache_dir", "usable_cache_dir", "check_output_path", "check_outputs", "read_input_bytes", "atomic_write_bytes",
           "atomic_write_text", "same_file", "private_folder", "MAX_INPUT_BYTES"]

PathLike = str | os.PathLike

#: the largest input file read (a plan of a 175B model with a 128-micro-batch schedule is
#: about 2 MB); a larger one is refused before it is read
MAX_INPUT_BYTES = 256 * 2**20


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


def _kind(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    for test, name in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def _name_max(folder: str) -> int:
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (AttributeError, OSError, ValueError):
        return 255


def read_input_bytes(path: PathLike, *, what: str = "input file",
                     limit: int | None = None) -> bytes:
    """The bytes of the input file ``path``, read without waiting on anything.

    The file is opened without blocking (a named pipe with no writer would block the open) and
    checked before any read: it must be a regular file of at most ``limit`` bytes
    (:data:`MAX_INPUT_BYTES` by default).

    Raises:
        OSError: the file cannot be opened (its ``strerror`` says why), or it is not a regular
            file (``strerror`` names what it is), or it is larger than ``limit``.
    """
    limit = MAX_INPUT_BYTES if limit is None else limit
    p = os.fspath(path)
    fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
                 | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, f"it is {_kind(st.st_mode)}, not a regular file (autoplan reads only "
                             "regular files: a pipe or a device could block or never end)", p)
        if st.st_size > limit:
            raise OSError(0, f"it holds {st.st_size:,} bytes, more than the {limit:,} an autoplan "
                             f"{what} may hold", p)
        chunks = []
        left = limit + 1
        while left > 0:  # (a file growing while read is cut at the limit)
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise OSError(0, f"it grew past the {limit:,} bytes an autoplan {what} may hold while "
                             "it was read", p)
        return data
    finally:
        os.close(fd)


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
        if real == os.devnull:
            return p
        raise OutputError(f"{what} {p!r} is {_kind(os.stat(real).st_mode)}, not a regular file: "
                          "writing it could block or never end. Fix: choose a file path "
                          f"(e.g. {example!r}), or {os.devnull} to discard the output.")
    folder = os.path.dirname(real) or "."
    name = os.path.basename(real)
    name_max = _name_max(folder) if os.path.isdir(folder) else 255
    if len(os.fsencode(name)) > name_max:
        raise OutputError(f"{what} {p!r}: the file name is {len(os.fsencode(name))} bytes long, "
                          f"more than the {name_max} the file system allows. Fix: choose a shorter "
                          "name.")
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


def check_outputs(outputs: Iterable[tuple[str, PathLike | None, str]],
                  inputs: Iterable[tuple[str, PathLike]] = ()) -> None:
    """Check a command's outputs before any work: each one as :func:`check_output_path` does,
    none of them one of ``inputs``, and no two of them the same file.

    Args:
        outputs: ``(how the message names it, path or None, example name)``; None is skipped
            (an option not given).
        inputs: ``(what it is, path)`` of every file the command reads: plan, cluster or profile
            files, the workload's source files.

    Raises:
        OutputError: an output fails :func:`check_output_path`, is one of the inputs (also
            through a symbolic or hard link), or is the same file as another output.
    """
    inputs = [(what, os.fspath(p)) for what, p in inputs]
    seen: list[tuple[str, str]] = []
    for what, path, example in outputs:
        if path is None:
            continue
        p = _fspath(path, what)
        for in_what, inp in inputs:
            if os.path.exists(inp) and same_file(p, inp):
                raise OutputError(
                    f"{what} {p!r} is the input file {inp!r} ({in_what}, which the command "
                    "reads): writing it would destroy the input. Fix: choose another output path.")
        for other_what, other in seen:
            if os.path.realpath(p) == os.path.realpath(other) or (
                    os.path.exists(p) and same_file(p, other)):
                raise OutputError(
                    f"{what} {p!r} is the same file as {other_what} {other!r}: the second write "
                    "would replace the first. Fix: give each output its own path.")
        check_output_path(p, what=what, example=example)
        seen.append((what, p))


def atomic_write_bytes(path: PathLike, data: bytes, *, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` atomically: the old file (if any) or the complete new one,
    never a part of it.

    Args:
        path: the file to write.
        data: its new contents.
        mode: the new file's permission bits whatever the umask (``0o600``: private); by
            default a new file gets ``0o666`` less the umask and a replaced one keeps its own.

    Raises:
        OutputError: the write failed (the folder is not writable, the disk is full, the file
            size limit is reached), or ``path`` is a named pipe, a socket or a device other than
            ``/dev/null``; the file at ``path`` is left as it was.
    """
    p = _fspath(path, "output file")
    target = os.path.realpath(p)
    if _is_special(target):
        if target != os.devnull:
            raise OutputError(f"could not write {p!r}: it is {_kind(os.stat(target).st_mode)}, not "
                              "a regular file, and writing it could wait forever. Fix: choose a "
                              "file path.")
        try:
            with open(target, "wb") as f:
                f.write(data)
        except OSError as err:
            raise OutputError(f"could not write {p!r}: {err.strerror or err}. Fix: check the "
                              "path.") from err
        return
    folder, name = os.path.split(target)
    tmp = os.path.join(folder, _temporary_name(folder, name))
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                     0o666 if mode is None else mode)
    except OSError as err:
        raise OutputError(f"could not write {p!r}: cannot create a file in {folder!r} "
                          f"({err.strerror}). Fix: choose an existing, writable folder.") from err
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)  # (the umask cannot widen or narrow it)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is None:
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


def _temporary_name(folder: str, name: str) -> str:
    """``.NAME.PID.RANDOM.tmp``, NAME cut so that the whole fits the folder's name limit."""
    tail = f".{os.getpid()}.{secrets.token_hex(4)}.tmp"
    room = _name_max(folder or ".") - len(tail) - 1
    raw = os.fsencode(name)
    if len(raw) > room:
        raw = raw[:max(room, 1)]
        name = raw.decode(errors="ignore") or "x"  # (not cut inside a UTF-8 sequence)
        name = os.fsdecode(os.fsencode(name))
    return f".{name}{tail}"


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


def private_folder(folder: Path, *, create: bool, own: bool = True) -> bool:
    """Whether ``folder`` may hold a private cache (the plan cache, the profile cache): created ``0700`` (whatever the umask) when missing
    and ``create``. A folder that is autoplan's ``own`` must also be the user's (else False: do
    not use it), and is narrowed to ``0700`` when it is wider; a folder the user named
    (``$AUTOPLAN_CACHE_DIR``, which may be shared, or ``/tmp``) is used as it is, since the
    entries and the key live in the ``search/`` folder inside it, which is autoplan's own."""
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        if not create:
            return False
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return False
        try:
            st = os.stat(folder)
        except OSError:
            return False
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return False
    if not own:
        return True
    if st.st_uid != os.geteuid():
        return False
    if stat.S_IMODE(st.st_mode) & 0o077:
        try:
            os.chmod(folder, 0o700)
        except OSError:
            return False
    return True


def cache_dir() -> Path:
    """autoplan's cache folder (the plan cache's ``search/`` and the measured profiles):
    ``$AUTOPLAN_CACHE_DIR``, else ``$XDG_CACHE_HOME/autoplan``, else ``~/.cache/autoplan``."""
    env = os.environ.get("AUTOPLAN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "autoplan"


def usable_cache_dir(*, create: bool) -> bool:
    """Whether :func:`cache_dir` may hold autoplan's private caches (:func:`private_folder`,
    created so when ``create``): autoplan's own folder must be the user's; a folder the user
    named with ``$AUTOPLAN_CACHE_DIR`` is used as it is."""
    named = bool(os.environ.get("AUTOPLAN_CACHE_DIR"))
    return private_folder(cache_dir(), create=create, own=not named)
