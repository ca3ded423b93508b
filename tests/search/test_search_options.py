"""SearchOptions: one frozen, validated record of a search's options whose key is the plan
cache's; ``autoplan.search`` is the function, the algorithms are ``autoplan.algorithms``, and the
old ``from autoplan.search import <name>`` warns."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import warnings

import pytest
from jax.sharding import PartitionSpec as P

import autoplan
from autoplan import SearchError, SearchOptions, algorithms, models
from autoplan.search import _api


def test_options_are_checked_when_made_with_the_searchs_messages():
    with pytest.raises(SearchError, match="level should be one of"):
        SearchOptions(level="O9")
    with pytest.raises(SearchError, match="microbatches=4 sets pipeline plans, but pipeline=False"):
        SearchOptions(pipeline=False, microbatches=4)
    with pytest.raises(SearchError, match="mesh_shape=\\(2, 4\\) sets the logical mesh"):
        SearchOptions(pipeline=True, mesh_shape=(2, 4))
    with pytest.raises(SearchError, match="workers should be a positive integer"):
        SearchOptions(workers=0)
    with pytest.raises(SearchError, match="time_limit should be a positive number"):
        SearchOptions(time_limit=-1)
    with pytest.raises(SearchError, match="stage_algorithm should be 'auto', 'dp' or 'ilp'"):
        SearchOptions(stage_algorithm="greedy")
    with pytest.raises(SearchError, match="pins should be a dict"):
        SearchOptions(pins=[("^w", P("x"))])
    # the same refusal through the keywords, before any tracing
    with pytest.raises(SearchError, match="level should be one of"):
        autoplan.search("not even a workload", level="O9")


def test_options_are_frozen_hashable_and_keyed_alike_in_every_process():
    a = SearchOptions(level="folded", mesh_shape=[2, 4], pins={"^embed": P(None, "y")})
    b = SearchOptions(level="folded", mesh_shape=(2, 4), pins={"^embed": P(None, "y")})
    assert a == b and hash(a) == hash(b) and a.key() == b.key()
    assert a.mesh_shape == (2, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.level = "auto"
    with pytest.raises(TypeError):
        a.pins["^embed"] = None
    assert a.replace(level="auto").key() != a.key()
    # workers and the cache change no result: not in the key
    assert a.replace(workers=2, cache=False).key() == a.key()
    code = ("from jax.sharding import PartitionSpec as P; from autoplan import SearchOptions; "
            "print(SearchOptions(level='folded', mesh_shape=(2, 4), "
            "pins={'^embed': P(None, 'y')}).key())")
    keys = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip()
            for seed in ("1", "2")}
    assert keys == {a.key()}


def test_search_takes_the_options_as_one_record():
    wl = models.get("mlp", size="tiny")
    opts = SearchOptions(pipeline=False, level="exhaustive", mesh_shape=(4, 2), cache=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        by_record = autoplan.search(wl, "cpu:8", options=opts)
        by_keywords = autoplan.search(wl, "cpu:8", pipeline=False, level="exhaustive",
                                      mesh_shape=(4, 2), cache=False)
    def timeless(result):  # (the best plan's notes and search time say how long it took)
        return [{k: v for k, v in p.to_dict().items() if k not in ("search_seconds", "notes")}
                for p in result.plans]

    assert timeless(by_record) == timeless(by_keywords)
    with pytest.raises(SearchError, match="options= holds every option, but level='folded'"):
        autoplan.search(wl, "cpu:8", options=opts, level="folded")
    with pytest.raises(SearchError, match="options should be an autoplan.SearchOptions"):
        autoplan.search(wl, "cpu:8", options={"level": "folded"})


def test_autoplan_search_is_the_function_and_the_old_names_warn():
    import autoplan.search.fold._mine  # noqa: F401 (binds the package, which autoplan ignores)

    assert autoplan.search is _api.search and callable(autoplan.search)
    from autoplan import search

    assert search is _api.search
    with pytest.warns(DeprecationWarning, match="use autoplan.algorithms.mine"):
        from autoplan.search import mine
    assert mine is algorithms.mine
    with pytest.warns(DeprecationWarning, match="use autoplan.search "):
        from autoplan.search import search as old  # noqa: F401
    with pytest.warns(DeprecationWarning, match="use autoplan.algorithms.group_layers"):
        from autoplan.search import cluster_layers
    assert cluster_layers is algorithms.group_layers
    with pytest.raises(ImportError):
        from autoplan.search import no_such_name  # noqa: F401
    assert set(algorithms.__all__) >= {"mine", "segments", "stage_dp", "pipeline_search",
                                       "schedule_table", "SearchOptions", "SearchResult"}
