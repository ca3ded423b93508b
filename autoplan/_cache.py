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
* every option that changes a result (pipeline mode, schedule, micro-batches, level, mesh shape,
  memory budget, pins, time limit, baselines, layers, stage algorithm, submesh hosts) and the
  workload's config;
* the code: a hash of autoplan's own source files and the JAX version, so a changed search (an
  upgrade, or an edited checkout) never returns a plan the old code made.

``workers`` and ``progress`` change no result and are not part of it.

Entry. One file per key: a header line (format and the SHA-256 of the rest) and the pickled
result: the ranked plans, the index of the best, the statistics, the folding analysis the
figures read (segments, their classes, critical nodes, fold ratio) and the warnings the search
raised (raised again on a hit). Pickle, not JSON: a pipeline plan of 128 micro-batches holds
thousands of schedule events, and writing it as JSON took seconds. The key's code hash means an
entry is only ever read by the code that wrote it; the folder is the user's own, as for any
cache of pickled results.

Not stored: the graph (a hit is given the graph the caller traced or passed, by reference), the
mining result behind the analysis (``analysis.mining`` is None on a hit; ``autoplan.search.mine(
result.graph)`` recomputes it), and the argument pytrees (taken from the caller's graph).

Where. ``$AUTOPLAN_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/autoplan``, else
``~/.cache/autoplan``; entries live in its ``search/`` folder.

Safety. Entries are written to a temporary file and renamed over the entry (``os.replace``), so
concurrent writers and readers never see a partial file. An entry that cannot be read, whose
checksum differs, or that does not unpickle into a search result is a miss (it is removed and
recomputed), never an error. A cache folder that cannot be written costs the store, not the
search. The folder is kept under :data:`MAX_BYTES` (``$AUTOPLAN_CACHE_MAX_BYTES`` overrides it, a
whole number of bytes; ``0`` stores nothing, and a value that is not a byte count is an error
before the search): after a store, the least recently used entries are removed until it holds at
most 80% of that.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import time
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["cache_dir", "search_key", "load", "store", "MAX_BYTES", "FORMAT"]

#: version of the entry layout (entries of another layout are misses)
FORMAT = 1
#: default bound of the cache folder's size in bytes
MAX_BYTES = 512 * 2**20
_MAGIC = "autoplan-search-cache"


def cache_dir() -> Path:
    """The cache folder: ``$AUTOPLAN_CACHE_DIR``, else ``$XDG_CACHE_HOME/autoplan``, else
    ``~/.cache/autoplan``."""
    env = os.environ.get("AUTOPLAN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "autoplan"


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


def search_key(graph: Any, cluster: Any, options: Mapping[str, Any],
               config: Mapping[str, Any]) -> str:
    """The key of a search (see the module docstring)."""
    text = json.dumps({
        "code": code_version(),
        "graph": graph.structure_hash,
        "cluster": cluster.to_dict(),
        "options": {k: repr(v) for k, v in sorted(options.items())},
        "config": {str(k): repr(v) for k, v in sorted(config.items(), key=lambda kv: str(kv[0]))},
    }, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _path(key: str) -> Path:
    return _entries() / f"{key}.entry"


def load(key: str) -> dict[str, Any] | None:
    """The stored entry of ``key`` as ``{"plans": [Plan], "best": int, "stats": dict,
    "analysis": dict | None, "warnings": [(category, message)]}``, or None when there is no
    usable entry (missing, unreadable, or corrupt: a corrupt one is removed)."""
    from autoplan._plan import Plan  # noqa: PLC0415

    path = _path(key)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        header, _, payload = data.partition(b"\n")
        magic, fmt, digest = header.decode("ascii").rsplit(" ", 2)
        if magic != _MAGIC or int(fmt) != FORMAT or hashlib.sha256(payload).hexdigest() != digest:
            raise ValueError("not an entry of this format, or its checksum differs")
        d = pickle.loads(payload)
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
        header = f"{_MAGIC} {FORMAT} {hashlib.sha256(payload).hexdigest()}\n".encode("ascii")
        folder = _entries()
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(_path(key), header + payload)
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
            st = p.stat()
        except OSError:
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
