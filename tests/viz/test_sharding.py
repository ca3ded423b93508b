"""The sharding figure: tile geometry and colours follow the specs."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.costs._cluster import Cluster
from autoplan.plans._plan import Plan, Predicted, Schedule, Stage
from autoplan.viz import (
    REPLICATED_COLOR,
    mesh_color,
    op_layers,
    sharding_figure,
    tile_color,
    tile_devices,
    tile_grid,
)
from autoplan.viz._sharding import MAX_BANDS, block_tiles, sharding_columns

from .conftest import XY, X, Y, dot, param, ts

MESH, AXES = (2, 4), ("x", "y")


def blocks(fig):
    """Each drawn tensor block: its hover point's fields and the colours of the polygons in it."""
    polys = []
    for t in fig.data:
        if (t.meta or {}).get("kind") != "tiles":
            continue
        xs, ys = list(t.x), list(t.y)
        for k in range(0, len(xs), 6):
            polys.append((min(xs[k:k + 5]), max(xs[k:k + 5]), min(ys[k:k + 5]), max(ys[k:k + 5]),
                          t.fillcolor, t.meta["striped"]))
    hover = next(t for t in fig.data if (t.meta or {}).get("kind") == "tensors")
    out = []
    for x, y, cd, text in zip(hover.x, hover.y, hover.customdata, hover.hovertext):
        op, name, role, col, row, w, h = cd
        inside = [p for p in polys if x - w / 2 - 2e-4 <= p[0] and p[1] <= x + w / 2 + 2e-4
                  and y - h / 2 - 2e-4 <= p[2] and p[3] <= y + h / 2 + 2e-4]
        out.append({"op": op, "tensor": name, "role": role, "column": col, "row": row, "w": w,
                    "h": h, "polys": inside, "text": text})
    return out


def block(fig, tensor, column=None):
    found = [b for b in blocks(fig) if b["tensor"] == tensor and (column is None or b["column"] == column)]
    assert found, f"no block for {tensor}"
    return found[0]


def stage_of(plan, k=0):
    return plan.stages[k]


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


def test_tile_colours_are_keyed_to_mesh_coordinates():
    # hue from the x coordinate (2 values), lightness from y (4 values)
    colors = [[mesh_color([i, j], MESH) for j in range(4)] for i in range(2)]
    assert len({c for row in colors for c in row}) == 8
    assert REPLICATED_COLOR not in {c for row in colors for c in row}
    # a tile on devices (0, 4) is split over y only: same y coordinate, no hue
    assert tile_color((0, 4), MESH) == mesh_color([None, 0], MESH)
    assert tile_color((0, 4), MESH) != tile_color((1, 5), MESH)
    assert tile_color(tuple(range(8)), MESH) == REPLICATED_COLOR
    # a 1x8 mesh: y is the only axis of several devices, so it sets the hue: 8 distinct colours
    assert len({tile_color((d,), (1, 8)) for d in range(8)}) == 8
    # 1,024 devices: at most 24 hues x 6 lightness levels, never grey
    big = {tile_color((d,), (128, 8)) for d in range(1024)}
    assert 8 < len(big) <= 24 * 6 and REPLICATED_COLOR not in big


def test_replicated_weight_is_one_grey_tile(intra_plan):
    b = block(sharding_figure(intra_plan), "params['head']['kernel']")
    assert [p[4] for p in b["polys"]] == [REPLICATED_COLOR]
    tiles = block_tiles(intra_plan.ops[4].tensors[1], stage_of(intra_plan))
    assert len(tiles) == 1 and tiles[0].devices == tuple(range(8)) and not tiles[0].striped


def test_output_dim_split_over_the_4_device_axis(intra_plan):
    t = intra_plan.ops[0].tensors[1]  # fc1 kernel, (1024, 4096), P(None, 'y')
    tiles = block_tiles(t, stage_of(intra_plan))
    assert [(x.row, x.col) for x in tiles] == [(0, c) for c in range(4)]
    assert [x.devices for x in tiles] == tile_devices((1024, 4096), (None, ("y",)), MESH, AXES)[0]
    # 4 tiles on 2 devices each (replicated over x): striped, one lightness per y coordinate
    assert all(x.striped for x in tiles)
    assert [x.color for x in tiles] == [mesh_color([None, c], MESH) for c in range(4)]
    b = block(sharding_figure(intra_plan), "params['fc1']['kernel']")
    assert sorted(p[4] for p in b["polys"]) == sorted(x.color for x in tiles)
    assert all(p[5] for p in b["polys"])


def test_2d_split_over_both_axes_has_8_distinct_colours(intra_plan):
    t = intra_plan.ops[2].tensors[1]  # attn qkv (1024, 3072), P('x', 'y')
    tiles = block_tiles(t, stage_of(intra_plan))
    assert sorted(x.devices for x in tiles) == [(d,) for d in range(8)]
    assert len({x.color for x in tiles}) == 8 and not any(x.striped for x in tiles)
    for x in tiles:  # device d holds tile (d // 4, d % 4): its colour is its coordinates'
        d = x.devices[0]
        assert (x.row, x.col) == divmod(d, 4) and x.color == mesh_color(list(divmod(d, 4)), MESH)


def test_rank3_tensor_is_folded_and_hover_says_so(intra_plan):
    fig = sharding_figure(intra_plan)
    b = block(fig, "%8", column=2)  # (64, 128, 3072) spec (x, None, y)
    assert len(b["polys"]) == 8
    assert "folded into rows" in b["text"] and "2x4 tiles" in b["text"]


def test_hover_and_spec_text(intra_plan):
    fig = sharding_figure(intra_plan)
    b = block(fig, "params['fc1']['kernel']")
    assert "1024x4096" in b["text"] and "P(None, 'y')" in b["text"] and "RS(y)" in b["text"]
    assert "4.00 MiB" in b["text"]  # 1024*4096*4 bytes / 4 shards
    assert "held by devices 0, 4" in b["text"]
    text = next(t for t in fig.data if (t.meta or {}).get("kind") == "spec_text")
    assert "RS(y)" in text.text and "S(x)S(y)" in text.text
    assert "Operator sharding" in fig.layout.title.text and "2x4" in fig.layout.title.text


def test_block_size_tells_big_tensors_from_small(intra_plan):
    fig = sharding_figure(intra_plan)
    big = block(fig, "params['proj']['kernel']")  # 1024 x 8192 floats: the largest
    small = block(fig, "params['head']['kernel']")  # 1024 x 10
    assert big["w"] > 1.5 * small["w"] and big["h"] > 1.5 * small["h"]
    sizes = sorted((math.prod(t.shape), block(fig, t.name, c)["w"])
                   for c, o in enumerate(intra_plan.ops[:5]) for t in o.tensors)
    assert [w for _, w in sizes] == sorted(w for _, w in sizes)  # larger tensor, larger block


def test_columns_are_layers_rows_are_operator_kinds(intra_plan):
    fig = sharding_figure(intra_plan)
    cols = fig.layout.meta["columns"]
    # five distinct layers; only forward operators (op 5 is fc1's backward)
    assert [c["layers"] for c in cols] == [["fc1"], ["fc2"], ["attn"], ["proj"], ["head"]]
    assert sorted(o for c in cols for o in c["ops"]) == [0, 1, 2, 3, 4]
    assert {b["column"] for b in blocks(fig)} == set(range(5))


def repeated_plan(layers=24, differ=()):
    """One stage on a 2x4 mesh, ``layers`` identical layers of 2 dots (their weights split over
    y) between an embedding and a head; the layers in ``differ`` replicate their weights."""
    ops = [dot(0, "embed", [ts("%0", "input", (64, 256), (X, None)),
                             ts("params['embed']", "weight", (256, 512), (None, None)),
                             ts("%1", "output", (64, 512), (X, None))])]
    inputs = [param("['embed']", (256, 512), (None, None))]
    for k in range(layers):
        w = None if k in differ else Y
        for j, name in enumerate(("fc1", "fc2")):
            ops.append(OpShardingLike(2 + 2 * k + j, f"layers_{k}", name,
                                      [ts(f"%{10 * k + j}", "input", (64, 512), (X, None)),
                                       ts(f"params['layers_{k}']['{name}']['kernel']", "weight",
                                          (512, 512), (None, w)),
                                       ts(f"%{10 * k + j + 5}", "output", (64, 512), (X, w))]))
            inputs.append(param(f"['layers_{k}']['{name}']['kernel']", (512, 512), (None, w)))
    ops.append(dot(999, "head", [ts("%998", "input", (64, 512), (X, None)),
                                 ts("params['head']", "weight", (512, 10), (None, None)),
                                 ts("%999", "output", (64, 10), (X, None))]))
    inputs.append(param("['head']", (512, 10), (None, None)))
    names = ("embed", *[f"layers_{k}" for k in range(layers)], "head")
    stage = Stage(0, names, (0, len(names)), (1, 8), tuple(range(8)), (2, 4), ("x", "y"),
                  ops=tuple(ops), forward_time=1e-3, backward_time=2e-3, memory=2**30)
    return Plan("gpt-like", "0" * 16, Cluster.preset("p3.16xlarge", 1), (stage,), tuple(inputs),
                Schedule("none", 1, 1), Predicted(3e-3, 1e4, 2**30))


def OpShardingLike(op, layer, name, tensors):
    from dataclasses import replace

    return replace(dot(op, layer, tensors), scope=f"{layer}/mlp/{name}")


def test_identically_sharded_layers_share_a_column():
    plan = repeated_plan(24)
    fig = sharding_figure(plan)
    cols = fig.layout.meta["columns"]
    assert [len(c["layers"]) for c in cols] == [1, 24, 1]
    assert cols[1]["layers"] == [f"layers_{k}" for k in range(24)]
    assert len(cols[1]["ops"]) == 48
    assert fig.layout.meta["rows"] == ["embed", "mlp/fc1", "mlp/fc2", "head"]
    assert "x24" in fig.layout.xaxis.ticktext[1] and "layers_0 .. layers_23" in fig.layout.xaxis.ticktext[1]
    assert "26 layers in 3 columns" in fig.layout.title.text
    # a layer sharded otherwise gets a column of its own; the others still share one
    cols = sharding_figure(repeated_plan(24, differ=(5,))).layout.meta["columns"]
    assert [len(c["layers"]) for c in cols] == [1, 23, 1, 1]
    assert cols[2]["layers"] == ["layers_5"]


def test_drill_down_shows_every_operator_of_one_layer(intra_plan):
    fig = sharding_figure(intra_plan, layer="fc1")
    cols = fig.layout.meta["columns"]
    assert [c["ops"] for c in cols] == [[0], [5]]  # forward and backward
    assert "(backward)" in fig.layout.xaxis.ticktext[1]
    assert fig.layout.meta["layer"] == "fc1" and "layer fc1" in fig.layout.title.text
    with pytest.raises(ValueError, match="layer should be one of"):
        sharding_figure(intra_plan, layer="nope")
    with pytest.raises(ValueError, match="max_columns"):
        sharding_figure(intra_plan, max_columns=0)


def test_subsampling_says_so(intra_plan):
    fig = sharding_figure(intra_plan, max_columns=3)
    assert [c["layers"] for c in fig.layout.meta["columns"]] == [["fc1"], ["attn"], ["head"]]
    assert "3 of 5 columns shown" in fig.layout.title.text


def test_pipeline_plan_marks_stages_and_folds_layers_sharded_alike(pipeline_plan):
    fig = sharding_figure(pipeline_plan)
    cols = fig.layout.meta["columns"]
    # the four layers of each stage are sharded alike; the stages' meshes differ (1x4, 1x2, 1x1)
    assert [(c["stages"], len(c["layers"])) for c in cols] == [([0], 4), ([1], 4), ([2], 4)]
    assert ["stage 0" in t for t in fig.layout.xaxis.ticktext] == [True, False, False]
    assert "stage 2" in fig.layout.xaxis.ticktext[2]
    # stages on meshes of one shape, sharded alike, share a column that names them
    stages = tuple(s.__class__(**{**s.__dict__, "mesh_shape": (1, 4), "submesh_shape": (1, 4)})
                   for s in pipeline_plan.stages)
    same = pipeline_plan.with_(stages=(stages[0],) + tuple(
        st.__class__(**{**st.__dict__, "ops": tuple(
            replace(o, tensors=tuple(
                replace(t, spec=u.spec) for t, u in zip(o.tensors, stages[0].ops[0].tensors)))
            for o in st.ops)}) for st in stages[1:]))
    cols = sharding_figure(same).layout.meta["columns"]
    assert [(c["stages"], len(c["layers"])) for c in cols] == [([0, 1, 2], 12)]
    assert "stages 0-2" in sharding_figure(same).layout.xaxis.ticktext[0]


def test_a_thousand_devices_draw_in_few_traces():
    ops = (dot(0, "big", [ts("%0", "input", (4096, 1024), (XY, None)),
                          ts("params['big']", "weight", (1024, 4096), (None, Y)),
                          ts("%1", "output", (4096, 4096), (X, Y))]),)
    stage = Stage(0, ("big",), (0, 1), (128, 8), tuple(range(1024)), (128, 8), ("x", "y"), ops=ops)
    plan = Plan("big", "0" * 16, Cluster.preset("p3.16xlarge", 128), (stage,),
                (param("['big']", (1024, 4096), (None, Y)),), Schedule("none", 1, 1),
                Predicted(1.0, 1.0, 1.0))
    fig = sharding_figure(plan)
    assert len(fig.data) < 24 * 6 + 4
    b = block(fig, "%0")  # 1,024 row tiles drawn as 16 bands
    assert len(b["polys"]) == MAX_BANDS and "16x1 bands" in b["text"]
    key = next(t for t in fig.data if (t.meta or {}).get("kind") == "mesh_key")
    assert len(key.z) == 128 and len(key.z[0]) == 8


def test_unscoped_operators_are_named_by_their_parameters():
    ops = tuple(dot(k, "(root)", [ts(f"%{k}", "input", (16, 64), (X, None)),
                                  ts(f"params[{k}]['w']", "weight", (64, 64), (None, None)),
                                  ts(f"%{k + 10}", "output", (16, 64), (X, None))])
                for k in range(3))
    ops = tuple(replace(o, scope="") for o in ops)
    stage = Stage(0, ("(root)",), (0, 1), (1, 8), tuple(range(8)), (2, 4), ("x", "y"), ops=ops)
    plan = Plan("mlp", "0" * 16, Cluster.preset("p3.16xlarge", 1), (stage,), (), Schedule("none", 1, 1),
                Predicted(1.0, 1.0, 1.0))
    assert op_layers(plan) == {0: "params[0]", 1: "params[1]", 2: "params[2]"}
    cols, _ = sharding_columns(plan)
    assert [c.layers for c in cols] == [["params[0]", "params[1]", "params[2]"]]


def test_colours_are_deterministic(intra_plan):
    a = sharding_figure(intra_plan).to_plotly_json()
    b = sharding_figure(intra_plan).to_plotly_json()
    assert a == b


def test_dense_views_write_only_the_split_labels_that_fit():
    """Many columns (a deep model whose layers shard differently): a block too narrow for its
    split's label carries none (its hover still names the split); a wide view writes them all."""
    from autoplan.viz._sharding import FIGURE_WIDTH_PX, LABEL_CHAR_PX, label_fits  # noqa: PLC0415

    specs = [(X, None), (Y, None), (None, X), (None, None), (XY, None), (None, XY), (X, Y), (Y, X)]

    def plan_of(n):
        ops = tuple(dot(k, f"block{k}", [ts(f"%{k}", "input", (64, 64), specs[k % 8]),
                                         ts(f"params['block{k}']['w']", "weight", (64, 64),
                                            specs[(k // 8 + k) % 8]),
                                         ts(f"%{k + 100}", "output", (64, 64), specs[k % 8])])
                    for k in range(n))
        stage = Stage(0, tuple(f"block{k}" for k in range(n)), (0, n), (1, 8), tuple(range(8)),
                      MESH, AXES, ops=ops)
        return Plan("deep", "0" * 16, Cluster.preset("p3.16xlarge", 1), (stage,), (),
                    Schedule("none", 1, 1), Predicted(1.0, 1.0, 1.0))

    def labels(fig):
        t = next((t for t in fig.data if (t.meta or {}).get("kind") == "spec_text"), None)
        return list(t.text) if t is not None else []

    few, many = sharding_figure(plan_of(4)), sharding_figure(plan_of(12))
    assert len(labels(few)) == 4 * 3  # every block of a wide view is labelled
    cols = len(many.layout.meta["columns"])
    assert cols == 12
    written = labels(many)
    assert 0 < len(written) < 12 * 3  # the short splits ("RR") fit, the long ones do not
    # what is written fits its slot at the width the figure is laid out for
    col_px = FIGURE_WIDTH_PX * (many.layout.xaxis.domain[1]) / cols
    slot_px = col_px * 0.92 / 3
    assert all(LABEL_CHAR_PX * len(s) + 2 <= slot_px for s in written)
    assert all(not label_fits(s, slot_px, 40) for s in ("S(x)S(y)", "S(x)R"))
    assert labels(sharding_figure(plan_of(40))) == []  # 40 columns: no room for any
