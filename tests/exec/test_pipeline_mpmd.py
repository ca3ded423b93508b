"""Pipeline plans across processes (MPMD): each process runs the tasks of the stages whose
submeshes hold its devices, and activations and their gradients move between submeshes of
different processes with a collective (JAX's CPU backend cannot ``device_put`` across
processes). Launched as 2 processes x 4 devices, GPipe and 1F1B plans of tiny GPT and MLP
match single-device execution; the collective transfer itself is checked in one process."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from exec_cases import FAST, plan, workload
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from autoplan.exec import _stages as _pipeline
from autoplan.exec import _transfer, launch, run
from autoplan.exec._transfer import transfer


def _mesh(ids):
    devs = jax.devices()
    return Mesh(np.array([devs[i] for i in ids]), ("x",))


@pytest.mark.parametrize("src,dst", [((0, 1), (2, 3, 4, 5, 6, 7)), ((0, 1, 2), (5, 6)),
                                     ((4, 5, 6, 7), (0, 1, 2, 3))])
def test_the_collective_transfer_moves_every_bit(src, dst):
    a, b = _mesh(src), _mesh(dst)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    x[0, 0], x[1, 1], x[2, 2] = np.nan, np.inf, -0.0
    host = [x, np.arange(6, dtype=np.int32).reshape(2, 3), np.array([True, False, True])]
    # on three source devices the first two values are split there (gathered before moving)
    split = len(src) == 3
    specs = [PartitionSpec("x") if split else PartitionSpec(),
             PartitionSpec(None, "x") if split else PartitionSpec(), PartitionSpec()]
    values = [jax.device_put(h, NamedSharding(a, sp)) for h, sp in zip(host, specs)]
    avals = [(h.shape, h.dtype) for h in host]
    moved = transfer(values, a, b, avals, collective=True)
    assert len(moved) == 3
    for m, h in zip(moved, host):
        assert m.sharding == NamedSharding(b, PartitionSpec()) and m.dtype == h.dtype
        for shard in m.addressable_shards:  # every destination device holds the whole value
            np.testing.assert_array_equal(np.asarray(shard.data).view(np.uint8),
                                          np.ascontiguousarray(h).view(np.uint8))


def test_a_pipeline_with_collective_transfers_matches_in_one_process(monkeypatch, fast):
    monkeypatch.setattr(_pipeline, "_FORCE_COLLECTIVE_TRANSFERS", True)
    before = len(_transfer._UNION_CACHE)
    rep = run(plan("mlp", "pp", "1f1b"), workload("mlp"), steps=2, compiler_options=fast,
              time_tasks=False)
    assert rep.equivalence.matched and rep.losses[1] < rep.losses[0]
    assert len(_transfer._UNION_CACHE) > before  # the union programs were built and used


def _interleaved(p):
    """The same plan with each stage holding two devices of each process."""
    ids = [(0, 1, 4, 5), (2, 3, 6, 7)]
    return dataclasses.replace(p, stages=tuple(dataclasses.replace(s, device_ids=i)
                                               for s, i in zip(p.stages, ids)))


def _launch(p, name):
    handle = launch(p, {"model": name, "size": "tiny"}, num_processes=2, devices_per_process=4,
                    steps=2, timeout=240, compiler_options=FAST)
    result = handle.wait()
    assert result.matched is True, [ev.get("equivalence") for ev in result.done.values()]
    assert result.losses[0] == result.losses[1]  # every process reports the last stage's loss
    assert result.loss[1] < result.loss[0]
    for ev in result.done.values():
        assert ev["equivalence"].startswith("matched")
    return result


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("name", ["gpt", "mlp"])
def test_two_stages_on_two_processes_match_single_device(name, schedule):
    result = _launch(plan(name, "pp", schedule), name)
    # each process ran only the stage on its own four devices
    assert result.done[0]["executed_on"] == [0, 1, 2, 3]
    assert result.done[1]["executed_on"] == [4, 5, 6, 7]


def test_stages_whose_submeshes_span_both_processes_match():
    result = _launch(_interleaved(plan("mlp", "pp", "gpipe")), "mlp")
    assert result.done[0]["executed_on"] == result.done[1]["executed_on"] == list(range(8))


def test_memory_levers_run_across_processes():
    """ZeRO-3 over each stage's axis and every other layer rematerialised, with each stage's
    submesh spanning both processes (so the sharded state lives on two processes): the launch
    matches one device."""
    base = _interleaved(plan("gpt", "pp", "1f1b"))
    levered = base.with_(stages=tuple(
        dataclasses.replace(s, zero=3, zero_axes=tuple(s.axis_names), remat_layers=s.layers[::2])
        for s in base.stages))
    result = _launch(levered, "gpt")
    assert result.done[0]["executed_on"] == result.done[1]["executed_on"] == list(range(8))
    for ev in result.done.values():  # each process applied every stage's levers
        assert sorted(ev["levers"]) == ["0", "1"]
        for s in levered.stages:
            lv = ev["levers"][str(s.index)]
            assert lv["zero"] == 3 and lv["recomputed"] > 0
            assert list(lv["remat_layers"]) == list(s.remat_layers)
