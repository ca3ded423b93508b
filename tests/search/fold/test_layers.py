"""Grouping operators into pipeline layers (Alpa's operator clustering): Alpa's DP, balanced, against brute force."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autoplan
from autoplan import models
from autoplan.algorithms import group_layers
from autoplan.search.fold._layers import _layer_cuts


def _brute(flops, cross, L, eps):
    """The groupings (cut lists) Alpa's objective then balance pick, by enumeration."""
    n = len(flops)
    total = sum(flops)
    cap = max((1 + eps) * total / L, max(flops)) * (1 + 1e-9)
    best = None
    feasible = []
    for inner in itertools.combinations(range(1, n), L - 1):
        cuts = list(inner) + [n]
        bounds = [0] + cuts
        groups = [sum(flops[a:b]) for a, b in zip(bounds, bounds[1:])]
        if max(groups) > cap:
            continue
        worst = max((cross[c - 1] for c in inner), default=0.0)
        feasible.append((worst, sum(f * f for f in groups), cuts))
    if not feasible:
        return None
    b_star = min(f[0] for f in feasible)
    best = min(f[1] for f in feasible if f[0] <= b_star * (1 + 1e-9))
    return b_star, best


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=2, max_size=8), st.data())
def test_grouping_is_the_brute_force_optimum(flops, data):
    n = len(flops)
    L = data.draw(st.integers(1, n))
    cross = np.asarray(data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)), float)
    flops = [float(f) for f in flops]
    want = _brute(flops, cross, L, 0.5)
    cuts = _layer_cuts(flops, cross, L, 0.5)
    assert len(cuts) == L and cuts[-1] == n and cuts == sorted(set(cuts))
    if want is None:
        return
    bounds = [0] + cuts
    groups = [sum(flops[a:b]) for a, b in zip(bounds, bounds[1:])]
    worst = max((cross[c - 1] for c in cuts[:-1]), default=0.0)
    assert worst == want[0]
    assert sum(f * f for f in groups) == want[1]


def test_gpt_2_6b_in_8_layers_is_balanced():
    """GPT-2.6B's 32 blocks, embedding and head in 8 layers: every layer within 1.3x of the
    mean FLOPs (the cut bytes tie between blocks; the sum of squares spreads the blocks evenly,
    where minimising bytes alone gave 6, 6, 6, 6, 6, 1, 1 blocks and the head)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = autoplan.trace(models.get("gpt", size="2.6B"))
    layers = group_layers(g, 8)
    mean = sum(ly.flops for ly in layers) / len(layers)
    assert len(layers) == 8
    assert max(ly.flops for ly in layers) <= 1.3 * mean
    assert min(ly.flops for ly in layers) >= mean / 1.3
    names = [n for ly in layers for n in ly.names]
    assert names == ["embed"] + [f"layers_{i}" for i in range(32)] + ["head"]


def test_cluster_layers_is_a_deprecated_name_of_group_layers():
    """The old name still works for one release and names the new one."""
    from autoplan import algorithms as search  # noqa: PLC0415

    with pytest.warns(DeprecationWarning, match="use autoplan.algorithms.group_layers"):
        old = search.cluster_layers
    assert old is group_layers
    assert "cluster_layers" not in search.__all__
    with pytest.raises(AttributeError, match="no_such_name"):
        search.no_such_name  # noqa: B018
