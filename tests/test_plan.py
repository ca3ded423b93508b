"""The Plan format: JSON round trip, refusals, JAX views."""

import dataclasses
import json
import pickle

import jax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import autoplan
from autoplan import PlanFileError, PlanMismatchError
from autoplan.models import get
from autoplan.plans._plan import Plan
from autoplan.plans._spec import Spec


@pytest.fixture(scope="module")
def tiny():
    wl = get("mlp", size="tiny")
    return wl, autoplan.plan(wl, "cpu:8", pipeline=False, level="exhaustive", mesh_shape=(2, 4),
                             baselines=False)


def test_spec_conversions():
    spec = (("x", "y"), None, ("y",))
    assert Spec.of(spec).to_pspec() == PartitionSpec(("x", "y"), None, "y")
    assert Spec.from_pspec(PartitionSpec(("x", "y"), None, "y"), 3) == spec
    assert Spec.from_pspec(PartitionSpec("x"), 2) == (("x",), None)
    assert Spec(None, None).to_pspec() == PartitionSpec()
    assert str(Spec.of(((("x",)), None))) == "S(x)R"


def test_json_round_trip_is_exact(tiny, tmp_path):
    _, plan = tiny
    path = tmp_path / "plan.json"
    plan.to_json(str(path))
    again = Plan.from_json(str(path))
    assert again == plan
    assert Plan.from_json(plan.to_json()) == plan
    d = json.loads(plan.to_json())
    assert d["schema_version"] == 1 and d["jax_version"] == jax.__version__
    assert "mesh_axis_types" not in d  # a plan's meshes have Auto axes: nothing to record
    assert d["cluster"]["name"] == "cpu"


def test_malformed_files_are_refused(tiny, tmp_path):
    _, plan = tiny
    with pytest.raises(PlanFileError, match="not valid JSON"):
        Plan.from_json("{not json")
    with pytest.raises(PlanFileError, match="not an autoplan plan"):
        Plan.from_json('{"schema": "other"}')
    d = json.loads(plan.to_json())
    d["schema_version"] = 99
    with pytest.raises(PlanFileError, match="schema_version should be 1. Got 99"):
        Plan.from_json(json.dumps(d))
    d = json.loads(plan.to_json())
    del d["stages"][0]["mesh_shape"]
    with pytest.raises(PlanFileError, match=r"stages\[0\]\.mesh_shape is missing"):
        Plan.from_json(json.dumps(d))
    with pytest.raises(PlanFileError, match="cannot read plan file"):
        Plan.from_json(str(tmp_path / "missing.json"))


def test_plan_for_another_model_is_refused(tiny):
    _, plan = tiny
    other = autoplan.trace(get("mlp", size="tiny", hidden=128))
    with pytest.raises(PlanMismatchError, match="made for model"):
        plan.check_matches(other)
    with pytest.raises(PlanMismatchError, match="uses 8 devices but 4"):
        plan.check_matches(autoplan.trace(get("mlp", size="tiny")), num_devices=4)


def test_partition_specs_mirror_the_arguments(tiny):
    wl, plan = tiny
    specs = plan.partition_specs(like=wl.args)
    assert jax.tree.structure(specs, is_leaf=lambda x: isinstance(x, PartitionSpec)) == \
        jax.tree.structure(tuple(wl.args))
    rebuilt = plan.partition_specs()
    flat_a = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    flat_b = jax.tree.leaves(rebuilt, is_leaf=lambda x: isinstance(x, PartitionSpec))
    assert flat_a == flat_b
    mesh = plan.mesh()
    assert mesh.shape == {"x": 2, "y": 4}
    shardings = plan.named_shardings(mesh, like=wl.args)
    assert all(isinstance(s, NamedSharding) for s in jax.tree.leaves(
        shardings, is_leaf=lambda x: isinstance(x, NamedSharding)))
    rules = plan.logical_axis_rules()
    assert rules and all(isinstance(name, str) for name, _ in rules)


def test_summary_and_html(tiny):
    _, plan = tiny
    text = plan.summary()
    assert "step time" in text and "mesh 2x4" in text
    html = plan._repr_html_()
    assert "PartitionSpec" in html and "params" in html


def test_plan_is_hashable_and_equal_after_a_round_trip(tiny):
    _, plan = tiny
    again = Plan.from_json(plan.to_json())
    assert again == plan and hash(again) == hash(plan)
    assert plan.arg_trees is not None and again.arg_trees is None  # in memory only: not compared
    assert {plan, again} == {plan}
    other = plan.with_(config={**plan.config, "batch": 2 * plan.config["batch"]})
    assert other != plan and other.config["batch"] == 2 * plan.config["batch"]
    assert pickle.loads(pickle.dumps(plan)) == plan  # the search cache pickles plans


def test_plan_is_immutable_all_the_way_down(tiny):
    _, plan = tiny
    assert plan.analysis["layers"]
    for mapping in (plan.config, plan.analysis, plan.analysis["layers"][0], plan.stages[0].comm_bytes,
                    plan.predicted.comm_bytes, plan.predicted.comm_by_axis,
                    plan.predicted.comm_time_by_kind):
        with pytest.raises(TypeError, match="does not support item assignment"):
            mapping["x"] = 1
        with pytest.raises(AttributeError):
            mapping.update(x=1)
    assert isinstance(plan.analysis["layers"], tuple)  # JSON lists are tuples in a plan
    with pytest.raises(AttributeError):
        plan.analysis["layers"].append({"name": "x"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.config = {}
    # whatever a constructor is given, the plan holds frozen values
    made = plan.with_(config={"dims": [2, {"k": [1]}]}, notes=["a"])
    assert made.config["dims"] == (2, {"k": (1,)}) and made.notes == ("a",)
    with pytest.raises(TypeError):
        made.config["dims"][1]["k"] = 2
    assert hash(made) == hash(plan.with_(config={"dims": (2, {"k": (1,)})}, notes=("a",)))


def test_files_that_say_submesh_still_load(tiny):
    _, plan = tiny
    d = json.loads(plan.to_json())
    assert d["stages"][0]["submesh_shape"] == [1, 8] and "submesh" not in d["stages"][0]
    old = json.loads(plan.to_json())  # as files written before the field was renamed
    old["stages"][0] = {("submesh" if k == "submesh_shape" else k): v for k, v in old["stages"][0].items()}
    assert Plan.from_json(json.dumps(old)) == plan
    old["stages"][0]["submesh"] = [1, 16]
    with pytest.raises(PlanFileError, match=r"stages\[0\]\.submesh should be \[hosts, devices per host\] "
                                            r"within the cluster's 1 x 8") as err:
        Plan.from_json(json.dumps(old))
    assert err.value.field == "stages[0].submesh"
    both = json.loads(plan.to_json())
    both["stages"][0]["submesh"] = [1, 8]
    with pytest.raises(PlanFileError, match=r"stages\[0\]\.submesh is not a field of a stage record"):
        Plan.from_json(json.dumps(both))


def test_stage_submesh_is_a_deprecated_name_of_submesh_shape(tiny):
    _, plan = tiny
    with pytest.warns(DeprecationWarning, match="use Stage.submesh_shape"):
        assert plan.stages[0].submesh == plan.stages[0].submesh_shape == (1, 8)


def test_files_with_mesh_axis_types_still_load(tiny):
    _, plan = tiny
    d = json.loads(plan.to_json())
    d["mesh_axis_types"] = ["Auto", "Auto"]  # as older autoplans wrote
    assert Plan.from_json(json.dumps(d)) == plan
    d["mesh_axis_types"] = ["Explicit", "Auto"]
    with pytest.raises(PlanFileError, match=r"mesh_axis_types should be 2 entries .* from \['Auto'\]"):
        Plan.from_json(json.dumps(d))
    assert plan.mesh().axis_types == (jax.sharding.AxisType.Auto,) * 2


def test_records_freeze_what_their_constructors_are_given():
    from autoplan.plans._frozen import FrozenDict
    from autoplan.plans._plan import Comm, Stage, TensorSharding

    assert Comm("all-reduce", 8.0, ["x"], 1e-6).axes == ("x",)
    t = TensorSharding("w", "weight", [4, 8], "float32", [["x"], None])
    assert t.shape == (4, 8) and t.spec == (("x",), None)
    st = Stage(0, ["a"], [0, 1], [1, 2], [0, 1], [2], ["x"], comm_bytes={"all-reduce": 8.0})
    assert (st.layers, st.layer_range, st.submesh_shape, st.device_ids) == (("a",), (0, 1), (1, 2), (0, 1))
    assert isinstance(st.comm_bytes, FrozenDict) and st.comm_bytes == {"all-reduce": 8.0}
    assert hash(st) == hash(Stage(0, ("a",), (0, 1), (1, 2), (0, 1), (2,), ("x",),
                                  comm_bytes=FrozenDict({"all-reduce": 8.0})))


def test_frozen_records_and_specs_are_kept_as_they_are():
    # a record that froze its own fields, a spec, and a tuple of them are immutable already:
    # freezing keeps the very objects (no copy), while a list holding them still becomes a tuple
    from autoplan.plans._frozen import freeze
    from autoplan.plans._plan import OpSharding, TensorSharding
    from autoplan.plans._spec import Spec

    spec = Spec("x", None)
    t = TensorSharding("w", "weight", (4, 8), "float32", spec)
    assert freeze(spec) is spec and t.spec is spec
    ts = (t, t)
    op = OpSharding(0, "dot_general", "", "", "forward", "RR", ts)
    assert op.tensors is ts and freeze(op) is op
    assert freeze([t, spec]) == (t, spec) and isinstance(freeze([t, spec]), tuple)
    assert freeze({"s": [spec]})["s"][0] is spec


def test_record_maker_fills_any_field_names_in_order():
    """A record class's unchecked maker equals its constructor whatever its fields are named,
    names of the maker's own locals included."""
    from dataclasses import dataclass

    from autoplan.plans._plan import record_maker

    @dataclass(frozen=True)
    class Rec:
        d: int
        obj: str
        new: float
        cls: tuple

    rec = record_maker(Rec)(1, "a", 2.0, (3,))
    assert rec == Rec(1, "a", 2.0, (3,)) and list(vars(rec)) == ["d", "obj", "new", "cls"]
    assert record_maker(Rec) is record_maker(Rec)

    @dataclass(frozen=True, slots=True)  # the plan's records keep their fields in slots
    class Slotted:
        s0: int
        obj: str
        new: float
        cls: tuple

    rec = record_maker(Slotted)(1, "a", 2.0, (3,))
    assert rec == Slotted(1, "a", 2.0, (3,)) and not hasattr(rec, "__dict__")
    assert (rec.s0, rec.obj, rec.new, rec.cls) == (1, "a", 2.0, (3,))
