"""Per-operator sharding strategies (Alpa's "parallel algorithms of an operator").

:func:`strategies` lists, for one operator of an :class:`~autoplan.OpGraph` on a logical mesh, the
ways it can run sharded: each :class:`Strategy` fixes the spec of every operand and result, the
collectives the operator itself needs, its compute time and its output memory per device.

Heavy operators enumerate every mapping of their loop dimensions to mesh axes (each mesh axis of
size > 1 used at most once, several axes on one loop dimension in mesh order):

* ``dot_general``: batch dims, the lhs free dims (i), the rhs free dims (j) and the contracting
  dims (k), as in Alpa's table: ``SS = SR x RS`` needs nothing, ``SR = SS x SR`` and
  ``RS = RS x SS`` leave partial sums that are resolved by an **all-reduce** (replicated result)
  or a **reduce-scatter** (result split on one more output dimension);
* ``conv_general_dilated``: batch, output channel, input channel (partial sums, all-reduce) and
  their 2-D combinations; spatial dimensions are never split (that would need halo exchange);
* ``gather`` (embedding lookup ``jnp.take``): index/batch split, feature split, or
  vocabulary-parallel (table split on the indexed dimension, masked lookup, all-reduce);
* ``scatter``/``scatter-add`` (its gradient): update split (partial sums, all-reduce), feature
  split, or table split on the scattered dimension;
* ``reduce_sum`` over a split dimension: all-reduce (the follower rule) or the partial sums kept
  scattered on a result dimension (reduce-scatter; listed by :func:`strategies`, used when the
  reduction is not merged into its operand).

Every other supported operator is a *follower*: given the spec of one operand, :func:`derive`
infers the only sensible strategy (elementwise ops share the operand's spec, with size-1
broadcast dimensions replicated; transpose permutes it; reshape maps splits through the factoring
of dimensions; a reduction over a split dimension all-reduces; slice/pad/concatenate/cumsum/sort
replicate the dimension they cut or scan...). The ILP merges followers into the operand they
follow (see :mod:`autoplan.search.intra._ilp`).

Costs: ``compute_time`` is a roofline plus a per-kernel overhead, per device,

    t = max(F / R(F, dtype), Q / BW) + o . [the operator is a kernel]

where ``F`` is the operator's FLOPs divided by the number of devices doing distinct work
(replicated work costs the full FLOPs), ``R`` the cluster's achievable FLOP/s for a matmul or
convolution of ``F`` FLOPs (the measured curve of a profile, else peak x efficiency), ``Q`` the
bytes it reads from and writes to memory per device (each tensor's bytes over its spec's tiles),
``BW`` the memory bandwidth and ``o`` the cluster's per-kernel overhead.

XLA fuses: elementwise and data-movement operators (:data:`LOOP_FUSIBLE`) run inside the kernel
of the operator that reads them, so an overhead per traced operator would be about three times too
many. An operator is a **kernel** when it is not loop-fusible, or when its result is read by an
operator that is not (a matmul, a reduction, a gather...) or is a result of the step: measured on
the zoo's train steps (tiny and medium), this count is 0.96-1.22x the kernels XLA compiles, where
one per traced operator is 3.3x (:func:`fusion_context`). Only a kernel writes its results to
memory, and an operator reads from memory only the operands a kernel (or the step's inputs)
produced; operators that read a slice (slices, gathers) read only what they produce.

Communication uses the mesh's collective times (the profile's tables, or the alpha-beta model),
with ``backward=True`` for the collectives of backward-role operators (gradient communication,
discounted by the cluster's gamma). A collective whose result only feeds the optimizer update or
the step's results (a gradient's all-reduce, the loss's) is one XLA combines with the others of
its kind (:func:`combinable_ops`): of the ``k`` operators of the step that may issue such a
collective (the combinable matmuls, convolutions, gathers, scatters and reductions), each is
charged its transfer time and ``1/k`` of the latency, so that a plan in which they all
communicate pays about one latency, as the combined collective does; the plan then adds what is
missing for one latency per combined group (:func:`combined_latency`).

PRNG keys are replicated, never sharded: the key primitives (:data:`KEY_OPS`: ``random_seed``,
``random_wrap``, ``random_unwrap``, ``random_split``, ``random_fold_in``) run replicated on
their few bytes, and graph inputs that hold keys take only the replicated spec
(:attr:`autoplan.OpGraph.key_tensors`). ``random_bits``, which draws the random numbers, reads
its key replicated and may produce its bits in any spec: a threefry key's bits depend on the key
and each element's index only (``jax_threefry_partitionable``, JAX's default), so every device
draws its own tile of the very bits a single device draws, and a dropout mask is sharded like the
activation it masks. Bits drawn from RBG keys (``key<rbg>``), which make no such promise, stay
replicated.

Any primitive without a rule gets the replicated strategy only; the caller collects their names
(``unknown``) to warn once per search.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import compress
from typing import Any

import numpy as np

from autoplan._dtype import dtype_bytes, is_partitionable_key
from autoplan._memo import BoundedCache, per_owner
from autoplan._options import require_instance
from autoplan.costs._mesh import COMBINE_THRESHOLD, LogicalMesh
from autoplan.plans._plan import Comm
from autoplan.plans._spec import Spec, tile_count
from autoplan.search.intra._reshard import collective_time, mesh_id
from autoplan.search.intra._spec_space import enumerate_specs, replicated
from autoplan.tracing import _primitives
from autoplan.tracing._graph import OpGraph, OpNode
from autoplan.tracing._operands import operand_arrays

__all__ = [
    "Strategy",
    "strategies",
    "derive",
    "fusion_context",
    "combinable_ops",
    "combined_latency",
    "compute_time",
    "gradient_feeds",
    "LOOP_FUSIBLE",
    "is_follower",
    "is_heavy",
    "is_generator",
    "leader_operand",
    "ELEMENTWISE",
    "FOLLOWERS",
    "HEAVY",
    "KEY_OPS",
    "RANDOM_BITS",
]


@dataclass(frozen=True)
class Strategy:
    """One way to run an operator sharded.

    Attributes:
        out_specs: the spec of each result.
        in_specs: the spec each operand must have (None for literals).
        comm: collectives the operator itself needs.
        compute_time: seconds of computation per device.
        memory: bytes per device of its results.
        label: the name to show instead of the description of :attr:`name` (None: that
            description).
    """

    out_specs: tuple[Spec, ...]
    in_specs: tuple[Spec | None, ...]
    comm: tuple[Comm, ...] = ()
    compute_time: float = 0.0
    memory: float = 0.0
    label: str | None = None

    @cached_property
    def name(self) -> str:
        """Alpa-style description, e.g. ``S(x)R x RS(y) -> S(x)S(y)`` or
        ``RS(y) x S(y)R -> RR (all-reduce y)``: the specs of the operands (scalars and literals
        left out), of the results, and the operator's collectives; the :attr:`label` when there
        is one. Written when first read: a search lists many strategies and shows few."""
        if self.label is not None:
            return self.label
        ins = [str(s) for s in self.in_specs if s is not None and len(s) > 0]
        name = " x ".join(ins) + " -> " + ", ".join(str(s) for s in self.out_specs)
        if self.comm:
            name += " (" + ", ".join(f"{c.kind} {','.join(c.axes)}" for c in self.comm) + ")"
        return name

    @property
    def comm_time(self) -> float:
        """Seconds of the operator's own collectives."""
        return sum(c.time for c in self.comm)

    @property
    def cost(self) -> float:
        """``comm_time + compute_time``."""
        return self.comm_time + self.compute_time


# ---------------------------------------------------------------------------------------------
# primitive classes
# ---------------------------------------------------------------------------------------------

# The classes are views of the primitive registry (:mod:`autoplan.tracing._primitives`), which says
# what each primitive is and holds the follower rules :func:`_follow` dispatches to.
ELEMENTWISE = _primitives.ELEMENTWISE
#: primitives whose strategy is inferred from one operand's spec (merged into it by the ILP)
FOLLOWERS = _primitives.FOLLOWERS
_SCATTER = _primitives.SCATTERS
#: primitives with their own strategy variable
HEAVY = _primitives.STRATEGY_HEAVY
_GENERATORS = _primitives.GENERATORS
#: primitives that make, convert, split or fold PRNG keys: replicated (keys are never sharded)
KEY_OPS = _primitives.KEY_OPS
#: primitives that draw random bits from a key: the key replicated, the bits any spec
RANDOM_BITS = _primitives.RANDOM_BITS
#: primitives XLA fuses into the kernel of the operator reading them (loop fusion)
LOOP_FUSIBLE = _primitives.LOOP_FUSIBLE
#: primitives that read only the part of their first operand they produce
_READS_SLICE = _primitives.READS_SLICE
_REDUCTIONS = _primitives.STOP_REDUCTIONS

#: an operator's place in XLA's fusion: (it is a kernel, which operands it reads from memory,
#: the share of a collective's latency its collectives pay: 1, or 1/k for the k operators whose
#: collectives XLA combines); ``()`` for the operands means all of them
Context = tuple[bool, tuple[bool, ...], float]
UNFUSED: Context = (True, (), 1.0)


def is_heavy(op: OpNode) -> bool:
    """dot/conv/gather/scatter: operators that enumerate their own strategies."""
    return op.primitive in HEAVY


def is_follower(op: OpNode) -> bool:
    """Operators whose strategy follows one operand's spec (elementwise, movement, reductions)."""
    return op.primitive in FOLLOWERS


def is_generator(op: OpNode) -> bool:
    """Operators that create a tensor from no tensor operand (``iota``, ``broadcast_in_dim`` of a
    literal): they can produce any spec locally at no cost."""
    return (op.primitive in _GENERATORS or op.primitive in FOLLOWERS) and all(
        s is None or len(s) == 0 for s in op.in_shapes)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

@per_owner
def fusion_context(graph: OpGraph) -> Sequence[Context]:
    """Per operator: whether it is a kernel under XLA's fusion, which of its operands it reads
    from memory, and the share of a collective's latency its collectives pay (see the module
    docstring); once per graph.

    An operator is a kernel when it is not loop-fusible, or its result is a result of the graph
    or is read by an operator that is not loop-fusible. An operand is read from memory when a
    kernel or the graph's inputs made it.
    """
    # over the flat operand arrays: a loop-fusible operator is a kernel when a result of it is a
    # result of the graph or an operand of an operator that is not loop-fusible
    ops = graph.ops
    arr = operand_arrays(graph)
    fusible = np.fromiter((op.primitive in LOOP_FUSIBLE for op in ops), bool, len(ops))
    kernel = ~fusible
    made = arr.tensor >= 0
    producer = arr.made_by
    by_op = producer >= 0
    kernel[producer[by_op & ~fusible[arr.reader]]] = True
    outs = np.asarray([graph.tensors[o.tensor].producer for o in graph.outputs], np.int64)
    kernel[outs[outs >= 0]] = True
    # an operand is read from memory when a kernel or the graph's inputs made it
    mat = (made & ~by_op) | (by_op & kernel[np.maximum(producer, 0)])
    combine = combinable_ops(graph)
    # the operators whose collectives XLA would combine (heavy ones and reductions among the
    # combinable): their latency is shared
    k = sum(compress(_passing_flags(graph)[1], combine))
    shared = 1.0 / max(1, k)
    return _Contexts(kernel.tolist(), mat.tolist(), arr.start.tolist(), combine, shared)


class _Contexts(Sequence):
    """The operators' fusion contexts (:func:`fusion_context`), each made when first read (a
    search reads those of the operators it solves and of the few with collectives)."""

    def __init__(self, kernel: list[bool], from_memory: list[bool], bounds: list[int],
                 combine: list[bool], shared: float):
        self._kernel, self._from_memory, self._bounds = kernel, from_memory, bounds
        self._combine, self._shared = combine, shared
        self._made: list[Context | None] = [None] * len(kernel)

    def __len__(self) -> int:
        return len(self._made)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        c = self._made[i]
        if c is None:
            i = range(len(self))[i]
            a, b = self._bounds[i], self._bounds[i + 1]
            c = self._made[i] = (self._kernel[i], tuple(self._from_memory[a:b]),
                                 self._shared if self._combine[i] else 1.0)
        return c


@per_owner
def _passing_flags(graph: OpGraph) -> tuple[list[bool], list[bool]]:
    """Per operator: whether it is an optimizer update, and whether it is heavy or a reduction
    (its readers wait for its collectives; a gradient does not pass through it unchanged);
    once per graph, for the backward sweeps of :func:`combinable_ops` and
    :func:`gradient_feeds`, which then read flags instead of operators."""
    stops = HEAVY | _REDUCTIONS
    return [op.role == "update" for op in graph.ops], [op.primitive in stops for op in graph.ops]


@per_owner
def _results(graph: OpGraph) -> tuple[list[int], list[int]]:
    """Every operator's results as one flat list and each operator's offset in it; once per
    graph (both backward sweeps read them)."""
    arr = operand_arrays(graph)
    return arr.output.tolist(), arr.out_start.tolist()


@per_owner
def combinable_ops(graph: OpGraph) -> list[bool]:
    """Per operator: its results only feed the optimizer update or the step's results, through
    operators that are neither heavy nor reductions (a weight gradient, a bias gradient, the
    loss). Nothing else waits for such an operator's collectives, so XLA combines them with the
    others of their kind; once per graph."""
    consumers = graph.consumers
    outputs = {o.tensor for o in graph.outputs}
    update, stop = _passing_flags(graph)
    output, start = _results(graph)
    terminal = [False] * len(graph.ops)
    for i in range(len(graph.ops) - 1, -1, -1):
        # some result is used (a result of the step, or read), and no reader but the
        # update waits for it
        used = False
        ok = True
        for t in output[start[i]:start[i + 1]]:
            readers = consumers[t]
            if readers or t in outputs:
                used = True
            for c in readers:
                if update[c]:
                    continue
                if stop[c] or not terminal[c]:
                    ok = False
                    break
            if not ok:
                break
        terminal[i] = ok and used
    return terminal


@per_owner
def gradient_feeds(graph: OpGraph) -> list[bool]:
    """feeds[op]: the op's result reaches the optimizer update through movement/elementwise ops
    only (it makes a gradient); once per graph."""
    consumers = graph.consumers
    update, stop = _passing_flags(graph)
    output, start = _results(graph)
    feeds = [False] * len(graph.ops)
    # marks[c]: a result read by operator c feeds the update (c is an update, or c makes a
    # gradient and passes it on: not heavy, not a reduction); operators are visited
    # consumers first, so an operator's consumers are marked before it is
    marks = list(update)
    for i in range(len(graph.ops) - 1, -1, -1):
        for t in output[start[i]:start[i + 1]]:
            for c in consumers[t]:
                if marks[c]:
                    break
            else:
                continue
            feeds[i] = True
            if not stop[i]:
                marks[i] = True
            break
    return feeds


def combined_latency(graph: OpGraph, mesh: LogicalMesh,
                     comms: Sequence[tuple[int | None, Comm]]) -> dict[str, float]:
    """The latency the collectives XLA combines still have to pay, by kind: for every kind and
    mesh axes, the collectives of :func:`combinable_ops` operators run as
    ``ceil(bytes / COMBINE_THRESHOLD)`` combined collectives, each paying the latency once; their
    strategies already charged their shares of it (see the module docstring), and the rest is
    returned (never below zero).

    Args:
        graph: the graph; ``mesh`` the mesh; ``comms`` ``(operator id, Comm)`` of a plan.
    """
    ctx = fusion_context(graph)
    groups: dict[tuple[str, tuple[str, ...]], list[float]] = {}
    for i, c in comms:
        if i is None or c.where == "reshard" or ctx[i][2] >= 1.0:
            continue
        g = groups.setdefault((c.kind, c.axes), [0.0, 0.0])
        g[0] += c.bytes
        g[1] += ctx[i][2]
    out: dict[str, float] = {}
    for (kind, axes), (nbytes, charged) in groups.items():
        n = max(1, math.ceil(nbytes / COMBINE_THRESHOLD))
        missing = max(0.0, n - charged) * mesh.latency(kind, _axis_idx(mesh, axes))
        if missing > 0:
            out[kind] = out.get(kind, 0.0) + missing
    return out


def _context(op: OpNode, graph: OpGraph | None) -> Context:
    if graph is None or op.id >= len(graph.ops) or graph.ops[op.id] is not op:
        return UNFUSED
    return fusion_context(graph)[op.id]


def _op_key(op: OpNode) -> tuple:
    return (op.primitive, repr(op.params), op.in_shapes, op.out_shapes, op.in_dtypes,
            op.out_dtypes, op.role, op.flops)


@lru_cache(maxsize=65536)
def _nbytes(shape: tuple[int, ...], dtype: str | None) -> float:
    """Bytes of a tensor (once per shape and dtype: costing every strategy asks again and
    again)."""
    return float(math.prod(shape) * dtype_bytes(dtype or "float32"))


def _axis_idx(mesh: LogicalMesh, axes: Sequence[str]) -> list[int]:
    return [mesh.axis_names.index(a) for a in axes]


def _finish(op: OpNode, mesh: LogicalMesh, in_specs: Sequence[Spec | None],
            out_specs: Sequence[Spec], comms: Sequence[tuple[str, float, tuple[str, ...]]],
            work: int | None = None, ctx: Context = UNFUSED) -> Strategy:
    """Build a Strategy: time the collectives, compute time and output memory."""
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    backward = op.role == "backward"
    mid = mesh_id(mesh)
    cs = []
    for kind, nbytes, axes in comms:
        axes = tuple(a for a in axes if sizes[a] > 1)
        if not axes or nbytes <= 0:
            continue
        idx = tuple(_axis_idx(mesh, axes))
        t = collective_time(mesh, kind, nbytes, idx, backward, mid=mid)
        if ctx[2] < 1.0:  # combined with others: the transfer and a share of the latency
            transfer = collective_time(mesh, kind, nbytes, idx, backward, latency=False, mid=mid)
            t = transfer + ctx[2] * (t - transfer)
        cs.append(Comm(kind, float(nbytes), axes, t, "op"))
    if work is None:
        work = max([tile_count(s, sizes) for s in in_specs] + [tile_count(s, sizes) for s in out_specs] + [1])
    compute = _compute_time(op, mesh, in_specs, out_specs, work, ctx, sizes, mid)
    mem = 0.0
    for shp, dt, s in zip(op.out_shapes, op.out_dtypes, out_specs):
        mem += _nbytes(shp, dt) / tile_count(s, sizes)
    out_specs = tuple(map(Spec.of, out_specs))
    in_specs = tuple(None if s is None else Spec.of(s) for s in in_specs)
    return Strategy(out_specs, in_specs, tuple(cs), compute, mem)


def compute_time(op: OpNode, mesh: LogicalMesh, in_specs: Sequence[Spec | None],
                 out_specs: Sequence[Spec], work: int, ctx: Context = UNFUSED,
                 sizes: dict[str, int] | None = None) -> float:
    """Seconds per device of ``op`` under these specs: ``max(F / R(F), Q / BW) + o`` (see the
    module docstring), ``work`` the number of devices doing distinct work."""
    if sizes is None:
        sizes = dict(zip(mesh.axis_names, mesh.shape))
    return _compute_time(op, mesh, in_specs, out_specs, work, ctx, sizes, mesh_id(mesh))


#: the cluster's FLOP and memory times, by mesh (:func:`mesh_id`: its cluster among the rest)
#: and arguments
_DEVICE_TIMES: BoundedCache[tuple, float] = BoundedCache(1_000_000)


def _flop_time(mesh: LogicalMesh, mid: int, op_class: str, flops: float,
               dtype: str | None) -> float:
    """``mesh.cluster.flop_time(op_class, flops, dtype)``, once per mesh and arguments (the
    strategies of an operator ask for the same FLOPs again and again)."""
    key = (mid, op_class, flops, dtype)
    t = _DEVICE_TIMES.get(key)
    if t is None:
        t = _DEVICE_TIMES.put(key, mesh.cluster.flop_time(op_class, flops, dtype))
    return t


def _memory_time(mesh: LogicalMesh, mid: int, nbytes: float) -> float:
    """``mesh.cluster.memory_time(nbytes)``, once per mesh and bytes."""
    key = (mid, nbytes)
    t = _DEVICE_TIMES.get(key)
    if t is None:
        t = _DEVICE_TIMES.put(key, mesh.cluster.memory_time(nbytes))
    return t


def _compute_time(op: OpNode, mesh: LogicalMesh, in_specs: Sequence[Spec | None],
                  out_specs: Sequence[Spec], work: int, ctx: Context, sizes: dict[str, int],
                  mid: int) -> float:
    """:func:`compute_time` given the mesh's axis sizes and :func:`mesh_id`."""
    cluster = mesh.cluster
    kernel, mat, _ = ctx
    flops = op.flops / work if op.flops else 0.0
    prim = op.primitive
    if prim == "dot_general":
        t = _flop_time(mesh, mid, "matmul", flops, op.in_dtypes[0])
    elif prim == "conv_general_dilated":
        t = _flop_time(mesh, mid, "conv", flops, op.in_dtypes[0])
    else:
        t = _flop_time(mesh, mid, "elementwise", flops,
                       op.out_dtypes[0] if op.out_dtypes else None)
    if cluster.memory_bandwidth > 0:
        q = 0.0
        for k, (shp, dt, s) in enumerate(zip(op.in_shapes, op.in_dtypes, in_specs)):
            if shp is None or (mat and not mat[k]) or (k == 0 and prim in _READS_SLICE):
                continue
            q += _nbytes(shp, dt) / tile_count(s, sizes)
        if kernel or prim in _READS_SLICE:
            for shp, dt, s in zip(op.out_shapes, op.out_dtypes, out_specs):
                b = _nbytes(shp, dt) / tile_count(s, sizes)
                q += 2 * b if prim in _READS_SLICE else b  # a slice reads what it writes
        t = max(t, _memory_time(mesh, mid, q))
    return t + cluster.op_overhead if kernel else t


def _replicated_strategy(op: OpNode, mesh: LogicalMesh, ctx: Context = UNFUSED) -> Strategy:
    ins = tuple(None if s is None else replicated(len(s)) for s in op.in_shapes)
    outs = tuple(replicated(len(s)) for s in op.out_shapes)
    return _finish(op, mesh, ins, outs, (), work=1, ctx=ctx)


def leader_operand(op: OpNode, candidates: Sequence[int] | None = None,
                   graph: OpGraph | None = None) -> int | None:
    """The operand a follower follows: the largest tensor operand (Alpa follows the most-tiled
    operand; before solving, the largest is the one that can be tiled most). Ties prefer an
    operand of the result's rank, then one not made by ``broadcast_in_dim``, then the first.

    Args:
        op: the operator.
        candidates: operand positions allowed (default: every tensor operand).
        graph: used to look at operands' producers for the tie-break.

    Returns:
        The operand position, or None when there is no candidate.
    """
    pos = [k for k, s in enumerate(op.in_shapes) if s is not None] if candidates is None else list(candidates)
    if not pos:
        return None
    out_rank = len(op.out_shapes[0]) if op.out_shapes else 0

    def score(k: int) -> tuple:
        shp = op.in_shapes[k] or ()
        bcast = 0
        if graph is not None and op.inputs[k] is not None:
            p = graph.tensors[op.inputs[k]].producer
            bcast = int(p >= 0 and graph.ops[p].primitive == "broadcast_in_dim")
        return (math.prod(shp), len(shp) == out_rank, -bcast, -k)

    return max(pos, key=score)


# ---------------------------------------------------------------------------------------------
# follower rules: one operand's spec -> the whole strategy
# ---------------------------------------------------------------------------------------------

def _follow(op: OpNode, k: int, spec: Spec, sizes: dict[str, int]
            ) -> tuple[tuple, tuple, list, int | None] | None:
    """``(in_specs, out_specs, comms, work)`` when operand ``k`` has ``spec``; None if no rule
    (the primitive's follower rule in the registry, :data:`autoplan.tracing._primitives.RULES`)."""
    outs_shapes = op.out_shapes
    if not outs_shapes:
        return None
    src = op.in_shapes[k]
    if src is None:
        return None
    rule = _primitives.rule_of(op.primitive).follow
    return None if rule is None else rule(op, k, spec, src, outs_shapes[0], sizes)


# ---------------------------------------------------------------------------------------------
# heavy operators: enumerate loop-dimension -> mesh-axis mappings
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Slot:
    """A loop dimension: its size, the operand dims it indexes, its result dim (None: summed)."""

    size: int
    operand_dims: tuple[tuple[int, int], ...]  # (operand position, dim)
    out_dim: int | None


def _enumerate_slots(op: OpNode, mesh: LogicalMesh, slots: Sequence[_Slot], allow_rs: bool,
                     out_index: int = 0, partial_ok: bool = True,
                     ctx: Context = UNFUSED) -> list[Strategy]:
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    axes = [(a, n) for a, n in zip(mesh.axis_names, mesh.shape) if n > 1]
    out_shape = op.out_shapes[out_index]
    out_dtype = op.out_dtypes[out_index]
    result: list[Strategy] = []
    seen: set = set()
    for assign in itertools.product(range(-1, len(slots)), repeat=len(axes)):
        per_slot: dict[int, tuple[str, ...]] = {}
        for (a, _n), s in zip(axes, assign):
            if s >= 0:
                per_slot[s] = per_slot.get(s, ()) + (a,)
        ok = True
        for s, ax in per_slot.items():
            k = math.prod(sizes[a] for a in ax)
            sl = slots[s]
            if sl.size % k:
                ok = False
                break
            for pos, d in sl.operand_dims:
                if op.in_shapes[pos] is None or op.in_shapes[pos][d] % k:
                    ok = False
                    break
            if not ok:
                break
        if not ok:
            continue
        ins: list[Any] = [None if s is None else [None] * len(s) for s in op.in_shapes]
        out: list[Any] = [None] * len(out_shape)
        partial: list[str] = []
        slot_of: dict[str, int] = {}  # partial axis -> the summed loop dimension it splits
        for s, ax in per_slot.items():
            sl = slots[s]
            for pos, d in sl.operand_dims:
                ins[pos][d] = ax
            if sl.out_dim is None:
                partial.extend(ax)
                slot_of.update(dict.fromkeys(ax, s))
            else:
                out[sl.out_dim] = ax
        if partial and not partial_ok:
            continue
        partial.sort(key=mesh.axis_names.index)
        in_specs = tuple(None if s is None else tuple(s) for s in ins)
        base_out = tuple(out)
        work = tile_count(base_out, sizes) * math.prod(sizes[a] for a in partial)
        # resolutions of partial sums: all-reduce, or reduce-scatter onto an output dim
        options: list[list[int | None]] = []
        for a in partial:
            opts: list[int | None] = [None]
            if allow_rs:
                opts.extend(_scatter_dims(out, out_shape, a, mesh))
            options.append(opts)
        for res in itertools.product(*options):
            o = list(base_out)
            bad = False
            for a, d in zip(partial, res):
                if d is not None:
                    o[d] = (o[d] or ()) + (a,)
            for d, e in enumerate(o):
                if e and out_shape[d] % math.prod(sizes[b] for b in e):
                    bad = True
            if bad:
                continue
            cur_b = _nbytes(out_shape, out_dtype) / tile_count(base_out, sizes)
            comms: list[tuple[str, float, tuple[str, ...]]] = []
            for a, d in zip(partial, res):
                if d is not None:
                    comms.append(("reduce-scatter", cur_b, (a,)))
                    cur_b /= sizes[a]
            # one all-reduce per summed loop dimension, over the axes splitting it (XLA reduces
            # the partial sums of each split dimension on its own, each of the whole buffer)
            ar = [a for a, d in zip(partial, res) if d is None]
            for s in dict.fromkeys(slot_of[a] for a in ar):
                comms.append(("all-reduce", cur_b, tuple(a for a in ar if slot_of[a] == s)))
            outs = list(replicated(len(s)) for s in op.out_shapes)
            outs[out_index] = tuple(o)
            key = (in_specs, tuple(outs))
            if key in seen:
                continue
            seen.add(key)
            result.append(_finish(op, mesh, in_specs, outs, comms, work=work, ctx=ctx))
    return result


def _dot_slots(op: OpNode) -> list[_Slot]:
    (lc, rc), (lb, rb) = op.params["dimension_numbers"]
    ls, rs = op.in_shapes[0], op.in_shapes[1]
    lfree = [d for d in range(len(ls)) if d not in lc and d not in lb]
    rfree = [d for d in range(len(rs)) if d not in rc and d not in rb]
    slots = [_Slot(ls[a], ((0, a), (1, b)), i) for i, (a, b) in enumerate(zip(lb, rb))]
    slots += [_Slot(ls[a], ((0, a),), len(lb) + j) for j, a in enumerate(lfree)]
    slots += [_Slot(rs[b], ((1, b),), len(lb) + len(lfree) + j) for j, b in enumerate(rfree)]
    slots += [_Slot(ls[a], ((0, a), (1, b)), None) for a, b in zip(lc, rc)]
    return [s for s in slots if s.size > 1]


def _conv_slots(op: OpNode) -> list[_Slot]:
    dn = op.params["dimension_numbers"]
    lsp, rsp, osp = dn["lhs_spec"], dn["rhs_spec"], dn["out_spec"]
    fg = int(op.params.get("feature_group_count", 1) or 1)
    bg = int(op.params.get("batch_group_count", 1) or 1)
    ls, rs = op.in_shapes[0], op.in_shapes[1]
    slots = []
    if bg == 1:
        slots.append(_Slot(ls[lsp[0]], ((0, lsp[0]),), osp[0]))
    if fg == 1 and bg == 1:
        slots.append(_Slot(rs[rsp[0]], ((1, rsp[0]),), osp[1]))
        slots.append(_Slot(ls[lsp[1]], ((0, lsp[1]), (1, rsp[1])), None))
    return [s for s in slots if s.size > 1]


def _gather_slots(op: OpNode) -> list[_Slot] | None:
    dn = op.params["dimension_numbers"]
    opnd, idx = op.in_shapes[0], op.in_shapes[1]
    out = op.out_shapes[0]
    offset_dims = tuple(dn["offset_dims"])
    collapsed = tuple(dn["collapsed_slice_dims"])
    sim = tuple(dn["start_index_map"])
    obd = tuple(dn.get("operand_batching_dims", ()) or ())
    ibd = tuple(dn.get("start_indices_batching_dims", ()) or ())
    sizes_ = tuple(op.params.get("slice_sizes", ()))
    if opnd is None or idx is None or len(sizes_) != len(opnd):
        return None
    batch_out = [d for d in range(len(out)) if d not in offset_dims]
    idx_batch = list(range(len(idx) - 1))
    if len(batch_out) != len(idx_batch):
        return None
    slots = []
    for j, i in enumerate(idx_batch):
        if i in ibd:
            od = obd[ibd.index(i)]
            slots.append(_Slot(idx[i], ((1, i), (0, od)), batch_out[j]))
        else:
            slots.append(_Slot(idx[i], ((1, i),), batch_out[j]))
    off_operand = [d for d in range(len(opnd)) if d not in collapsed and d not in obd]
    for j, d in enumerate(off_operand):
        if j < len(offset_dims) and sizes_[d] == opnd[d]:
            slots.append(_Slot(opnd[d], ((0, d),), offset_dims[j]))
    for d in collapsed:
        if d in sim and sizes_[d] == 1:
            slots.append(_Slot(opnd[d], ((0, d),), None))  # vocabulary-parallel
    return [s for s in slots if s.size > 1]


def _scatter_slots(op: OpNode) -> list[_Slot] | None:
    dn = op.params["dimension_numbers"]
    if len(op.in_shapes) < 3:
        return None
    opnd, idx, upd = op.in_shapes[0], op.in_shapes[1], op.in_shapes[2]
    if opnd is None or idx is None or upd is None:
        return None
    uwd = tuple(dn["update_window_dims"])
    iwd = tuple(dn["inserted_window_dims"])
    sdod = tuple(dn["scatter_dims_to_operand_dims"])
    obd = tuple(dn.get("operand_batching_dims", ()) or ())
    ibd = tuple(dn.get("scatter_indices_batching_dims", ()) or ())
    upd_scatter = [d for d in range(len(upd)) if d not in uwd]
    idx_batch = list(range(len(idx) - 1))
    if len(upd_scatter) != len(idx_batch):
        return None
    slots = []
    additive = op.primitive in _primitives.ADDITIVE_SCATTERS
    for j, i in enumerate(idx_batch):
        if i in ibd:
            od = obd[ibd.index(i)]
            slots.append(_Slot(idx[i], ((1, i), (2, upd_scatter[j]), (0, od)), od))
        elif additive:
            slots.append(_Slot(idx[i], ((1, i), (2, upd_scatter[j])), None))
    win_operand = [d for d in range(len(opnd)) if d not in iwd and d not in obd]
    for j, d in enumerate(win_operand):
        if j < len(uwd) and upd[uwd[j]] == opnd[d]:
            slots.append(_Slot(opnd[d], ((0, d), (2, uwd[j])), d))
    for d in iwd:
        if d in sdod:
            slots.append(_Slot(opnd[d], ((0, d),), d))
    return [s for s in slots if s.size > 1]


# ---------------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------------

_DERIVE_CACHE: BoundedCache[tuple, Strategy | None] = BoundedCache(2_000_000)
_STRAT_CACHE: BoundedCache[tuple, tuple[tuple[Strategy, ...], bool]] = BoundedCache(200_000)
#: :func:`derive_all`'s lists, by mesh, operator, operand, operand specs and fusion context
_DERIVE_ALL_CACHE: BoundedCache[tuple, list[Strategy] | None] = BoundedCache(200_000)


def derive(op: OpNode, mesh: LogicalMesh, k: int, spec: Spec,
           graph: OpGraph | None = None) -> Strategy | None:
    """The follower strategy of ``op`` when its operand ``k`` has ``spec``.

    The returned strategy's ``in_specs[k]`` may differ from ``spec`` where the operator cannot
    keep a split (e.g. a reduce-window or cumsum along a split dimension): the difference is a
    resharding the caller charges.

    Args:
        op: the operator; ``graph`` its graph (for its place in XLA's fusion; without it the
            operator is costed as a kernel of its own).

    Returns:
        The strategy, or None when ``op`` has no follower rule.
    """
    ctx = _context(op, graph)
    return _derive(op, mesh, k, spec, ctx)


def _derive(op: OpNode, mesh: LogicalMesh, k: int, spec: Spec, ctx: Context) -> Strategy | None:
    key = (mesh_id(mesh), _op_key(op), k, spec, ctx)
    if key in _DERIVE_CACHE:
        return _DERIVE_CACHE[key]
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    try:
        r = _follow(op, k, spec, sizes)
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError):
        r = None
    st = None
    if r is not None:
        ins, outs, comms, work = r
        st = _finish(op, mesh, ins, outs, comms, work=work, ctx=ctx)
    return _DERIVE_CACHE.put(key, st)


def derive_all(op: OpNode, mesh: LogicalMesh, k: int, specs: tuple[Spec, ...], ctx: Context,
               op_key: tuple | None = None) -> list[Strategy] | None:
    """The follower strategies of ``op`` for each of the specs ``specs`` of its operand ``k``
    (``_derive`` of each), or None when one has none; ``op_key`` is ``_op_key(op)`` when the
    caller has it.

    Once per mesh (:func:`mesh_id`), operator, operand, specs and fusion context, what
    ``_derive`` is a function of: the problems a search builds on one mesh (the fold's segments,
    a layer's problems) derive the same followers from the same leader specs again and again.
    The list is shared by every caller, which must not change it."""
    key = (mesh_id(mesh), _op_key(op) if op_key is None else op_key, k, specs, ctx)
    try:
        return _DERIVE_ALL_CACHE[key]
    except KeyError:
        pass
    out: list[Strategy] | None = [_derive(op, mesh, k, spec, ctx) for spec in specs]
    if not all(s is not None for s in out):  # type: ignore[union-attr]
        out = None
    return _DERIVE_ALL_CACHE.put(key, out)


def strategies(op: OpNode, graph: OpGraph | None, mesh: LogicalMesh,
               unknown: set[str] | None = None) -> list[Strategy]:
    """The sharding strategies of one operator on ``mesh``.

    Args:
        op: the operator.
        graph: its graph (used to pick the operand a follower follows); may be None.
        mesh: the logical mesh.
        unknown: if given, the primitive's name is added when it has no rule (it then gets only
            the replicated strategy).

    Returns:
        Distinct strategies (no two with the same operand and result specs), never empty; the
        replicated strategy is always among them.

    Examples:
        >>> import jax, jax.numpy as jnp, autoplan
        >>> g = autoplan.trace(lambda x, w: x @ w, jax.ShapeDtypeStruct((8, 16), jnp.float32),
        ...                    jax.ShapeDtypeStruct((16, 4), jnp.float32))
        >>> mesh = autoplan.Cluster.preset("p3.16xlarge").logical_mesh((1, 2))
        >>> [s.name for s in strategies(g[0], g, mesh)]  # doctest: +NORMALIZE_WHITESPACE
        ['RR x RR -> RR', 'S(y)R x RR -> S(y)R', 'RR x RS(y) -> RS(y)',
         'RS(y) x S(y)R -> RR (all-reduce y)', 'RS(y) x S(y)R -> S(y)R (reduce-scatter y)',
         'RS(y) x S(y)R -> RS(y) (reduce-scatter y)']
    """
    require_instance("strategies", "op", op, OpNode, "pass one of graph.ops")
    require_instance("strategies", "mesh", mesh, LogicalMesh, "pass cluster.logical_mesh((2, 4))")
    ctx = _context(op, graph)
    key = (mesh_id(mesh), _op_key(op), ctx)
    hit = _STRAT_CACHE.get(key)
    if hit is None:
        try:
            out = _strategies(op, graph, mesh, ctx)
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError, AttributeError):
            out = []
        is_unknown = not out
        if is_unknown:
            out = [_replicated_strategy(op, mesh, ctx)]
        elif not any(all(not e for s in st.out_specs for e in s) and
                     all(s is None or not any(s) for s in st.in_specs) for st in out):
            out.insert(0, _replicated_strategy(op, mesh, ctx))
        hit = (tuple(out), is_unknown)
        _STRAT_CACHE.put(key, hit)
    if hit[1] and unknown is not None:
        unknown.add(op.primitive)
    return list(hit[0])


def _strategies(op: OpNode, graph: OpGraph | None, mesh: LogicalMesh,
                ctx: Context = UNFUSED) -> list[Strategy]:
    prim = op.primitive
    if not op.out_shapes:
        return []
    if prim in KEY_OPS:
        return [_replicated_strategy(op, mesh, ctx)]
    if prim in RANDOM_BITS:
        return _random_bits_strategies(op, mesh, ctx)
    if prim == "dot_general":
        return _enumerate_slots(op, mesh, _dot_slots(op), allow_rs=True, ctx=ctx)
    if prim == "conv_general_dilated":
        return _enumerate_slots(op, mesh, _conv_slots(op), allow_rs=False, ctx=ctx)
    if prim == "gather":
        slots = _gather_slots(op)
        return [] if slots is None else _enumerate_slots(op, mesh, slots, allow_rs=False, ctx=ctx)
    if prim in _SCATTER:
        slots = _scatter_slots(op)
        return [] if slots is None else _enumerate_slots(op, mesh, slots, allow_rs=False, ctx=ctx)
    if prim in FOLLOWERS:
        k = leader_operand(op, [i for i, s in enumerate(op.in_shapes) if s is not None and len(s)],
                           graph)
        if k is None:
            if not is_generator(op):
                return []
            return [_finish(op, mesh, tuple(None if s is None else () for s in op.in_shapes),
                            (spec,) + tuple(replicated(len(s)) for s in op.out_shapes[1:]), (),
                            ctx=ctx)
                    for spec in enumerate_specs(op.out_shapes[0], mesh)]
        out: list[Strategy] = []
        seen: set = set()
        for spec in enumerate_specs(op.in_shapes[k], mesh):
            st = _derive(op, mesh, k, spec, ctx)
            if st is None:
                return []
            key = (st.in_specs, st.out_specs)
            if key not in seen:
                seen.add(key)
                out.append(st)
        if prim == "reduce_sum" and len(op.out_shapes) == 1:
            for st in _partial_sum_variants(op, mesh, out, ctx):
                key = (st.in_specs, st.out_specs)
                if key not in seen:
                    seen.add(key)
                    out.append(st)
        return out
    return []


def _random_bits_strategies(op: OpNode, mesh: LogicalMesh, ctx: Context) -> list[Strategy]:
    """``random_bits``: the key operand replicated; the bits in every spec of the result when
    the key is a threefry key (each device draws its own tile of the same bits, with no
    communication), else replicated only."""
    keys = tuple(None if s is None else replicated(len(s)) for s in op.in_shapes)
    if not (op.in_dtypes and is_partitionable_key(op.in_dtypes[0])):
        return [_replicated_strategy(op, mesh, ctx)]
    return [_finish(op, mesh, keys, (spec,), (), ctx=ctx)
            for spec in enumerate_specs(op.out_shapes[0], mesh)]


def _scatter_dims(spec: Sequence[Any], out_shape: Sequence[int], a: str,
                  mesh: LogicalMesh) -> list[int]:
    """The result dimensions a reduce-scatter over mesh axis ``a`` can scatter onto: ``a`` goes
    last on the dimension (no axis already there comes after it in the mesh) and the dimension
    divides by all its axes' sizes."""
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    ai = mesh.axis_names.index(a)
    dims = []
    for d in range(len(out_shape)):
        cur = spec[d] or ()
        if any(mesh.axis_names.index(b) > ai for b in cur):
            continue
        if out_shape[d] % (math.prod(sizes[b] for b in cur) * sizes[a]):
            continue
        dims.append(d)
    return dims


def _partial_sum_variants(op: OpNode, mesh: LogicalMesh, base: list[Strategy],
                          ctx: Context = UNFUSED) -> list[Strategy]:
    """Reductions over a split dimension keeping the partial sums scattered: a reduce-scatter
    onto a result dimension instead of the all-reduce (one mesh axis at a time)."""
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    out_shape = op.out_shapes[0]
    extra = []
    for st in base:
        ar = [c for c in st.comm if c.kind == "all-reduce"]
        if len(ar) != 1 or len(ar[0].axes) != 1:
            continue
        a = ar[0].axes[0]
        spec = st.out_specs[0]
        for d in _scatter_dims(spec, out_shape, a, mesh):
            new = tuple((e or ()) + (a,) if i == d else e for i, e in enumerate(spec))
            extra.append(_finish(op, mesh, st.in_specs, (new,),
                                 [("reduce-scatter", ar[0].bytes, (a,))],
                                 work=tile_count(st.in_specs[0], sizes), ctx=ctx))
    return extra
