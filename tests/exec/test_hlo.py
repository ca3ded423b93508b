"""The HLO collective parser on compiled sharded programs and on hand-written HLO text."""

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from autoplan.exec import collectives, comm_bytes
from autoplan.exec._hlo import shape_bytes


def _mesh():
    return jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)


def _compiled(fn, out_spec, *specs_and_shapes):
    mesh = _mesh()
    args = [jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))
            for shape, spec in specs_and_shapes]
    return jax.jit(fn, out_shardings=NamedSharding(mesh, out_spec)).lower(*args).compile()


def test_sharded_matmul_has_one_all_reduce_of_the_output_bytes():
    # contracting dimension split 4 ways on "y": each device holds a partial [16, 8] product
    c = _compiled(lambda a, b: a @ b, P(), ((16, 32), P(None, "y")), ((32, 8), P("y", None)))
    colls = collectives(c.as_text())
    assert [(x.kind, x.bytes, x.group_size, x.dtype) for x in colls] == [
        ("all-reduce", 16 * 8 * 4, 4, "f32")]
    assert colls[0].equivalent == "all-reduce"
    assert comm_bytes(colls)["all-reduce"] == 512


def test_cpu_all_reduce_plus_dynamic_slice_counts_as_reduce_scatter():
    c = _compiled(lambda a, b: a @ b, P("y"), ((16, 32), P(None, "y")), ((32, 8), P("y", None)))
    (coll,) = collectives(c.as_text())
    assert coll.kind == "all-reduce" and coll.equivalent == "reduce-scatter"
    assert comm_bytes([coll])["reduce-scatter"] == 512
    assert comm_bytes([coll], map_cpu=False)["all-reduce"] == 512


def test_all_gather_bytes_are_the_gathered_size():
    c = _compiled(lambda a: a * 2, P(), ((16, 32), P(None, "y")))
    (coll,) = collectives(c.as_text())
    assert coll.kind == "all-gather" and coll.group_size == 4
    assert coll.operand_bytes == 16 * 8 * 4 and coll.bytes == coll.result_bytes == 16 * 32 * 4


HLO = """
HloModule m, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

ENTRY %main (p0: f32[64,32], p1: bf16[16]) -> (f32[64,32], bf16[16], f32[8,32]) {
  %p0 = f32[64,32]{1,0} parameter(0)
  %p1 = bf16[16]{0} parameter(1)
  %ar = (f32[64,32]{1,0}, bf16[16]{0}) all-reduce(%p0, %p1), replica_groups=[4,2]<=[8], to_apply=%add
  %g0 = f32[64,32]{1,0} get-tuple-element(%ar), index=0
  %g1 = bf16[16]{0} get-tuple-element(%ar), index=1
  %a2a = f32[8,32]{1,0} all-to-all(%p0), replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  %cp = f32[64,32]{1,0} collective-permute(%g0), source_target_pairs={{0,1},{1,0}}
  ROOT %t = (f32[64,32]{1,0}, bf16[16]{0}, f32[8,32]{1,0}) tuple(%cp, %g1, %a2a)
}
"""


def test_tuple_all_reduce_counts_each_operand_and_group_spellings():
    colls = collectives(HLO)
    kinds = [(c.kind, c.operand, c.bytes, c.group_size) for c in colls]
    assert kinds == [("all-reduce", 0, 64 * 32 * 4, 2), ("all-reduce", 1, 16 * 2, 2),
                     ("all-to-all", 0, 64 * 32 * 4, 8), ("collective-permute", 0, 64 * 32 * 4, 2)]
    totals = comm_bytes(colls)
    assert totals["all-reduce"] == 64 * 32 * 4 + 32
    assert totals["all-to-all"] == totals["collective-permute"] == 64 * 32 * 4


def test_shape_bytes():
    assert shape_bytes("f32[16,8]{1,0}") == 512
    assert shape_bytes("(f32[2]{0}, bf16[3,3]{1,0}, pred[])") == 8 + 18 + 1


def test_hlo_element_types_have_the_sizes_of_their_numpy_dtypes():
    """An HLO type's size is read from its NumPy name by the one dtype-size function."""
    import numpy as np

    from autoplan._dtype import dtype_bytes
    from autoplan.costs._hlotext import dtype_size, numpy_dtype_name

    cases = {"pred": "bool", "s8": "int8", "u16": "uint16", "s32": "int32", "u64": "uint64",
             "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
             "c64": "complex64", "c128": "complex128", "s4": "int4", "u2": "uint2",
             "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2", "f4e2m1fn": "float4_e2m1fn"}
    for hlo, name in cases.items():
        assert numpy_dtype_name(hlo) == name
        assert dtype_size(hlo) == dtype_bytes(name)
        if name not in ("int4", "uint2", "float4_e2m1fn"):  # sub-byte types take a byte
            import ml_dtypes  # noqa: F401  (registers the narrow floats with NumPy)

            assert dtype_size(hlo) == np.dtype(name).itemsize
    assert dtype_size("token") == 0 and dtype_size("tuple") == 0
    assert numpy_dtype_name("opaque") is None
