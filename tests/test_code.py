"""Plan.to_code(): the snippet runs on 8 emulated devices and gives plan.named_shardings()."""

from __future__ import annotations

import re

import jax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autoplan
from autoplan import models
from autoplan.plans._code import path_rules, stage_rules


@pytest.fixture(scope="module")
def gpt():
    wl = models.get("gpt", "tiny", layers=4)
    return wl, autoplan.search(wl, "cpu:8", baselines=True)


def run(code: str) -> dict:
    ns: dict = {}
    exec(compile(code, "<plan.to_code()>", "exec"), ns)
    return ns


def test_the_snippet_builds_the_plans_shardings(gpt):
    wl, result = gpt
    intra = [p for p in result.plans if not p.is_pipeline]
    assert len(intra) >= 4 and any(p.label.startswith("baseline") for p in intra)
    for plan in intra:
        code = plan.to_code()
        ns = run(code)
        got = ns["shardings_for"](wl.args)
        want = plan.named_shardings()
        assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
        assert got == want, plan.describe()
        assert ns["mesh"].devices.shape == plan.mesh_shape
        assert ns["mesh"].axis_names == plan.axis_names
        # short: a rule per kind of leaf, not one per leaf (4 layers of params, mu and nu)
        rules = [ln for ln in code.splitlines() if ln.startswith("    (")]
        assert len(rules) <= 24 and 4 * len(rules) < len(plan.inputs)


def test_the_snippet_of_a_pipeline_plan_gives_each_stage_its_leaves(gpt):
    wl, result = gpt
    pipe = [p for p in result.plans if p.is_pipeline]
    assert pipe
    for plan in pipe:
        ns = run(plan.to_code())
        assert len(ns["meshes"]) == len(plan.stages)
        for s in plan.stages:
            got = ns["shardings_for"](wl.args, s.index)
            want = plan.named_shardings(stage=s.index)
            assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
            assert got == want, (plan.describe(), s.index)


def test_the_snippet_mirrors_a_users_own_pytree_types():
    import importlib.util
    import pathlib

    import optax

    path = pathlib.Path(__file__).parent / "user_models" / "optax_mlp.py"
    spec = importlib.util.spec_from_file_location("autoplan_test_optax_mlp", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    wl = mod.workload(hidden=32, layers=2, batch=8)
    plan = autoplan.search(autoplan.Workload(wl.fn, wl.args), "cpu:8", pipeline=False,
                           mesh_shape=(2, 4), baselines=False).best
    got = run(plan.to_code())["shardings_for"](wl.args)
    assert got == plan.named_shardings()
    assert isinstance(got[1][0], optax.ScaleByAdamState)  # the user's own types, mirrored


def test_flax_logical_axis_rules_on_request(gpt):
    _, result = gpt
    plan = result.plans[0]
    code = plan.to_code(logical_axis_rules=True)
    rules = run(code)["LOGICAL_AXIS_RULES"]
    assert rules == [(n, ax) for n, ax in plan.logical_axis_rules() if ax is not None]
    assert "LOGICAL_AXIS_RULES" not in plan.to_code()  # zoo pytrees are dicts, not Flax's


def test_rules_generalise_numbered_layers_and_merge_adam_moments():
    leaves = []
    for arg, prefix in ((0, ""), (1, "['mu']"), (1, "['nu']")):
        for k in range(12):
            leaves.append((arg, f"{prefix}['layers_{k}']['fc1']['kernel']", (None, ("y",)), 0))
            leaves.append((arg, f"{prefix}['layers_{k}']['fc2']['kernel']", (("y",), None), 0))
            leaves.append((arg, f"{prefix}['layers_{k}']['ln']['scale']", (None,), 0))
    rules = path_rules(leaves)
    assert len(rules) == 4  # fc1 and fc2, for the parameters and for both moments at once
    assert any(r"\['(?:mu|nu)'\]" in rx for _, _, rx, _ in rules)
    assert all(r"layers_\d+" in rx for _, _, rx, _ in rules)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 5), st.sampled_from(["a", "b", "w"]),
                          st.sampled_from([(None,), (("x",),), (("y",),)]), st.integers(0, 2)),
                min_size=1, max_size=30, unique_by=lambda t: (t[0], t[1], t[2])))
def test_rules_reproduce_every_leaf(raw):
    leaves = [(arg, f"['layers'][{k}]['{name}']", spec, stage) for arg, k, name, spec, stage in raw]
    for default in (True, False):
        rules = path_rules([(a, p, s, 0 if default else st_) for a, p, s, st_ in leaves], default=default)
        for arg, path, spec, stage in leaves:
            hit = next((r for r in rules if r[1] == arg and re.search(r[2], path)), None)
            want_stage = 0 if default else stage
            if hit is None:
                assert default and not any(spec)
            else:
                assert (hit[0], hit[3]) == (want_stage, spec)
    stages = stage_rules([(a, p, s) for a, p, _, s in leaves])
    for arg, path, _, stage in leaves:
        assert next(st_ for a, rx, st_ in stages if a == arg and re.search(rx, path)) == stage


def _merge_by_rescanning(rules):
    """The definition of the merge: the first mergeable pair (in order) merges, then the scan
    starts again from the first pair; until no pair merges."""
    from autoplan.plans._code import _alternatives, _ending, _split

    rules = list(rules)
    while True:
        for i in range(len(rules)):
            for j in range(i + 1, len(rules)):
                a, b = rules[i], rules[j]
                if (a[0], a[1], a[3], _ending(a[2])) != (b[0], b[1], b[3], _ending(b[2])):
                    continue
                ta, tb = _split(a[2]), _split(b[2])
                diff = [k for k in range(len(ta)) if ta[k] != tb[k]] if len(ta) == len(tb) else []
                if len(diff) != 1:
                    continue
                x, y = _alternatives(ta[diff[0]]), _alternatives(tb[diff[0]])
                if x is None or y is None:
                    continue
                ta[diff[0]] = r"\['(?:" + "|".join(sorted(set(x) | set(y))) + r")'\]"
                rules[i] = (a[0], a[1], "^" + "".join(ta) + _ending(a[2]), a[3])
                del rules[j]
                break
            else:
                continue
            break
        else:
            return rules


_KEYS = ["a", "b", "c"]


@st.composite
def _key(draw):
    keys = draw(st.lists(st.sampled_from(_KEYS), min_size=1, max_size=2, unique=True))
    return r"\['" + (keys[0] if len(keys) == 1 else "(?:" + "|".join(sorted(keys)) + ")") + r"'\]"


@st.composite
def _rule(draw):
    toks = [r"\['layers'\]", r"\[" + str(draw(st.integers(0, 1))) + r"\]"]
    toks.insert(draw(st.integers(0, 1)), draw(_key()))
    if draw(st.booleans()):
        toks.append(draw(_key()))
    return (draw(st.integers(0, 1)), draw(st.integers(0, 1)), "^" + "".join(toks) + "$",
            draw(st.sampled_from([(None,), ("x",)])))


@settings(max_examples=300, deadline=None)
@given(st.lists(_rule(), max_size=30))
def test_merging_alternatives_makes_the_merges_of_a_full_rescan(rules):
    """The merge skips what a merge cannot have changed; it makes the same merges in the same
    order as rescanning every pair after each merge."""
    from autoplan.plans._code import _merge_alternatives

    assert _merge_alternatives(list(rules)) == _merge_by_rescanning(rules)


def test_a_merge_can_make_an_earlier_rule_mergeable():
    """x and y differ in two keys; once y and z merge, x differs from the merged rule in one
    key, and merges with it."""
    from autoplan.plans._code import _merge_alternatives

    x, y, z = (r"^\['(?:a|b)'\]\['c'\]$", r"^\['a'\]\['d'\]$", r"^\['b'\]\['d'\]$")
    rules = [(0, 0, rx, ("x",)) for rx in (x, y, z)]
    assert _merge_alternatives(rules) == _merge_by_rescanning(rules) == [
        (0, 0, r"^\['(?:a|b)'\]\['(?:c|d)'\]$", ("x",))]
