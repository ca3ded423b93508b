"""Plan files validated as a whole: every load either gives a plan that round-trips and can be
used, or raises PlanFileError naming the field, the value and the fix; never anything else."""

from __future__ import annotations

import copy
import functools
import json
import math
import operator
import re
import warnings

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import autoplan
from autoplan import PlanFileError, PlanMismatchError
from autoplan.cli import main
from autoplan.models import get
from autoplan.plans._plan import Plan


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    """Valid plans made once: an intra-operator plan, a pipeline plan, a 16-device plan."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        intra = autoplan.plan(get("mlp", "tiny"), "cpu:8", pipeline=False, level="exhaustive",
                              mesh_shape=(2, 4), baselines=False)
        pipe = autoplan.search(get("gpt", "tiny"), "cpu:8", pipeline=True, baselines=False).best
        multi = autoplan.plan(get("mlp", "tiny"), "p3.16xlarge:2", pipeline=False,
                              level="exhaustive", baselines=False)
    assert pipe.is_pipeline and pipe.schedule.microbatches > 1 and not intra.is_pipeline
    return {"intra": intra, "pipe": pipe, "multi": multi}


def _dict(plan: Plan) -> dict:
    return json.loads(plan.to_json())


def _refused(d, field: str | None, *words: str) -> PlanFileError:
    with pytest.raises(PlanFileError) as info:
        Plan.from_json(json.dumps(d) if not isinstance(d, str | bytes) else d)
    err = info.value
    assert err.field == field, str(err)
    text = str(err)
    assert "Got" in text and "Fix:" in text, text
    for w in words:
        assert w in text, text
    return err


# ---- every plan the search makes loads and round-trips ---------------------------------------
def test_valid_plans_round_trip(plans, tmp_path):
    for name, plan in plans.items():
        assert Plan.from_json(plan.to_json()) == plan, name
        assert Plan.from_dict(plan.to_dict()) == plan, name
        path = tmp_path / f"{name}.json"
        plan.to_json(path)  # a pathlib.Path works too
        assert Plan.from_json(path) == plan
        assert Plan.from_json(path.read_bytes()) == plan


def test_a_dag_pipeline_plan_with_nested_layer_ranges_loads(plans):
    # TePDist's DAG stages may be non-contiguous: a stage [0, 4) holding layers 0 and 3 around a
    # stage [1, 3): the ranges nest without sharing an end, and each layer is in one stage
    d = _dict(plans["pipe"])
    names = [n for s in d["stages"] for n in s["layers"]]
    assert len(names) == 4 and len(d["stages"]) >= 2
    d["stages"] = d["stages"][:2]
    d["stages"][0].update(layers=[names[0], names[3]], layer_range=[0, 4])
    d["stages"][1].update(layers=[names[1], names[2]], layer_range=[1, 3],
                          device_ids=d["stages"][1]["device_ids"])
    d["schedule"]["num_stages"] = 2
    d["schedule"]["table"] = d["schedule"]["events"] = []
    for i in d["inputs"]:
        i.update(stage=min(i["stage"], 1), spec=[None] * len(i["shape"]))
    for s in d["stages"]:
        s["ops"] = []
    _fix_devices(d)
    plan = Plan.from_json(json.dumps(d))
    assert plan.stages[0].layer_range == (0, 4) and plan.stages[1].layer_range == (1, 3)


def _fix_devices(d: dict) -> None:
    """Give each stage of ``d`` 4 devices of an 8-device host, meshes (4, 1)."""
    for k, s in enumerate(d["stages"]):
        s.update(submesh_shape=[1, 4], device_ids=list(range(4 * k, 4 * k + 4)), mesh_shape=[4, 1],
                 axis_names=["x", "y"])


# ---- bytes, encodings, JSON -----------------------------------------------------------------
def test_bytes_that_are_not_utf8_are_a_plan_file_error(plans, tmp_path):
    path = tmp_path / "latin1.json"
    path.write_bytes(plans["intra"].to_json().replace('"mlp"', '"ml\u00e9"').encode("latin-1"))
    err = _refused(str(path), None, "not UTF-8", "0xe9")
    assert repr(str(path)) in str(err)  # the message names the file


def test_a_byte_order_mark_is_accepted(plans, tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + plans["intra"].to_json().encode())
    assert Plan.from_json(str(path)) == plans["intra"]


@pytest.mark.parametrize("text, words", [
    ("", ["empty"]), ("   \n", ["empty"]), ("{not json", ["not valid JSON"]),
    ("[1, 2]", ["not an autoplan plan"]), ("{" * 100_000, ["not"]),
    ('{"schema": "autoplan.plan", "schema_version": 1, "x": ' + "1" * 5000 + "}", ["not a plan file"]),
])
def test_text_that_is_not_a_plan(text, words):
    with pytest.raises(PlanFileError) as info:
        Plan.from_json(text.encode() if text.strip() == "" else text)
    for w in words:
        assert w in str(info.value)


def test_a_file_that_cannot_be_read(tmp_path):
    with pytest.raises(PlanFileError, match="cannot read plan file"):
        Plan.from_json(str(tmp_path))  # a folder
    with pytest.raises(PlanFileError, match="should be JSON text, bytes, or a file path"):
        Plan.from_json(3.5)  # type: ignore[arg-type]


# ---- one field wrong at a time ----------------------------------------------------------------
def _set(d: dict, path: str, value) -> dict:
    """A copy of ``d`` with the field at a JSON path like ``stages[1].mesh_shape`` set (or
    deleted, for ``_DELETE``)."""
    d = copy.deepcopy(d)
    *parents, last = [int(k) if k.isdigit() else k for k in re.findall(r"\w+", path)]
    node = functools.reduce(operator.getitem, parents, d)
    if value is _DELETE:
        node.pop(last)
    else:
        node[last] = value
    return d


_DELETE = object()


@pytest.mark.parametrize("which, path, value, field, words", [
    ("intra", "stages[0].mesh_shape", [64, 64], "stages[0].mesh_shape", ["logical mesh of 8 devices",
                                                                          "[64, 64]"]),
    ("intra", "stages[0].mesh_shape", [2, 2, 2], "stages[0].axis_names", ["3 distinct"]),
    ("intra", "stages[0].device_ids[3]", 8, "stages[0].device_ids[3]", ["below 8"]),
    ("intra", "stages[0].device_ids[3]", 2, "stages[0].device_ids[3]", ["lists once"]),
    ("intra", "stages[0].device_ids", [0, 1, 2], "stages[0].device_ids", ["8 device ids"]),
    ("intra", "stages[0].submesh_shape", [1, 16], "stages[0].submesh_shape", ["within the cluster's 1 x 8"]),
    ("intra", "stages[0].axis_names", ["x", "x"], "stages[0].axis_names", ["distinct"]),
    ("intra", "stages[0].index", 1, "stages[0].index", ["position"]),
    ("intra", "stages[0].layer_range", [0, 9], "stages", ["at least 9 layers"]),
    ("intra", "stages[0].layer_range", [1, 4], "stages", ["no stage holds layer 0"]),
    ("intra", "stages[0].layer_range", [0, 10**12], "stages", ["at least"]),
    ("intra", "stages[0].mesh_shape", _DELETE, "stages[0].mesh_shape", ["is missing"]),
    ("intra", "stages[0].colour", "red", "stages[0].colour", ["not a field of a stage"]),
    ("intra", "stages[0].memory", -1.0, "stages[0].memory", [">= 0"]),
    ("intra", "stages", [], "stages", ["at least 1"]),
    ("intra", "cluster.nodes", "eight", "cluster.nodes", ["integer >= 1"]),
    ("intra", "cluster.nodes", 10**9, "cluster.nodes", ["at most"]),
    ("intra", "cluster.gamma", 0.0, "cluster", ["gamma should be in (0, 1]"]),
    ("intra", "cluster.intra_latency", -1e-6, "cluster.intra_latency", [">= 0"]),
    ("intra", "predicted.step_time", float("nan"), "predicted.step_time", ["finite"]),
    ("intra", "predicted.step_time", float("inf"), "predicted.step_time", ["finite"]),
    ("intra", "predicted.memory_per_device", None, "predicted.memory_per_device", ["finite"]),
    ("intra", "predicted.bubble_fraction", 2.0, "predicted.bubble_fraction", ["<= 1"]),
    ("intra", "predicted.comm_bytes", 5, "predicted.comm_bytes", ["object of numbers"]),
    ("intra", "schema_version", True, "schema_version", ["schema_version should be 1"]),
    ("intra", "schema_version", 2, "schema_version", ["schema_version should be 1. Got 2"]),
    ("intra", "schema", "other", "schema", ["not an autoplan plan"]),
    ("intra", "label", 7, "label", ["a string"]),
    ("intra", "notes", "one note", "notes", ["list of strings"]),
    ("intra", "config", [1], "config", ["an object"]),
    ("intra", "config.batch", 0, "config.batch", ["positive integer"]),
    ("intra", "mesh_axis_types", ["Auto"], "mesh_axis_types", ["2 entries"]),
    ("intra", "inputs[0].stage", 1, "inputs[0].stage", ["a stage of the plan (0 .. 0)"]),
    ("intra", "inputs[0].arg", -1, "inputs[0].arg", ["integer >= 0"]),
    ("intra", "inputs[0].shape", [2.5], "inputs[0].shape[0]", ["integer"]),
    ("intra", "schedule.kind", "zigzag", "schedule.kind", ["one of 'none', 'gpipe', '1f1b', 'interleaved', 'zb-h1'"]),
    ("intra", "schedule.num_stages", 2, "schedule.num_stages", ["the number of stages"]),
    ("intra", "schedule.microbatches", 0, "schedule.microbatches", ["integer >= 1"]),
    ("pipe", "schedule.kind", "none", "schedule.kind", ["one of 'gpipe', '1f1b', 'interleaved', 'zb-h1'"]),
    ("pipe", "schedule.microbatches", 3, "schedule.microbatches", ["divisor of the batch 8"]),
    ("pipe", "schedule.microbatches", 10**12, "schedule.microbatches", ["divisor"]),
    ("pipe", "stages[1].device_ids[0]", 0, "stages[1].device_ids[0]", ["not used by stages[0]"]),
    ("pipe", "schedule.table[0][0]", None, "schedule.table", ["tasks"]),
    ("pipe", "schedule.table[0][0]", [0, 0, "sideways"], "schedule.table[0][0][2]",
     ["'forward' or 'backward'"]),
    ("pipe", "schedule.table[0][0]", [5, 0, "forward"], "schedule.table[0][0][0]", ["below"]),
    ("pipe", "schedule.table[0]", [None], "schedule.table[0]", ["entries (one per mesh)"]),
    ("pipe", "schedule.events[0][1]", -1.0, "schedule.events[0][1]", [">= 0"]),
    ("pipe", "schedule.events[0][2]", 1, "schedule.events[0][2]", ["the mesh of stage 0"]),
    ("pipe", "schedule.events", [], None, []),  # no events is allowed (they are predictions)
    ("multi", "stages[0].device_ids", list(range(0, 16, 2)) + list(range(1, 16, 2)),
     None, []),  # any order of the same devices is a valid placement
    # integer fields of the cluster take whole numbers only (infinity once crashed the reader)
    ("multi", "cluster.nvlinks[0][0]", float("inf"), "cluster", ["whole number. Got inf"]),
    ("multi", "cluster.nvlinks[0][2]", 1.5, "cluster", ["whole number. Got 1.5"]),
])
def test_a_wrong_field_is_named(plans, which, path, value, field, words):
    d = _set(_dict(plans[which]), path, value)
    if field is None:
        Plan.from_json(json.dumps(d))
        return
    _refused(d, field, *words)


def test_a_layer_belongs_to_one_stage(plans):
    d = _dict(plans["pipe"])
    (lo0, hi0), (lo1, _) = d["stages"][0]["layer_range"], d["stages"][1]["layer_range"]
    assert lo0 == 0 and hi0 == lo1  # a chain: Alpa's stage DP gives contiguous stages
    # stage 0 reaching into stage 1's first layer (with a name for it, so only the range is wrong)
    wider = _set(d, "stages[0].layers", d["stages"][0]["layers"] + ["one_more"])
    _refused(_set(wider, "stages[0].layer_range", [0, hi0 + 1]), "stages[1].layer_range",
             f"layer {hi0} is an end of stages[0].layer_range")
    if hi0 > 1:
        _refused(_set(wider, "stages[0].layer_range", [1, hi0]), "stages", "no stage holds layer 0")
    name = d["stages"][0]["layers"][0]
    _refused(_set(d, "stages[1].layers", d["stages"][1]["layers"] + [name]),
             f"stages[1].layers[{len(d['stages'][1]['layers'])}]", "stages[0] already")


def test_specs_are_checked_against_their_stage_mesh(plans):
    d = _dict(plans["intra"])
    k = next(k for k, i in enumerate(d["inputs"]) if len(i["shape"]) == 2)
    six = _set(d, f"inputs[{k}].shape", [6, d["inputs"][k]["shape"][1]])  # 8 devices do not divide 6
    _refused(_set(six, f"inputs[{k}].spec", [["x", "y"], None]), f"inputs[{k}].spec[0]",
             "divisor of dimension 0 (size 6)")
    assert Plan.from_json(json.dumps(_set(six, f"inputs[{k}].spec", [["x"], None])))  # 2 divides 6
    _refused(_set(d, "inputs[0].spec", [["z"]] + [None] * (len(d["inputs"][0]["shape"]) - 1)),
             "inputs[0].spec[0][0]", "a mesh axis of stage 0's mesh 2x4 (x, y)")
    two = next(k for k, i in enumerate(d["inputs"]) if len(i["shape"]) == 2 and i["shape"][0] % 2 == 0
               and i["shape"][1] % 2 == 0)
    _refused(_set(d, f"inputs[{two}].spec", [["x"], ["x"]]), f"inputs[{two}].spec[1][0]", "at most one")
    _refused(_set(d, "inputs[0].spec", [None] * 7), "inputs[0].spec", "one entry per dimension")
    op = next(j for j, o in enumerate(d["stages"][0]["ops"]) if o["tensors"])
    t0 = d["stages"][0]["ops"][op]["tensors"][0]
    _refused(_set(d, f"stages[0].ops[{op}].tensors[0].spec", [["w"]] + [None] * (len(t0["shape"]) - 1)),
             f"stages[0].ops[{op}].tensors[0].spec[0][0]", "mesh axis")


def test_inputs_form_a_tree(plans):
    d = _dict(plans["intra"])
    first = d["inputs"][0]
    dup = copy.deepcopy(first)
    _refused(_set(d, "inputs", d["inputs"] + [dup]), f"inputs[{len(d['inputs'])}].path", "no other input")
    inner = copy.deepcopy(first)
    inner["path"] = first["path"] + "['inner']"
    _refused(_set(d, "inputs", d["inputs"] + [inner]), f"inputs[{len(d['inputs'])}].path", "inside the leaf")
    renamed = _set(d, "inputs[1].arg_name", "weights")
    if d["inputs"][1]["arg"] == first["arg"]:
        _refused(renamed, "inputs[1].arg_name", repr(first["arg_name"]))
    _refused(_set(d, "inputs[0].path", "[99999999]"), "inputs[0].path", "list indices")


def test_the_schedule_table_keeps_dependencies(plans):
    d = _dict(plans["pipe"])
    table = d["schedule"]["table"]
    swapped = _set(d, "schedule.table", [table[-1]] + table[1:-1] + [table[0]])
    err = _refused(swapped, "schedule.table[0][0]", "depends on")
    assert "after micro-batch" in str(err)


def test_microbatches_must_divide_the_batch_inputs(plans):
    d = _dict(plans["pipe"])
    del d["config"]["batch"]
    k = next(k for k, i in enumerate(d["inputs"]) if i["kind"] == "batch")
    d["inputs"][k]["shape"][0] = 7
    d["inputs"][k]["spec"] = [None] * len(d["inputs"][k]["shape"])
    _refused(d, "schedule.microbatches", f"inputs[{k}] has shape [7")


def test_cli_commands_refuse_a_bad_plan_file(plans, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_set(_dict(plans["intra"]), "stages[0].mesh_shape", [64, 64])))
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"model": "caf\xe9"}')
    for argv in (["show", str(bad)], ["report", str(bad), "-o", str(tmp_path / "r.html")],
                 ["launch", str(bad), "--model", "mlp"], ["show", str(latin)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("autoplan: error: plan file") and err.count("\n") == 1, err
        assert "Traceback" not in err
    assert not (tmp_path / "r.html").exists()


# ---- property: mutated plan files ---------------------------------------------------------------
_VALUES = [None, True, False, 0, 1, -1, 2, 3, 7, 8, 64, 2**70, 0.5, -0.0, 1e308, math.nan, math.inf,
           "", "x", "y", "z", "forward", "none", [], [0], [64, 64], [None], [["x"]], {}, {"a": 1}]


def _node_paths(d, prefix=()) -> list[tuple]:
    """Paths of the nodes worth mutating: every field except the bulk of the per-operator records,
    events and inputs (a few of each are kept)."""
    out = [prefix]
    if isinstance(d, dict):
        for k, v in d.items():
            out += _node_paths(v, prefix + (k,))
    elif isinstance(d, list):
        keep = len(d)
        if prefix and prefix[-1] in ("ops", "events", "inputs", "table", "tensors"):
            keep = min(len(d), 3)
        for i in range(keep):
            out += _node_paths(d[i], prefix + (i,))
    return out


def _mutate(d, path: tuple, how: int, value_index: int):
    """Apply mutation ``how`` at ``path``: drop, retype, perturb, duplicate, swap, add a field."""
    if not path:
        return _VALUES[value_index] if how == 1 else d
    parent = d
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    cur = parent[key]
    if how == 0:  # drop
        del parent[key]
    elif how == 1:  # retype / replace
        parent[key] = copy.deepcopy(_VALUES[value_index])
    elif how == 2:  # perturb a number or a string
        if isinstance(cur, bool):
            parent[key] = not cur
        elif isinstance(cur, int | float):
            parent[key] = [cur + 1, cur - 1, cur * 2, cur // 2 if isinstance(cur, int) else cur / 2,
                           -cur, 0, cur * 64][value_index % 7]
        elif isinstance(cur, str):
            parent[key] = ["", "x", "y", "z", cur + "x", "forward", "backward"][value_index % 7]
        elif isinstance(cur, list) and cur:
            cur.append(copy.deepcopy(cur[value_index % len(cur)]))  # duplicate an element
        elif isinstance(cur, dict):
            cur[f"extra{value_index}"] = value_index  # an unknown field
    elif how == 3 and isinstance(cur, list) and len(cur) > 1:  # swap two elements
        i, j = value_index % len(cur), (value_index * 7 + 1) % len(cur)
        cur[i], cur[j] = cur[j], cur[i]
    elif how == 3 and isinstance(cur, list):
        cur.clear()
    return d


_SETTINGS = settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))


@_SETTINGS
@given(data=st.data())
def test_every_mutated_plan_file_round_trips_or_is_a_plan_file_error(plans, data):
    name = data.draw(st.sampled_from(sorted(plans)), label="plan")
    base = _dict(plans[name])
    paths = _node_paths(base)
    d = base
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        path = data.draw(st.sampled_from(paths), label="path")
        how = data.draw(st.integers(0, 3), label="how")
        d = _mutate(d, path, how, data.draw(st.integers(0, len(_VALUES) - 1), label="value"))
        paths = _node_paths(d)
    text = json.dumps(d)
    try:
        plan = Plan.from_json(text)
    except PlanFileError as err:
        assert str(err).count("Fix:") == 1
        event("refused: " + (err.field or "(file)").split("[")[0].split(".")[0])
        return
    event("accepted")
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assert plan.summary() and plan.describe()
    if any(plan.arg_types):  # pytrees a path cannot rebuild: the views ask for like=
        with pytest.raises(PlanMismatchError, match="like="):
            plan.partition_specs()
    else:
        plan.partition_specs()
    plan._repr_html_()


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_random_bytes_and_truncations_are_plan_file_errors(plans, tmp_path_factory, data):
    good = plans[data.draw(st.sampled_from(sorted(plans)))].to_json().encode()
    choice = data.draw(st.integers(0, 2))
    if choice == 0:
        blob = data.draw(st.binary(max_size=400))
    elif choice == 1:
        blob = good[: data.draw(st.integers(0, len(good) - 1))]
    else:  # a few bytes replaced at random
        blob = bytearray(good)
        for _ in range(data.draw(st.integers(1, 4))):
            blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
        blob = bytes(blob)
    path = tmp_path_factory.mktemp("bytes") / "plan.json"
    path.write_bytes(blob)
    try:
        plan = Plan.from_json(str(path))
    except PlanFileError:
        return
    assert Plan.from_json(plan.to_json()) == plan  # a harmless change (a digit, a space)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_an_accepted_mutated_plan_can_be_drawn(plans, data):
    from autoplan.viz import sharding_figure, stage_figure, timeline_figure

    name = data.draw(st.sampled_from(sorted(plans)))
    d = _dict(plans[name])
    paths = [p for p in _node_paths(d) if p and p[0] in ("stages", "schedule", "inputs", "cluster")]
    d = _mutate(d, data.draw(st.sampled_from(paths)), data.draw(st.integers(0, 3)),
                data.draw(st.integers(0, len(_VALUES) - 1)))
    try:
        plan = Plan.from_json(json.dumps(d))
    except PlanFileError:
        return
    # each figure draws the plan it was given: every stage of the mutated plan has its own
    # legend entry in the stage figure and its own forward bars in the timeline
    sharding_figure(plan)
    names = [t.name or "" for t in stage_figure(plan).data]
    bars = {t.name for t in timeline_figure(plan).data}
    for st_ in plan.stages:
        assert any(n.startswith(f"stage {st_.index}:") for n in names), (st_.index, names)
        assert f"stage {st_.index} forward" in bars, (st_.index, bars)
