"""Plan files of interleaved and ZB-H1 plans: they round-trip, and a file whose chunks do not
share their mesh's devices, whose virtual stages do not fit, or whose table lacks a W pass, is
refused with the field named."""

from __future__ import annotations

import json
import warnings

import pytest

import autoplan
from autoplan import PlanFileError
from autoplan.models import get
from autoplan.plans._plan import Plan


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    wl = get("gpt", size="tiny", layers=8, batch=16)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind in ("interleaved", "zb-h1"):
            res = autoplan.search(wl, "cpu:4", pipeline=True, schedule=kind, microbatches=4,
                                  baselines=False, level="exhaustive", workers=1)
            out[kind] = next(p for p in res.plans if p.schedule.kind == kind)
    return out


def _refused(d: dict, field: str, *words: str) -> None:
    with pytest.raises(PlanFileError) as info:
        Plan.from_json(json.dumps(d))
    assert info.value.field == field, str(info.value)
    for w in words:
        assert w in str(info.value), str(info.value)


def test_new_schedules_round_trip(plans):
    for plan in plans.values():
        d = json.loads(plan.to_json())
        assert d["schedule"]["virtual_stages"] == plan.schedule.virtual_stages
        assert Plan.from_dict(d) == plan
    # files written before the field existed read as one stage per mesh
    d = json.loads(plans["zb-h1"].to_json())
    del d["schedule"]["virtual_stages"]
    assert Plan.from_dict(d).schedule.virtual_stages == 1


def test_interleaved_chunks_share_their_meshes_devices(plans):
    plan = plans["interleaved"]
    P = plan.schedule.num_meshes
    d = json.loads(plan.to_json())
    d["stages"][P]["device_ids"] = list(reversed(d["stages"][P]["device_ids"])) if len(
        d["stages"][P]["device_ids"]) > 1 else [d["stages"][1]["device_ids"][0]]
    _refused(d, f"stages[{P}].device_ids", "the devices of stages[0]")
    d = json.loads(plan.to_json())
    d["schedule"]["virtual_stages"] = 3
    _refused(d, "schedule.virtual_stages", f"a divisor of the {len(plan.stages)} stages")
    d["schedule"]["virtual_stages"] = 0
    _refused(d, "schedule.virtual_stages", "an integer >= 1")
    # virtual stages only for the interleaved kind
    d = json.loads(plans["zb-h1"].to_json())
    d["schedule"]["virtual_stages"] = 2
    d["stages"][2]["device_ids"], d["stages"][3]["device_ids"] = (d["stages"][0]["device_ids"],
                                                                  d["stages"][1]["device_ids"])
    _refused(d, "schedule.virtual_stages", "1 for a 'zb-h1' schedule")


def test_a_zb_h1_table_must_hold_every_weight_pass(plans):
    d = json.loads(plans["zb-h1"].to_json())
    rows = d["schedule"]["table"]
    t, j = next((t, j) for t, row in enumerate(rows) for j, e in enumerate(row)
                if e is not None and e[2] == "weight")
    rows[t][j] = None
    d["schedule"]["events"] = []
    _refused(d, "schedule.table", "a weight")
    # a weight pass in a schedule that does not split the backward
    d = json.loads(plans["zb-h1"].to_json())
    d["schedule"]["kind"] = "1f1b"
    _refused(d, "schedule.events", "a forward, a backward of each")
