"""The primitive registry (``autoplan.tracing._primitives``): the sets the package read before the registry
existed, each kept member for member by a view of it; the follower rules ``_follow`` dispatches to,
table-driven against the results of the if-chain they replaced; the default rule of a primitive the
table does not list."""

from __future__ import annotations

import pytest

from autoplan.search.fold import _graphnodes, _layers
from autoplan.search.intra import _strategies
from autoplan.tracing import _primitives as P
from autoplan.tracing._graph import OpNode

_SCATTERS = ("scatter scatter-add scatter_add scatter-mul scatter_mul scatter-min scatter_min "
             "scatter-max scatter_max")
_ELEMENTWISE = """
    neg sign floor ceil round is_finite exp exp2 log log1p expm1 tanh logistic sin cos tan asin
    acos atan sinh cosh asinh acosh atanh sqrt rsqrt cbrt abs not imag real conj complex lgamma
    digamma erf erfc erf_inv square reciprocal integer_pow pow add add_any sub mul div rem max min
    atan2 nextafter and or xor eq ne lt le gt ge shift_left shift_right_logical
    shift_right_arithmetic population_count clz select_n clamp convert_element_type copy copy_p
    stop_gradient reduce_precision sharding_constraint device_put mesh_cast reshard igamma igammac
    random_gamma_grad bessel_i0e bessel_i1e polygamma zeta threefry2x32 bitcast_convert_type tan_p
    logaddexp one_minus_square"""
_MOVE = ("broadcast_in_dim reshape squeeze expand_dims transpose slice pad concatenate split rev "
         "dynamic_slice dynamic_update_slice scan_slice scan_stack sort top_k")
_REDUCE = ("reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or reduce_xor "
           "reduce_precision_sum")
_CUMULATIVE = "cumsum cumprod cummax cummin cumlogsumexp"
_WINDOW = ("reduce_window_sum reduce_window_max reduce_window_min select_and_scatter_add "
           "select_and_gather_add")
_KEY_OPS = "random_seed random_wrap random_unwrap random_split random_fold_in random_clone"

# (where the set was, its members before the registry, the view that replaces it, the kinds its
# members have in the registry)
FORMER_SETS = [
    ("intra/_strategies.HEAVY", "dot_general conv_general_dilated gather " + _SCATTERS,
     P.STRATEGY_HEAVY, {"heavy", "gather", "scatter"}),
    ("intra/_strategies.ELEMENTWISE", _ELEMENTWISE, P.ELEMENTWISE, {"elementwise"}),
    ("intra/_strategies._SCATTER", _SCATTERS, P.SCATTERS, {"scatter"}),
    ("intra/_strategies.FOLLOWERS",
     " ".join((_ELEMENTWISE, _REDUCE, "argmax argmin", _CUMULATIVE, _WINDOW, _MOVE)), P.FOLLOWERS,
     {"elementwise", "reduction", "cumulative", "window", "movement", "sort"}),
    ("intra/_strategies.KEY_OPS", _KEY_OPS, P.KEY_OPS, {"key"}),
    ("intra/_strategies.RANDOM_BITS", "random_bits", P.RANDOM_BITS, {"random"}),
    ("intra/_strategies._GENERATORS", "iota broadcast_in_dim full zeros_like", P.GENERATORS,
     {"generator", "movement"}),
    ("intra/_strategies.LOOP_FUSIBLE",
     _ELEMENTWISE + " broadcast_in_dim reshape squeeze expand_dims iota slice rev pad concatenate "
                    "transpose dynamic_slice", P.LOOP_FUSIBLE,
     {"elementwise", "movement", "generator"}),
    ("intra/_strategies._READS_SLICE", "slice dynamic_slice scan_slice gather", P.READS_SLICE,
     {"movement", "gather"}),
    ("intra/_strategies._REDUCTIONS and pipeline/_pipeline._REDUCTIONS",
     "reduce_sum reduce_max reduce_min reduce_prod argmax argmin", P.STOP_REDUCTIONS,
     {"reduction"}),
    ("intra/_intra._PLAN_PRIMITIVES", "dot_general conv_general_dilated gather random_bits "
     + _SCATTERS, P.PLAN_RECORDED, {"heavy", "gather", "scatter", "random"}),
    ("fold/_summary._PLANNED and fold/_layers.HEAVY", "dot_general conv_general_dilated",
     P.LAYER_HEAVY, {"heavy"}),
    ("fold/_graphnodes.HEAVY", "dot_general conv_general_dilated ragged_dot", P.GRAPHNODE_HEAVY,
     {"heavy"}),
    ("fold/_graphnodes.ANCHORS",
     "dot_general conv_general_dilated ragged_dot gather scatter scatter-add scatter_add "
     "scatter-mul scatter_mul scatter-min scatter-max sort argsort top_k while cond scan "
     "custom_call select_and_scatter_add reduce_window reduce_window_sum reduce_window_max "
     "all_reduce psum all_gather all_to_all", P.GRAPHNODE_ANCHORS,
     {"heavy", "gather", "scatter", "sort", "control", "window", "collective"}),
    ("fold/_graphnodes.REDUCTIONS",
     "reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or argmax argmin cumsum "
     "cumprod cummax cummin cumlogsumexp reduce_precision_sum", P.GRAPHNODE_REDUCTIONS,
     {"reduction", "cumulative"}),
    ("_trace.MOVEMENT (no FLOPs)",
     "reshape transpose broadcast_in_dim squeeze expand_dims slice dynamic_slice "
     "dynamic_update_slice gather concatenate pad convert_element_type copy copy_p iota rev split "
     "scan_slice scan_stack stop_gradient sharding_constraint device_put bitcast_convert_type "
     "squeeze_p reduce_precision optimization_barrier mesh_cast reshard select_and_gather_add "
     + _KEY_OPS, P.ZERO_FLOPS,
     {"movement", "gather", "elementwise", "generator", "window", "key"}),
    ("_trace.REDUCTIONS (a FLOP per element read)",
     "reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or argmax argmin cumsum "
     "cumprod cummax cummin cumlogsumexp reduce_precision_sum", P.OPERAND_FLOPS,
     {"reduction", "cumulative"}),
]


@pytest.mark.parametrize("where, members, view, kinds", FORMER_SETS,
                         ids=[s[0] for s in FORMER_SETS])
def test_each_former_set_is_a_view_with_the_same_members(where, members, view, kinds):
    assert view == frozenset(members.split()), where
    assert {P.rule_of(p).kind for p in view} == kinds, where


# every member of a former set keeps one class, whichever set it was in
EXPECTED_KINDS = {
    **dict.fromkeys(_ELEMENTWISE.split(), "elementwise"),
    **dict.fromkeys(_REDUCE.split() + ["argmax", "argmin"], "reduction"),
    **dict.fromkeys(_CUMULATIVE.split(), "cumulative"),
    **dict.fromkeys(_WINDOW.split() + ["reduce_window"], "window"),
    **dict.fromkeys(_MOVE.split() + ["squeeze_p", "optimization_barrier"], "movement"),
    **dict.fromkeys(["sort", "top_k", "argsort"], "sort"),
    **dict.fromkeys(_SCATTERS.split(), "scatter"),
    **dict.fromkeys(["dot_general", "conv_general_dilated", "ragged_dot"], "heavy"),
    "gather": "gather", "random_bits": "random",
    **dict.fromkeys(["iota", "full", "zeros_like"], "generator"),
    **dict.fromkeys(_KEY_OPS.split(), "key"),
    **dict.fromkeys(["while", "cond", "scan", "custom_call"], "control"),
    **dict.fromkeys(["all_reduce", "psum", "all_gather", "all_to_all"], "collective"),
}


def test_every_primitive_of_the_former_sets_has_its_class():
    assert set().union(*(frozenset(m.split()) for _, m, _, _ in FORMER_SETS)) <= set(P.RULES)
    assert {p: r.kind for p, r in P.RULES.items()} == EXPECTED_KINDS


def test_the_table_is_well_formed():
    for name, rule in P.RULES.items():
        assert rule.kind in P.KINDS and rule.kind != "other", name
        assert rule.flops in P.FLOP_COUNTS, name
        assert rule.follow is None or callable(rule.follow), name


def test_the_callers_read_the_registry():
    assert _strategies.HEAVY is P.STRATEGY_HEAVY
    assert _strategies.FOLLOWERS is P.FOLLOWERS
    assert _layers.HEAVY is P.LAYER_HEAVY
    assert (_graphnodes.HEAVY, _graphnodes.ANCHORS, _graphnodes.REDUCTIONS) == (
        P.GRAPHNODE_HEAVY, P.GRAPHNODE_ANCHORS, P.GRAPHNODE_REDUCTIONS)


def test_an_unknown_primitive_gets_the_default_rule():
    rule = P.rule_of("my_custom_primitive")
    assert rule is P.DEFAULT
    assert (rule.kind, rule.follow, rule.fusible, rule.reads_slice, rule.flops) == (
        "other", None, False, False, "output")


X, Y = ("x",), ("y",)
# (primitive, params, operand shapes, result shapes, operand followed, its spec, what _follow
# returned before it was a table: (in specs, out specs, collectives, work) or None)
FOLLOW_CASES = [
    ("add", {}, ((8, 16), (1, 16)), ((8, 16),), 0, (X, Y),
     (((X, Y), (None, Y)), ((X, Y),), (), None)),
    ("mul", {}, ((8, 16), None), ((8, 16),), 0, (X, None), (((X, None), None), ((X, None),), (), None)),
    ("convert_element_type", {}, ((8, 16),), ((8, 16),), 0, (None, Y),
     (((None, Y),), ((None, Y),), (), None)),
    ("broadcast_in_dim", {"broadcast_dimensions": (1,)}, ((16,),), ((8, 16),), 0, (Y,),
     (((Y,),), ((None, Y),), (), None)),
    ("broadcast_in_dim", {"broadcast_dimensions": (0, 1)}, ((1, 16), (2,)), ((8, 16),), 0, (X, Y),
     (((None, Y), (None,)), ((None, Y),), (), None)),
    ("broadcast_in_dim", {"broadcast_dimensions": (1,)}, ((16,), (2,)), ((8, 16),), 1, (None,),
     None),
    ("reshape", {"dimensions": None}, ((8, 16),), ((8, 4, 4),), 0, (X, Y),
     (((X, Y),), ((X, Y, None),), (), None)),
    ("reshape", {"dimensions": (1, 0)}, ((8, 16),), ((128,),), 0, (X, None),
     (((None, None),), ((None,),), (), None)),
    ("squeeze", {"dimensions": (1,)}, ((8, 1, 16),), ((8, 16),), 0, (X, None, Y),
     (((X, None, Y),), ((X, Y),), (), None)),
    ("expand_dims", {"dimensions": (0,)}, ((8, 16),), ((1, 8, 16),), 0, (X, Y),
     (((X, Y),), ((None, X, Y),), (), None)),
    ("transpose", {"permutation": (1, 0)}, ((8, 16),), ((16, 8),), 0, (X, Y),
     (((X, Y),), ((Y, X),), (), None)),
    ("transpose", {"permutation": (0, 0)}, ((8, 16),), ((16, 8),), 0, (X, Y), None),
    ("reduce_sum", {"axes": (1,)}, ((8, 16),), ((8,),), 0, (X, Y),
     (((X, Y),), ((X,),), (("all-reduce", 16.0, Y),), 8)),
    ("reduce_max", {"axes": (0,)}, ((8, 16),), ((16,),), 0, (("x", "y"), None),
     (((("x", "y"), None),), ((None,),), (("all-reduce", 64.0, ("x", "y")),), 8)),
    ("reduce_and", {"axes": (0,)}, ((8, 16),), ((16,),), 0, (None, Y),
     (((None, Y),), ((Y,),), (), 4)),
    ("argmax", {"axes": (1,), "index_dtype": "int32"}, ((8, 16),), ((8,),), 0, (X, Y),
     (((X, None),), ((X,),), (), None)),
    ("cumsum", {"axis": 1, "reverse": False}, ((8, 16),), ((8, 16),), 0, (X, Y),
     (((X, None),), ((X, None),), (), None)),
    ("sort", {"dimension": 1, "num_keys": 1}, ((8, 16), (8, 16)), ((8, 16), (8, 16)), 0, (X, Y),
     (((X, None), (X, None)), ((X, None), (X, None)), (), None)),
    ("top_k", {"k": 2}, ((8, 16),), ((8, 2), (8, 2)), 0, (X, Y),
     (((X, None),), ((X, None), (X, None)), (), None)),
    ("concatenate", {"dimension": 0}, ((8, 16), (4, 16)), ((12, 16),), 1, (X, Y),
     (((None, Y), (None, Y)), ((None, Y),), (), None)),
    ("split", {"sizes": (8, 8), "axis": 1}, ((8, 16),), ((8, 8), (8, 8)), 0, (X, Y),
     (((X, None),), ((X, None), (X, None)), (), None)),
    ("slice", {"start_indices": (0, 2), "limit_indices": (8, 10), "strides": None}, ((8, 16),),
     ((8, 8),), 0, (X, Y), (((X, None),), ((X, None),), (), None)),
    ("pad", {"padding_config": ((0, 0, 0), (1, 1, 0))}, ((8, 16), ()), ((8, 18),), 0, (X, Y),
     (((X, None), ()), ((X, None),), (), None)),
    ("pad", {"padding_config": ((0, 0, 0), (1, 1, 0))}, ((8, 16), ()), ((8, 18),), 1, (), None),
    ("rev", {"dimensions": (0,)}, ((8, 16),), ((8, 16),), 0, (X, Y),
     (((None, Y),), ((None, Y),), (), None)),
    ("dynamic_slice", {"slice_sizes": (8, 4)}, ((8, 16), (), ()), ((8, 4),), 0, (X, Y),
     (((X, None), (), ()), ((X, None),), (), None)),
    ("dynamic_slice", {"slice_sizes": (8, 4)}, ((8, 16), (), ()), ((8, 4),), 1, (), None),
    ("dynamic_update_slice", {}, ((8, 16), (8, 4), (), ()), ((8, 16),), 1, (X, Y),
     (((X, None), (X, None), (), ()), ((X, None),), (), None)),
    ("scan_slice", {"index": 0}, ((4, 8, 16),), ((8, 16),), 0, (X, Y, None),
     (((None, Y, None),), ((Y, None),), (), None)),
    ("scan_stack", {}, ((8, 16), (8, 16)), ((2, 8, 16),), 0, (X, Y),
     (((X, Y), (X, Y)), ((None, X, Y),), (), None)),
    ("reduce_window_sum", {"window_dimensions": (1, 2), "window_strides": (1, 2),
                           "padding": ((0, 0), (0, 0))}, ((8, 16),), ((8, 8),), 0, (X, Y),
     (((X, None),), ((X, None),), (), None)),
    ("select_and_scatter_add", {"window_dimensions": (1, 2), "window_strides": (1, 2),
                                "padding": ((0, 0), (0, 0))}, ((8, 8), (8, 16)), ((8, 16),), 1,
     (X, Y), (((X, None), (X, None)), ((X, None),), (), None)),
    ("reduce_window_max", {"window_dimensions": (2,)}, ((8, 16),), ((8, 8),), 0, (X, Y), None),
    # no follower rule: a heavy primitive, one the table does not list, a literal operand, no result
    ("dot_general", {"dimension_numbers": (((1,), (0,)), ((), ()))}, ((8, 16), (16, 4)),
     ((8, 4),), 0, (X, Y), None),
    ("my_custom_primitive", {}, ((8, 16),), ((8, 16),), 0, (X, Y), None),
    ("add", {}, ((8, 16), None), ((8, 16),), 1, (), None),
    ("add", {}, ((8, 16),), (), 0, (X, Y), None),
]


def _plain(v):
    return tuple(_plain(x) for x in v) if isinstance(v, tuple | list) else v


@pytest.mark.parametrize("prim, params, ins, outs, k, spec, expected", FOLLOW_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(FOLLOW_CASES)])
def test_follow_gives_what_the_if_chain_gave(prim, params, ins, outs, k, spec, expected):
    op = OpNode(0, prim, params, tuple(range(len(ins))), tuple(range(len(outs))), 0.0, (),
                "forward", ins, outs, in_dtypes=tuple(None if s is None else "float32" for s in ins),
                out_dtypes=("float32",) * len(outs))
    assert _plain(_strategies._follow(op, k, spec, {"x": 2, "y": 4})) == expected
