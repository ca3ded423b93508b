"""Layers: a training graph's operators grouped into pipeline layers (Alpa's operator
clustering, the inter-operator pass's step 1).

The pipeline search cuts a model between *layers*; :func:`group_layers` builds them, and they
are the one notion of layers the search uses (the pipeline's stage boundaries and, for models
with named layers, the folded search's segments):

1. **Units.** The model's forward operators are split into units in program order:

   * a model with named-scope layers (:attr:`~autoplan.OpGraph.layer_names`: ``jax.named_scope``
     blocks, Flax linen submodules, the iterations of an unrolled ``lax.scan``) gets one unit
     per layer, named by it; a forward operator outside every named layer (a reshape between
     two blocks, the loss) joins the unit before it (the first unit when it comes first);
   * a model without them (Flax NNX, Equinox, plain JAX) gets one unit per repeated block
     found by mining (TAPAS's classes, whatever library built the block: an ``nnx.List`` of
     modules, ``eqx.nn`` layers, a Python loop) and one per run of forward operators before,
     between and after them;
   * without repeated blocks either, one unit per heavy operator (dot/conv) with the light
     operators that follow it.

   Such a unit is named from what it holds (:func:`unit_name`): the parameters its forward
   operators read first, by their common pytree path (``blocks[0]`` for the leaves of
   ``params['blocks'][0]``, ``dense0`` for ``params['dense0']['kernel']``, ``params[2]`` for a
   list's third array, ``conv1+conv2`` for two siblings); a unit reading no parameter is
   ``input`` before the first that does, else ``after <the unit before>``. Names are unique
   (a repeat gets `` #2``). Every view of a plan names layers this way
   (:func:`op_layer_names`), and a plan's operators record the names, so the pipeline executor
   finds a forward operator's unit from the plan's operators.
2. **Layers.** Consecutive units are merged into ``L`` layers (when ``L`` is less than the number
   of units) by Alpa's operator-clustering DP, then balanced. With ``C(i, j)`` the bytes of
   forward tensors crossing a cut before unit ``j`` and ``F`` the FLOPs of a group of units:

       G(k, j) = min over i { max(G(k - 1, i), C(j)) : F(i..j) <= (1 + eps) . F_total / L }

   gives the least largest crossing ``B* = G(L, n)`` (``eps = 0.5`` as in Alpa); among the
   groupings whose cuts all cross at most ``B*`` bytes under the same FLOPs cap, the one with the
   least sum of squared group FLOPs is taken (repeated blocks cross equal bytes everywhere, and
   the sum of squares then spreads them evenly: GPT-2.6B's 32 blocks in 8 layers are 4 to 5
   blocks each, not 6, 6, 6, 6, 6, 1, 1).
3. **Backward and update operators** join the layer of the forward work they differentiate or
   update: by named-scope layer where present, else by data flow (a backward op belongs to the
   latest layer among the producers of its inputs; an update op to the layer of the parameter,
   gradient or optimizer state it reads).

References:
    Zheng et al., "Alpa: Automating Inter- and Intra-Operator Parallelism for Distributed Deep
    Learning", OSDI 2022, section 5.2 and appendix (operator clustering).
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoplan._errors import SearchError
from autoplan._memo import per_owner, per_owner_and_args
from autoplan._names import unit_name
from autoplan._options import require_graph
from autoplan.plans._keystr import parse_keystr
from autoplan.search.fold._graphnodes import op_labels
from autoplan.tracing._graph import OpGraph
from autoplan.tracing._operands import operand_arrays, runs
from autoplan.tracing._primitives import LAYER_HEAVY

_ROLE_KEY = {"forward": "f", "backward": "b", "update": "u"}
_ROLE_CODE = {"forward": 0, "backward": 1, "update": 2}

__all__ = ["LayerGroup", "group_layers", "op_layer_names", "layer_order", "segment_names", "unit_name",
           "HEAVY"]

#: the matmuls and convolutions that cut layers (a view of the primitive registry)
HEAVY = LAYER_HEAVY


@dataclass(frozen=True)
class LayerGroup:
    """A layer for the pipeline search.

    Attributes:
        index: position along the model.
        names: the units (scope names) it is made of.
        forward, backward, update: operator ids by role.
        flops: forward + backward FLOPs.
        params: names of the graph inputs (parameters and their optimizer state) it owns.
        signature: a structural hash; layers with equal signatures cost the same (folding).
    """

    index: int
    names: tuple[str, ...]
    forward: tuple[int, ...]
    backward: tuple[int, ...]
    update: tuple[int, ...]
    flops: float
    params: tuple[str, ...]
    signature: str

    @property
    def ops(self) -> tuple[int, ...]:
        return tuple(sorted(self.forward + self.backward + self.update))

    @property
    def name(self) -> str:
        return self.names[0] if len(self.names) == 1 else f"{self.names[0]}..{self.names[-1]}"


@per_owner
def _forward(graph: OpGraph) -> tuple[list, bool]:
    """The forward operators, and whether the model has named-scope layers
    (:attr:`~autoplan.OpGraph.layer_names`; made once per graph)."""
    fwd = [op for op in graph.ops if op.role == "forward"]
    names = graph.layer_names
    return fwd, any(names[op.id] is not None for op in fwd)


@per_owner
def _units(graph: OpGraph) -> list[tuple[str, list[int]]]:
    """The units of the forward pass, in program order: (name, forward operator ids); see the
    module docstring (made once per graph)."""
    return _make_units(graph)


def _make_units(graph: OpGraph) -> list[tuple[str, list[int]]]:
    fwd, scoped = _forward(graph)
    units: list[tuple[str, list[int]]] = []
    if scoped:
        names = graph.layer_names
        index: dict[str, int] = {}
        before: list[int] = []  # unnamed forward operators before the first named layer
        for op in fwd:
            name = names[op.id]
            if name is None:
                (units[-1][1] if units else before).append(op.id)
                continue
            if name not in index:
                index[name] = len(units)
                units.append((name, before))
                before = []
            units[index[name]][1].append(op.id)
        return units
    starts = _block_starts(graph, fwd)
    if starts:
        cuts = sorted(set(starts) | {fwd[0].id})
    else:  # one unit per heavy operator and the light operators after it
        cuts = sorted({fwd[0].id} | {op.id for op in fwd if op.primitive in HEAVY})
    k = -1
    spans: list[list[int]] = []
    for op in fwd:
        while k + 1 < len(cuts) and op.id >= cuts[k + 1]:
            k += 1
            spans.append([])
        spans[-1].append(op.id)
    return list(zip(_unit_names(graph, spans), spans))


def _unit_names(graph: OpGraph, spans: Sequence[Sequence[int]]) -> list[str]:
    """Names for the units of a model without named-scope layers (see the module docstring)."""
    ops = graph.ops
    seen: set[int] = set()
    names: list[str | None] = []
    for span in spans:
        first, every = [], []
        for o in span:
            for t in ops[o].inputs:
                gi = graph.input_of_tensor.get(t) if t is not None else None
                if gi is None or gi.kind != "parameter":
                    continue
                pair = (gi.arg_name, gi.path)
                if pair not in every:
                    every.append(pair)
                if gi.tensor not in seen:
                    seen.add(gi.tensor)
                    first.append(pair)
        names.append(unit_name(first or every))
    out: list[str] = []
    count: dict[str, int] = {}
    for k, name in enumerate(names):
        if name is None:
            name = f"after {out[-1]}" if any(n is not None for n in names[:k]) else "input"
        count[name] = count.get(name, 0) + 1
        out.append(name if count[name] == 1 else f"{name} #{count[name]}")
    return out


def op_layer_names(graph: OpGraph) -> list[str]:
    """Every operator's layer name, the one every view of a plan shows: the layer of
    :func:`group_layers` with one layer per unit (a named-scope layer, or a unit named from what
    it holds), for forward, backward and update operators alike (made once per graph)."""
    return _named_layers(graph)[0]


def layer_order(graph: OpGraph) -> tuple[str, ...]:
    """The names :func:`op_layer_names` gives, in the model's order (made once per graph)."""
    return _named_layers(graph)[1]


@per_owner
def _named_layers(graph: OpGraph) -> tuple[list[str], tuple[str, ...]]:
    out = ["step"] * len(graph.ops)
    if not _units(graph):
        return out, ("step",)
    layers = group_layers(graph, max_layers=None)
    for ly in layers:
        for o in ly.ops:
            out[o] = ly.name
    return out, tuple(ly.name for ly in layers)


def _block_starts(graph: OpGraph, fwd: Sequence) -> list[int]:
    """Where the repeated blocks found by mining start and end in the forward pass: for each
    instance with a heavy forward operator (instances of every class, in program order, an
    instance starting inside an earlier one skipped) its first forward operator, and the
    forward operator after its last. Empty when mining finds no such block."""
    from autoplan.search.fold._mine import mining_of  # noqa: PLC0415

    mining = mining_of(graph)
    ops = graph.ops
    spans = []
    for cls in mining.classes:
        for inst in cls.instances:
            f = [o for o in inst if ops[o].role == "forward"]
            if f and any(ops[o].primitive in HEAVY for o in f):
                spans.append((min(f), max(f)))
    spans.sort()
    fwd_ids = [op.id for op in fwd]
    out: list[int] = []
    end = -1
    for lo, hi in spans:
        if lo <= end:
            continue
        out.append(lo)
        k = bisect.bisect_right(fwd_ids, hi)
        if k < len(fwd_ids):
            out.append(fwd_ids[k])
        end = hi
    return out


def _crossing_bytes(graph: OpGraph, unit_of: dict[int, int], n: int) -> np.ndarray:
    """cross[u] = bytes of forward tensors made in units <= u and read in units > u."""
    diff = np.zeros(n + 1)
    for op in graph.ops:
        if op.id not in unit_of:
            continue
        for t in op.outputs:
            users = [unit_of[c] for c in graph.consumers[t] if c in unit_of]
            if not users:
                continue
            p, last = unit_of[op.id], max(users)
            if last > p:
                diff[p] += graph.tensors[t].nbytes
                diff[last] -= graph.tensors[t].nbytes
    return np.cumsum(diff)[:n]


def _layer_cuts(flops: Sequence[float], cross: np.ndarray, num_layers: int, eps: float) -> list[int]:
    """Cut points (end index, exclusive) of ``num_layers`` contiguous groups of units: Alpa's
    least largest crossing ``B*`` under the FLOPs cap ``(1+eps).total/L`` (relaxed to the
    largest unit when one unit alone exceeds it), then, among the groupings whose every cut
    crosses at most ``B*`` bytes under that cap, the least sum of squared group FLOPs."""
    n = len(flops)
    pre = np.concatenate([[0.0], np.cumsum(flops)])
    cap = max((1 + eps) * pre[-1] / num_layers, max(flops) if n else 0.0) * (1 + 1e-9)
    cut = np.append(np.asarray(cross[:n - 1], dtype=float), 0.0)  # cut[j - 1]: after unit j - 1
    INF = np.inf
    # pass 1: G(k, j), the least largest crossing of k groups ending at unit j
    big = np.full((num_layers + 1, n + 1), INF)
    big[0, 0] = 0.0
    for k in range(1, num_layers + 1):
        for j in range(k, n - (num_layers - k) + 1):
            i = np.arange(k - 1, j)
            ok = pre[j] - pre[i] <= cap
            if ok.any():
                big[k, j] = max(float(np.min(big[k - 1, i[ok]])), cut[j - 1] if j < n else 0.0)
    if not np.isfinite(big[num_layers, n]):
        # balance impossible with contiguous units: fall back to equal unit counts
        return [round((k + 1) * n / num_layers) for k in range(num_layers)]
    limit = big[num_layers, n] * (1 + 1e-9)
    # pass 2: the least sum of squared group FLOPs with every cut crossing <= B*
    best = np.full((num_layers + 1, n + 1), INF)
    arg = np.zeros((num_layers + 1, n + 1), dtype=int)
    best[0, 0] = 0.0
    for k in range(1, num_layers + 1):
        for j in range(k, n - (num_layers - k) + 1):
            if j < n and cut[j - 1] > limit:
                continue
            i = np.arange(k - 1, j)
            f = pre[j] - pre[i]
            v = np.where(f <= cap, best[k - 1, i] + f * f, INF)
            m = int(np.argmin(v))
            if np.isfinite(v[m]):
                best[k, j], arg[k, j] = v[m], i[m]
    cuts, j = [], n
    for k in range(num_layers, 0, -1):
        cuts.append(j)
        j = arg[k, j]
    return cuts[::-1]


def group_layers(graph: OpGraph, num_layers: int | None = None, eps: float = 0.5, *,
                 max_layers: int | None = 64) -> list[LayerGroup]:
    """Group a training graph's operators into pipeline layers (Alpa's operator clustering).

    Args:
        graph: the traced training step.
        num_layers: how many layers; default: one per unit (named scope) up to ``max_layers``,
            else ``max_layers``.
        eps: Alpa's balance slack: each layer's FLOPs <= (1+eps) . average.
        max_layers: the default's cap (None: one layer per unit however many there are).

    Returns:
        The layers in model order; every operator belongs to exactly one.

    Raises:
        SearchError: ``num_layers`` is not a positive integer or exceeds the number of units, or
            ``max_layers`` is not a positive integer or None.
    """
    require_graph("group_layers", graph)
    units = _units(graph)
    if not units:
        raise SearchError("group_layers: the graph has no forward operators to group.")
    n = len(units)
    if max_layers is not None and (not isinstance(max_layers, int) or max_layers <= 0):
        raise SearchError(f"group_layers: max_layers should be a positive integer or None (one "
                          f"layer per unit). Got {max_layers!r}.")
    if num_layers is None:
        num_layers = n if max_layers is None else min(n, max_layers)
    if not isinstance(num_layers, int) or num_layers <= 0 or num_layers > n:
        raise SearchError(f"group_layers: num_layers should be an integer in [1, {n}] (the "
                          f"number of units in this graph). Got {num_layers!r}.")
    if num_layers < n:  # group units into layers (one layer per unit needs no grouping)
        unit_of = {op: u for u, (_, ops) in enumerate(units) for op in ops}
        uflops = [sum(graph.ops[o].flops for o in ops) for _, ops in units]
        cuts = _layer_cuts(uflops, _crossing_bytes(graph, unit_of, n), num_layers, eps)
    else:
        cuts = list(range(1, n + 1))
    layer_of_unit = [0] * n
    start = 0
    for k, end in enumerate(cuts):
        layer_of_unit[start:end] = [k] * (end - start)
        start = end
    # operator -> layer and tensor -> layer as lists (-1: not assigned yet); every forward
    # operator is in a unit
    ops = graph.ops
    layer_of = [-1] * len(ops)
    for u, (_, uops) in enumerate(units):
        k = layer_of_unit[u]
        for o in uops:
            layer_of[o] = k
    scope_layer = {name: layer_of_unit[u] for u, (name, _) in enumerate(units)}
    layer_names = graph.layer_names

    # a tensor read by backward or update ops belongs to the latest forward layer that reads it
    # (an activation saved for backward, a parameter), else to the layer that made it
    t_layer = [-1] * len(graph.tensors)
    rest = []  # the backward and update operators, in order
    for op in ops:
        if op.role != "forward":
            rest.append(op)
            continue
        k = layer_of[op.id]
        for t in op.outputs:
            if t_layer[t] < 0:
                t_layer[t] = k
        for t in op.inputs:
            if t is not None and t_layer[t] < k:
                t_layer[t] = k
    _place_optimizer_state(graph, t_layer)
    # the layers known from the forward pass (and optimizer state); later entries are inherited
    fwd_layer = list(t_layer)
    last = num_layers - 1
    for op in rest:
        ly = None
        if op.role == "backward" and layer_names[op.id] in scope_layer:
            ly = scope_layer[layer_names[op.id]]
        else:
            own = [fwd_layer[t] for t in op.inputs if t is not None and fwd_layer[t] >= 0]
            if own:
                ly = max(own) if op.role == "backward" else min(own)
            else:
                inherited = [t_layer[t] for t in op.inputs if t is not None and t_layer[t] >= 0]
                if inherited:
                    ly = min(inherited)
        if ly is None:
            ly = last if op.role == "update" else 0
        layer_of[op.id] = ly
        for t in op.outputs:
            if t_layer[t] < 0:
                t_layer[t] = ly

    groups: list[dict] = [{"f": [], "b": [], "u": [], "names": []} for _ in range(num_layers)]
    for u, (name, _) in enumerate(units):
        groups[layer_of_unit[u]]["names"].append(name)
    for op in ops:
        groups[layer_of[op.id]][_ROLE_KEY[op.role]].append(op.id)
    owned: list[list[str]] = [[] for _ in range(num_layers)]
    for gi in graph.inputs:
        if gi.kind in ("parameter", "optimizer_state") and t_layer[gi.tensor] >= 0:
            owned[t_layer[gi.tensor]].append(gi.name)
    out = []
    for k, g in enumerate(groups):
        ops_k = g["f"] + g["b"]
        out.append(LayerGroup(
            index=k, names=tuple(g["names"]), forward=tuple(g["f"]), backward=tuple(g["b"]),
            update=tuple(g["u"]), flops=float(sum([ops[o].flops for o in ops_k])),
            params=tuple(owned[k]), signature=_signature(graph, g["f"] + g["b"] + g["u"])))
    return out


def _place_optimizer_state(graph: OpGraph, t_layer: list[int]) -> None:
    """Put each optimizer-state input no forward operator reads in its parameter's layer (in
    ``t_layer``, per tensor), matched by the longest ending of its path (whole keys) that ends
    the paths of one layer's parameters only: Adam's moments mirror the parameters' tree
    (``[0].mu['Dense_0']['kernel']`` is ``['Dense_0']['kernel']``'s), also where the parameters
    sit under a field of their own (a TrainState's ``.params[...]``). A parameter's own path
    comes first; an ending of several layers' parameters, or of a parameter no layer reads,
    places nothing."""
    param_layer: dict[tuple, int] = {}
    ending_layer: dict[tuple, int] = {}
    for gi in graph.inputs:
        if gi.kind == "parameter" and gi.path:
            ly = max(t_layer[gi.tensor], -1)
            if ly >= 0:
                param_layer[path_endings(gi.path)[0]] = ly
            for e in path_endings(gi.path):
                ending_layer[e] = ly if ending_layer.get(e, ly) == ly else -1  # (-1: none, several)
    for gi in graph.inputs:
        if gi.kind == "optimizer_state" and t_layer[gi.tensor] < 0 and gi.path:
            ly = next((param_layer.get(e, ending_layer.get(e)) for e in path_endings(gi.path)
                       if e in ending_layer), -1)
            if ly >= 0:
                t_layer[gi.tensor] = ly


def path_endings(path: str) -> list[tuple]:
    """The endings of a leaf's path (``jax.tree_util.keystr``) in whole keys, longest first:
    ``".opt_state[0].mu['w']"`` gives the keys of itself, of ``"[0].mu['w']"``, ``".mu['w']"``
    and ``"['w']"`` (an attribute and a dict key of one name alike); the path alone where it
    does not read as keys."""
    keys = parse_keystr(path)
    if not keys:
        return [(path,)]
    return [tuple(keys[i:]) for i in range(len(keys))]


def _signature(graph: OpGraph, ops: Sequence[int]) -> str:
    """Structural identity of a layer: its operators' primitives, shapes and the wiring among
    them, independent of ids and scope names (memoised per graph and operator set: the levels
    ask again for the layers :func:`group_layers` just signed)."""
    return _sorted_signature(graph, tuple(sorted(ops)))


def loose_signature(graph: OpGraph, ops: Sequence[int]) -> str:
    """:func:`_signature` with a scalar read from outside the operators signed as a literal:
    layers that differ only where one reads a constant and another a scalar made elsewhere (a
    running sum that starts from ``0.0`` in the first layer) share it. Equal loose signatures
    say only that two layers' operators line up one to one; whether their intra-operator
    problems are the same is checked on the problems themselves
    (:func:`~autoplan.search.intra._ilp_problem.aligned_nodes`)."""
    return _sorted_signature(graph, tuple(sorted(ops)), True)


@per_owner_and_args
def _sorted_signature(graph: OpGraph, ops: tuple[int, ...], loose: bool = False) -> str:
    """:func:`_signature` of the sorted operator ids ``ops`` (with ``loose``,
    :func:`loose_signature`'s), once per graph and ``ops``."""
    # each operator as its structural label (primitive, shapes, dtypes, params: see
    # ``op_labels``) with its role, and its operand count; then per operand its producer's offset
    # in ``ops`` (negative: producers come first), 0 for a literal, or a stable 64-bit hash of an
    # outside tensor's shape (0 for a scalar with ``loose``); the int64 sequence is built with
    # numpy (``ops`` is sorted)
    arr = operand_arrays(graph)
    head = _signature_op_codes(graph)
    shape_words = _signature_shape_words(graph)
    o = np.asarray(ops, dtype=np.int64)
    n = len(o)
    cnt = arr.count[o]
    first = np.zeros(n, dtype=np.int64)  # each operator's first operand in the local order
    np.cumsum(cnt[:-1], out=first[1:])
    who = np.repeat(np.arange(n, dtype=np.int64), cnt)  # local index of each operand's reader
    where = runs(arr.start[o], cnt)  # each operand in the flat arrays
    t = arr.tensor[where]
    p = arr.made_by[where]
    j = np.minimum(np.searchsorted(o, p), n - 1)
    inside = (p >= 0) & (o[j] == p)
    code = np.where(inside, j - who, 0)
    outside = np.flatnonzero((t >= 0) & ~inside)
    if len(outside):
        tensors = graph.tensors
        words = []
        for x in t[outside].tolist():
            shape = tensors[x].shape
            if loose and not shape:
                words.append(0)
                continue
            w = shape_words.get(shape)
            if w is None:
                w = shape_words[shape] = int.from_bytes(
                    hashlib.blake2b(repr(shape).encode(), digest_size=8).digest(), "little",
                    signed=True)
            words.append(w)
        code[outside] = np.asarray(words, dtype=np.int64)
    heads = head[o]
    if loose:  # (an operator reading a scalar: its label without that operand's shape and dtype)
        scalar = t < 0
        if len(outside):
            scalar[outside] = code[outside] == 0
        for r in np.unique(who[scalar]).tolist():
            heads[r] = _loose_op_code(graph, int(o[r]))
    out = np.empty(2 * n + len(where), dtype=np.int64)
    at = 2 * np.arange(n, dtype=np.int64) + first
    out[at] = heads
    out[at + 1] = cnt
    out[runs(at + 2, cnt)] = code
    return hashlib.sha256(out.tobytes()).hexdigest()[:16]


def _loose_op_code(graph: OpGraph, i: int) -> int:
    """Operator ``i``'s head word in a loose signature (:func:`loose_signature`): its primitive,
    shapes, dtypes and params with every scalar operand's shape and dtype left out (a literal has
    neither), times 4 plus its role's code (its params all kept: stricter than its label, which
    leaves out names)."""
    op = graph.ops[i]
    keep = [s != () and s is not None for s in op.in_shapes]
    label = (op.primitive, [s for s, k in zip(op.in_shapes, keep) if k], op.out_shapes,
             [d for d, k in zip(op.in_dtypes, keep) if k], op.out_dtypes,
             sorted((k, repr(v)) for k, v in op.params.items()))
    word = int.from_bytes(hashlib.blake2b(repr(label).encode(), digest_size=7).digest(), "little")
    return word * 4 + _ROLE_CODE.get(op.role, 3)


@per_owner
def _signature_op_codes(graph: OpGraph) -> np.ndarray:
    """Every operator's structural label id (:func:`op_labels`) times 4 plus its role's code: the
    head word of each operator in a signature; once per graph."""
    return (np.asarray(op_labels(graph).ids, dtype=np.int64) * 4
            + np.asarray([_ROLE_CODE.get(op.role, 3) for op in graph.ops], dtype=np.int64))


@per_owner
def _signature_shape_words(graph: OpGraph) -> dict[tuple[int, ...], int]:
    """``{shape: its 64-bit hash}``, filled as signatures meet tensors from outside their
    operators; one dict per graph."""
    return {}


def segment_names(graph: OpGraph, segs: Any) -> list[str]:
    """Each segment's name: the layer (:func:`~autoplan.search.fold._layers.op_layer_names`, the
    name every view gives it) of its main operators, ``first..last`` when they span several; a
    layer cut into several segments names them ``layer (1/2)``, ``layer (2/2)``, so no name is
    listed twice."""
    names = op_layer_names(graph)
    base = []
    for seg in segs:
        main = list(seg.main) or list(seg.ops)
        own = list(dict.fromkeys(names[o] for o in main if graph.ops[o].role == "forward")
                   ) or list(dict.fromkeys(names[o] for o in main))
        base.append(own[0] if len(own) == 1 else f"{own[0]}..{own[-1]}")
    total = {n: base.count(n) for n in base}
    seen: dict[str, int] = {}
    out = []
    for n in base:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if total[n] == 1 else f"{n} ({seen[n]}/{total[n]})")
    return out
