"""How users' models are seen by the search: their layers (named scopes where the libraries
leave usable ones, mined blocks where they do not), the folded search's plans against the
exhaustive ILP's, and the level ``"auto"`` picks."""

from __future__ import annotations

import re
import warnings

import pytest
import user_steps

import autoplan
from autoplan.algorithms import group_layers, level_search
from autoplan.search.fold._levels import AUTO_EXHAUSTIVE_OPS, choose_level


@pytest.fixture(scope="module")
def graphs():
    cache = {}

    def get(name, **kw):
        key = (name, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = autoplan.trace(user_steps.MAKERS[name](**kw))
        return cache[key]

    return get


def test_layer_names_follow_the_libraries_scopes(graphs):
    # Flax linen: the blocks inside the root module are the layers, in forward and backward
    # (the backward of a remat block repeats the root scope: Mixer/Mixer/CheckpointMixerBlock_0)
    g = graphs("linen_mixer")
    names = g.layer_names
    blocks = [f"Mixer/CheckpointMixerBlock_{i}" for i in range(2)]
    assert [ly.name for ly in g.layers if ly.name.startswith("Mixer/Check")] == blocks
    for role in ("forward", "backward"):
        assert {names[op.id] for op in g if op.role == role} >= set(blocks)
    # lax.scan iterations: iteration i of the backward scan is named as forward iteration i
    g = graphs("scan_cnn")
    for i in range(3):
        fwd = [op for op in g if g.layer_names[op.id] == f"scan_{i}" and op.role == "forward"]
        bwd = [op for op in g if g.layer_names[op.id] == f"scan_{i}" and op.role == "backward"]
        assert len(fwd) == 10 and len(bwd) == 21
    # Equinox names scopes by layer class (eqx.nn.Linear recurs), jnp.einsum by its subscripts:
    # neither is a layer
    for name in ("equinox_cnn", "nnx_transformer"):
        g = graphs(name)
        assert any(op.scope for op in g) and not any(g.layer_names)


@pytest.mark.parametrize("make, prefix", [(user_steps.make_linen_scan, "LinenScanNet/"),
                                          (user_steps.make_nnx_scan, "")])
def test_layers_stacked_with_the_libraries_scans_are_layers(make, prefix):
    """``nn.scan`` and ``nnx.scan`` over stacked layers: each iteration is a layer for the
    pipeline search (with the model's input and output layers around them for linen)."""
    g = autoplan.trace(make(layers=4))
    names = [ly.name for ly in group_layers(g)]
    scans = [f"{prefix}scan_{i}" for i in range(4)]
    assert [n for n in names if "scan_" in n] == scans
    bwd = {g.layer_names[op.id] for op in g if op.role == "backward"}
    assert set(scans) <= bwd


@pytest.mark.parametrize("name, blocks", [("nnx_transformer", 2), ("equinox_cnn", 2),
                                          ("control_flow_mlp", 2)])
def test_layers_without_scopes_are_the_mined_blocks(graphs, name, blocks):
    """Without usable scopes the pipeline layers are the mined repeated blocks (the NNX
    transformer's blocks, the Equinox residual blocks, the MLP's hidden layers after the first),
    plus what comes before and after them, each named from the parameters it reads first."""
    g = graphs(name)
    layers = group_layers(g)
    assert len(layers) == blocks + 2
    want = {"nnx_transformer": ["embed", "blocks[0]", "blocks[1]", "ln+head"],
            "equinox_cnn": ["conv1+conv2", "blocks[0]", "blocks[1]", "head"],
            "control_flow_mlp": ["input", "params[0]", "params[1]", "params[2]"]}[name]
    assert [ly.name for ly in layers] == want
    starts = [ly.forward[0] for ly in layers]
    assert starts == sorted(starts) and starts[0] == 0  # ranges of the forward pass, in order
    # the blocks' forward operators are alike (their backward may differ: the first block's
    # input needs no gradient)
    fwd = [[g.ops[o].primitive for o in ly.forward] for ly in layers[1:-1]]
    assert all(f == fwd[0] for f in fwd)
    ex = [ly for ly in layers[1:-1]]
    assert max(ly.flops for ly in ex) <= 1.6 * min(ly.flops for ly in ex)


def _levels(g, shape, **kw):
    cluster = autoplan.Cluster.parse("cpu:8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return (level_search(g, cluster, shape, level="exhaustive"),
                level_search(g, cluster, shape, level="folded", **kw))


@pytest.mark.parametrize("name", ["nnx_transformer", "linen_mixer", "equinox_cnn",
                                  "control_flow_mlp"])
@pytest.mark.parametrize("shape", [(8, 1), (2, 4)])
def test_folded_plans_of_users_models_match_the_exhaustive_ilp(graphs, name, shape):
    """The folded search's plans are as good as the exhaustive ILP's on users' models: a graph
    input read by several segments (a parameter updated in another segment, the causal mask's
    tokens) takes one spec in all of them, boundary tensors one side's ILP does not decide take
    the other side's spec, and a remat block's backward stays in its layer. Before, the folded
    plans were up to 7x the exhaustive ones (spurious all-gathers of the parameters)."""
    ex, fo = _levels(graphs(name), shape)
    assert fo.stats["level"] == "folded"
    assert fo.plan.predicted.step_time <= ex.plan.predicted.step_time * 1.01
    assert fo.stats["stitch_mismatches"] == 0


def test_folded_search_past_its_ilp_bound_falls_back_to_exhaustive(graphs):
    """The scan CNN's stacked weights and residuals couple every iteration's segment; its folded
    search needs hundreds of pair ILPs. Bounded, it stops and the exhaustive ILP is used."""
    g = graphs("scan_cnn")
    ex, fo = _levels(g, (2, 4), max_ilps=12)
    assert fo.stats["level"] == "exhaustive" and "bound of 12 ILPs" in fo.stats["level_reason"]
    assert fo.plan.predicted.step_time == ex.plan.predicted.step_time
    assert any("bound of 12 ILPs" in n for n in fo.plan.notes)


def test_auto_bound_is_foreseen_from_the_disagreeing_boundaries(graphs, monkeypatch):
    """With the automatic bound, a chain whose disagreeing boundaries have more one-sided states
    left to solve than the bound allows goes to the exhaustive search right after its free
    solves; the same bound given explicitly is reached by solving up to it. Both plans are the
    exhaustive search's."""
    from autoplan.search.fold import _levels as L

    g = graphs("scan_cnn")
    L._stitched_of(g).clear()  # (the module's graphs are shared: searched by the tests before)
    monkeypatch.setattr(L, "AUTO_EXHAUSTIVE_OPS", 0)  # (the auto level folds the small graph,
    monkeypatch.setattr(L, "AUTO_FOLD_RATIO", 0.0)  # with a bound of 12 ILPs)
    monkeypatch.setattr(L, "AUTO_MIN_ILPS", 12)
    monkeypatch.setattr(L, "AUTO_ILPS_PER_CLASS", 0)
    solved = []
    solve = L.solve_ilp
    monkeypatch.setattr(L, "solve_ilp", lambda *a, **k: solved.append(1) or solve(*a, **k))
    cluster = autoplan.Cluster.parse("cpu:8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = level_search(g, cluster, (2, 4), level="exhaustive")
        auto = level_search(g, cluster, (2, 4))
        free = len(solved)
        solved.clear()
        given = level_search(g, cluster, (2, 4), level="folded", max_ilps=12)
    why = auto.stats["level_reason"]
    assert auto.stats["level"] == "exhaustive" and "more than its bound of 12 ILPs" in why
    assert f"after {free} ILPs" in why and free < 12
    assert "reached its bound of 12 ILPs" in given.stats["level_reason"] and len(solved) == 12
    assert (auto.plan.predicted.step_time == given.plan.predicted.step_time
            == ex.plan.predicted.step_time)
    # the count is exact: with a bound of the ILPs solved plus the states counted, that run of
    # the chain DP goes on; one less and it stops there
    states = int(re.search(r"had (\d+) one-sided", why).group(1))
    for bound, stops in ((free + states, False), (free + states - 1, True)):
        monkeypatch.setattr(L, "AUTO_MIN_ILPS", bound)
        L._stitched_of(g).clear()  # (what the searches before found, kept by key, not by bound)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = level_search(g, cluster, (2, 4))
        reason = res.stats.get("level_reason", "")
        assert (f"had {states} one-sided boundary states left to solve after {free} ILPs"
                in reason) is stops
    # a search of the same graph and key that stopped is not searched again (the Explorer's
    # budget changes): it goes to the exhaustive ILP without a segment ILP
    solved.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = level_search(g, cluster, (2, 4), memory_budget=1e12)
    assert not solved and again.stats["level"] == "exhaustive"


def test_foreseen_states_are_the_one_sided_ilps_left(graphs, monkeypatch):
    """What the forecast counts at each run of the chain DP: one-sided ILPs none of which is
    solved yet, among which is every one-sided ILP the run then solves (the scan CNN's 14 runs,
    the later ones with one-sided ILPs of earlier runs solved)."""
    from autoplan.search.fold import _levels as L

    g = graphs("scan_cnn")
    L._stitched_of(g).clear()
    monkeypatch.setattr(L, "AUTO_EXHAUSTIVE_OPS", 0)  # (folded, with a bound it never reaches)
    monkeypatch.setattr(L, "AUTO_FOLD_RATIO", 0.0)
    monkeypatch.setattr(L, "AUTO_MIN_ILPS", 10**6)
    runs: list[tuple[set, set]] = []  # per run: (counted, one-sided ILPs solved)
    count, solve = L._ChainSearch.one_sided_left, L._ChainSearch._solve

    def counted(self, cands, agree, ckey):
        left = count(self, cands, agree, ckey)
        assert not left & set(self.cache)
        runs.append((left, set()))
        return left

    def solved(self, rep, ck, a, b):
        if runs and (a is None) != (b is None):
            runs[-1][1].add((ck, a, b))
        return solve(self, rep, ck, a, b)

    monkeypatch.setattr(L._ChainSearch, "one_sided_left", counted)
    monkeypatch.setattr(L._ChainSearch, "_solve", solved)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = level_search(g, autoplan.Cluster.parse("cpu:8"), (2, 4))
    assert res.stats["level"] == "folded" and len(runs) > 1
    assert all(done <= left for left, done in runs)
    assert sum(len(done) for _, done in runs) > 0


def test_auto_level_picks_by_size_and_repetition(graphs):
    g = graphs("nnx_transformer")
    level, why = choose_level(g)
    assert level == "exhaustive" and "fast path" in why
    big = autoplan.trace(autoplan.models.get("gpt", size="tiny", layers=12, hidden=32, heads=2,
                                              seq_len=8, vocab=64))
    assert len(big) > AUTO_EXHAUSTIVE_OPS
    level, why = choose_level(big)
    assert level == "folded" and "fold ratio" in why
    res = level_search(big, autoplan.Cluster.parse("cpu:8"), (2, 4))
    assert res.stats["level"] == "folded" and res.stats["ilps_solved"] <= 64
    assert res.plan.level == "folded" and any("fold ratio" in n for n in res.plan.notes)
