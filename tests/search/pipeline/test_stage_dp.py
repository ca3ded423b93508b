"""Tests of Alpa's stage-mesh DP: brute force, an unpruned reference DP, memory, placement."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan._errors import InfeasiblePlanError, SearchError
from autoplan.search.pipeline._stage_dp import (
    StageDPResult,
    place_submeshes,
    stage_dp,
    stage_dp_counts,
    submesh_shapes,
)

CLUSTERS = [(1, 1), (1, 2), (1, 4), (2, 2), (2, 4), (3, 2)]


def brute_force(t, shapes, N, M, B, pm=None, am=None, dm=None, max_stages=None, step=None,
                min_stages=1):
    """Every split into contiguous stages x every (submesh, config) per stage, devices = N*M;
    with ``step``, the first stage's per-step cost is added once."""
    L, _, K, C = t.shape
    D = N * M
    best = math.inf
    for S in range(max(1, min_stages), L + 1):
        if max_stages is not None and S > max_stages:
            break
        for cuts in itertools.combinations(range(1, L), S - 1):
            bounds = (0, *cuts, L)
            segs = [(bounds[i], bounds[i + 1]) for i in range(S)]
            choices = []
            for idx, (a, e) in enumerate(segs):
                pos = S - idx  # position from the end: min(pos, B) micro-batches in flight
                opts = []
                for q in range(K):
                    for c in range(C):
                        v = t[a, e - 1, q, c]
                        if not np.isfinite(v):
                            continue
                        if dm is not None and pm[a, e - 1, q, c] + min(pos, B) * am[a, e - 1, q, c] > dm:
                            continue
                        u = 0.0 if step is None or idx else step[a, e - 1, q, c]
                        opts.append((shapes[q][0] * shapes[q][1], v, u))
                choices.append(opts)
            for combo in itertools.product(*choices):
                if sum(sz for sz, _, _ in combo) != D:
                    continue
                costs = [v for _, v, _ in combo]
                best = min(best, sum(costs) + (B - 1) * max(costs) + combo[0][2])
    return best


def random_instance(rng, L, N, M, C, inf_frac=0.2):
    shapes = submesh_shapes(N, M)
    K = len(shapes)
    width = (np.arange(L)[None, :] - np.arange(L)[:, None] + 1).clip(min=1)
    t = np.round(rng.uniform(0.5, 3.0, (L, L, K, C)) * width[:, :, None, None], 1)
    t[rng.random(t.shape) < inf_frac] = np.inf
    return t, shapes


def check_result(r: StageDPResult, t, shapes, N, M, B, pm=None, am=None, dm=None):
    L = t.shape[0]
    assert r.stages[0].start == 0 and r.stages[-1].end == L
    for a, b in zip(r.stages, r.stages[1:]):
        assert a.end == b.start
    assert sum(s.submesh[0] * s.submesh[1] for s in r.stages) == N * M
    S = len(r.stages)
    for idx, s in enumerate(r.stages):
        assert s.submesh == shapes[s.submesh_index]
        assert s.cost == t[s.start, s.end - 1, s.submesh_index, s.config_index]
        if dm is not None:
            inflight = min(S - idx, B)
            key = (s.start, s.end - 1, s.submesh_index, s.config_index)
            assert pm[key] + inflight * am[key] <= dm
    costs = [s.cost for s in r.stages]
    assert r.t_max == max(costs)
    assert r.total_latency == pytest.approx(sum(costs) + (B - 1) * max(costs), rel=1e-12)
    # every plan the DP returns can be placed on concrete devices
    devs = place_submeshes([s.submesh for s in r.stages], N, M)
    assert sorted(d for ds in devs for d in ds) == list(range(N * M))


def costed_instance(rng, L, N, M, C, dm, step, inf_frac):
    """A random instance with its keyword costs: per-step costs with ``step``, and with a device
    memory ``dm`` (None: none) parameter and activation memories."""
    t, shapes = random_instance(rng, L, N, M, C, inf_frac=inf_frac)
    kw = {"step_cost": rng.uniform(0, 1, t.shape)} if step else {}
    if dm is not None:
        kw.update(param_mem=rng.uniform(0, 5, t.shape), act_mem=rng.uniform(0, 3, t.shape),
                  device_memory=dm)
    return t, shapes, kw


def checked_problem(t, shapes, N, M, B, kw):
    """The stage DP's checked problem of an instance's arrays and its keyword costs (from
    :func:`costed_instance`), every stage count allowed."""
    from autoplan.search.pipeline._stage_dp import _check_inputs  # noqa: PLC0415

    return _check_inputs(t, shapes, N, M, B, max_stages=None, min_stages=1,
                         param_mem=kw.get("param_mem"), act_mem=kw.get("act_mem"),
                         device_memory=kw.get("device_memory"), step_cost=kw.get("step_cost"))


def run_or_inf(*args, **kw):
    try:
        return stage_dp(*args, **kw)
    except InfeasiblePlanError:
        return None


# ------------------------------------------------------------------------------------------
# submesh shapes and placement
# ------------------------------------------------------------------------------------------


def test_submesh_shapes_alpa_8x8():
    assert submesh_shapes(8, 8) == [(1, 1), (1, 2), (1, 4), (1, 8)] + [(n, 8) for n in range(2, 9)]
    assert len(submesh_shapes(8, 8)) == 11


def test_submesh_shapes_pow2_hosts_for_large_clusters():
    one_host = [(1, 1), (1, 2), (1, 4), (1, 8)]
    assert submesh_shapes(128, 8, "pow2") == one_host + [(n, 8) for n in (2, 4, 8, 16, 32, 64, 128)]
    # N itself is always a shape, so a one-stage plan over the whole cluster stays possible
    assert submesh_shapes(12, 8, "pow2") == one_host + [(2, 8), (4, 8), (8, 8), (12, 8)]
    assert submesh_shapes(8, 8, "pow2") == submesh_shapes(8, 8)[:4] + [(2, 8), (4, 8), (8, 8)]
    with pytest.raises(SearchError, match="submesh hosts"):
        submesh_shapes(8, 8, "odd")
    # every device count of whole hosts can still be covered exactly: 12 hosts = 8 + 4
    r = stage_dp(np.ones((4, 4, len(submesh_shapes(12, 8, "pow2")), 1)),
                 submesh_shapes(12, 8, "pow2"), 12, 8, 4)
    assert sum(s.submesh[0] * s.submesh[1] for s in r.stages) == 96


def test_submesh_shapes_small_and_non_power_of_two():
    assert submesh_shapes(1, 1) == [(1, 1)]
    assert submesh_shapes(2, 1) == [(1, 1), (2, 1)]
    assert submesh_shapes(2, 4) == [(1, 1), (1, 2), (1, 4), (2, 4)]
    # M = 6: (1, 4) is left out (it does not divide 6, so it could not always be placed)
    assert submesh_shapes(3, 6) == [(1, 1), (1, 2), (1, 6), (2, 6), (3, 6)]


def test_submesh_shapes_rejects_bad_cluster():
    with pytest.raises(SearchError, match="num_hosts"):
        submesh_shapes(0, 8)
    with pytest.raises(SearchError, match="devices_per_host"):
        submesh_shapes(2, 2.5)


@st.composite
def shape_multisets(draw):
    N = draw(st.integers(1, 4))
    M = draw(st.sampled_from([1, 2, 4, 6, 8]))
    ones = [m for n, m in submesh_shapes(N, M) if n == 1 and m < M]
    shapes = []
    h = 0
    while h < N:
        if draw(st.booleans()):  # a whole-host block
            n = draw(st.integers(1, N - h))
            shapes.append((n, M))
            h += n
        else:  # split one host into power-of-two pieces
            left = M
            while left:
                m = draw(st.sampled_from([x for x in ones + [M] if x <= left and (left - x) % min(ones + [M]) == 0]))
                shapes.append((1, m))
                left -= m
            h += 1
    perm = draw(st.permutations(list(range(len(shapes)))))
    return N, M, [shapes[i] for i in perm]


@settings(max_examples=150, deadline=None)
@given(shape_multisets())
def test_place_submeshes_covers_without_overlap(case):
    N, M, shapes = case
    devs = place_submeshes(shapes, N, M)
    assert len(devs) == len(shapes)
    flat = [d for ds in devs for d in ds]
    assert sorted(flat) == list(range(N * M))  # cover, no overlap
    for (n, m), ds in zip(shapes, devs):
        assert len(ds) == n * m
        hosts = sorted({d // M for d in ds})
        assert len(hosts) == n and hosts == list(range(hosts[0], hosts[0] + n))
        if n == 1 and m < M:  # one-host pieces are contiguous and aligned to their size
            assert ds == list(range(ds[0], ds[0] + m)) and (ds[0] % M) % m == 0


def test_place_submeshes_example():
    assert place_submeshes([(1, 1), (2, 4), (1, 2), (1, 1)], 3, 4) == [
        [10], [0, 1, 2, 3, 4, 5, 6, 7], [8, 9], [11]
    ]


def test_place_submeshes_rejects():
    with pytest.raises(SearchError, match="exactly"):
        place_submeshes([(1, 4)], 2, 4)
    with pytest.raises(SearchError, match="submesh shape"):
        place_submeshes([(2, 2), (2, 2)], 2, 4)  # (2, 2) is not one of Alpa's shapes
    with pytest.raises(SearchError, match="submesh shape"):
        place_submeshes([(1, 4), (1, 4), (1, 4)], 2, 6)


# ------------------------------------------------------------------------------------------
# stage_dp
# ------------------------------------------------------------------------------------------


def test_known_answer_two_layers():
    shapes = submesh_shapes(1, 2)  # (1,1), (1,2)
    t = np.full((2, 2, 2, 1), np.inf)
    t[0, 0, 0, 0] = t[1, 1, 0, 0] = 1.0  # one layer on one device
    t[0, 1, 1, 0] = 1.5  # both layers on two devices
    t[0, 0, 1, 0] = t[1, 1, 1, 0] = 0.6
    r = stage_dp(t, shapes, 1, 2, 4)  # two stages: 2 + 3 * 1 = 5 beats 1.5 + 3 * 1.5 = 6
    assert r.total_latency == pytest.approx(5.0)
    assert [(s.start, s.end, s.submesh) for s in r.stages] == [(0, 1, (1, 1)), (1, 2, (1, 1))]
    r1 = stage_dp(t, shapes, 1, 2, 1)  # B = 1: no pipelining pays, one stage: 1.5
    assert r1.total_latency == pytest.approx(1.5)
    assert len(r1.stages) == 1 and r1.evaluated_t_max == 1
    r2 = stage_dp(t, shapes, 1, 2, 4, max_stages=1)
    assert r2.total_latency == pytest.approx(6.0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), cluster=st.sampled_from(CLUSTERS), L=st.integers(1, 5),
       C=st.integers(1, 2), B=st.integers(1, 6), limit=st.sampled_from([None, None, 1, 2, 3]))
def test_matches_brute_force(seed, cluster, L, C, B, limit):
    rng = np.random.default_rng(seed)
    N, M = cluster
    t, shapes = random_instance(rng, L, N, M, C)
    expect = brute_force(t, shapes, N, M, B, max_stages=limit)
    r = run_or_inf(t, shapes, N, M, B, max_stages=limit)
    if math.isinf(expect):
        assert r is None
    else:
        assert r is not None and r.total_latency == pytest.approx(expect, rel=1e-12)
        check_result(r, t, shapes, N, M, B)
        if limit is not None:
            assert len(r.stages) <= limit


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), cluster=st.sampled_from(CLUSTERS), L=st.integers(1, 5),
       C=st.integers(1, 2), B=st.integers(1, 6), dm=st.floats(2.0, 12.0),
       limit=st.sampled_from([None, None, 2]))
def test_matches_brute_force_with_memory(seed, cluster, L, C, B, dm, limit):
    rng = np.random.default_rng(seed)
    N, M = cluster
    t, shapes = random_instance(rng, L, N, M, C, inf_frac=0.1)
    pm = rng.uniform(0, 5, t.shape)
    am = rng.uniform(0, 3, t.shape)
    expect = brute_force(t, shapes, N, M, B, pm, am, dm, max_stages=limit)
    r = run_or_inf(t, shapes, N, M, B, param_mem=pm, act_mem=am, device_memory=dm, max_stages=limit)
    if math.isinf(expect):
        assert r is None
    else:
        assert r is not None and r.total_latency == pytest.approx(expect, rel=1e-12)
        check_result(r, t, shapes, N, M, B, pm, am, dm)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), cluster=st.sampled_from(CLUSTERS), L=st.integers(1, 6),
       C=st.integers(1, 2), B=st.integers(1, 8), dm=st.one_of(st.none(), st.floats(2.0, 12.0)),
       step=st.booleans())
def test_stage_count_runs_sharing_tables_equal_runs_alone(seed, cluster, L, C, B, dm, step):
    """stage_dp_counts (the per-position tables made once for several stage-count ranges, as
    the pipeline search runs them) gives each range exactly what stage_dp gives alone."""
    N, M = cluster
    t, shapes, kw = costed_instance(np.random.default_rng(seed), L, N, M, C, dm, step, 0.1)
    counts = [(1, None), (2, 2), (1, 3), (3, 3), (2, None)]
    got = stage_dp_counts(t, shapes, N, M, B, counts, explain=False, **kw)
    for (lo, hi), r in zip(counts, got):
        try:
            alone = stage_dp(t, shapes, N, M, B, min_stages=lo, max_stages=hi, explain=False, **kw)
        except InfeasiblePlanError:
            assert isinstance(r, InfeasiblePlanError)
            continue
        assert not isinstance(r, InfeasiblePlanError)
        assert r.total_latency == alone.total_latency and r.stages == alone.stages
        assert r.alternatives == alone.alternatives


def reference_alpa_dp(t, shapes, N, M, B):
    """Alpa's Eq. 3-4 literally: every distinct stage cost as t_max, no pruning (no memory)."""
    L, _, K, _ = t.shape
    tc = t.min(axis=3)
    sizes = [n * m for n, m in shapes]
    cands = sorted({float(v) for i in range(L) for v in tc[i, i:].ravel() if np.isfinite(v)})
    best = math.inf
    for tm in cands:
        @functools.cache
        def F(k, d, tm=tm):
            if k == L:
                return 0.0 if d == 0 else math.inf
            out = math.inf
            for i in range(k, L):
                for q in range(K):
                    c = tc[k, i, q]
                    if c <= tm and sizes[q] <= d:
                        out = min(out, c + F(i + 1, d - sizes[q]))
            return out

        best = min(best, F(0, N * M) + (B - 1) * tm)
    return best


@pytest.mark.parametrize("seed", range(4))
def test_matches_unpruned_alpa_dp_on_medium_instances(seed):
    rng = np.random.default_rng(100 + seed)
    N, M = (2, 4) if seed % 2 else (2, 2)
    t, shapes = random_instance(rng, 8, N, M, 2, inf_frac=0.05)
    B = [2, 8, 16, 4][seed]
    r = stage_dp(t, shapes, N, M, B)
    assert r.total_latency == pytest.approx(reference_alpa_dp(t, shapes, N, M, B), rel=1e-12)
    check_result(r, t, shapes, N, M, B)


def test_all_infinite_is_infeasible_without_least_memory():
    shapes = submesh_shapes(2, 2)
    t = np.full((3, 3, len(shapes), 2), np.inf)
    with pytest.raises(InfeasiblePlanError) as info:
        stage_dp(t, shapes, 2, 2, 4)
    assert info.value.least_memory is None


def test_no_cover_is_infeasible():
    # only (1, 1) submesh has costs: two layers can use at most 2 of the 4 devices
    shapes = submesh_shapes(1, 4)
    t = np.full((2, 2, 3, 1), np.inf)
    t[:, :, 0, 0] = 1.0
    with pytest.raises(InfeasiblePlanError, match="covering all"):
        stage_dp(t, shapes, 1, 4, 2)


def test_memory_infeasible_reports_least_memory():
    rng = np.random.default_rng(7)
    N, M, B = 2, 2, 4
    t, shapes = random_instance(rng, 4, N, M, 2, inf_frac=0.0)
    pm = rng.uniform(1, 5, t.shape)
    am = rng.uniform(0.5, 3, t.shape)
    with pytest.raises(InfeasiblePlanError) as info:
        stage_dp(t, shapes, N, M, B, param_mem=pm, act_mem=am, device_memory=0.5)
    least = info.value.least_memory
    assert least is not None and least > 0.5
    r = stage_dp(t, shapes, N, M, B, param_mem=pm, act_mem=am, device_memory=least)
    check_result(r, t, shapes, N, M, B, pm, am, least)
    with pytest.raises(InfeasiblePlanError):
        stage_dp(t, shapes, N, M, B, param_mem=pm, act_mem=am, device_memory=least * (1 - 1e-9))


def test_memory_forces_more_stages():
    # two layers on a 1 x 2 cluster: one stage on (1, 2) is faster (1.2 * 4 = 4.8 < 1 + 1 + 3 = 5)
    # but its activations (2.5 per micro-batch) do not fit in 2.0; split in two stages on (1, 1),
    # the first (2nd from the end) holds 2 micro-batches of 1.0, the last one holds 1.
    shapes = submesh_shapes(1, 2)
    t = np.full((2, 2, 2, 1), np.inf)
    t[0, 0, 0, 0] = t[1, 1, 0, 0] = 1.0
    t[0, 1, 1, 0] = 1.2
    pm = np.zeros_like(t)
    am = np.ones_like(t)
    am[0, 1, 1, 0] = 2.5
    free = stage_dp(t, shapes, 1, 2, 4)
    assert len(free.stages) == 1 and free.total_latency == pytest.approx(4.8)
    tight = stage_dp(t, shapes, 1, 2, 4, param_mem=pm, act_mem=am, device_memory=2.0)
    assert len(tight.stages) == 2 and tight.total_latency == pytest.approx(5.0)
    # with one micro-batch only one is ever in flight: 1.0 fits even in 1.0
    one = stage_dp(t, shapes, 1, 2, 1, param_mem=pm, act_mem=am, device_memory=1.0)
    assert len(one.stages) == 2
    with pytest.raises(InfeasiblePlanError) as info:
        stage_dp(t, shapes, 1, 2, 4, param_mem=pm, act_mem=am, device_memory=1.5)
    assert info.value.least_memory == pytest.approx(2.0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(t_intra=np.zeros((2, 3, 3, 1))), "shape"),
        (dict(t_intra=np.full((2, 2, 3, 1), np.nan)), "NaN"),
        (dict(t_intra=-np.ones((2, 2, 3, 1))), ">= 0"),
        (dict(t_intra=np.ones((2, 2, 2, 1))), "one shape per"),
        (dict(microbatches=0), "microbatches"),
        (dict(max_stages=0), "max_stages"),
        (dict(param_mem=np.ones((2, 2, 3, 1))), "without device_memory"),
        (dict(device_memory=1.0, act_mem=np.ones((3, 3, 3, 1))), "shape of t_intra"),
        (dict(device_memory=-1.0), "device_memory"),
        (dict(submeshes=[(1, 1), (1, 2), (2, 2)]), "submesh shape"),
    ],
)
def test_bad_input(kwargs, match):
    args = dict(t_intra=np.ones((2, 2, 3, 1)), submeshes=submesh_shapes(1, 4), num_hosts=1,
                devices_per_host=4, microbatches=2)
    args.update(kwargs)
    with pytest.raises(SearchError, match=match):
        stage_dp(**args)


def gpt_like_costs(L, N, M, C, seed, penalty=0.6):
    rng = np.random.default_rng(seed)
    shapes = submesh_shapes(N, M)
    layer = rng.uniform(0.5, 1.5, L)
    pre = np.concatenate([[0.0], np.cumsum(layer)])
    work = np.maximum(pre[None, 1:] - pre[:-1, None], 0)
    sizes = np.array([n * m for n, m in shapes], dtype=float)
    scale = (1 + penalty * np.log2(sizes)) / sizes
    t = work[:, :, None, None] * scale[None, None, :, None] * rng.uniform(1, 1.4, (L, L, len(shapes), C))
    return t, shapes


def test_64_layers_on_8x8():
    # the speed of this case is measured in benchmarks/stage_dp.py; here: a valid, multi-stage plan
    t, shapes = gpt_like_costs(64, 8, 8, 4, seed=1)
    r = stage_dp(t, shapes, 8, 8, 16)
    check_result(r, t, shapes, 8, 8, 16)
    assert len(r.stages) > 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), cluster=st.sampled_from(CLUSTERS), L=st.integers(1, 5),
       C=st.integers(1, 3), B=st.integers(1, 6), memory=st.booleans(),
       counts=st.sampled_from([(1, None), (1, None), (2, None), (2, 2), (1, 3), (3, 3)]))
def test_first_stage_step_cost_and_stage_counts_match_brute_force(seed, cluster, L, C, B, memory,
                                                                   counts):
    """With per-step costs the DP adds the first stage's once (its config chosen by t + u) and
    stays exact; min_stages/max_stages bound the number of stages."""
    rng = np.random.default_rng(seed)
    N, M = cluster
    t, shapes = random_instance(rng, L, N, M, C, inf_frac=0.1)
    step = np.round(rng.uniform(0.0, 8.0, t.shape), 1)
    lo, hi = counts
    kw = {}
    if memory:
        kw = dict(param_mem=rng.uniform(0, 5, t.shape), act_mem=rng.uniform(0, 3, t.shape),
                  device_memory=9.0)
    expect = brute_force(t, shapes, N, M, B, kw.get("param_mem"), kw.get("act_mem"),
                         kw.get("device_memory"), max_stages=hi, step=step, min_stages=lo)
    r = run_or_inf(t, shapes, N, M, B, step_cost=step, min_stages=lo, max_stages=hi, **kw)
    if math.isinf(expect):
        assert r is None
        return
    assert r is not None and r.total_latency == pytest.approx(expect, rel=1e-12)
    assert lo <= len(r.stages) <= (hi or L)
    costs = [s.cost for s in r.stages]
    first = r.stages[0]
    assert first.step_cost == step[first.start, first.end - 1, first.submesh_index,
                                   first.config_index]
    assert r.total_latency == pytest.approx(sum(costs) + (B - 1) * max(costs) + first.step_cost)
    # the alternatives are distinct plans, best first, each with its own latency
    totals = [v for v, _ in r.alternatives]
    assert totals == sorted(totals) and totals[0] == pytest.approx(r.total_latency)
    keys = [tuple((s.start, s.end, s.submesh_index, s.config_index) for s in alt)
            for _, alt in r.alternatives]
    assert len(set(keys)) == len(keys)
    for v, alt in r.alternatives:
        c = [s.cost for s in alt]
        assert v == pytest.approx(sum(c) + (B - 1) * max(c) + alt[0].step_cost)


def test_first_stage_config_trades_time_for_per_step_work():
    """A first stage whose faster config synchronises much more once per step takes the other
    config when B x (time) + per-step says so."""
    shapes = submesh_shapes(1, 1)
    t = np.array([[[[1.0, 1.2]]]])  # one layer, one submesh, configs: fast / slower
    step = np.array([[[[5.0, 0.5]]]])  # the fast one pays 5.0 once per step
    r = stage_dp(t, shapes, 1, 1, 4, step_cost=step)
    assert r.stages[0].config_index == 1 and r.total_latency == pytest.approx(4 * 1.2 + 0.5)
    r = stage_dp(t, shapes, 1, 1, 64, step_cost=step)  # many micro-batches: per-step amortised
    assert r.stages[0].config_index == 0 and r.total_latency == pytest.approx(64 * 1.0 + 5.0)


def test_dp_latency_of_balanced_stages_equals_the_simulated_step():
    """Alpa's Eq. 2 plus the first stage's per-step work is the 1F1B and GPipe makespan plus
    the last update when stages are balanced and transfers free."""
    from autoplan.plans._schedule import schedule_events, schedule_stats

    L, N, M = 4, 1, 4
    shapes = submesh_shapes(N, M)
    K = len(shapes)
    t = np.full((L, L, K, 1), np.inf)
    step = np.zeros((L, L, K, 1))
    k1 = shapes.index((1, 1))
    for i in range(L):
        t[i, i, k1, 0] = 3.0  # forward 1 + backward 2 per micro-batch
        step[i, i, k1, 0] = 0.7 + 0.1 * i  # later stages finish their update earlier
    for B in (1, 3, 8):
        r = stage_dp(t, shapes, N, M, B, step_cost=step)
        assert len(r.stages) == 4
        for kind in ("1f1b", "gpipe"):
            ev = schedule_events(kind, 4, B, [1.0] * 4, [2.0] * 4,
                                 step_times=[s.step_cost for s in r.stages])
            assert schedule_stats(ev, 4).step_time == pytest.approx(r.total_latency)


def test_min_stages_bad_input():
    t = np.ones((2, 2, 1, 1))
    with pytest.raises(SearchError, match="min_stages"):
        stage_dp(t, [(1, 1)], 1, 1, 2, min_stages=0)
    with pytest.raises(InfeasiblePlanError, match="at least 3"):  # two layers, three stages
        stage_dp(np.ones((2, 2, 3, 1)), submesh_shapes(1, 4), 1, 4, 2, min_stages=3)
    with pytest.raises(SearchError, match="step_cost"):
        stage_dp(t, [(1, 1)], 1, 1, 2, step_cost=-np.ones((2, 2, 1, 1)))


# ------------------------------------------------------------------------------------------
# the exact speed-ups equal the computations they replace
# ------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), L=st.integers(1, 7), K=st.integers(1, 3),
       C=st.integers(1, 4), zero_act=st.booleans(), steps=st.lists(st.integers(1, 9), min_size=1,
                                                                    max_size=3))
def test_position_tables_equal_each_position_tested_alone(seed, L, K, C, zero_act, steps):
    """The per-position tables made from each config's count of fitting positions (a position
    from the one before, its dropped entries recomputed) equal the memory test run at every
    position, whatever positions are asked for and in what order."""
    from autoplan.search.pipeline._stage_dp import _Positions  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    t = np.round(rng.uniform(0.0, 4.0, (L, L, K, C)), 1)  # rounded: ties between configs
    t[rng.random(t.shape) < 0.2] = np.inf
    pm = np.round(rng.uniform(0.0, 6.0, t.shape), 1)
    am = np.zeros(t.shape) if zero_act else np.round(rng.uniform(0.0, 2.0, t.shape), 2)
    dm = float(rng.uniform(1.0, 12.0))
    pos = _Positions(t, pm, am, dm)
    base = np.where(np.tril(np.ones((L, L), dtype=bool), k=-1)[:, :, None, None], np.inf, t)
    for n_pos in steps:
        best, cfg, first = pos.upto(n_pos, True)
        for p in range(n_pos):
            masked = np.where(pm + (p + 1) * am <= dm, base, np.inf)
            assert np.array_equal(best[p], masked.min(axis=3))
            assert np.array_equal(cfg[p], masked.argmin(axis=3))
            assert np.array_equal(first[p], masked[0])
        # the candidate bounds: every distinct finite latency of those positions
        values = np.concatenate([best[np.isfinite(best)], first[np.isfinite(first)]])
        assert np.array_equal(pos.values(n_pos, True), np.unique(values))


def dense_tables(tb, P, sizes, D, n_exact):
    """F(s, k, d) by the recurrence over every term (no pruning)."""
    L, W = tb.shape[1], tb.shape[2]
    F = [np.full((L + 1, D + 1), np.inf)]
    F[0][L, 0] = 0.0
    for s in range(1, n_exact + 1):
        p = min(s, P) - 1
        Fs = np.full((L + 1, D + 1), np.inf)
        for k in range(L):
            for w in range(min(W, L - k)):
                for q, size in enumerate(sizes):
                    for d in range(int(size), D + 1):
                        Fs[k, d] = min(Fs[k, d], tb[p, k, w, q] + F[s - 1][k + w + 1, d - size])
        F.append(Fs)
    return F


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), cluster=st.sampled_from(CLUSTERS), L=st.integers(1, 6),
       P=st.integers(1, 4), W=st.integers(1, 6), inf_frac=st.sampled_from([0.0, 0.3, 0.7]),
       batched=st.booleans())
def test_exact_tables_equal_the_recurrence_over_every_term(seed, cluster, L, P, W, inf_frac,
                                                           batched):
    """The stage-count tables built from the finite terms only equal the recurrence taken over
    every (width, submesh) term, built batched (every candidate of a table at once) or run by
    run alike."""
    from autoplan.search.pipeline._stage_dp import _exact_tables  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    N, M = cluster
    sizes = np.array([n * m for n, m in submesh_shapes(N, M)], dtype=np.int64)
    W = min(W, L)
    tb = np.round(rng.uniform(0.0, 3.0, (P, L, W, len(sizes))), 1)
    tb[rng.random(tb.shape) < inf_frac] = np.inf
    tb[:, (np.arange(L)[:, None] + np.arange(W)[None, :]) >= L, :] = np.inf  # past the last layer
    n_exact = min(L, N * M) + 1
    got = _exact_tables(tb, P, sizes, N * M, n_exact, batched=batched)
    want = dense_tables(tb, P, sizes, N * M, n_exact)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_batched_tables_in_chunks_of_one_layer_equal_the_recurrence(monkeypatch):
    """Summed a first layer's candidates at a time (the chunks a wide table is cut into), the
    batched tables still equal the recurrence over every term, on a cluster whose sums of
    submesh sizes leave columns out."""
    from autoplan.search.pipeline import _stage_dp  # noqa: PLC0415

    monkeypatch.setattr(_stage_dp, "BATCHED_TABLE_CHUNK", 1)
    sizes = np.array([n * m for n, m in submesh_shapes(3, 4)], dtype=np.int64)
    for seed in range(6):
        rng = np.random.default_rng(seed)
        L, P, W = 7, 3, 5
        tb = np.round(rng.uniform(0.0, 3.0, (P, L, W, len(sizes))), 1)
        tb[rng.random(tb.shape) < 0.4] = np.inf
        tb[:, (np.arange(L)[:, None] + np.arange(W)[None, :]) >= L, :] = np.inf
        got = _stage_dp._exact_tables(tb, P, sizes, 12, 8, batched=True)
        want = dense_tables(tb, P, sizes, 12, 8)
        assert all(np.array_equal(a, b) for a, b in zip(got, want))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), cluster=st.sampled_from(CLUSTERS), L=st.integers(1, 7),
       C=st.integers(1, 3), B=st.integers(1, 8), dm=st.one_of(st.none(), st.floats(2.0, 12.0)),
       step=st.booleans())
def test_finite_stages_of_a_run_are_those_of_its_own_masked_table(seed, cluster, L, C, B, dm,
                                                                  step):
    """The finite stages a DP run reads (found once per prepared problem, filtered by t_max) are
    exactly, and in the same order, the finite entries of the run's own table: the stage costs
    sliced to the widths the run keeps, inf past t_max; and the run's tables equal those built
    from that table."""
    from autoplan.search.pipeline import _stage_dp  # noqa: PLC0415

    N, M = cluster
    t, shapes, kw = costed_instance(np.random.default_rng(seed), L, N, M, C, dm, step, 0.2)
    problem = checked_problem(t, shapes, N, M, B, kw)
    prep = problem.prepared(kw.get("device_memory"))
    D = problem.num_devices
    n_exact, _ = problem.layout(prep)
    Pn = max(1, min(n_exact, prep.P))
    K = prep.tb.shape[3]
    for t_max in list(prep.candidates[::max(1, len(prep.candidates) // 7)]) + [0.0]:
        ok_w = np.nonzero(prep.min_by_width <= t_max)[0]
        if ok_w.size == 0:
            continue
        tb = prep.tb[:, :, : int(ok_w[-1]) + 1, :]
        tb = np.where(tb <= t_max, tb, np.inf)
        pp, kk, ww, qq = np.nonzero(np.isfinite(tb[:Pn]))
        got = prep.finite_stages(Pn, float(t_max))
        want = (pp, kk, (kk + ww + 1) * K + qq, tb[:Pn][pp, kk, ww, qq])
        assert all(np.array_equal(a, b) for a, b in zip(got, want))
        with_finite = _stage_dp._exact_tables(tb, prep.P, problem.sizes, D, n_exact, True, got)
        alone = _stage_dp._exact_tables(tb, prep.P, problem.sizes, D, n_exact, True)
        assert all(np.array_equal(a, b) for a, b in zip(with_finite, alone))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), cluster=st.sampled_from(CLUSTERS), L=st.integers(1, 6),
       C=st.integers(1, 2), B=st.integers(1, 8), dm=st.one_of(st.none(), st.floats(2.0, 12.0)),
       step=st.booleans())
def test_no_plan_below_the_least_t_max(seed, cluster, L, C, B, dm, step):
    """Every candidate bound below :func:`_least_t_max` has no plan (the runs the search skips
    there would find none), and the optimum's slowest stage is never below it."""
    from autoplan.search.pipeline._stage_dp import _least_t_max  # noqa: PLC0415

    N, M = cluster
    t, shapes, kw = costed_instance(np.random.default_rng(seed), L, N, M, C, dm, step, 0.3)
    problem = checked_problem(t, shapes, N, M, B, kw)
    prep = problem.prepared(dm)
    least = _least_t_max(prep, problem.sizes, problem.num_devices)
    for cand in prep.candidates:
        if cand < least:
            assert problem.dp(prep, float(cand))[1] is None
    r = run_or_inf(t, shapes, N, M, B, **kw)
    if r is not None:
        assert r.t_max >= least
