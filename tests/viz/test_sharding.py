"""The sharding figure: tile geometry and colours follow the specs."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.viz import (
    GREYS,
    REPLICATED_COLOR,
    device_color,
    sharding_figure,
    tile_devices,
    tile_grid,
)

MESH, AXES = (2, 4), ("x", "y")


def tiles_of(fig, tensor, column=None):
    out = [t for t in fig.data if t.meta and t.meta.get("kind") == "tile" and t.meta["tensor"] == tensor
           and (column is None or t.meta["column"] == column)]
    assert out, f"no tiles for {tensor}"
    return out


def grid_of(tiles):
    rows = 1 + max(t.meta["row"] for t in tiles)
    cols = 1 + max(t.meta["col"] for t in tiles)
    g = [[None] * cols for _ in range(rows)]
    for t in tiles:
        g[t.meta["row"]][t.meta["col"]] = t
    return g


def test_tile_devices_known_layouts():
    # device id = row-major index: (x, y) -> 4 x + y
    assert tile_devices((8, 8), (None, None), MESH, AXES) == [[tuple(range(8))]]
    assert tile_devices((8, 8), (None, ("y",)), MESH, AXES) == [[(0, 4), (1, 5), (2, 6), (3, 7)]]
    assert tile_devices((8, 8), (("x",), None), MESH, AXES) == [[(0, 1, 2, 3)], [(4, 5, 6, 7)]]
    assert tile_devices((8, 8), (("x",), ("y",)), MESH, AXES) == [[(0,), (1,), (2,), (3,)],
                                                                   [(4,), (5,), (6,), (7,)]]
    # y split on rows, x on columns: tile (r, c) holds device 4 c + r
    assert tile_devices((8, 8), (("y",), ("x",)), MESH, AXES) == [[(0,), (4,)], [(1,), (5,)],
                                                                   [(2,), (6,)], [(3,), (7,)]]
    # both axes on one dim, x major: column q holds device q
    assert tile_devices((8, 8), (None, ("x", "y")), MESH, AXES) == [[(d,) for d in range(8)]]
    assert tile_devices((8, 8), (None, ("y", "x")), MESH, AXES) == [[(0,), (4,), (1,), (5,), (2,), (6,),
                                                                     (3,), (7,)]]


def test_tile_grid_folds_rank_3_and_1():
    # rank 3: dims 0, 1 -> rows, dim 2 -> cols
    assert tile_grid((4, 6, 8), (("x",), ("y",), None), MESH, AXES) == (8, 1)
    assert tile_grid((4, 6, 8), (("x",), None, ("y",)), MESH, AXES) == (2, 4)
    assert tile_grid((8,), (("y",),), MESH, AXES) == (1, 4)
    assert tile_grid((), (), MESH, AXES) == (1, 1)
    # rank 3 rows combine row-major: dim 0 split index is the major digit
    g = tile_devices((4, 6, 8), (("x",), ("y",), None), MESH, AXES)
    assert [row[0] for row in g] == [(0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,)]
    g = tile_devices((4, 6, 8), (("y",), ("x",), None), MESH, AXES)
    assert [row[0] for row in g] == [(0,), (4,), (1,), (5,), (2,), (6,), (3,), (7,)]


@pytest.mark.parametrize("spec, match", [
    ((None,), "one entry per dimension"),
    ((("z",), None), "mesh axis 'z'"),
    ((("x",), ("x",)), "twice"),
])
def test_tile_devices_rejects_bad_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        tile_devices((8, 8), spec, MESH, AXES)


@settings(max_examples=60, deadline=None)
@given(mesh=st.lists(st.integers(1, 3), min_size=1, max_size=3), data=st.data())
def test_tile_devices_partition_properties(mesh, data):
    names = ("a", "b", "c")[:len(mesh)]
    ndim = data.draw(st.integers(0, 3))
    owner = data.draw(st.lists(st.integers(-1, ndim - 1), min_size=len(mesh), max_size=len(mesh))) \
        if ndim else [-1] * len(mesh)
    spec = tuple(tuple(a for a, o in zip(names, owner) if o == d) or None for d in range(ndim))
    grid = tile_devices((6,) * ndim, spec, mesh, names)
    n = math.prod(mesh)
    used = math.prod(s for s, o in zip(mesh, owner) if o >= 0)
    flat = [devs for row in grid for devs in row]
    # every device holds exactly one tile; there are as many tiles as shards, each equally replicated
    assert sorted(itertools.chain.from_iterable(flat)) == list(range(n))
    assert len(flat) == used
    assert {len(d) for d in flat} == {n // used}


def test_replicated_weight_is_all_grey(intra_plan):
    tiles = tiles_of(sharding_figure(intra_plan), "params['head']['kernel']")
    assert len(tiles) == 1
    assert all(t.fillcolor == REPLICATED_COLOR for t in tiles)
    assert tiles[0].meta["devices"] == list(range(8))


def test_output_dim_split_over_4_device_axis(intra_plan):
    fig = sharding_figure(intra_plan)
    tiles = tiles_of(fig, "params['fc1']['kernel']")
    grid = grid_of(tiles)
    assert (len(grid), len(grid[0])) == (1, 4)
    expect = tile_devices((1024, 4096), (None, ("y",)), MESH, AXES)
    assert [[tuple(t.meta["devices"]) for t in row] for row in grid] == expect
    # 4 distinct colours, one per column tile; each tile is on 2 devices (replicated over x):
    # coloured by its lowest device and striped
    assert [t.fillcolor for t in grid[0]] == [device_color(d) for d in range(4)]
    assert all(t.meta["striped"] and t.fillpattern.shape == "/" for t in tiles)
    assert not {t.fillcolor for t in tiles} & GREYS


def test_output_dim_split_over_whole_1x4_mesh_has_4_device_colours(pipeline_plan):
    # stage 0 is a 1x4 mesh on devices 0-3; its weights are split on the output dim over y (size 4)
    stage = pipeline_plan.stages[0]
    fig = sharding_figure(pipeline_plan)
    tiles = sorted(tiles_of(fig, "params['layer0']['kernel']"), key=lambda t: t.meta["col"])
    assert [(t.meta["row"], t.meta["col"]) for t in tiles] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    expect = tile_devices((512, 512), (None, ("y",)), stage.mesh_shape, stage.axis_names)
    assert expect == [[(0,), (1,), (2,), (3,)]]
    assert [tuple(t.meta["devices"]) for t in tiles] == expect[0]
    assert [t.fillcolor for t in tiles] == [device_color(stage.device_ids[d[0]]) for d in expect[0]]
    assert len({t.fillcolor for t in tiles}) == 4 and not {t.fillcolor for t in tiles} & GREYS
    assert not any(t.meta["striped"] for t in tiles)


def test_output_dim_split_on_single_axis_mesh_gets_device_colours(pipeline_plan):
    # stage 1 runs on a 1x2 mesh (devices 4, 5); its weights are split on y: one device per tile
    fig = sharding_figure(pipeline_plan)
    tiles = tiles_of(fig, "params['layer4']['kernel']")
    assert len(tiles) == 2
    assert [t.meta["cluster_devices"] for t in sorted(tiles, key=lambda t: t.meta["col"])] == [[4], [5]]
    assert [t.fillcolor for t in sorted(tiles, key=lambda t: t.meta["col"])] == [device_color(4),
                                                                                 device_color(5)]
    # stage 2 is a single device: every tile is that device's colour
    assert {t.fillcolor for t in tiles_of(fig, "params['layer8']['kernel']")} == {device_color(6)}


def test_four_column_tiles_with_distinct_device_colours(intra_plan):
    # the output of fc1 is split over x on rows and y on columns: rows of 4 distinct colours
    fig = sharding_figure(intra_plan)
    grid = grid_of(tiles_of(fig, "%3", column=0))
    assert (len(grid), len(grid[0])) == (2, 4)
    for row in grid:
        assert len({t.fillcolor for t in row}) == 4
        assert not {t.fillcolor for t in row} & GREYS


def test_2d_split_over_both_axes_has_8_distinct_devices(intra_plan):
    fig = sharding_figure(intra_plan)
    tiles = tiles_of(fig, "params['attn']['qkv']")
    assert len(tiles) == 8
    devices = [tuple(t.meta["devices"]) for t in tiles]
    assert sorted(devices) == [(d,) for d in range(8)]
    assert len({t.fillcolor for t in tiles}) == 8
    expect = tile_devices((1024, 3072), (("x",), ("y",)), MESH, AXES)
    for t in tiles:
        assert (t.meta["devices"][0],) == expect[t.meta["row"]][t.meta["col"]]
        assert t.fillcolor == device_color(t.meta["devices"][0])
        assert not t.meta["striped"] and not t.fillpattern.shape


def test_one_dim_over_both_axes(intra_plan):
    tiles = tiles_of(sharding_figure(intra_plan), "params['proj']['kernel']")
    assert sorted((t.meta["col"], t.meta["devices"][0]) for t in tiles) == [(d, d) for d in range(8)]
    assert {t.meta["row"] for t in tiles} == {0}


def test_rank3_tensor_is_folded(intra_plan):
    fig = sharding_figure(intra_plan)
    grid = grid_of(tiles_of(fig, "%8", column=2))  # (64, 128, 3072) spec (x, None, y)
    assert (len(grid), len(grid[0])) == (2, 4)
    assert "folded" in fig.layout.title.text


def test_only_forward_ops_in_order_and_hover(intra_plan):
    fig = sharding_figure(intra_plan)
    tiles = [t for t in fig.data if t.meta and t.meta.get("kind") == "tile"]
    assert sorted({t.meta["op"] for t in tiles}) == [0, 1, 2, 3, 4]  # op 5 is backward
    assert [t.meta["op"] for t in sorted(tiles, key=lambda t: t.meta["column"])][0] == 0
    t = tiles_of(fig, "params['fc1']['kernel']")[0]
    assert "params['fc1']['kernel']" in t.text
    assert "1024x4096" in t.text and "P(None, 'y')" in t.text
    assert "4.00 MiB" in t.text  # 1024*4096*4 bytes / 4 shards
    assert "2 devices 0, 4" in t.text
    assert "Operator sharding" in fig.layout.title.text and "2x4" in fig.layout.title.text


def test_subsampling_says_so(intra_plan):
    fig = sharding_figure(intra_plan, max_ops=3)
    cols = {t.meta["op"] for t in fig.data if t.meta and t.meta.get("kind") == "tile"}
    assert cols == {0, 2, 4}
    assert "3 of 5 ops shown" in fig.layout.title.text
    with pytest.raises(ValueError, match="max_ops"):
        sharding_figure(intra_plan, max_ops=0)


def test_colours_are_deterministic(intra_plan):
    a = [t.fillcolor for t in sharding_figure(intra_plan).data if t.meta and t.meta.get("kind") == "tile"]
    b = [t.fillcolor for t in sharding_figure(intra_plan).data if t.meta and t.meta.get("kind") == "tile"]
    assert a == b
    assert len({device_color(d) for d in range(64)}) == 64
    assert not {device_color(d) for d in range(64)} & GREYS


def test_pipeline_plan_marks_stages(pipeline_plan):
    fig = sharding_figure(pipeline_plan)
    assert [a.text for a in fig.layout.annotations] == ["stage 0", "stage 1", "stage 2"]
