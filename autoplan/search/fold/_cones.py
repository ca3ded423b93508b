"""TePDist's hierarchy of the operator graph: cones, critical nodes and segments.

TePDist splits the SPMD strategy search in a three-tier hierarchy (Alibaba PAI's TePDist article):

* **Cones.** "a subgraph that contains two kinds of nodes: root and non-root. Root nodes have
  multiple inputs or are computationally intensive; non-roots are other nodes." Here (as in the
  reference notes): a *root* is an operator with several users or none (a value used by several
  operators, or a result of the graph), and at optimization level ``O2`` also one with several
  operands (``opt_level``: TePDist's "optimization level", O2 or O3, not the search level
  ``exhaustive``/``hierarchical``/``folded`` of :func:`autoplan.search`); a cone is a
  root plus everything upstream of it up to other roots. A non-root has exactly one user, so
  following users from it reaches exactly one root: every operator lies in exactly one cone. Per
  cone the root's strategies are enumerated and the rest inferred.
* **Critical nodes.** "all critical nodes in the graph are identified and used as graph intervals
  to divide the overall model into multiple approximately linear segments": operators that every
  topological order cuts at, i.e. an operator ``v`` such that every other operator is an ancestor
  or a descendant of ``v``.
* **Segments** lie between consecutive critical nodes; per segment an ILP over its cones for each
  pair of boundary strategies, then a DP along the chain of segments (``O2``).

Critical nodes in near-linear time (:func:`dag_critical_nodes`): take any topological order and
let ``v`` be at position ``i``. Every node after ``i`` is a descendant of ``v`` if and only if
each node after ``i`` has a predecessor at a position ``>= i`` (follow such predecessors back: the
positions decrease and stay ``>= i``, so the walk ends at ``v``; conversely the last edge of a path
from ``v`` is such a predecessor). Symmetrically, every node before ``i`` is an ancestor if and
only if each node before ``i`` has a successor at a position ``<= i``. With ``maxpred(w)`` and
``minsucc(u)`` (the latest predecessor and earliest successor positions), ``v`` is critical if and
only if ``min(maxpred(w) for w after i) >= i`` and ``max(minsucc(u) for u before i) <= i``: a
suffix minimum and a prefix maximum, ``O(V + E)`` after the topological sort.

What the cut structure of a training step looks like. On a whole ``train_step`` graph strict
critical nodes are almost absent: parameter broadcasts, masks and optimizer constants do not depend
on the batch (so no data operator is their ancestor), forward values saved for the backward pass
are neither ancestors nor descendants of the layer boundaries, gradients of every layer flow into
one update, and the backward pass does not consume the loss value itself. :func:`critical_nodes`
therefore works on a *main part*: the operators that depend on the batch and reach a result
(``part="all"``), or only the forward ones that reach the loss (``part="forward"``). Measured on
the zoo's GPT (tiny, 2 and 8 layers): even on the main part of the whole step only 7 operators are
critical, all in the embedding and the first LayerNorm's mean (after that, values saved for the
backward pass leave the chain); the forward part has 94 (2 layers) and 298 (8 layers) critical
nodes: every value on the residual stream and inside the sub-blocks' chains (several per layer);
:func:`segments` keeps one boundary per repeated layer (found by :func:`~autoplan.search.fold._mine.mine`)
and attaches every other operator (side computations, saved values, backward and update operators)
to the segment of the forward operators it belongs to: to the parameter it reads, the forward
values it reads, or its consumers (see :func:`segments`), so a GPT yields one segment per layer
plus the embedding and the head.
"""

from __future__ import annotations

import bisect
import warnings
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter

import networkx as nx
import numpy as np

from autoplan._errors import ArgumentError
from autoplan._options import require_graph
from autoplan.search.fold._graphnodes import (
    batch_inputs,
    data_dependent,
    dependence_masks,
)
from autoplan.tracing._graph import OpGraph
from autoplan.tracing._operands import operand_arrays

__all__ = [
    "Cone",
    "Segment",
    "cone_roots",
    "cones",
    "dag_critical_nodes",
    "critical_nodes",
    "main_part",
    "segments",
]

OPT_LEVELS = ("O2", "O3")  # TePDist's optimization levels
PARTS = ("all", "forward")


@dataclass(frozen=True)
class Cone:
    """A TePDist cone: a root operator and the operators upstream of it up to other roots.

    Attributes:
        id: index in the list :func:`cones` returns (cones are ordered by root).
        root: the root operator's id.
        ops: its operator ids, ascending (the root is the last).
        opt_level: TePDist's optimization level it was made at, ``"O2"`` or ``"O3"``.
        flops: FLOPs of its operators.
    """

    id: int
    root: int
    ops: tuple[int, ...]
    opt_level: str
    flops: float

    def __len__(self) -> int:
        return len(self.ops)

    @property
    def level(self) -> str:
        """Deprecated name of :attr:`opt_level` (kept one release)."""
        warnings.warn("Cone.level is deprecated and will be removed in the next release; use "
                      "Cone.opt_level (TePDist's optimization level).", DeprecationWarning,
                      stacklevel=2)
        return self.opt_level


@dataclass(frozen=True)
class Segment:
    """Operators between two consecutive critical nodes (TePDist), with what crosses its borders.

    Attributes:
        id: position in the chain of segments.
        ops: its operator ids, ascending.
        main: the operators of the analysed part (``part``) in it; the rest were attached.
        critical: the critical node that ends its main part (None for the last segment).
        inputs: ids of tensors it reads that operators of other segments produce.
        outputs: ids of tensors it produces that other segments read or that are graph results.
        params: ids of graph-input tensors (parameters, optimizer state, batch) it reads.
        flops: FLOPs of its operators.
    """

    id: int
    ops: tuple[int, ...]
    main: tuple[int, ...]
    critical: int | None
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    params: tuple[int, ...]
    flops: float

    def __len__(self) -> int:
        return len(self.ops)


def _check_opt_level(opt_level: str) -> None:
    if opt_level not in OPT_LEVELS:
        raise ArgumentError(f"cones: opt_level (TePDist's optimization level) should be one of "
                            f"{OPT_LEVELS}. Got {opt_level!r}. Fix: pass opt_level='O2' or "
                            "opt_level='O3'.")


def _users(graph: OpGraph) -> list[int]:
    """Distinct users of each operator: consumer operators, plus one if a value is a graph result
    (a use outside the graph)."""
    cons = graph.consumers
    results = {o.tensor for o in graph.outputs}
    out = []
    for op in graph.ops:
        us: set[int] = set()
        extra = 0
        for t in op.outputs:
            us.update(cons[t])
            if t in results:
                extra = 1
        out.append(len(us) + extra if us else 0)
    return out


def cone_roots(graph: OpGraph, opt_level: str = "O2") -> list[int]:
    """The cone roots of ``graph``, ascending.

    Args:
        graph: the operator graph.
        opt_level: TePDist's optimization level. ``"O3"``: operators with several users or
            none; a graph result counts as a user outside the graph, so an operator whose value
            is a result and also used by one operator has two users, and one whose value is only
            a result has none (inside); ``"O2"``: also operators with several operands (distinct
            non-literal input tensors).

    Returns:
        Root operator ids.
    """
    _check_opt_level(opt_level)
    users = _users(graph)
    roots = []
    for op in graph.ops:
        if users[op.id] != 1:
            roots.append(op.id)
        elif opt_level == "O2" and len({t for t in op.inputs if t is not None}) > 1:
            roots.append(op.id)
    return roots


def cones(graph: OpGraph, opt_level: str = "O2", *, level: str | None = None) -> list[Cone]:
    """Partition the operators into TePDist cones.

    Every non-root operator has exactly one user; it belongs to the cone of the root reached by
    following users, so each operator is in exactly one cone.

    Args:
        graph: the operator graph.
        opt_level: TePDist's optimization level, ``"O2"`` or ``"O3"`` (see :func:`cone_roots`).
        level: deprecated name of ``opt_level`` (kept one release, with a
            :class:`DeprecationWarning`).

    Returns:
        The cones, ordered by root id.

    Raises:
        ArgumentError: ``opt_level`` is not ``"O2"`` or ``"O3"``, or ``level`` and ``opt_level``
            disagree.

    Examples:
        >>> import jax, jax.numpy as jnp, autoplan
        >>> g = autoplan.trace(lambda w, x: jnp.tanh(jnp.exp(x) @ w).sum(),
        ...                    jax.ShapeDtypeStruct((4, 8), jnp.float32),
        ...                    jax.ShapeDtypeStruct((2, 4), jnp.float32))
        >>> [(c.root, c.ops) for c in cones(g, "O2")]
        [(1, (0, 1)), (3, (2, 3))]
        >>> [(c.root, c.ops) for c in cones(g, "O3")]
        [(3, (0, 1, 2, 3))]
    """
    require_graph("cones", graph)
    if level is not None:
        warnings.warn("cones(level=...) is deprecated and will be removed in the next release; use "
                      "cones(opt_level=...) (TePDist's optimization level).", DeprecationWarning,
                      stacklevel=2)
        if opt_level not in ("O2", level):
            raise ArgumentError(f"cones: level={level!r} and opt_level={opt_level!r} disagree. "
                                "Fix: pass only opt_level.")
        opt_level = level
    roots = set(cone_roots(graph, opt_level))
    cons = graph.consumers
    cone_of = [-1] * len(graph.ops)
    order: list[int] = []
    for op in reversed(graph.ops):
        if op.id in roots:
            cone_of[op.id] = op.id
            order.append(op.id)
        else:
            user = next(c for t in op.outputs for c in cons[t])
            cone_of[op.id] = cone_of[user]
    members: dict[int, list[int]] = {r: [] for r in order}
    for o, r in enumerate(cone_of):
        members[r].append(o)
    return [Cone(i, r, tuple(members[r]), opt_level, float(sum(graph.ops[o].flops for o in members[r])))
            for i, r in enumerate(sorted(order))]


def dag_critical_nodes(dag: nx.DiGraph, order: Sequence[Hashable] | None = None) -> list:
    """Nodes of a DAG that every topological order cuts at (all other nodes are ancestors or
    descendants), in ``O(V + E)`` by the prefix-maximum / suffix-minimum sweep of the module
    docstring.

    Args:
        dag: a directed acyclic graph.
        order: a topological order of its nodes (computed when omitted).

    Returns:
        The critical nodes, in topological order.

    Examples:
        >>> import networkx as nx
        >>> dag_critical_nodes(nx.DiGraph([(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)]))
        [0, 3, 4]
    """
    nodes = list(order) if order is not None else list(nx.topological_sort(dag))
    pos = {v: i for i, v in enumerate(nodes)}
    n = len(nodes)
    min_succ = [min((pos[w] for w in dag.successors(v)), default=n) for v in nodes]
    max_pred = [max((pos[u] for u in dag.predecessors(v)), default=-1) for v in nodes]
    return [nodes[i] for i in _sweep(min_succ, max_pred)]


def _sweep(min_succ: Sequence[int], max_pred: Sequence[int]) -> list[int]:
    n = len(min_succ)
    suffix = [n] * (n + 1)  # suffix[i] = min(max_pred[w] for w >= i)
    for i in range(n - 1, -1, -1):
        suffix[i] = min(suffix[i + 1], max_pred[i])
    out = []
    prefix = -1  # max(min_succ[u] for u < i)
    for i in range(n):
        if prefix <= i and suffix[i + 1] >= i:
            out.append(i)
        prefix = max(prefix, min_succ[i])
    return out


def _primary_dependent(graph: OpGraph) -> list[bool]:
    """Operators that depend on the *primary* data input: of the batch inputs (kind ``"batch"``
    or ``"input"``, else any graph input), the one whose dependent operators carry the most FLOPs
    (a GPT's token ids rather than its labels). One dependence pass serves every batch input."""
    best: list[bool] | None = None
    best_score = (-1.0, -1)
    ops = graph.ops
    sources = batch_inputs(graph)
    masks = dependence_masks(graph, sources)
    for k in range(len(sources)):
        bit = 1 << k
        dep = [bool(m & bit) for m in masks]
        score = (sum(map(attrgetter("flops"), compress(ops, dep))), sum(dep))
        if score > best_score:
            best, best_score = dep, score
    return best if best is not None else data_dependent(graph)


def main_part(graph: OpGraph, part: str = "all") -> list[int]:
    """The operators whose cut structure :func:`critical_nodes` analyses, ascending.

    Only operators that depend on the primary data input count (of the batch inputs, the one
    whose dependents carry the most FLOPs: a GPT's token ids; its labels' one-hot is a side
    branch that joins at the loss, like parameter broadcasts and masks).

    Args:
        graph: the operator graph.
        part: ``"all"``: operators that depend on the primary input and reach a graph result;
            ``"forward"``: forward operators that depend on it and reach, through forward
            operators, a forward operator producing a graph result (the loss); without such a
            result, forward operators with no forward users are the ends.

    Returns:
        Operator ids.
    """
    if part not in PARTS:
        raise ArgumentError(f"critical nodes: part should be one of {PARTS}. Got {part!r}. "
                            "Fix: pass part='all' or part='forward'.")
    dep = _primary_dependent(graph)
    ops = graph.ops
    cand = dep if part == "all" else [d and op.role == "forward" for op, d in zip(ops, dep)]
    ids = list(compress(range(len(ops)), cand))  # the candidates, ascending
    tensors = graph.tensors
    ends = sorted({p for p in (tensors[o.tensor].producer for o in graph.outputs)
                   if p >= 0 and cand[p]})  # the candidates making a graph result
    if not ends:
        cons = graph.consumers
        ends = [i for i in ids if not any(cand[c] for t in ops[i].outputs for c in cons[t])]
    # backwards from the ends over candidate -> candidate edges: each candidate's readers among
    # the candidates, from the operand arrays (CSR by producer)
    arr = operand_arrays(graph)
    is_cand = np.fromiter(cand, dtype=bool, count=len(cand))
    edge = arr.made_by >= 0
    edge[edge] = is_cand[arr.made_by[edge]] & is_cand[arr.reader[edge]]
    src, dst = arr.made_by[edge], arr.reader[edge]
    order = np.argsort(src, kind="stable")
    readers = dst[order].tolist()
    ptr = np.searchsorted(src[order], np.arange(len(ops) + 1)).tolist()
    alive = bytearray(len(ops))
    for e in ends:
        alive[e] = 1
    for i in reversed(ids):
        if not alive[i]:
            for c in readers[ptr[i]:ptr[i + 1]]:
                if alive[c]:
                    alive[i] = 1
                    break
    return list(compress(range(len(ops)), alive))


def _critical_of(graph: OpGraph, main: Sequence[int]) -> list[int]:
    """The critical nodes among ``main`` (ascending operator ids): per operator, the position
    of its first successor and of its last predecessor inside ``main``, over the flat operand
    arrays, then one sweep."""
    n = len(main)
    arr = operand_arrays(graph)
    pos = np.full(len(graph.ops), -1, dtype=np.int64)
    pos[np.asarray(main, dtype=np.int64)] = np.arange(n, dtype=np.int64)
    producer = arr.made_by
    src = np.where(producer >= 0, pos[np.maximum(producer, 0)], -1)
    dst = pos[arr.reader]
    edge = (src >= 0) & (dst >= 0)
    min_succ = np.full(n, n, dtype=np.int64)
    max_pred = np.full(n, -1, dtype=np.int64)
    np.minimum.at(min_succ, src[edge], dst[edge])
    np.maximum.at(max_pred, dst[edge], src[edge])
    return [main[i] for i in _sweep(min_succ.tolist(), max_pred.tolist())]


def critical_nodes(graph: OpGraph, part: str = "all") -> list[int]:
    """Critical nodes of the operator graph: operators ``v`` of the main part such that every
    other operator of the main part is an ancestor or a descendant of ``v``.

    Args:
        graph: the operator graph.
        part: which operators to analyse (see :func:`main_part`): ``"all"`` or ``"forward"``.

    Returns:
        Critical operator ids, ascending (a topological order).

    Examples:
        >>> import jax, jax.numpy as jnp, autoplan
        >>> def f(ws, x):
        ...     for w in ws:
        ...         x = jnp.tanh(x @ w)
        ...     return x.sum()
        >>> w = jax.ShapeDtypeStruct((8, 8), jnp.float32)
        >>> g = autoplan.trace(f, [w] * 2, jax.ShapeDtypeStruct((2, 8), jnp.float32))
        >>> critical_nodes(g)
        [0, 1, 2, 3, 4]
    """
    require_graph("critical_nodes", graph)
    return _critical_of(graph, main_part(graph, part))


def _layer_boundaries(graph: OpGraph, crit: Sequence[int], mining) -> list[int] | None:
    """Around every instance of every mined class holding critical nodes: its last critical node
    and the last critical node before its first one."""
    crit_set = set(crit)
    bounds: set[int] = set()
    for cls in mining.classes:
        per = [sorted(o for o in inst if o in crit_set) for inst in cls.instances]
        per = [p for p in per if p]
        if len(per) < 2:
            continue
        for p in per:
            bounds.add(p[-1])
            i = bisect.bisect_left(crit, p[0])
            if i > 0:
                bounds.add(crit[i - 1])
    return sorted(bounds) if bounds else None


def segments(graph: OpGraph, part: str = "forward", granularity: str = "layer", *,
             attach: str = "structure", mining=None) -> list[Segment]:
    """Split the graph into TePDist segments between critical nodes, covering every operator.

    The critical nodes of the main part (:func:`critical_nodes`) cut it into a chain. With
    ``granularity="layer"`` only the critical nodes around repeated layers are kept: for every
    instance of every repeated class (:func:`~autoplan.search.fold._mine.mine`) holding critical
    nodes, its last critical node and the last critical node before it, so a GPT gives
    ``[embedding] [layer 0] ... [layer L-1] [head]`` and a Wide-ResNet one segment per block;
    without a repeated class every critical node is kept (``granularity="critical"``).

    Every other operator is attached to a segment (``attach="structure"``, no scope names needed):

    0. with a mining result (``granularity="layer"``): the other operators of a mined instance
       (a layer's backward and update operators) join the segment holding most of its main
       operators;
    1. forward operators off the main part that read its values (values saved for the backward
       pass): the latest segment among their producers;
    2. operators reading a parameter or optimizer state: the segment of the first main operator
       reading that parameter (a weight's gradient, its optimizer update);
    3. backward and update operators reading forward values: the latest segment among them;
    4. the rest, consumers first: side computations (parameter broadcasts, masks, constants) the
       earliest segment among their users, others the latest;
    5. then producers first: the latest segment among their producers; anything still left (an
       operator connected to nothing) the segment of the nearest earlier operator.

    ``attach="scope"`` first attaches operators by their top-level named scope (to the segment
    holding most main operators of that scope), then applies the structural rules to the rest.

    Args:
        graph: the operator graph.
        part: ``"forward"`` (default; see :func:`main_part`) or ``"all"``.
        granularity: ``"layer"`` or ``"critical"``.
        attach: ``"structure"`` or ``"scope"``.
        mining: a :class:`~autoplan.search.fold._mine.MiningResult` of ``graph`` (mined here if needed).

    Returns:
        The segments in chain order; they partition the operators.
    """
    require_graph("segments", graph)
    if granularity not in ("layer", "critical"):
        raise ArgumentError(f"segments: granularity should be 'layer' or 'critical'. Got "
                            f"{granularity!r}. Fix: pass granularity='layer' or 'critical'.")
    if attach not in ("structure", "scope"):
        raise ArgumentError(f"segments: attach should be 'structure' or 'scope'. Got {attach!r}. "
                            "Fix: pass attach='structure' or 'scope'.")
    main = main_part(graph, part)
    crit = _critical_of(graph, main)
    bounds: list[int] | None = None
    if granularity == "layer" and crit:
        if mining is None:
            from autoplan.search.fold._mine import mining_of  # noqa: PLC0415

            mining = mining_of(graph)
        bounds = _layer_boundaries(graph, crit, mining)
    if bounds is None:
        bounds = list(crit)
    if main and bounds and bounds[-1] == main[-1]:
        bounds = bounds[:-1]  # the last main operator closes the last segment anyway
    n_seg = len(bounds) + 1
    seg = [-1] * len(graph.ops)
    k = 0
    for o in main:
        seg[o] = k
        if k < len(bounds) and o == bounds[k]:
            k += 1
    _attach(graph, seg, main, attach, mining)
    return _build_segments(graph, seg, n_seg, main, bounds)


def _attach(graph: OpGraph, seg: list[int], main: Sequence[int], attach: str, mining) -> None:
    ops = graph.ops
    cons = graph.consumers
    dep = data_dependent(graph)

    def producers(o: int) -> Iterable[int]:
        for t in ops[o].inputs:
            if t is not None and graph.tensors[t].producer >= 0:
                yield graph.tensors[t].producer

    def consumers(o: int) -> Iterable[int]:
        for t in ops[o].outputs:
            yield from cons[t]

    if attach == "scope":
        votes: dict[str, dict[int, int]] = {}
        for o in main:
            if ops[o].scope:
                v = votes.setdefault(ops[o].scope[0], {})
                v[seg[o]] = v.get(seg[o], 0) + 1
        owner = {s: max(v, key=v.__getitem__) for s, v in votes.items()}
        for op in ops:
            if seg[op.id] < 0 and op.scope and op.scope[0] in owner:
                seg[op.id] = owner[op.scope[0]]
    # 0. the rest of a mined instance goes where the majority of its main operators are
    if mining is not None:
        for cls in mining.classes:
            for inst in cls.instances:
                votes_i: dict[int, int] = {}
                for o in inst:
                    if seg[o] >= 0:
                        votes_i[seg[o]] = votes_i.get(seg[o], 0) + 1
                if votes_i:
                    k = max(votes_i, key=votes_i.__getitem__)
                    for o in inst:
                        if seg[o] < 0:
                            seg[o] = k
    # 1. forward values off the main part (saved for the backward pass)
    for op in ops:
        if seg[op.id] < 0 and op.role == "forward" and dep[op.id]:
            s = [seg[p] for p in producers(op.id) if seg[p] >= 0]
            if s:
                seg[op.id] = max(s)
    # 2. readers of parameters and optimizer state
    state = {gi.tensor for gi in graph.inputs if gi.kind in ("parameter", "optimizer_state")}
    first: dict[int, int] = {}
    for o in main:
        for t in ops[o].inputs:
            if t is not None and t in state and t not in first:
                first[t] = seg[o]
    # a parameter read only through side operators (a broadcast): the main operators using them
    for op in ops:
        if seg[op.id] < 0 and not dep[op.id]:
            for t in op.inputs:
                if t is not None and t in state and t not in first:
                    s = [seg[c] for c in consumers(op.id) if seg[c] >= 0]
                    if s:
                        first[t] = min(s)
    for op in ops:
        if seg[op.id] < 0:
            s = [first[t] for t in op.inputs if t is not None and t in first]
            if s:
                seg[op.id] = min(s)
    # 3. backward / update operators reading forward values
    for op in ops:
        if seg[op.id] < 0 and op.role != "forward":
            s = [seg[p] for p in producers(op.id) if seg[p] >= 0 and ops[p].role == "forward"]
            if s:
                seg[op.id] = max(s)
    # 4. consumers first
    for op in reversed(ops):
        if seg[op.id] < 0:
            s = [seg[c] for c in consumers(op.id) if seg[c] >= 0]
            if s:
                seg[op.id] = min(s) if not dep[op.id] else max(s)
    # 5. producers first, then the nearest earlier operator
    last = 0
    for op in ops:
        if seg[op.id] < 0:
            s = [seg[p] for p in producers(op.id) if seg[p] >= 0]
            seg[op.id] = max(s) if s else last
        last = seg[op.id]


def _build_segments(graph: OpGraph, seg: list[int], n_seg: int, main: Sequence[int],
                    bounds: Sequence[int]) -> list[Segment]:
    members: list[list[int]] = [[] for _ in range(n_seg)]
    for o, s in enumerate(seg):
        members[s].append(o)
    main_of: list[list[int]] = [[] for _ in range(n_seg)]
    for o in main:
        main_of[seg[o]].append(o)
    # per segment, over the flat operand arrays: the graph inputs it reads (params), the tensors
    # it reads from other segments (inputs), and the tensors it makes that other segments read or
    # that are graph results (outputs); each sorted
    arr = operand_arrays(graph)
    seg_a = np.asarray(seg, dtype=np.int64)
    made = arr.tensor >= 0
    t = arr.tensor[made]
    p = arr.producer[t]
    k_read = seg_a[arr.reader[made]]
    k_made = seg_a[np.maximum(p, 0)]
    cross = (p >= 0) & (k_made != k_read)
    res = np.fromiter((o.tensor for o in graph.outputs), np.int64)
    res = res[arr.producer[res] >= 0]
    n_t = len(graph.tensors)

    def per_segment(k: np.ndarray, x: np.ndarray) -> list[tuple[int, ...]]:
        pairs = np.unique(k * n_t + x)
        k, x = pairs // n_t, pairs % n_t
        cuts = np.searchsorted(k, np.arange(n_seg + 1))
        xs = x.tolist()
        return [tuple(xs[cuts[i]:cuts[i + 1]]) for i in range(n_seg)]

    params_of = per_segment(k_read[p < 0], t[p < 0])
    ins_of = per_segment(k_read[cross], t[cross])
    outs_of = per_segment(np.concatenate([k_made[cross], seg_a[arr.producer[res]]]),
                          np.concatenate([t[cross], res]))
    ops = graph.ops
    out = []
    for k in range(n_seg):
        out.append(Segment(
            id=k, ops=tuple(members[k]), main=tuple(main_of[k]),
            critical=bounds[k] if k < len(bounds) else None,
            inputs=ins_of[k], outputs=outs_of[k], params=params_of[k],
            flops=float(sum([ops[o].flops for o in members[k]]))))
    return out
