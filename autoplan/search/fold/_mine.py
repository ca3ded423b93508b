"""TAPAS frequent-subgraph mining: fold repeated layers into classes of isomorphic instances.

TAPAS (Section 4.3, Algorithm 1) searches the GraphNode graph for the unique subgraphs that occur at
least ``minSupport`` times with at least ``minSize`` nodes: "It starts by treating each node as a
single-node subgraph and considers them as initial candidates. Each candidate subgraph is then
counted in the graph for frequency [...] It then iteratively expands these candidates by merging the
existing frequent subgraphs that share a common edge, thereby generating larger candidate
subgraphs." The planner then searches a strategy for one representative per unique subgraph and
reuses it for every occurrence (the search space is *folded*).

:func:`mine` implements that Apriori growth with *embeddings*, which keeps it near linear:

1. **GraphNodes** (:func:`~autoplan.search.fold._graphnodes.group_graphnodes`) are the units; each has
   a structural key (operator primitives, shapes, dtypes and params; no scope names, so a model
   traced with ``scopes=False`` folds the same).
2. **Frequent single nodes.** Weisfeiler-Lehman refinement of the keys over the GraphNode DAG
   (edges labelled with the operand ports they carry) gives every GraphNode a signature of its
   ``wl_rounds``-neighbourhood. GraphNodes whose signature occurs ``c >= min_support`` times are
   candidate seeds: a frequent 1-node subgraph together with its ``c`` non-overlapping occurrences.
3. **Apriori growth.** A candidate subgraph is grown one adjacent GraphNode at a time, in all
   occurrences at once: an extension (an edge with its ports to a neighbour with a given key, seen
   from one node of the subgraph) is kept only if every occurrence has it, the ``c`` new nodes are
   distinct and not yet used (occurrences stay non-overlapping), and each new node connects to the
   occurrence it joins exactly as in the others (so occurrences stay isomorphic). Growth stops when
   no extension is frequent: the result is a *maximal* frequent subgraph. Extensions toward
   producers are tried before extensions toward consumers (``"producers"`` order) and the other way
   round (``"consumers"``); of the two, the one covering more operators wins, then the one with
   fewer bytes crossing instance boundaries. This fixes where instances start: a GPT layer starts
   at its first LayerNorm because the first layer's input comes from the embedding, and a
   Wide-ResNet block ends at its residual ReLU because the next stage starts differently.
4. **Greedy cover.** Seeds of each distinct count are grown (the few counts that cover most
   GraphNodes, the heaviest seed per count), the class covering the most operators is kept, its
   GraphNodes are removed, and the search repeats on what is left, so classes are disjoint and the
   first class is the dominant repeated structure.
5. **Verification.** Every instance's operators are checked to be isomorphic to the first
   instance's under the position-by-position correspondence the growth built (same labels, same
   internal edges and operand ports: an exact isomorphism test in linear time); instances that
   fail are dropped. The class's identity is the canonical Weisfeiler-Lehman hash
   (:func:`canonical_hash`) of its representative over primitive-, shape- and dtype-labelled
   operators, which every (isomorphic) instance shares.

Training steps: the backward and optimizer-update operators of a layer are reached from its
forward operators (saved activations, gradients, the parameter each update reads) and are attached
to the same instance, so a GPT with ``L`` layers yields one class of ``L`` instances, each holding a
layer's forward, backward and update operators. What stays unassigned is the embedding, the head,
the loss and the optimizer's shared scalars (bias corrections, step count).
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain
from typing import Any

import numpy as np

from autoplan._gc import gc_paused
from autoplan._memo import per_owner
from autoplan._options import require_graph
from autoplan.search.fold._graphnodes import GraphNodeGraph, OpLabeler, group_graphnodes
from autoplan.tracing._graph import OpGraph
from autoplan.tracing._operands import index_in_run, operand_arrays, runs

__all__ = ["RepeatedClass", "MiningResult", "mine", "canonical_hash"]


@dataclass(frozen=True)
class RepeatedClass:
    """A unique subgraph and its non-overlapping, isomorphic occurrences.

    Attributes:
        id: index in ``MiningResult.classes`` (classes are ordered by operators covered).
        hash: canonical Weisfeiler-Lehman hash of the instances (:func:`canonical_hash`).
        instances: each occurrence as a sorted tuple of operator ids, in graph order of their
            first operator.
        aligned: for each instance, its operator ids in *corresponding order*: ``aligned[i][k]``
            and ``aligned[j][k]`` play the same role, so a strategy found for the representative
            (instance 0) maps onto instance ``j`` position by position.
        graphnodes: for each instance, its GraphNode ids in corresponding order.
    """

    id: int
    hash: str
    instances: list[tuple[int, ...]]
    aligned: list[tuple[int, ...]] = field(repr=False)
    graphnodes: list[tuple[int, ...]] = field(repr=False)

    @property
    def count(self) -> int:
        """Number of instances (the support)."""
        return len(self.instances)

    @property
    def size(self) -> int:
        """Operators per instance."""
        return len(self.instances[0])

    @property
    def representative(self) -> tuple[int, ...]:
        """The instance whose strategy is searched (the first)."""
        return self.instances[0]

    def __repr__(self) -> str:
        return (f"RepeatedClass(id={self.id}, hash={self.hash[:12]}, count={self.count}, "
                f"size={self.size} ops, graphnodes={len(self.graphnodes[0])})")


@dataclass
class MiningResult:
    """What :func:`mine` found.

    Attributes:
        classes: the repeated classes, largest cover first.
        fold_ratio: operators / (operators of one representative per class + unassigned
            operators): how much smaller the search becomes.
        unassigned: ids of the operators in no class.
        timings: seconds spent per phase (``graphnodes``, ``signatures``, ``grow``, ``verify``,
            ``total``).
        num_ops: operators in the graph.
        graphnodes: the GraphNode graph mined.
        trials: how many seed growths were run.
    """

    classes: list[RepeatedClass]
    fold_ratio: float
    unassigned: tuple[int, ...]
    timings: dict[str, float]
    num_ops: int
    graphnodes: GraphNodeGraph = field(repr=False)
    trials: int = 0

    def class_of(self) -> dict[int, tuple[int, int]]:
        """Map operator id -> (class id, instance index) for every assigned operator."""
        out: dict[int, tuple[int, int]] = {}
        for c in self.classes:
            for j, inst in enumerate(c.instances):
                for o in inst:
                    out[o] = (c.id, j)
        return out

    @property
    def folded_size(self) -> int:
        """Operators left to search: one representative per class plus the unassigned ones."""
        return sum(c.size for c in self.classes) + len(self.unassigned)

    def summary(self) -> str:
        """A few lines: classes with their counts and sizes, fold ratio, timings."""
        lines = [f"mined {self.num_ops} operators ({len(self.graphnodes)} GraphNodes) in "
                 f"{self.timings.get('total', 0.0):.2f} s: {len(self.classes)} classes, "
                 f"{len(self.unassigned)} unassigned, fold ratio {self.fold_ratio:.2f}"]
        for c in self.classes[:12]:
            lines.append(f"  class {c.id}: {c.count} x {c.size} ops "
                         f"({len(c.graphnodes[0])} GraphNodes), hash {c.hash[:12]}")
        if len(self.classes) > 12:
            lines.append(f"  ... {len(self.classes) - 12} more")
        return "\n".join(lines)


# ---- canonical hashing ---------------------------------------------------------------------

def canonical_hash(graph: OpGraph, ops: Iterable[int], iterations: int = 3,
                   labeler: OpLabeler | None = None) -> str:
    """Canonical Weisfeiler-Lehman hash of the subgraph induced by ``ops``.

    Nodes are labelled by :func:`~autoplan.search.fold._graphnodes.op_label` (primitive, shapes,
    dtypes, params; no scopes or ids), edges by ``(output index, operand index)``. Each round
    relabels a node with the hash of its label and the sorted labels of its in- and out-neighbours
    with their edge labels; the result hashes the sorted multiset of final labels. Isomorphic
    subgraphs get equal hashes (the converse holds up to WL's usual limits).

    Args:
        graph: the operator graph.
        ops: operator ids of the subgraph.
        iterations: refinement rounds.
        labeler: a cached :class:`OpLabeler` of ``graph`` (built when omitted).

    Returns:
        A 32-hex-digit string.
    """
    lab = labeler or OpLabeler(graph)
    nodes = sorted(set(ops))
    inside = set(nodes)
    preds: dict[int, list[tuple[str, int]]] = {o: [] for o in nodes}
    succs: dict[int, list[tuple[str, int]]] = {o: [] for o in nodes}
    for o in nodes:
        op = graph.ops[o]
        for k, t in enumerate(op.inputs):
            if t is None:
                continue
            p = graph.tensors[t].producer
            if p in inside:
                e = f"{graph.ops[p].outputs.index(t)}:{k}"
                preds[o].append((e, p))
                succs[p].append((e, o))
    labels = {o: lab.digest(o) for o in nodes}
    for _ in range(iterations):
        new = {}
        for o in nodes:
            s = (labels[o] + "<" + ",".join(sorted(e + labels[p] for e, p in preds[o]))
                 + ">" + ",".join(sorted(e + labels[c] for e, c in succs[o])))
            new[o] = hashlib.blake2b(s.encode(), digest_size=8).hexdigest()
        labels = new
    final = ",".join(sorted(labels.values()))
    n_edges = sum(len(v) for v in preds.values())
    return hashlib.blake2b(f"{len(nodes)}|{n_edges}|{final}".encode(), digest_size=16).hexdigest()


# ---- the miner -----------------------------------------------------------------------------

class _SlottedGraph:
    """The GraphNode graph as the miner reads it: each GraphNode's interned key, operator count,
    FLOPs and role; its edges with interned port labels; and, per direction (producers,
    consumers, GraphNodes sharing a parameter), each GraphNode's neighbour slots (the neighbour
    reached by an edge label, neighbour key and rank), as dictionaries and as arrays."""

    def __init__(self, gng: GraphNodeGraph):
        self.gng = gng
        nodes = gng.nodes
        n = len(nodes)
        self.n = n
        self.key = [g.key for g in nodes]
        self.nops = [len(g.ops) for g in nodes]
        self.flops = [g.flops for g in nodes]
        self.forward = [g.role == "forward" for g in nodes]
        self.backward = [g.role == "backward" for g in nodes]
        # edges (u, v) with their interned port labels, as arrays
        # (an edge's ports as the bytes of its rows: equal bytes, equal ports)
        etab: dict[Any, int] = {}
        ea = gng.edge_arrays
        buf = ea.ports.tobytes()
        at = (ea.port_ptr * ea.ports.itemsize * 4).tolist()
        elab = np.array([etab.setdefault(buf[a:b], len(etab)) for a, b in zip(at, at[1:])],
                        dtype=np.int64)
        src, dst = ea.u.copy(), ea.v.copy()
        self.edge_arrays = (src, dst, elab.astype(np.uint64))
        # GraphNodes reading the same parameter / optimizer-state input: a third kind of adjacency
        # (an update GraphNode and the forward GraphNode of its parameter are otherwise unlinked)
        share_g, share_e, share_nb = _shared_state_edges(gng, etab)
        # slots: (direction, edge label, neighbour key, rank, count) -> neighbour; and for each
        # node and direction, an id of its set of slots (equal ids: the same slots). Built over
        # arrays (_slots_of); only the per-node dictionaries and tuples are made in Python.
        key = np.array(self.key, dtype=np.int64)
        directions = ((dst, elab, src), (src, elab, dst),
                      (np.array(share_g, dtype=np.int64), np.array(share_e, dtype=np.int64),
                       np.array(share_nb, dtype=np.int64)))
        self.slots: tuple[list[dict[int, int]], ...] = ([], [], [])
        self.slot_set: tuple[list[int], ...] = ([], [], [])
        self.slot_edge: dict[int, tuple[int, int]] = {}
        settab: dict[tuple[int, ...], int] = {}
        per_dir = []
        for d, (g, e, nb) in enumerate(directions):
            order = np.argsort(g, kind="stable")  # each node's entries in its adjacency order
            g, sk, e, nb = _slots_of(d, g[order], e[order], nb[order], key, self.slot_edge)
            bounds = np.searchsorted(g, np.arange(n + 1)).tolist()
            sks, nbs = sk.tolist(), nb.tolist()
            self.slots[d].extend([{sks[a]: nbs[a]} if b - a == 1 else
                                  dict(zip(sks[a:b], nbs[a:b])) if b != a else {}
                                  for a, b in zip(bounds, bounds[1:])])
            self.slot_set[d].extend([settab.setdefault(tuple(sks[a:b]), len(settab))
                                     for a, b in zip(bounds, bounds[1:])])
            per_dir.append((g, sk, e * 3 + d, nb))
        # the slots as sorted arrays too: per direction, node * slots + slot -> neighbour
        self.slot_arrays = []
        for g, sk, _code, nb in per_dir:
            gk = g * len(self.slot_edge) + sk
            order = np.argsort(gk)
            self.slot_arrays.append((gk[order], nb[order]))
        # every node's neighbours in all directions, in slot order, with the (direction, edge
        # label) of each: node g's are entries ptr[g]:ptr[g + 1] of nbr_arrays (neighbour,
        # 3 * edge label + direction) and of nbr_lists (ptr, (direction, edge label), neighbour)
        g, sk, code, nb = (np.concatenate(c) for c in zip(*per_dir))
        order = np.argsort(g, kind="stable")
        g, sk, code, nb = g[order], sk[order], code[order], nb[order]
        ptr = np.searchsorted(g, np.arange(n + 1))
        self.nbr_arrays = (ptr, nb, code)
        slot_edge = self.slot_edge
        self.nbr_lists = (ptr.tolist(), [slot_edge[s] for s in sk.tolist()], nb.tolist())
        self.forward_array = np.array(self.forward, dtype=bool)
        self.slot_set_array = np.array(self.slot_set, dtype=np.int64)

    @cached_property
    def nbrs(self) -> list[list[tuple[tuple[int, int], int]]]:
        """Each node's neighbours in all directions (in slot order) with the (direction, edge
        label) of each (made when asked: the growth reads ``nbr_lists``)."""
        ptr, ses, nbs = self.nbr_lists
        return [list(zip(ses[a:b], nbs[a:b])) for a, b in zip(ptr, ptr[1:])]

    @cached_property
    def edge_bytes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The GraphNode edges as arrays: source, destination, bytes."""
        ea = self.gng.edge_arrays
        return ea.u, ea.v, self.gng.edge_bytes

    def wl(self, rounds: int) -> list[list[int]]:
        """Weisfeiler-Lehman labels after 0, 1, .., ``rounds`` refinements of the keys, over
        arrays.

        A node's new label names (its label, the multiset of (edge label, label) of its
        producers, that of its consumers); each multiset is summed from 64-bit hashes of its
        elements (order-free; two different multisets collide with probability ~2^-64).
        """
        lab = np.asarray(self.key, dtype=np.uint64)
        src, dst, elab = self.edge_arrays
        elab = elab << np.uint64(32)
        levels = [list(self.key)]
        # the sums per node as sums of runs of the edges sorted by node (uint64 sums wrap)
        by_dst, by_src = np.argsort(dst, kind="stable"), np.argsort(src, kind="stable")
        dst_runs = np.flatnonzero(_runs(dst[by_dst]))
        src_runs = np.flatnonzero(_runs(src[by_src]))
        for _ in range(rounds):
            h_in = np.zeros(self.n, dtype=np.uint64)
            h_out = np.zeros(self.n, dtype=np.uint64)
            if len(src):
                h_in[dst[by_dst[dst_runs]]] = np.add.reduceat(
                    _mix(elab | lab[src])[by_dst], dst_runs)
                h_out[src[by_src[src_runs]]] = np.add.reduceat(
                    _mix(elab | lab[dst])[by_src], src_runs)
            # new labels: the ranks of the distinct (label, h_in, h_out) rows, in row order
            order = np.lexsort((h_out, h_in, lab))
            new = np.empty(self.n, dtype=np.int64)
            new[order] = np.cumsum(_runs(lab[order], h_in[order], h_out[order])) - 1
            lab = new.astype(np.uint64)
            levels.append(new.tolist())
        return levels



def _shared_state_edges(gng: GraphNodeGraph, etab: dict[Any, int]
                        ) -> tuple[list[int], list[int], list[int]]:
    """Edges between GraphNodes reading the same parameter or optimizer-state input (read by at
    most 16 operators), labelled by the ports read (interned into ``etab``): per edge, in the
    order made, its GraphNode, its label and its neighbour."""
    share_g: list[int] = []
    share_e: list[int] = []
    share_nb: list[int] = []
    graph = gng.graph
    node_of_op = gng.node_of_op
    member = gng.member_of_op
    ops = graph.ops
    consumers = graph.consumers
    state = sorted((consumers[gi.tensor][0], gi.tensor) for gi in graph.inputs
                   if gi.kind in ("parameter", "optimizer_state") and consumers[gi.tensor])
    for _first, t in state:
        readers = consumers[t]
        if len(readers) > 16:  # an input read everywhere links nothing in particular
            continue
        rs = [(node_of_op[c], member[c], k)
              for c in dict.fromkeys(readers)
              for k, x in enumerate(ops[c].inputs) if x == t]
        for ga, ma, ka in rs:
            for gb, mb, kb in rs:
                if ga != gb:
                    share_g.append(ga)
                    share_e.append(etab.setdefault(("share", ma, ka, mb, kb), len(etab)))
                    share_nb.append(gb)
    return share_g, share_e, share_nb


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a 64-bit mixing of each element (uint64 arithmetic wraps)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _runs(*cols: np.ndarray) -> np.ndarray:
    """For rows sorted by ``cols``: whether each row starts a run of equal rows."""
    start = np.ones(len(cols[0]), dtype=bool)
    if len(start):
        start[1:] = np.any([c[1:] != c[:-1] for c in cols], axis=0)
    return start


def _slots_of(d: int, g: np.ndarray, e: np.ndarray, nb: np.ndarray, key: np.ndarray,
              slot_edge: dict[int, tuple[int, int]]) -> tuple[np.ndarray, ...]:
    """One direction's neighbour slots, over arrays.

    ``g``, ``e``, ``nb``: the direction's adjacency entries (node, edge label, neighbour), grouped
    by node, each node's in its list order. A node's neighbours of one (edge label, neighbour key)
    form a group; groups come in the order of their first entry, and within a group the
    neighbours by id, the ``r``-th of ``c`` taking slot ``(d, edge label, key, r, c)``. Slots are
    numbered from ``len(slot_edge)`` in the order first met (nodes in id order, each node's slots
    in that order), and ``slot_edge`` gets each new slot's ``(d, edge label)``.

    This is the slot numbering of a per-node loop over dictionaries, done with a few sorts.

    Returns:
        The entries in slot order: node, slot id, edge label, neighbour.
    """
    m = len(g)
    k = key[nb]
    pos = np.arange(m)
    # groups (node, edge label, neighbour key), each with its first entry's position
    o = np.lexsort((pos, k, e, g))
    start = _runs(g[o], e[o], k[o])
    grp = np.empty(m, dtype=np.int64)
    grp[o] = np.cumsum(start) - 1
    first = np.empty(m, dtype=np.int64)
    first[o] = o[start][grp[o]]
    # slot order: by node, group's first entry, neighbour id; a group is then one run
    s = np.lexsort((nb, first, g))
    g, e, k, nb, grp = g[s], e[s], k[s], nb[s], grp[s]
    start = _runs(grp)
    run_at = np.flatnonzero(start)
    run_len = np.diff(np.append(run_at, m))
    run = np.cumsum(start) - 1
    rank = pos - run_at[run]
    count = run_len[run]
    # slot ids by first appearance of (edge label, key, rank, count)
    o = np.lexsort((count, rank, k, e))
    start = _runs(e[o], k[o], rank[o], count[o])
    uid = np.empty(m, dtype=np.int64)
    uid[o] = np.cumsum(start) - 1
    firsts = o[start]  # the stable sort puts each slot's first entry first
    by_first = np.argsort(firsts)
    base = len(slot_edge)
    sk_of_uid = np.empty(len(firsts), dtype=np.int64)
    sk_of_uid[by_first] = np.arange(base, base + len(firsts))
    for i, el in enumerate(e[firsts[by_first]].tolist()):
        slot_edge[base + i] = (d, el)
    return g, sk_of_uid[uid], e, nb


@dataclass
class _GrownClass:
    """A candidate class grown from seeds: its instances (GraphNode ids by position), the
    operators they cover, the bytes crossing their boundaries, and each instance's blame (how
    often it alone kept the others from growing)."""

    seed_label: tuple[int, int]  # (signature level, label)
    order: str
    inst: list[list[int]]  # per instance: GraphNode ids by position
    covered: int  # operators covered
    boundary: int = 0  # bytes crossing instance boundaries
    blame: list[int] = field(default_factory=list)


def _frequent(labels: Sequence[int], min_support: int) -> dict[int, list[int]]:
    """The labels given to at least ``min_support`` GraphNodes, each with its GraphNodes in id
    order, in the order of their first GraphNode (a dictionary of lists built over arrays)."""
    lab = np.asarray(labels, dtype=np.int64)
    order = np.argsort(lab, kind="stable")
    start = np.flatnonzero(_runs(lab[order]))
    end = np.append(start[1:], len(lab))
    frequent = end - start >= min_support
    start, end = start[frequent], end[frequent]
    by_first = np.argsort(order[start])  # a run's first GraphNode is its smallest
    members = order.tolist()
    return {lab: members[a:b] for lab, a, b in zip(lab[order[start[by_first]]].tolist(),
                                                    start[by_first].tolist(),
                                                    end[by_first].tolist())}


def _cover(ix: _SlottedGraph, inst: list[list[int]]) -> int:
    return sum(map(ix.nops.__getitem__, chain.from_iterable(inst)))


_WIDE = 32  # from this many instances on, _grow checks candidate columns over arrays


def _grow(ix: _SlottedGraph, seeds: Sequence[int], claimed: bytearray,
          order: str) -> tuple[list[list[int]], list[int]]:
    """Apriori growth of the 1-node subgraph at ``seeds`` in all occurrences at once.

    Two phases: first over forward GraphNodes only (which fixes where the layers start and end),
    then over all (attaching backward and update GraphNodes, first those one edge away from the
    instance, then the rest). ``order`` says which extensions are tried first: ``"producers"``
    (toward the inputs) for forward GraphNodes and toward consumers for backward ones (the
    backward pass runs the layers in reverse), or the mirror image for ``"consumers"``.

    Returns:
        Per instance its GraphNode ids by position, and per instance how often it alone kept the
        others from growing (its blame).
    """
    g = _Growth(ix, seeds, claimed, order)
    g.run([0], forward_only=ix.forward[seeds[0]])
    # attach what hangs off the instance one edge away first, then grow freely
    first: list[int] = []
    for p in range(len(g.cols)):
        for d in (0, 1, 2):
            g.extend(p, d, False, first)
    g.run(list(range(len(g.cols))), forward_only=False)
    inst = [[col[j] for col in g.cols] for j in range(g.n_inst)]
    return inst, g.blame


class _Growth:
    """A pattern growing in all its occurrences at once (:func:`_grow`): its GraphNodes by
    position, which GraphNodes the occurrences own and where, and each occurrence's blame.

    ``cols[p][j]`` is instance ``j``'s GraphNode at position ``p``; for each GraphNode, whether an
    instance owns it, and (``own_inst``, ``own_pos``) which one, at which position (-1, 0: none).
    With many instances (from ``_WIDE`` on), a candidate column is checked over arrays: the same
    tests, at a cost that hardly grows with the instances (Python, per instance, costs more from
    about ``_WIDE`` instances on); ``own_inst`` and ``own_pos`` are then arrays, else lists.
    """

    def __init__(self, ix: _SlottedGraph, seeds: Sequence[int], claimed: bytearray, order: str):
        """Start the pattern at its one position, ``seeds``."""
        self.ix = ix
        self.claimed = claimed
        self.n_inst = n_inst = len(seeds)
        self.cols: list[list[int]] = [list(seeds)]
        self.owned = owned = bytearray(ix.n)
        for s in seeds:
            owned[s] = 1
        self.primary = 0 if order == "producers" else 1
        self.blame = [0] * n_inst
        self.odd = max(1, n_inst // 3)
        self.others = range(1, n_inst)
        ptr, nb_node, nb_code = ix.nbr_arrays
        # a signature entry's code (below big), offset by its instance: instance * big + code
        self.big = big = (int(nb_code.max(initial=0)) + 1) * ix.n
        self.wide = n_inst >= _WIDE and big * n_inst < 2**62
        if self.wide:
            self.own_inst_a = np.full(ix.n, -1, dtype=np.int64)
            self.own_inst_a[self.cols[0]] = np.arange(n_inst)
            self.own_pos_a = np.zeros(ix.n, dtype=np.int64)
            self.owned_a = np.frombuffer(owned, dtype=np.uint8)  # views: writes reach the bytearrays
            self.claimed_a = np.frombuffer(claimed, dtype=np.uint8)
            self.rows = np.arange(n_inst)
            self.offsets = self.rows * big
            self.cols_a = [np.array(self.cols[0], dtype=np.int64)]  # cols as arrays
        else:
            self.own_inst = own_inst = [-1] * ix.n
            self.own_pos = [0] * ix.n
            for j, s in enumerate(seeds):
                own_inst[s] = j
        self.differ_at = [self.differing(self.cols[0])]

    def signature(self, c: int, j: int) -> list:
        """How ``c`` connects to instance ``j``: (direction and edge label, position) pairs."""
        ptr_l, ses, nbs = self.ix.nbr_lists
        own_inst, own_pos = self.own_inst, self.own_pos
        a, b = ptr_l[c], ptr_l[c + 1]
        sig = [(se, own_pos[nb]) for se, nb in zip(ses[a:b], nbs[a:b]) if own_inst[nb] == j]
        sig.sort()
        return sig

    def same_signatures(self, c: np.ndarray) -> bool:
        """Whether ``signature(c[j], j)`` is the same for every instance ``j``, over arrays:
        each signature entry coded as ``(3 * edge label + direction) * n + position`` (below
        ``big``), plus ``j * big``. Sorted, the codes fall into equal rows after removing the
        offsets exactly when every instance has the same multiset of codes (had some instance
        more, a row would hold codes of two instances, and the rows could not all agree)."""
        ptr, nb_node, nb_code = self.ix.nbr_arrays
        big, offsets, n_inst = self.big, self.offsets, self.n_inst
        start = ptr[c]
        lens = ptr[c + 1] - start
        j = np.repeat(offsets, lens)
        idx = np.arange(len(j)) + np.repeat(start - (np.cumsum(lens) - lens), lens)
        nb = nb_node[idx]
        inside = self.own_inst_a[nb] * big == j
        if np.count_nonzero(inside) % n_inst:
            return False
        code = np.sort((j + nb_code[idx] * self.ix.n + self.own_pos_a[nb])[inside])
        code = code.reshape(n_inst, -1)
        return bool((code - offsets[:, None] == code[0]).all())

    def differing(self, col: list[int]) -> tuple[list[int], ...]:
        """Per direction, the instances whose slots at this position differ from instance
        0's (usually none)."""
        if self.wide:
            slot_set_a = self.ix.slot_set_array
            differ = slot_set_a[:, col] != slot_set_a[:, col[:1]]
            if not differ.any():
                return [], [], []
            return tuple([np.flatnonzero(row).tolist() for row in differ])
        slot_set = self.ix.slot_set
        return tuple([j for j in self.others if slot_set[d][col[j]] != slot_set[d][col[0]]]
                     for d in (0, 1, 2))

    def extend(self, p: int, d: int, forward_only: bool, pending: list[int]) -> None:
        """Add every column reached from position ``p`` through a slot of direction ``d`` that
        all instances have, whose GraphNodes are distinct, free, and joined to their instances
        alike; their positions go to ``pending``. Instances missing a slot the others have are
        blamed."""
        ix, cols, blame, claimed, owned = self.ix, self.cols, self.blame, self.claimed, self.owned
        n_inst, wide, others, forward = self.n_inst, self.wide, self.others, ix.forward
        slots_d = ix.slots[d]
        at = cols[p]
        differ = self.differ_at[p][d]
        map0 = slots_d[at[0]]
        if wide:
            slot_gk_d, slot_nb_d = ix.slot_arrays[d]
            n_slots = len(ix.slot_edge)
        else:
            own_inst, own_pos, signature = self.own_inst, self.own_pos, self.signature
        if n_inst > 2 and differ and differ[0] == 1:
            for sk in slots_d[at[1]]:
                if sk not in map0 and all(sk in slots_d[at[j]] for j in range(2, n_inst)):
                    blame[0] += 1
        for sk, c0 in map0.items():
            if differ:
                missing = [j for j in differ if sk not in slots_d[at[j]]]
                if missing:
                    if len(missing) <= self.odd:
                        for j in missing:
                            blame[j] += 1
                    continue
            # instance 0's candidate decides most rejections alone
            if claimed[c0] or owned[c0] or (forward_only and not forward[c0]):
                continue
            pos = len(cols)
            if wide:  # every instance has slot sk here (the differing ones were checked)
                c = slot_nb_d[np.searchsorted(slot_gk_d, self.cols_a[p] * n_slots + sk)]
                distinct = np.sort(c)
                if ((distinct[1:] == distinct[:-1]).any() or self.claimed_a[c].any()
                        or self.owned_a[c].any()
                        or (forward_only and not ix.forward_array[c].all())
                        or not self.same_signatures(c)):
                    continue
                self.own_inst_a[c] = self.rows
                self.own_pos_a[c] = pos
                self.owned_a[c] = 1
                self.cols_a.append(c)
                cands = c.tolist()
            else:
                cands = [slots_d[g][sk] for g in at]
                if len(set(cands)) != n_inst:
                    continue
                if any(claimed[c] or owned[c] or (forward_only and not forward[c])
                       for c in cands):
                    continue
                sig0 = signature(c0, 0)
                if any(signature(cands[j], j) != sig0 for j in others):
                    continue
                for j, c in enumerate(cands):
                    own_inst[c] = j
                    own_pos[c] = pos
                    owned[c] = 1
            cols.append(cands)
            self.differ_at.append(self.differing(cands))
            pending.append(pos)

    def run(self, positions: list[int], forward_only: bool) -> None:
        """Grow from ``positions`` until no extension is frequent: each new position's preferred
        direction first (by ``order``; reversed for backward GraphNodes), the others after."""
        hi: deque[tuple[int, int]] = deque()
        lo: deque[tuple[int, int]] = deque()
        cols, backward, primary = self.cols, self.ix.backward, self.primary

        def push(p: int) -> None:
            d = 1 - primary if backward[cols[p][0]] else primary
            hi.append((p, d))
            lo.append((p, 1 - d))
            lo.append((p, 2))

        for p in positions:
            push(p)
        while hi or lo:
            p, d = hi.popleft() if hi else lo.popleft()
            pending: list[int] = []
            self.extend(p, d, forward_only, pending)
            for q in pending:
                push(q)


def _boundary_bytes(ix: _SlottedGraph, inst: list[list[int]]) -> int:
    """Bytes crossing instance boundaries: each instance's edges to GraphNodes outside it (an
    edge between two instances counts for both)."""
    own = np.full(ix.n, -1, dtype=np.int64)
    for j, members in enumerate(inst):
        own[members] = j
    src, dst, nbytes = ix.edge_bytes
    a, b = own[src], own[dst]
    crossing = (a != b).astype(np.int64) * ((a >= 0).astype(np.int64) + (b >= 0))
    return int(crossing @ nbytes)


def _aligned_ops(gng: GraphNodeGraph, inst: list[int]) -> tuple[int, ...]:
    nodes = gng.nodes
    return tuple(chain.from_iterable([nodes[g].ops for g in inst]))


def _positional_signature(graph: OpGraph, labeler: OpLabeler, aligned: Sequence[int]) -> tuple:
    """Each operator's label and, per operand, ``(position of its producer, output index)`` when
    the producer is in ``aligned``, -1 when it is not, None for a literal.

    The definition :func:`_same_signature_as_first` checks, for all instances at once."""
    pos = {o: i for i, o in enumerate(aligned)}
    ops, tensors, ids = graph.ops, graph.tensors, labeler.ids
    return tuple([
        (ids[o], tuple([
            None if t is None
            else (pos[p], ops[p].outputs.index(t)) if (p := tensors[t].producer) in pos else -1
            for t in ops[o].inputs]))
        for o in aligned])


def _same_signature_as_first(graph: OpGraph, labeler: OpLabeler,
                             aligned: Sequence[Sequence[int]]) -> list[int]:
    """The indices ``j`` of the instances whose :func:`_positional_signature` equals instance
    0's (0 included), computed over arrays for all instances at once.

    The instances must be disjoint. Each operand is coded as -2 (a literal), -1 (made outside
    its instance), or ``position * k + output index`` of its producer in its instance (``k``
    exceeds every output index); an instance matches when its labels, operand counts and
    operand codes equal instance 0's. A tensor's producer is the operator listing it among its
    outputs (which ``_positional_signature`` relies on too). Reading each operator once, in id
    order, costs much less than reading them in instance order (memory locality).
    """
    size = len(aligned[0])
    rows = [j for j, a in enumerate(aligned) if len(a) == size]
    m = len(rows)
    ops = graph.ops
    by_row = np.array([aligned[j] for j in rows], dtype=np.int64).reshape(m, size)
    row_of_op = np.full(len(ops), -1, dtype=np.int64)
    pos_of_op = np.zeros(len(ops), dtype=np.int64)
    row_of_op[by_row] = np.arange(m)[:, None]
    pos_of_op[by_row] = np.arange(size)
    label = np.array(labeler.ids, dtype=np.int64)[by_row]
    # operands and results of the operators, in id order
    flat = np.sort(by_row, axis=None)
    arr = operand_arrays(graph)
    n_in = arr.count[flat]
    n_out = arr.out_count[flat]
    n_in_of = np.zeros(len(ops), dtype=np.int64)
    n_in_of[flat] = n_in
    n_in_rows = n_in_of[by_row]
    ok = (label == label[0]).all(axis=1) & (n_in_rows == n_in_rows[0]).all(axis=1)
    # each result tensor's instance, its producer's position, and its first output index
    out_t = arr.output[runs(arr.out_start[flat], n_out)]
    out_op = np.repeat(flat, n_out)
    n_t = len(graph.tensors)
    t_row = np.full(n_t, -1, dtype=np.int64)
    t_row[out_t] = row_of_op[out_op]
    t_pos = np.zeros(n_t, dtype=np.int64)
    t_pos[out_t] = pos_of_op[out_op]
    t_index = np.full(n_t, len(out_t), dtype=np.int64)
    np.minimum.at(t_index, out_t, index_in_run(n_out))
    # each operand's code, instance, and place among its instance's operands
    t = arr.tensor[runs(arr.start[flat], n_in)]  # (a literal is -1)
    literal = t < 0
    op = np.repeat(flat, n_in)
    row = row_of_op[op]
    inside = ~literal & (t_row[t] == row)
    k = int(n_out.max(initial=0)) + 1
    code = np.where(literal, -2, np.where(inside, t_pos[t] * k + t_index[t], -1))
    nth = index_in_run(n_in)  # operand index
    first = np.cumsum(n_in_rows[0]) - n_in_rows[0]  # where each position's operands start
    keep = ok[row]
    block = np.zeros((m, int(n_in_rows[0].sum())), dtype=np.int64)
    block[row[keep], first[pos_of_op[op[keep]]] + nth[keep]] = code[keep]
    same = ok & (block == block[0]).all(axis=1)
    return [rows[r] for r in np.flatnonzero(same).tolist()]


def _saved(tr: _GrownClass, ix: _SlottedGraph) -> int:
    """Operators a class saves from the search: all its operators but one representative's."""
    return tr.covered - sum(ix.nops[g] for g in tr.inst[0])


def _orient(ix: _SlottedGraph, best: _GrownClass, seeds: list[int], claimed: bytearray,
            min_size: int) -> tuple[_GrownClass, int]:
    """Grow ``seeds`` in the other order too; keep the growth that saves more operators, then
    the one with fewer bytes crossing instance boundaries. Returns it and the growths run."""
    other = "consumers" if best.order == "producers" else "producers"
    inst, blame = _grow(ix, seeds, claimed, other)
    alt = _GrownClass(best.seed_label, other, inst, _cover(ix, inst), blame=blame)
    if len(alt.inst[0]) >= min_size:
        if _saved(alt, ix) > _saved(best, ix):
            return alt, 1
        if _saved(alt, ix) == _saved(best, ix):  # a tie: the boundary bytes decide
            best.boundary = _boundary_bytes(ix, best.inst)
            alt.boundary = _boundary_bytes(ix, alt.inst)
            if alt.boundary < best.boundary:
                return alt, 1
    return best, 1


def _subsumed(seeds: Sequence[int], r: _GrownClass, where: dict[int, int]) -> bool:
    """Whether ``seeds`` sit at one position of every instance of the grown ``r``. Such seeds
    enter ``r``'s occurrences at another node, and are not grown again: the growth is taken to
    reach the same maximal pattern (it does on GPT, MoE, Wide-ResNet and MLP, where growing them
    anyway changes no class)."""
    if len(seeds) != len(r.inst):
        return False
    p = where.get(seeds[0])
    return p is not None and all(where.get(s) == p for s in seeds)


def _greedy_round(ix: _SlottedGraph, groups: list[dict[int, list[int]]], claimed: bytearray,
                  min_support: int, min_size: int, seeds_per_level: int, complete_gain: float) -> tuple[_GrownClass | None, int, list[tuple[int, int]]]:
    """One round of the greedy cover: grow candidate seeds, return the class that saves most.

    Candidates: for each signature level and each distinct count, the heaviest (then earliest)
    seed label; per level the ``seeds_per_level`` counts covering the most operators. Identical
    seed sets found at several levels are grown once, and so are seed sets at one position of
    every instance of a pattern grown already (:func:`_subsumed`).

    Returns:
        The best grown class (None if no seed grew to ``min_size`` GraphNodes), the number of
        growths run, and the ``(level, label)`` seeds tried.
    """
    cands: list[tuple[int, int]] = []
    seen: set[tuple[int, ...]] = set()
    for level, grp in enumerate(groups):
        best_for_count: dict[int, int] = {}
        best_weight: dict[int, tuple[float, int]] = {}  # (max flops, -first seed) of those
        mass: dict[int, int] = {}
        for lab, free in grp.items():
            c = len(free)
            mass[c] = mass.get(c, 0) + sum(map(ix.nops.__getitem__, free))
            weight = (max(map(ix.flops.__getitem__, free)), -free[0])
            cur = best_weight.get(c)
            if cur is None or weight > cur:
                best_for_count[c] = lab
                best_weight[c] = weight
        for c in sorted(mass, key=lambda c: (-mass[c], -c))[:seeds_per_level]:
            lab = best_for_count[c]
            key = tuple(grp[lab])
            if key not in seen:
                seen.add(key)
                cands.append((level, lab))
    trials = 0
    results: list[_GrownClass] = []
    where: list[dict[int, int]] = []  # per result: GraphNode -> its position in its instance
    for level, lab in cands:
        seeds = groups[level][lab]
        if any(_subsumed(seeds, r, w) for r, w in zip(results, where)):
            continue
        inst, blame = _grow(ix, seeds, claimed, "producers")
        where.append({g: p for m in inst for p, g in enumerate(m)})
        trials += 1
        results.append(_GrownClass((level, lab), "producers", inst, _cover(ix, inst), blame=blame))
    ok = [r for r in results if len(r.inst[0]) >= min_size]
    if not ok:
        return None, trials, cands
    best = max(ok, key=lambda r: (_saved(r, ix), r.covered))
    best, n = _orient(ix, best, [m[0] for m in best.inst], claimed, min_size)
    trials += n
    # an odd occurrence (the first block of a stage, with another input shape) can keep the
    # others from growing: drop it when the rest then grow by complete_gain of their size
    while len(best.inst) > min_support and max(best.blame) >= 2:
        seeds = [m[0] for m in best.inst]
        j = max(range(len(seeds)), key=lambda i: best.blame[i])
        rest = seeds[:j] + seeds[j + 1:]
        hit = next((r for r, w in zip(results, where) if _subsumed(rest, r, w)), None)
        if hit is not None:  # grown already, from other seeds of the same occurrences
            inst, blame = hit.inst, hit.blame
        else:
            inst, blame = _grow(ix, rest, claimed, "producers")
            trials += 1
        cand = _GrownClass(best.seed_label, "producers", inst, _cover(ix, inst), blame=blame)
        if cand.covered / len(inst) < (1.0 + complete_gain) * best.covered / len(best.inst):
            break
        best, n = _orient(ix, cand, rest, claimed, min_size)
        trials += n
    return best, trials, cands


@gc_paused
def mine(graph: OpGraph, min_support: int = 2, min_size: int = 8, *,
         graphnodes: GraphNodeGraph | None = None, wl_rounds: int = 3, seeds_per_level: int = 2,
         max_classes: int | None = None, complete_gain: float = 0.05,
         verify: bool = True) -> MiningResult:
    """Find the repeated subgraphs of ``graph`` (TAPAS subgraph mining, see the module docstring).

    Args:
        graph: the operator graph (from :func:`autoplan.trace`).
        min_support: TAPAS's ``minSupport``: the fewest occurrences a class needs.
        min_size: TAPAS's ``minSize``: the fewest GraphNodes per occurrence.
        graphnodes: a GraphNode graph of ``graph`` already built (else built here).
        wl_rounds: Weisfeiler-Lehman rounds for the seed signatures (larger = seeds must agree on
            a wider neighbourhood).
        seeds_per_level: per greedy round and signature level (0 .. ``wl_rounds``), how many seed
            counts are grown.
        max_classes: stop after this many classes (None: until no frequent subgraph is left).
        complete_gain: an occurrence that blocks the others' growth is dropped from a class when
            the other occurrences then grow by at least this fraction of their size.
        verify: check every instance against the representative (position by position) and by
            canonical hash; instances that fail are dropped.

    Returns:
        The :class:`MiningResult`.

    Examples:
        >>> import jax, jax.numpy as jnp, autoplan
        >>> def f(ws, x):
        ...     x = jnp.tanh(x)
        ...     for w in ws:
        ...         x = jnp.tanh(x @ w) + x
        ...     return x.sum()
        >>> w = jax.ShapeDtypeStruct((8, 8), jnp.float32)
        >>> g = autoplan.trace(f, [w] * 4, jax.ShapeDtypeStruct((2, 8), jnp.float32))
        >>> r = mine(g, min_size=1)
        >>> [c.count for c in r.classes], r.fold_ratio > 1
        ([4], True)
    """
    require_graph("mine", graph)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    gng = graphnodes if graphnodes is not None else group_graphnodes(graph)
    timings["graphnodes"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    ix = _SlottedGraph(gng)
    wl_levels = ix.wl(wl_rounds)
    timings["signatures"] = time.perf_counter() - t1

    t2 = time.perf_counter()
    found, trials = _greedy_cover(ix, wl_levels, min_support, min_size, seeds_per_level,
                                  max_classes, complete_gain)
    timings["grow"] = time.perf_counter() - t2

    t3 = time.perf_counter()
    classes = _verified_classes(graph, gng, found, min_support, verify)
    timings["verify"] = time.perf_counter() - t3

    assigned = np.zeros(len(graph.ops), dtype=bool)
    for c in classes:
        assigned[list(chain.from_iterable(c.instances))] = True
    unassigned = tuple(np.flatnonzero(~assigned).tolist())
    folded = sum(c.size for c in classes) + len(unassigned)
    fold_ratio = len(graph.ops) / folded if folded else 1.0
    timings["total"] = time.perf_counter() - t0
    return MiningResult(classes=classes, fold_ratio=fold_ratio, unassigned=unassigned,
                        timings=timings, num_ops=len(graph.ops), graphnodes=gng, trials=trials)


def _greedy_cover(ix: _SlottedGraph, wl_levels: Sequence[Sequence[int]], min_support: int,
                  min_size: int, seeds_per_level: int, max_classes: int | None,
                  complete_gain: float) -> tuple[list[_GrownClass], int]:
    """The greedy cover: rounds of :func:`_greedy_round` over the seeds still free, each class
    found claiming its GraphNodes, until no seed grows (or ``max_classes``). Returns the classes
    in the order found and the growths run."""
    claimed = bytearray(ix.n)
    found: list[_GrownClass] = []
    trials = 0
    by_label = [_frequent(wl, min_support) for wl in wl_levels]
    dead: set[tuple[int, int]] = set()
    while max_classes is None or len(found) < max_classes:
        groups: list[dict[int, list[int]]] = []
        for level, bl in enumerate(by_label):
            grp: dict[int, list[int]] = {}
            for lab, members in bl.items():
                if (level, lab) in dead:
                    continue
                free = [g for g in members if not claimed[g]]
                if len(free) >= min_support:
                    grp[lab] = free
                else:
                    dead.add((level, lab))
            groups.append(grp)
        if not any(groups):
            break
        best, n, tried = _greedy_round(ix, groups, claimed, min_support, min_size, seeds_per_level,
                                       complete_gain)
        trials += n
        if best is None:
            dead.update(tried)
            continue
        for members in best.inst:
            for g in members:
                claimed[g] = 1
        found.append(best)
        dead.add(best.seed_label)
    return found, trials


def _verified_classes(graph: OpGraph, gng: GraphNodeGraph, found: Sequence[_GrownClass],
                      min_support: int, verify: bool) -> list[RepeatedClass]:
    """The grown classes as :class:`RepeatedClass` es, numbered largest cover first: instances
    that fail the isomorphism check against the representative dropped (with ``verify``), and
    classes left with fewer than ``min_support`` instances too."""
    labeler = gng.labeler or OpLabeler(graph)
    classes: list[RepeatedClass] = []
    for tr in found:
        aligned = [_aligned_ops(gng, members) for members in tr.inst]
        keep = list(range(len(aligned)))
        if verify:
            # position-by-position isomorphism to the representative (exact, linear); isomorphic
            # instances then share the representative's canonical hash
            keep = _same_signature_as_first(graph, labeler, aligned)
        if len(keep) < min_support:
            continue
        h = canonical_hash(graph, aligned[keep[0]], labeler=labeler)
        order = sorted(keep, key=lambda j: min(aligned[j]))
        classes.append(RepeatedClass(
            id=0, hash=h,
            instances=[tuple(sorted(aligned[j])) for j in order],
            aligned=[aligned[j] for j in order],
            graphnodes=[tuple(tr.inst[j]) for j in order]))
    classes.sort(key=lambda c: (-c.count * c.size, min(c.instances[0])))
    return [RepeatedClass(i, c.hash, c.instances, c.aligned, c.graphnodes)
            for i, c in enumerate(classes)]


@per_owner
def mining_of(graph: OpGraph) -> MiningResult:
    """:func:`mine` of ``graph``, computed once per graph: the mining the folded levels, the
    segments, the pipeline layers and the folding analysis all read."""
    return mine(graph)
