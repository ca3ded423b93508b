"""The primitive registry: what the planner knows about each JAX primitive, in one table.

:data:`RULES` maps a primitive's name to its :class:`PrimitiveRule`, as JAX keeps its
per-primitive rules in tables keyed by primitive. A rule holds:

* the primitive's **kind** (its class): ``heavy`` (matmuls and convolutions), ``gather``,
  ``scatter``, ``elementwise``, ``reduction``, ``cumulative``, ``window``, ``movement``, ``sort``,
  ``generator``, ``key`` (PRNG key handling), ``random`` (drawing bits), ``control`` and
  ``collective``;
* its **follower rule** (``follow``), the sharding propagation of the intra-operator search:
  given the spec of one operand, the specs of every operand and result, the collectives and the
  number of devices doing distinct work (see :func:`autoplan.search.intra._strategies.derive`);
  None when the primitive has none;
* whether XLA **loop-fuses** it into the kernel of its reader (``fusible``), whether it reads only
  the part of its first operand it produces (``reads_slice``), and how the trace counts its
  **FLOPs** (``flops``: ``"none"`` for data movement, ``"operand"`` for one per element read,
  ``"updates"`` for one per update of a scatter, ``"output"`` for one per element written; a
  matmul's, convolution's, sort's and ``random_bits``' own formulas are in
  :func:`autoplan.tracing._trace.op_flops`).

A primitive not in the table gets :data:`DEFAULT` (:func:`rule_of`): kind ``other``, no follower
rule (the search plans it replicated and names it once per search), not fusible, one FLOP per
element written.

The sets the rest of the package reads are views of the table, defined at the end of this module:
each caller's view is named after what it is for, and where one differs from a plain union of
kinds the comment says why. The views keep exactly the members their callers had before the
table existed, so that plans do not change.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from autoplan._dtype import dtype_bytes
from autoplan.plans._spec import Spec, tile_count

#: an operator of the traced graph (:class:`autoplan.tracing._graph.OpNode`, which reads this
#: registry: named here without importing it)
OpNode = Any

__all__ = ["PrimitiveRule", "RULES", "DEFAULT", "KINDS", "rule_of", "of_kind"]

#: the kinds (classes) of primitives
KINDS = ("heavy", "gather", "scatter", "elementwise", "reduction", "cumulative", "window",
         "movement", "sort", "generator", "key", "random", "control", "collective", "other")
#: how the trace counts a primitive's FLOPs (see the module docstring)
FLOP_COUNTS = ("output", "none", "operand", "updates")

#: ``(in_specs, out_specs, comms, work)`` of a follower: ``comms`` as ``(kind, bytes, axes)``,
#: ``work`` the number of devices doing distinct work (None: counted from the specs)
Follow = tuple[tuple, tuple, list, "int | None"]
#: ``rule(op, k, spec, src, out_shape, sizes)``: the strategy of ``op`` when its operand ``k``
#: (of shape ``src``) has ``spec``; ``out_shape`` is its first result's shape and ``sizes`` the
#: mesh's ``{axis: size}``. None when the operator cannot follow that operand.
FollowRule = Callable[[OpNode, int, Spec, tuple, tuple, dict], "Follow | None"]


@dataclass(frozen=True)
class PrimitiveRule:
    """What the planner knows about one primitive (see the module docstring).

    Attributes:
        kind: its class, one of :data:`KINDS`.
        follow: its follower sharding rule (:data:`FollowRule`), or None.
        fusible: XLA fuses it into the kernel of the operator reading it (loop fusion).
        reads_slice: it reads only the part of its first operand it produces.
        flops: how the trace counts its FLOPs, one of :data:`FLOP_COUNTS`.
    """

    kind: str
    follow: FollowRule | None = None
    fusible: bool = False
    reads_slice: bool = False
    flops: str = "output"


# ---------------------------------------------------------------------------------------------
# follower rules: one operand's spec -> the whole strategy
# ---------------------------------------------------------------------------------------------

def _replicated_rest(shapes: Iterable) -> tuple:
    """Replicated specs for the operands after the one followed (None for literals)."""
    return tuple(None if s is None else Spec.replicated(len(s)) for s in shapes)


def _keep_dims(spec: Spec, keep: Iterable[bool]) -> tuple:
    return tuple(e if k else None for e, k in zip(spec, keep))


def _bcast_spec(out: Spec, shp: tuple[int, ...] | None, out_shape: tuple[int, ...]) -> Spec | None:
    """The spec an operand of shape ``shp`` needs for an elementwise result spec ``out``."""
    if shp is None:
        return None
    if len(shp) == 0:
        return ()
    if shp == out_shape:  # (the common case: the spec itself, no new tuple)
        return out
    if len(shp) == len(out_shape):
        return tuple(e if shp[d] == out_shape[d] else None for d, e in enumerate(out))
    return Spec.replicated(len(shp))


def _reshape_map(src_shape: tuple[int, ...], dst_shape: tuple[int, ...], spec: Spec,
                 sizes: dict[str, int]) -> tuple[tuple, tuple]:
    """Map a split through a reshape by factoring: an input dim maps to the output dim with the
    same row-major prefix product whose size the split divides (so ``H -> (heads, head_dim)``
    keeps a split of H on heads, and ``(heads, head_dim) -> H`` keeps a heads split on H).

    Returns ``(input spec actually usable, output spec)``: unmapped splits are dropped
    (replicated) on both sides."""
    out: list[Any] = [None] * len(dst_shape)
    used_in: list[Any] = [None] * len(src_shape)
    prefix_out: dict[int, list[int]] = {}
    p = 1
    for j, n in enumerate(dst_shape):
        prefix_out.setdefault(p, []).append(j)
        p *= n
    p = 1
    for i, n in enumerate(src_shape):
        e = spec[i]
        if e:
            k = math.prod(sizes[a] for a in e)
            for j in prefix_out.get(p, ()):
                if dst_shape[j] > 1 and dst_shape[j] % k == 0 and out[j] is None:
                    out[j] = e
                    used_in[i] = e
                    break
                if dst_shape[j] > 1:
                    break
        p *= n
    return tuple(used_in), tuple(out)


def _elementwise(op: OpNode, k: int, spec: Spec, src: tuple, out_shape: tuple,
                 sizes: dict) -> Follow:
    if src == out_shape:
        out = spec
    elif len(src) == len(out_shape):
        out = tuple(e if src[d] == out_shape[d] else None for d, e in enumerate(spec))
    else:
        out = Spec.replicated(len(out_shape))
    ins = tuple(_bcast_spec(out, s, out_shape) for s in op.in_shapes)
    outs = tuple(out if s == out_shape else Spec.replicated(len(s)) for s in op.out_shapes)
    return ins, outs, [], None


def _broadcast_in_dim(op: OpNode, k: int, spec: Spec, src: tuple, out_shape: tuple,
                      sizes: dict) -> Follow | None:
    bd = tuple(op.params.get("broadcast_dimensions", ()))
    if k != 0 or len(bd) != len(src):
        return None
    out_l: list[Any] = [None] * len(out_shape)
    in_l: list[Any] = [None] * len(src)
    for i, d in enumerate(bd):
        if spec[i] and src[i] == out_shape[d]:
            out_l[d] = spec[i]
            in_l[i] = spec[i]
    return (tuple(in_l),) + _replicated_rest(op.in_shapes[1:]), (tuple(out_l),), [], None


def _reshape(op: OpNode, k: int, spec: Spec, src: tuple, out_shape: tuple,
             sizes: dict) -> Follow:
    if op.params.get("dimensions") is not None:
        used_in, out = Spec.replicated(len(src)), Spec.replicated(len(out_shape))
    else:
        used_in, out = _reshape_map(src, out_shape, spec, sizes)
    return (used_in,) + _replicated_rest(op.in_shapes[1:]), (out,), [], None


def _squeeze(op: OpNode, k: int, spec: Spec, src: tuple, out_shape: tuple,
             sizes: dict) -> Follow:
    dims = {d % max(len(src), 1) for d in op.params.get("dimensions", ())}
    out = tuple(e for d, e in enumerate(spec) if d not in dims)
    return (_keep_dims(spec, [d not in dims for d in range(len(src))]),), (out,), [], None


def _expand_dims(op: OpNode, k: int, spec: Spec, src: tuple, out_shape: tuple,
                 sizes: dict) -> Follow:
    dims = sorted(op.params.get("dimensions", ()))
    it = iter(spec)
    out = tuple(None if d in dims else next(it, None) for d in range(len(out_shape)))
    return (spec,), (out,), [], None


def _transpose(op: OpNode, k: int, spec: Spec, src: tuple, out_shape: tuple,
               sizes: dict) -> Follow | None:
    perm = tuple(op.params.get("permutation", ()))
    if sorted(perm) != list(range(len(src))):
        return None
    return (spec,), (tuple(spec[p] for p in perm),), [], None


def _reduce(op: OpNode, k: int, spec: Spec, src: tuple, out_shape: tuple,
            sizes: dict) -> Follow:
    """A reduction: the reduced dimensions leave the spec; a split one all-reduces."""
    axes = {a % max(len(src), 1) for a in op.params.get("axes", ())}
    red_axes = tuple(a for d in sorted(axes) for a in (spec[d] or ()))
    out = tuple(e for d, e in enumerate(spec) if d not in axes)
    comms = []
    if red_axes:
        dtype = op.out_dtypes[0]
        out_b = float(math.prod(out_shape) * dtype_bytes(dtype or "float32")) / tile_count(out, sizes)
        comms.append(("all-reduce", out_b, red_axes))
    ins = (spec,) + tuple(None if s is None else _bcast_spec(out, s, out_shape)
                          for s in op.in_shapes[1:])
    return ins, (out,) * len(op.out_shapes), comms, tile_count(spec, sizes)


def _arg_reduce(op: OpNode, k: int, spec: Spec, src: tuple, out_shape: tuple,
                sizes: dict) -> Follow:
    """argmax/argmin: the reduced dimensions replicated (no partial results to combine)."""
    axes = {a % max(len(src), 1) for a in op.params.get("axes", ())}
    in_s = _keep_dims(spec, [d not in axes for d in range(len(src))])
    out = tuple(e for d, e in enumerate(in_s) if d not in axes)
    return (in_s,), (out,), [], None


def _cumulative(op: OpNode, k: int, spec: Spec, src: tuple, out_shape: tuple,
                sizes: dict) -> Follow:
    ax = int(op.params.get("axis", 0)) % max(len(src), 1)
    s = _keep_dims(spec, [d != ax for d in range(len(src))])
    return (s,), (s,), [], None


def _same_rank_or_replicated(s: tuple, shapes: Iterable, rank: int) -> tuple:
    return tuple(None if sh is None else (s if len(sh) == rank else Spec.replicated(len(sh)))
                 for sh in shapes)


def _sort(op: OpNode, k: int, spec: Spec, src: tuple, out_shape: tuple,
          sizes: dict) -> Follow:
    """sort/top_k: the sorted dimension replicated (top_k's results are cut along it)."""
    ax = int(op.params.get("dimension", len(src) - 1)) % max(len(src), 1)
    s = _keep_dims(spec, [d != ax for d in range(len(src))])
    ins = _same_rank_or_replicated(s, op.in_shapes, len(src))
    sort = op.primitive == "sort"
    outs = tuple(s if len(sh) == len(src) and (sort or d != ax) else
                 (_keep_dims(s, [True] * len(sh)) if len(sh) == len(src)
                  else Spec.replicated(len(sh)))
                 for d, sh in enumerate(op.out_shapes))
    return ins, outs, [], None


def _concatenate(op: OpNode, k: int, spec: Spec, src: tuple, out_shape: tuple,
                 sizes: dict) -> Follow:
    """concatenate/split: the joined or cut dimension replicated."""
    P = op.params
    ax = int(P.get("dimension", P.get("axis", 0))) % max(len(src), 1)
    s = _keep_dims(spec, [d != ax for d in range(len(src))])
    ins = _same_rank_or_replicated(s, op.in_shapes, len(src))
    outs = tuple(s if len(sh) == len(src) else Spec.replicated(len(sh)) for sh in op.out_shapes)
    return ins, outs, [], None


def _slice(op: OpNode, k: int, spec: Spec, src: tuple, out_shape: tuple,
           sizes: dict) -> Follow:
    P = op.params
    st, lim, strd = P.get("start_indices", ()), P.get("limit_indices", ()), P.get("strides")
    keep = [len(st) > d and st[d] == 0 and lim[d] == src[d] and (not strd or strd[d] == 1)
            for d in range(len(src))]
    s = _keep_dims(spec, keep)
    return (s,), (s,), [], None


def _pad(op: OpNode, k: int, spec: Spec, src: tuple, out_shape: tuple,
         sizes: dict) -> Follow | None:
    cfg = op.params.get("padding_config", ())
    keep = [d < len(cfg) and tuple(cfg[d]) == (0, 0, 0) for d in range(len(src))]
    if k != 0:
        return None
    s = _keep_dims(spec, keep)
    return (s,) + _replicated_rest(op.in_shapes[1:]), (s,), [], None


def _rev(op: OpNode, k: int, spec: Spec, src: tuple, out_shape: tuple,
         sizes: dict) -> Follow:
    dims = set(op.params.get("dimensions", ()))
    s = _keep_dims(spec, [d not in dims for d in range(len(src))])
    return (s,), (s,), [], None


def _dynamic_slice(op: OpNode, k: int, spec: Spec, src: tuple, out_shape: tuple,
                   sizes: dict) -> Follow | None:
    if k != 0:
        return None
    sz = tuple(op.params.get("slice_sizes", out_shape))
    s = _keep_dims(spec, [d < len(sz) and sz[d] == src[d] for d in range(len(src))])
    return (s,) + _replicated_rest(op.in_shapes[1:]), (s,), [], None


def _dynamic_update_slice(op: OpNode, k: int, spec: Spec, src: tuple, out_shape: tuple,
                          sizes: dict) -> Follow | None:
    ins_shapes = op.in_shapes
    if k not in (0, 1) or ins_shapes[0] is None or ins_shapes[1] is None:
        return None
    opnd, upd = ins_shapes[0], ins_shapes[1]
    if len(opnd) != len(upd):
        return None
    keep = [opnd[d] == upd[d] for d in range(len(opnd))]
    s = _keep_dims(spec, keep)
    return (s, s) + _replicated_rest(ins_shapes[2:]), (s,), [], None


def _scan_slice(op: OpNode, k: int, spec: Spec, src: tuple, out_shape: tuple,
                sizes: dict) -> Follow:
    s = _keep_dims(spec, [d != 0 for d in range(len(src))])
    return (s,), (s[1:],), [], None


def _scan_stack(op: OpNode, k: int, spec: Spec, src: tuple, out_shape: tuple,
                sizes: dict) -> Follow:
    ins = tuple(None if sh is None else (spec if sh == src else Spec.replicated(len(sh)))
                for sh in op.in_shapes)
    return ins, ((None,) + tuple(spec),), [], None


def _window(op: OpNode, k: int, spec: Spec, src: tuple, out_shape: tuple,
            sizes: dict) -> Follow | None:
    """A windowed reduction: only the dimensions its windows leave whole (size 1, stride 1, no
    padding or dilation) keep their split."""
    P = op.params
    wd = tuple(P.get("window_dimensions", ()))
    ws = tuple(P.get("window_strides", ()))
    pad = tuple(tuple(p) for p in P.get("padding", ()))
    bd = tuple(P.get("base_dilation", ()) or ())
    wdil = tuple(P.get("window_dilation", ()) or ())
    n = len(src)
    if len(wd) != n:
        return None
    keep = [wd[d] == 1 and (d >= len(ws) or ws[d] == 1)
            and (d >= len(pad) or tuple(pad[d]) == (0, 0))
            and (d >= len(bd) or bd[d] == 1) and (d >= len(wdil) or wdil[d] == 1)
            for d in range(n)]
    s = _keep_dims(spec, keep)
    ins = _same_rank_or_replicated(s, op.in_shapes, n)
    outs = tuple(s if len(sh) == n else Spec.replicated(len(sh)) for sh in op.out_shapes)
    return ins, outs, [], None


# ---------------------------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------------------------

def _rows(kind: str, names: str, **fields: Any) -> dict[str, PrimitiveRule]:
    rule = PrimitiveRule(kind, **fields)
    return dict.fromkeys(names.split(), rule)


_ELEMENTWISE_NAMES = """
    neg sign floor ceil round is_finite exp exp2 log log1p expm1 tanh logistic sin cos tan asin
    acos atan sinh cosh asinh acosh atanh sqrt rsqrt cbrt abs not imag real conj complex lgamma
    digamma erf erfc erf_inv square reciprocal integer_pow pow add add_any sub mul div rem max min
    atan2 nextafter and or xor eq ne lt le gt ge shift_left shift_right_logical
    shift_right_arithmetic population_count clz select_n clamp igamma igammac random_gamma_grad
    bessel_i0e bessel_i1e polygamma zeta threefry2x32 tan_p logaddexp
    one_minus_square
"""  # one_minus_square: JAX 0.11's 1 - x**2 (the derivative of tanh)
#: elementwise primitives that only convert, copy or place their operand (no arithmetic)
_RETYPE_NAMES = """
    convert_element_type copy copy_p stop_gradient reduce_precision sharding_constraint device_put
    mesh_cast reshard bitcast_convert_type
"""
_NONE = {"flops": "none"}
_FUSED_MOVE = {"fusible": True, "flops": "none"}

RULES: dict[str, PrimitiveRule] = {
    **_rows("heavy", "dot_general conv_general_dilated ragged_dot"),
    **_rows("gather", "gather", reads_slice=True, flops="none"),
    # JAX spells the scatters with a hyphen; the underscore spellings are accepted too
    **_rows("scatter", "scatter scatter-add scatter_add", flops="updates"),
    **_rows("scatter", "scatter-mul scatter_mul scatter-min scatter_min scatter-max scatter_max"),
    **_rows("elementwise", _ELEMENTWISE_NAMES, follow=_elementwise, fusible=True),
    **_rows("elementwise", _RETYPE_NAMES, follow=_elementwise, fusible=True, flops="none"),
    **_rows("reduction", "reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or "
                         "reduce_precision_sum", follow=_reduce, flops="operand"),
    # reduce_xor is counted one FLOP per result element, as the trace always has
    **_rows("reduction", "reduce_xor", follow=_reduce),
    **_rows("reduction", "argmax argmin", follow=_arg_reduce, flops="operand"),
    **_rows("cumulative", "cumsum cumprod cummax cummin cumlogsumexp", follow=_cumulative,
            flops="operand"),
    **_rows("window", "reduce_window_sum reduce_window_max reduce_window_min select_and_scatter_add",
            follow=_window),
    **_rows("window", "select_and_gather_add", follow=_window, flops="none"),
    **_rows("window", "reduce_window"),  # the generic form: no follower rule
    "broadcast_in_dim": PrimitiveRule("movement", _broadcast_in_dim, **_FUSED_MOVE),
    "reshape": PrimitiveRule("movement", _reshape, **_FUSED_MOVE),
    "squeeze": PrimitiveRule("movement", _squeeze, **_FUSED_MOVE),
    "expand_dims": PrimitiveRule("movement", _expand_dims, **_FUSED_MOVE),
    "transpose": PrimitiveRule("movement", _transpose, **_FUSED_MOVE),
    "slice": PrimitiveRule("movement", _slice, reads_slice=True, **_FUSED_MOVE),
    "pad": PrimitiveRule("movement", _pad, **_FUSED_MOVE),
    "concatenate": PrimitiveRule("movement", _concatenate, **_FUSED_MOVE),
    "split": PrimitiveRule("movement", _concatenate, **_NONE),
    "rev": PrimitiveRule("movement", _rev, **_FUSED_MOVE),
    "dynamic_slice": PrimitiveRule("movement", _dynamic_slice, reads_slice=True, **_FUSED_MOVE),
    "dynamic_update_slice": PrimitiveRule("movement", _dynamic_update_slice, **_NONE),
    "scan_slice": PrimitiveRule("movement", _scan_slice, reads_slice=True, **_NONE),
    "scan_stack": PrimitiveRule("movement", _scan_stack, **_NONE),
    **_rows("movement", "squeeze_p optimization_barrier", flops="none"),
    **_rows("sort", "sort top_k", follow=_sort),
    **_rows("sort", "argsort"),
    "iota": PrimitiveRule("generator", **_FUSED_MOVE),
    **_rows("generator", "full zeros_like"),
    **_rows("key", "random_seed random_wrap random_unwrap random_split random_fold_in random_clone",
            flops="none"),
    **_rows("random", "random_bits"),
    **_rows("control", "while cond scan custom_call"),
    **_rows("collective", "all_reduce psum all_gather all_to_all"),
}

#: the rule of a primitive the table does not list
DEFAULT = PrimitiveRule("other")


def rule_of(primitive: str) -> PrimitiveRule:
    """The rule of ``primitive``: its row of :data:`RULES`, else :data:`DEFAULT`."""
    return RULES.get(primitive, DEFAULT)


def of_kind(*kinds: str) -> frozenset[str]:
    """The primitives of the given kinds."""
    return frozenset(p for p, r in RULES.items() if r.kind in kinds)


def _where(test: Callable[[PrimitiveRule], bool]) -> frozenset[str]:
    return frozenset(p for p, r in RULES.items() if test(r))


# ---------------------------------------------------------------------------------------------
# the views the package reads
# ---------------------------------------------------------------------------------------------

ELEMENTWISE = of_kind("elementwise")
SCATTERS = of_kind("scatter")
#: the scatters that add their updates (partial sums over the updates can be all-reduced)
ADDITIVE_SCATTERS = frozenset({"scatter-add", "scatter_add"})
#: primitives whose strategy follows one operand's spec
FOLLOWERS = _where(lambda r: r.follow is not None)
#: primitives XLA fuses into the kernel of the operator reading them (loop fusion)
LOOP_FUSIBLE = _where(lambda r: r.fusible)
#: primitives that read only the part of their first operand they produce
READS_SLICE = _where(lambda r: r.reads_slice)
#: primitives that make, convert, split or fold PRNG keys
KEY_OPS = of_kind("key")
#: primitives that draw random bits from a key
RANDOM_BITS = of_kind("random")
#: primitives that can make a tensor from no tensor operand (a broadcast of a literal among them)
GENERATORS = of_kind("generator") | {"broadcast_in_dim"}
#: primitives the trace counts as no arithmetic, and as one FLOP per element read
ZERO_FLOPS = _where(lambda r: r.flops == "none")
OPERAND_FLOPS = _where(lambda r: r.flops == "operand")

#: the intra-operator search's heavy primitives: those with a strategy enumerator of their own
#: (loop dimensions to mesh axes). ``ragged_dot`` has none: it is planned replicated, as a
#: primitive without a rule.
STRATEGY_HEAVY = of_kind("heavy", "gather", "scatter") - {"ragged_dot"}
#: the operators a plan records (and the executor pins): those with strategies of their own,
#: ``random_bits`` among them (each device draws the tile of the random numbers the plan gives
#: it, from the replicated key)
PLAN_RECORDED = STRATEGY_HEAVY | RANDOM_BITS
#: the reductions whose readers wait for their collectives (with the heavy primitives they stop a
#: gradient passing unchanged, in the analyses of combinable collectives and gradient operators).
#: The logical reductions and ``reduce_precision_sum`` are not among them, as they never were.
STOP_REDUCTIONS = of_kind("reduction") - {"reduce_and", "reduce_or", "reduce_xor",
                                          "reduce_precision_sum"}
#: the matmuls and convolutions that cut pipeline layers (and that the folding analysis lists as a
#: segment's planned operators). ``ragged_dot`` does not cut a layer, as it never did: the layers,
#: and the plans built on them, stay as they were.
LAYER_HEAVY = of_kind("heavy") - {"ragged_dot"}
#: TAPAS GraphNodes: the heavy primitives, each starting a GraphNode of its own
GRAPHNODE_HEAVY = of_kind("heavy")
#: TAPAS GraphNodes: the primitives that always start a GraphNode (heavy, gathers and scatters,
#: sorts, windowed reductions, control flow, collectives). The underscore spellings
#: ``scatter_min``/``scatter_max`` (never JAX's), ``reduce_window_min`` and
#: ``select_and_gather_add`` are left out, as the grouping always left them out: the GraphNodes,
#: the mined classes and the plans built on them stay as they were.
GRAPHNODE_ANCHORS = (of_kind("heavy", "gather", "scatter", "sort", "window", "control",
                             "collective")
                     - {"scatter_min", "scatter_max", "reduce_window_min", "select_and_gather_add"})
#: TAPAS GraphNodes: the reductions (and cumulative scans) that start a normalisation GraphNode.
#: ``reduce_xor`` is left out, as the grouping always left it out.
GRAPHNODE_REDUCTIONS = of_kind("reduction", "cumulative") - {"reduce_xor"}


# ---------------------------------------------------------------------------------------------
# the views of the trace and of the batch-flow analysis (names the table has no row for:
# containers and control flow the trace walks, and draws outside ``random_bits``)
# ---------------------------------------------------------------------------------------------

#: primitives that draw random numbers (typed keys and raw ``uint32`` keys alike reach one of
#: them): the one list the graph, the search's notes and the equivalence check read
RANDOM_DRAWS = RANDOM_BITS | {"threefry2x32", "rng_bit_generator", "rng_uniform", "random_gamma_p"}
#: container primitives whose body the trace walks inline (:mod:`autoplan.tracing._jaxpr`)
INLINE_CALLS = frozenset({"pjit", "jit", "closed_call", "core_call", "remat", "remat2",
                          "checkpoint", "custom_jvp_call", "custom_vjp_call",
                          "custom_vjp_call_jaxpr", "named_call", "custom_lin"})
#: control flow kept as one operator whose FLOPs the trace counts from its bodies (``scan`` is
#: unrolled unless it is over-long, then counted so too)
OPAQUE_CONTROL = frozenset({"while", "cond", "shard_map", "xla_pmap", "custom_transpose_call"})
#: the batch-flow analysis (:mod:`autoplan.tracing._batchflow`): reductions that may reduce over
#: the batch, the cumulative operators along an axis (``{primitive: the parameter naming it}``),
#: the slices, the control flow it sees as opaque, and the functions that are not linear
BATCH_REDUCTIONS = of_kind("reduction") - {"reduce_precision_sum"}
SCANS_ALONG = {**dict.fromkeys(sorted(of_kind("cumulative")), "axis"), "sort": "dimension"}
SLICES = frozenset({"slice", "dynamic_slice"})
BATCH_OPAQUE = frozenset({"while", "cond", "scan", "scan_slice", "scan_stack"})
NONLINEAR = frozenset({"log", "exp", "exp2", "sqrt", "rsqrt", "cbrt", "pow", "integer_pow",
                       "tanh", "logistic", "log1p", "expm1", "sin", "cos", "erf", "square"})
