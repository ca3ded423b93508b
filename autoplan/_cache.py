"""The plan cache: a search repeated with the same graph, cluster and options returns at once.

:func:`autoplan.search` looks its result up here before searching and stores it after (unless
given ``cache=False``). A notebook's explorer re-searches on every control change; a command
line user re-plans the model they planned before: both get the stored result instead of a search.

Key. The SHA-256 of

* the graph's :attr:`~autoplan.OpGraph.structure_hash` (its fingerprint and every operator:
  primitive, parameters, operands, shapes, dtypes, FLOPs, scopes; the same step traced twice
  hashes alike);
* the cluster's every field (``Cluster.to_dict()``: device kind, counts, memory, peak FLOP/s,
  bandwidths, latencies, and any measured profile a cluster carries);
* every option that changes a result (:meth:`autoplan.SearchOptions.key`: pipeline mode,
  schedule, micro-batches, level, mesh shape, memory budget, pins, time limit, baselines, layers,
  stage algorithm, submesh hosts, micro-batching a mixing loss), whether the search was given a
  workload, and the workload's config;
* the code: a hash of autoplan's own source files and the JAX version, so a changed search (an
  upgrade, or an edited checkout) never returns a plan the old code made.

``workers`` and ``progress`` change no result and are not part of it.

Entry. One file per key: a header line (format and the HMAC-SHA-256 of the rest, under the
folder's key) and the pickled result: the ranked plans, the index of the best, the statistics,
the folding analysis the figures read (:class:`autoplan._analysis.FoldingAnalysis`, in its plain
form) and the warnings the search raised (raised again on a hit). Pickle, not JSON: a pipeline plan of 128
micro-batches holds thousands of schedule events, and reading ten plans back from JSON (with
their validation) took 180 ms where unpickling takes 33 ms. The key's code hash means an entry is
only ever read by the code that wrote it.

Who may write it (the threat model). Unpickling runs code, so an entry is unpickled only when it
is authentic: its header carries the HMAC of its payload under a 32-byte random key that is kept
beside the entries (``search/key``, ``0600``), and is checked (in constant time) before a byte is
unpickled. Someone who can put a file in the cache folder (a folder left group- or
world-writable, a cache folder on a shared disk, an entry copied from another machine or
planted by another local user) but cannot read the user's key cannot make an entry that is
read: a forged or foreign entry is a miss, and is removed. Whoever can read the key is already
the user (or root), who can change autoplan's own code as easily. Further:

* folders are created ``0700`` and entries ``0600`` whatever the umask; autoplan's own folders
  (``search/``, and the default ``.../autoplan``) are narrowed to ``0700`` when they are wider,
  and not used at all (no read, no store) when another user owns them; a folder named by
  ``$AUTOPLAN_CACHE_DIR`` is left as it is (it may be shared on purpose), its ``search/`` folder
  held to those rules;
* an entry that is not a regular file (a named pipe, a device, a symbolic link), not owned by
  the user, writable by the group or others, or larger than the folder's bound is a miss and is
  removed, before anything is read from it (it is opened without following links and without
  blocking);
* a key file that is not a regular file of the user's, readable by nobody else, is replaced by a
  new key (which makes every entry signed with the old one a miss).

Not stored: the graph (a hit is given the graph the caller traced or passed, by reference), the
mining result behind the analysis, and the argument pytrees (taken from the caller's graph).

Where. ``$AUTOPLAN_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/autoplan``, else
``~/.cache/autoplan``; entries live in its ``search/`` folder.

Safety. Entries are written to a temporary file and renamed over the entry (``os.replace``), so
concurrent writers and readers never see a partial file. An entry that cannot be read, whose
HMAC differs, or that does not unpickle into a search result is a miss (it is removed and
recomputed), never an error. A cache folder that cannot be written costs the store, not the
search. The folder is kept under :data:`MAX_BYTES` (``$AUTOPLAN_CACHE_MAX_BYTES`` overrides it, a
whole number of bytes; ``0`` stores nothing, and a value that is not a byte count is an error
before the search): after a store, the least recently used entries are removed until it holds at
most 80% of that.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import pickle
import secrets
import stat
import time
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from ._io import cache_dir, private_folder, usable_cache_dir

__all__ = ["cache_dir", "search_key", "load", "store", "MAX_BYTES", "FORMAT"]

#: version of the entry layout (entries of another layout are misses)
FORMAT = 2
#: default bound of the cache folder's size in bytes
MAX_BYTES = 512 * 2**20
_MAGIC = "autoplan-search-cache"
_KEY_BYTES = 32
_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_CLOEXEC", 0))


def _entries() -> Path:
    return cache_dir() / "search"


def _max_bytes() -> int:
    """``$AUTOPLAN_CACHE_MAX_BYTES`` (0: store nothing); a bad value is an ArgumentError, which
    ``autoplan.search`` raises before any work."""
    from ._options import cache_max_bytes  # noqa: PLC0415

    return cache_max_bytes(MAX_BYTES)


@cache
def code_version() -> str:
    """A hash of autoplan's source files and the JAX version (once per process)."""
    import jax  # noqa: PLC0415

    h = hashlib.sha256(f"{FORMAT}|{jax.__version__}".encode())
    root = Path(__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def search_key(graph: Any, cluster: Any, options: Any, config: Mapping[str, Any], *,
               workload: bool, microbatching: bool) -> str:
    """The key of a search (see the module docstring): ``options`` is its
    :class:`autoplan.SearchOptions` (keyed by :meth:`~autoplan.SearchOptions.key`), ``workload``
    whether it was given a workload (a graph alone makes no pipeline plans) and
    ``microbatching`` whether it may make micro-batched plans."""
    text = json.dumps({
        "code": code_version(),
        "graph": graph.structure_hash,
        "cluster": cluster.to_dict(),
        "options": options.key(), "workload": workload, "microbatching": microbatching,
        "config": {str(k): repr(v) for k, v in sorted(config.items(), key=lambda kv: str(kv[0]))},
    }, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _path(key: str) -> Path:
    return _entries() / f"{key}.entry"


def _usable(*, create: bool) -> bool:
    """Whether the cache folder and its ``search/`` folder are usable and ``search/`` private
    (see the module docstring), created so when ``create``."""
    return usable_cache_dir(create=create) and private_folder(_entries(), create=create)


def _read_entry(fd: int, limit: int) -> bytes | None:
    """The bytes of an open entry, read only when it is a regular file of this user's that only
    the user may write, of at most ``limit`` bytes; else None."""
    st = os.fstat(fd)
    if not (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
            and not stat.S_IMODE(st.st_mode) & 0o022 and st.st_size <= limit):
        return None
    chunks, left = [], st.st_size
    while left > 0:  # (os.read may return less than asked)
        chunk = os.read(fd, left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _remove(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            return  # (a folder is never ours to remove)
        path.unlink()
    except OSError:
        pass


def _key(*, create: bool) -> bytes | None:
    """The folder's HMAC key (made when missing and ``create``); None when there is none."""
    path = _entries() / "key"
    for _ in range(3):
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except FileNotFoundError:
            if not create:
                return None
            fresh = secrets.token_bytes(_KEY_BYTES)
            tmp = path.with_name(f".key.{os.getpid()}.{secrets.token_hex(4)}")
            try:
                wfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                              0o600)
                try:
                    os.fchmod(wfd, 0o600)
                    os.write(wfd, fresh)
                    os.fsync(wfd)
                finally:
                    os.close(wfd)
                os.link(tmp, path)  # (fails when another process made one first: that one wins)
            except FileExistsError:
                pass
            except OSError:
                return None
            finally:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            continue
        except OSError:  # a symbolic link (O_NOFOLLOW), or unreadable: replaced
            _remove(path)
            continue
        try:
            st = os.fstat(fd)
            good = (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
                    and not stat.S_IMODE(st.st_mode) & 0o077 and st.st_size == _KEY_BYTES)
            data = os.read(fd, _KEY_BYTES + 1) if good else b""
        except OSError:
            data = b""
        finally:
            os.close(fd)
        if len(data) == _KEY_BYTES:
            return data
        _remove(path)  # another's, readable by others, or the wrong size: a new key
    return None


def _sign(key: bytes, payload: bytes) -> str:
    return hmac.new(key, payload, hashlib.sha256).hexdigest()


def load(key: str) -> dict[str, Any] | None:
    """The stored entry of ``key`` as ``{"plans": [Plan], "best": int, "stats": dict,
    "analysis": dict | None, "warnings": [(category, message)]}``, or None when there is no
    usable entry (missing, unreadable, or corrupt: a corrupt one is removed)."""
    from autoplan.plans._plan import Plan  # noqa: PLC0415

    path = _path(key)
    if not _usable(create=False):
        return None
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError:  # a symbolic link (O_NOFOLLOW), or unreadable: not an entry of ours
        _remove(path)
        return None
    try:
        data = _read_entry(fd, max(MAX_BYTES, _max_bytes()))
    except OSError:
        data = None
    finally:
        os.close(fd)
    if data is None:  # a pipe, a device, another's file, writable by others, or too large
        _remove(path)
        return None
    secret = _key(create=False)
    try:
        header, _, payload = data.partition(b"\n")
        magic, fmt, digest = header.decode("ascii").rsplit(" ", 2)
        if (secret is None or magic != _MAGIC or int(fmt) != FORMAT
                or not hmac.compare_digest(_sign(secret, payload), digest)):
            raise ValueError("not an entry of this format, or not signed with this folder's key")
        d = pickle.loads(payload)  # (authentic: written by this user's autoplan)
        plans, best = d["plans"], d["best"]
        if (d["key"] != key or not isinstance(plans, list) or not plans
                or not all(isinstance(p, Plan) for p in plans) or not isinstance(best, int)
                or not 0 <= best < len(plans) or not isinstance(d["stats"], dict)):
            raise ValueError("not a search result")
        out = {k: d[k] for k in ("plans", "best", "stats", "analysis", "warnings")}
    except Exception:  # a corrupt entry is a miss: removed, recomputed and stored again
        try:
            path.unlink()
        except OSError:
            pass
        return None
    try:
        os.utime(path)  # recently used: kept longest when the folder is pruned
    except OSError:
        pass
    return out


def store(key: str, plans: list[Any], best: int, stats: Mapping[str, Any],
          analysis: Mapping[str, Any] | None, recorded: list[tuple[type[Warning], str]]) -> bool:
    """Store a search's result under ``key``: its ranked plans (without the argument pytrees,
    which are the caller's), the index of the best, its statistics, its analysis summary and the
    warnings it raised. True when stored; False when something in it cannot be stored or the
    folder cannot be written (the search's result is unaffected)."""
    from autoplan._io import atomic_write_bytes  # noqa: PLC0415

    if _max_bytes() == 0:  # $AUTOPLAN_CACHE_MAX_BYTES=0: keep nothing
        return False
    try:
        payload = pickle.dumps({
            "key": key, "created": time.time(), "best": best, "stats": dict(stats),
            "plans": [p.with_(arg_trees=None) if p.arg_trees is not None else p for p in plans],
            "analysis": analysis, "warnings": list(recorded)}, protocol=pickle.HIGHEST_PROTOCOL)
        folder = _entries()
        if not _usable(create=True):
            return False
        secret = _key(create=True)
        if secret is None:
            return False
        header = f"{_MAGIC} {FORMAT} {_sign(secret, payload)}\n".encode("ascii")
        atomic_write_bytes(_path(key), header + payload, mode=0o600)
    except Exception:  # (an unstorable value, a read-only or full disk: no entry, no error)
        return False
    _prune(folder, _max_bytes())
    return True


def _prune(folder: Path, limit: int) -> None:
    """Remove least recently used entries until the folder holds at most 80% of ``limit``."""
    entries = []
    total = 0
    for p in folder.glob("*.entry"):
        try:
            st = p.lstat()
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):  # (never an entry of ours)
            _remove(p)
            continue
        entries.append((st.st_mtime, st.st_size, p))
        total += st.st_size
    if total <= limit:
        return
    for _, size, p in sorted(entries, key=lambda e: e[0]):
        if total <= 0.8 * limit:
            break
        try:
            p.unlink()
            total -= size
        except OSError:
            pass
