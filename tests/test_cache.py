"""The plan cache (autoplan._cache): a repeated search returns the stored result without searching;
corrupt entries are recomputed; the key covers the graph's structure, every cluster field and
the options; concurrent writers, a bounded folder and an unwritable one."""

from __future__ import annotations

import dataclasses
import pathlib
import threading
import warnings

import jax
import jax.numpy as jnp
import pytest

import autoplan
from autoplan import _cache, models
from autoplan.search import _api
from autoplan.search.intra._ilp import UnsupportedPrimitiveWarning


@pytest.fixture(scope="module")
def graph():
    return autoplan.trace(models.get("gpt", size="tiny", layers=3))


def _search(g, cluster="p3.16xlarge:1", **kw):
    kw = {"pipeline": False, "level": "folded", "mesh_shape": (2, 4), "workers": 1, **kw}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return autoplan.search(g, cluster, **kw)


def _no_search(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("searched although the result was stored")

    monkeypatch.setattr(_api, "_search_plans", refuse)


def _comparable(plan):
    """A plan's record without what depends on timing."""
    d = plan.to_dict()
    d.pop("search_seconds")
    d.pop("notes")
    return d


def _entries():
    return sorted((_cache.cache_dir() / "search").glob("*.entry"))


def test_repeated_search_returns_the_stored_result(graph, monkeypatch):
    first = _search(graph)
    assert first.stats["cache"] == "stored" and len(_entries()) == 1
    _no_search(monkeypatch)
    again = _search(graph)
    assert again.stats["cache"] == "hit"
    assert again.plans == first.plans and again.best == first.best
    assert [p.search_seconds for p in again.plans] == [p.search_seconds for p in first.plans]
    assert {k: v for k, v in again.stats.items() if k != "cache"} == \
        {k: v for k, v in first.stats.items() if k != "cache"}
    # the folding analysis (the record the figures read) is kept
    assert again.analysis == first.analysis and again.analysis.segments
    assert again.graph is graph
    # the same step traced again is the same structure: a hit too
    retraced = autoplan.trace(models.get("gpt", size="tiny", layers=3))
    assert retraced is not graph and retraced.structure_hash == graph.structure_hash
    assert _search(retraced).plans == first.plans


def test_the_users_pytrees_come_from_the_callers_graph(monkeypatch):
    wl = models.get("mlp", size="tiny")
    first = _search(wl, level="auto")
    _no_search(monkeypatch)
    again = _search(wl, level="auto")
    assert again.stats["cache"] == "hit"
    assert again.best.arg_trees is not None and again.best.arg_trees == first.best.arg_trees
    assert again.best.arg_types == first.best.arg_types


def test_cache_false_neither_reads_nor_writes(graph):
    res = _search(graph, cache=False)
    assert res.stats["cache"] == "off" and _entries() == []
    _search(graph)
    assert _search(graph, cache=False).stats["cache"] == "off"
    with pytest.raises(autoplan.SearchError, match="cache should be True or False"):
        _search(graph, cache="no")


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty", "not a result"])
def test_corrupt_entry_is_recomputed(graph, damage):
    first = _search(graph)
    (path,) = _entries()
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        k = len(data) - 100
        path.write_bytes(data[:k] + bytes([data[k] ^ 0xFF]) + data[k + 1:])
    elif damage == "garbage":
        path.write_bytes(b"\x00\xffnot a cache entry\n" * 10)
    elif damage == "empty":
        path.write_bytes(b"")
    else:  # a well-formed entry of something else under this key, signed with the folder's key
        import pickle

        payload = pickle.dumps({"key": path.stem, "plans": [], "best": 0, "stats": {}})
        path.write_bytes(f"autoplan-search-cache {_cache.FORMAT} "
                         f"{_cache._sign(_cache._key(create=False), payload)}\n".encode() + payload)
    again = _search(graph)
    assert again.stats["cache"] == "stored"  # recomputed and stored again
    assert [_comparable(p) for p in again.plans] == [_comparable(p) for p in first.plans]
    assert _search(graph).stats["cache"] == "hit"


def test_key_covers_options_cluster_and_structure(graph):
    _search(graph)
    assert _search(graph).stats["cache"] == "hit"
    assert _search(graph, mesh_shape=(4, 2)).stats["cache"] == "stored"
    assert _search(graph, time_limit=30.0).stats["cache"] == "stored"
    assert _search(graph, baselines=False).stats["cache"] == "stored"
    # any cost field of the cluster (a measured profile changes them)
    cl = autoplan.Cluster.parse("p3.16xlarge:1")
    slower = dataclasses.replace(cl, inter_bandwidth=cl.inter_bandwidth / 2,
                                 intra_bandwidth=cl.intra_bandwidth / 2)
    assert _search(graph, slower).stats["cache"] == "stored"
    assert _search(graph, slower).stats["cache"] == "hit"
    # another structure: one more layer, or the same layers with another width
    for other in (models.get("gpt", size="tiny", layers=4),
                  models.get("gpt", size="tiny", layers=3, hidden=96)):
        g = autoplan.trace(other)
        assert g.structure_hash != graph.structure_hash
        assert _search(g).stats["cache"] == "stored"
    # workers change no result: not part of the key
    assert _search(graph, workers=2).stats["cache"] == "hit"


def test_warnings_of_the_search_are_raised_again_on_a_hit():
    def f(x, w):
        return jnp.fft.fft(x @ w).real.sum()

    g = autoplan.trace(f, jax.ShapeDtypeStruct((64, 32), jnp.float32),
                       jax.ShapeDtypeStruct((32, 32), jnp.float32))
    for expect in ("stored", "hit"):
        with pytest.warns(UnsupportedPrimitiveWarning, match="fft"):
            res = autoplan.search(g, "cpu:8", pipeline=False, mesh_shape=(2, 4))
        assert res.stats["cache"] == expect


def test_concurrent_writers_and_readers_never_see_a_partial_entry(graph):
    first = _search(graph)
    key = next(iter(_entries())).stem
    hit = _cache.load(key)
    errors: list[BaseException] = []
    seen: list[object] = []

    def write():
        try:
            for _ in range(10):
                assert _cache.store(key, hit["plans"], hit["best"], hit["stats"], hit["analysis"],
                                    hit["warnings"])
        except BaseException as err:
            errors.append(err)

    def read():
        try:
            for _ in range(30):
                got = _cache.load(key)
                seen.append(None if got is None else got["plans"] == first.plans)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=write) for _ in range(3)] + \
        [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert set(seen) <= {True}  # every read found a whole entry (never a partial one)
    # no temporary files left: the entry and the folder's key
    assert sorted(p.suffix or p.name for p in (_cache.cache_dir() / "search").iterdir()) == \
        [".entry", "key"]


def test_folder_is_bounded_least_recently_used_first(graph, monkeypatch):
    _search(graph)
    size = _entries()[0].stat().st_size
    monkeypatch.setenv("AUTOPLAN_CACHE_MAX_BYTES", str(int(2.5 * size)))
    for t in (30.0, 20.0, 10.0):  # three more entries of about the same size
        _search(graph, time_limit=t)
    total = sum(p.stat().st_size for p in _entries())
    assert total <= 2.5 * size
    assert _search(graph, time_limit=10.0).stats["cache"] == "hit"  # the newest is kept
    assert _search(graph).stats["cache"] == "stored"  # the oldest was removed


def test_unwritable_folder_costs_the_store_not_the_search(graph, tmp_path, monkeypatch):
    blocker = tmp_path / "a file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("AUTOPLAN_CACHE_DIR", str(blocker))
    res = _search(graph)
    assert res.stats["cache"] == "not stored" and res.plans
    assert _search(graph).stats["cache"] == "not stored"


def test_cache_folder_location(monkeypatch, tmp_path):
    monkeypatch.delenv("AUTOPLAN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _cache.cache_dir() == tmp_path / "xdg" / "autoplan"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _cache.cache_dir() == tmp_path / "home" / ".cache" / "autoplan"
    monkeypatch.setenv("AUTOPLAN_CACHE_DIR", str(tmp_path / "mine"))
    assert _cache.cache_dir() == tmp_path / "mine"
    # the measured profiles live under the same folder, read by the same one function
    from autoplan.costs import _local

    assert _local.cache_dir() == str(tmp_path / "mine")
    monkeypatch.setenv("AUTOPLAN_CACHE_DIR", "~/elsewhere")
    assert _local.cache_dir() == str(pathlib.Path("~/elsewhere").expanduser())
