"""TAPAS frequent-subgraph mining: fold repeated layers into classes of isomorphic instances.

TAPAS (Section 4.3, Algorithm 1) searches the GraphNode graph for the unique subgraphs that occur at
least ``minSupport`` times with at least ``minSize`` nodes: "It starts by treating each node as a
single-node subgraph and considers them as initial candidates. Each candidate subgraph is then
counted in the graph for frequency [...] It then iteratively expands these candidates by merging the
existing frequent subgraphs that share a common edge, thereby generating larger candidate
subgraphs." The planner then searches a strategy for one representative per unique subgraph and
reuses it for every occurrence (the search space is *folded*).

:func:`mine` implements that Apriori growth with *embeddings*, which keeps it near linear:

1. **GraphNodes** (:func:`~autoplan.search._graphnodes.group_graphnodes`) are the units; each has
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

import numpy as np

from autoplan._gc import gc_paused
from autoplan._graph import OpGraph
from autoplan.search._graphnodes import GraphNodeGraph, OpLabeler, group_graphnodes

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

    Nodes are labelled by :func:`~autoplan.search._graphnodes.op_label` (primitive, shapes,
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

class _Index:
    """Interned labels and neighbour slots of the GraphNode graph."""

    def __init__(self, gng: GraphNodeGraph):
        self.gng = gng
        n = len(gng.nodes)
        self.n = n
        self.key = [g.key for g in gng.nodes]
        self.nops = [len(g.ops) for g in gng.nodes]
        self.flops = [g.flops for g in gng.nodes]
        self.forward = [g.role == "forward" for g in gng.nodes]
        self.backward = [g.role == "backward" for g in gng.nodes]
        etab: dict[tuple, int] = {}
        self.inn: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        self.out: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        self.ebytes: dict[tuple[int, int], int] = {}
        src: list[int] = []
        dst: list[int] = []
        elab: list[int] = []
        for (u, v), ports in gng.ports.items():
            e = etab.setdefault(ports, len(etab))
            self.out[u].append((e, v))
            self.inn[v].append((e, u))
            self.ebytes[(u, v)] = gng.edges[(u, v)]["bytes"]
            src.append(u)
            dst.append(v)
            elab.append(e)
        self.edge_arrays = (np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64),
                            np.array(elab, dtype=np.uint64))
        # GraphNodes reading the same parameter / optimizer-state input: a third kind of adjacency
        # (an update GraphNode and the forward GraphNode of its parameter are otherwise unlinked)
        self.share: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        graph = gng.graph
        node_of_op = gng.node_of_op
        consumers = graph.consumers
        state = sorted((consumers[gi.tensor][0], gi.tensor) for gi in graph.inputs
                       if gi.kind in ("parameter", "optimizer_state") and consumers[gi.tensor])
        for _first, t in state:
            readers = consumers[t]
            if len(readers) > 16:  # an input read everywhere links nothing in particular
                continue
            rs = [(node_of_op[c], gng.nodes[node_of_op[c]].ops.index(c), k)
                  for c in dict.fromkeys(readers)
                  for k, x in enumerate(graph.ops[c].inputs) if x == t]
            for ga, ma, ka in rs:
                for gb, mb, kb in rs:
                    if ga != gb:
                        e = etab.setdefault(("share", ma, ka, mb, kb), len(etab))
                        self.share[ga].append((e, gb))
        # slots: (direction, edge label, neighbour key, rank, count) -> neighbour; and for each
        # node and direction, an id of its set of slots (equal ids: the same slots)
        stab: dict[tuple, int] = {}
        settab: dict[tuple[int, ...], int] = {}
        key = self.key
        self.slots: tuple[list[dict[int, int]], ...] = ([], [], [])
        self.slot_set: tuple[list[int], ...] = ([], [], [])
        self.slot_edge: dict[int, tuple[int, int]] = {}
        slot_edge = self.slot_edge
        # every node's neighbours in all directions, with the (direction, edge label) of each
        self.nbrs: list[list[tuple[tuple[int, int], int]]] = [[] for _ in range(n)]
        for d, adj in ((0, self.inn), (1, self.out), (2, self.share)):
            slots_d, set_d = self.slots[d], self.slot_set[d]
            for g in range(n):
                m: dict[int, int] = {}
                nb_list = adj[g]
                if len(nb_list) == 1:  # the common case: one neighbour, one slot
                    e, nb = nb_list[0]
                    sk = stab.get((d, e, key[nb], 0, 1))
                    if sk is None:
                        sk = stab[(d, e, key[nb], 0, 1)] = len(stab)
                        slot_edge[sk] = (d, e)
                    m[sk] = nb
                    self.nbrs[g].append((slot_edge[sk], nb))
                elif nb_list:
                    by: dict[tuple[int, int], list[int]] = {}
                    for e, nb in nb_list:
                        by.setdefault((e, key[nb]), []).append(nb)
                    for (e, k), nbs in by.items():
                        nbs.sort()
                        for r, nb in enumerate(nbs):
                            sk = stab.get((d, e, k, r, len(nbs)))
                            if sk is None:
                                sk = stab[(d, e, k, r, len(nbs))] = len(stab)
                                slot_edge[sk] = (d, e)
                            m[sk] = nb
                    self.nbrs[g].extend([(slot_edge[sk], nb) for sk, nb in m.items()])
                slots_d.append(m)
                set_d.append(settab.setdefault(tuple(m), len(settab)))

    def wl(self, rounds: int) -> list[list[int]]:
        """Weisfeiler-Lehman labels after 0, 1, .., ``rounds`` refinements of the keys, over
        arrays.

        A node's new label names (its label, the multiset of (edge label, label) of its
        producers, that of its consumers); each multiset is summed from 64-bit hashes of its
        elements (order-free; two different multisets collide with probability ~2^-64).
        """
        lab = np.asarray(self.key, dtype=np.uint64)
        src, dst, elab = self.edge_arrays
        levels = [list(self.key)]
        for _ in range(rounds):
            h_in = np.zeros(self.n, dtype=np.uint64)
            h_out = np.zeros(self.n, dtype=np.uint64)
            np.add.at(h_in, dst, _mix((elab << np.uint64(32)) | lab[src]))
            np.add.at(h_out, src, _mix((elab << np.uint64(32)) | lab[dst]))
            _, inv = np.unique(np.stack([lab, h_in, h_out], axis=1), axis=0, return_inverse=True)
            lab = inv.reshape(-1).astype(np.uint64)
            levels.append(lab.astype(np.int64).tolist())
        return levels


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a 64-bit mixing of each element (uint64 arithmetic wraps)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@dataclass
class _Trial:
    seed_label: tuple[int, int]  # (signature level, label)
    order: str
    inst: list[list[int]]  # per instance: GraphNode ids by position
    covered: int  # operators covered
    boundary: int = 0  # bytes crossing instance boundaries
    blame: list[int] = field(default_factory=list)


def _cover(ix: _Index, inst: list[list[int]]) -> int:
    return sum(ix.nops[g] for m in inst for g in m)


def _grow(ix: _Index, seeds: Sequence[int], claimed: bytearray,
          order: str) -> tuple[list[list[int]], list[int]]:
    """Apriori growth of the 1-node subgraph at ``seeds`` in all occurrences at once.

    Two phases: first over forward GraphNodes only (which fixes where the layers start and end),
    then over all (attaching backward and update GraphNodes, first those one edge away from the
    instance, then the rest). ``order`` says which extensions are tried first: ``"producers"``
    (toward the inputs) for forward GraphNodes and toward consumers for backward ones (the
    backward pass runs the layers in reverse), or the mirror image for ``"consumers"``.
    """
    n_inst = len(seeds)
    # the pattern by position: cols[p][j] is instance j's GraphNode at position p; and for each
    # GraphNode, the instance owning it (-1: none) and its position there
    cols: list[list[int]] = [list(seeds)]
    own_inst = [-1] * ix.n
    own_pos = [0] * ix.n
    for j, s in enumerate(seeds):
        own_inst[s] = j
    primary = 0 if order == "producers" else 1
    slots = ix.slots
    slot_set = ix.slot_set
    forward = ix.forward
    nbrs = ix.nbrs
    backward = ix.backward
    blame = [0] * n_inst
    odd = max(1, n_inst // 3)
    others = range(1, n_inst)

    def signature(c: int, j: int) -> list:
        """How ``c`` connects to instance ``j``: (direction and edge label, position) pairs."""
        sig = [(se, own_pos[nb]) for se, nb in nbrs[c] if own_inst[nb] == j]
        sig.sort()
        return sig

    def differing(col: list[int]) -> tuple[list[int], ...]:
        """Per direction, the instances whose slots at this position differ from instance
        0's (usually none)."""
        return tuple([j for j in others if slot_set[d][col[j]] != slot_set[d][col[0]]]
                     for d in (0, 1, 2))

    differ_at = [differing(cols[0])]

    def extend(p: int, d: int, forward_only: bool, pending: list[int]) -> None:
        slots_d = slots[d]
        at = cols[p]
        differ = differ_at[p][d]
        map0 = slots_d[at[0]]
        if n_inst > 2 and differ and differ[0] == 1:
            for sk in slots_d[at[1]]:
                if sk not in map0 and all(sk in slots_d[at[j]] for j in range(2, n_inst)):
                    blame[0] += 1
        for sk, c0 in map0.items():
            if differ:
                missing = [j for j in differ if sk not in slots_d[at[j]]]
                if missing:
                    if len(missing) <= odd:
                        for j in missing:
                            blame[j] += 1
                    continue
            # instance 0's candidate decides most rejections alone
            if claimed[c0] or own_inst[c0] >= 0 or (forward_only and not forward[c0]):
                continue
            cands = [slots_d[g][sk] for g in at]
            if any(claimed[c] or own_inst[c] >= 0 or (forward_only and not forward[c])
                   for c in cands):
                continue
            if len(set(cands)) != n_inst:
                continue
            sig0 = signature(c0, 0)
            if any(signature(cands[j], j) != sig0 for j in others):
                continue
            pos = len(cols)
            for j, c in enumerate(cands):
                own_inst[c] = j
                own_pos[c] = pos
            cols.append(cands)
            differ_at.append(differing(cands))
            pending.append(pos)

    def run(positions: list[int], forward_only: bool) -> None:
        hi: deque[tuple[int, int]] = deque()
        lo: deque[tuple[int, int]] = deque()

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
            extend(p, d, forward_only, pending)
            for q in pending:
                push(q)

    run([0], forward_only=ix.forward[seeds[0]])
    # attach what hangs off the instance one edge away first, then grow freely
    first: list[int] = []
    for p in range(len(cols)):
        for d in (0, 1, 2):
            extend(p, d, False, first)
    run(list(range(len(cols))), forward_only=False)
    inst = [[col[j] for col in cols] for j in range(n_inst)]
    return inst, blame


def _boundary_bytes(ix: _Index, inst: list[list[int]]) -> int:
    total = 0
    for members in inst:
        s = set(members)
        for g in members:
            for _e, v in ix.out[g]:
                if v not in s:
                    total += ix.ebytes[(g, v)]
            for _e, u in ix.inn[g]:
                if u not in s:
                    total += ix.ebytes[(u, g)]
    return total


def _aligned_ops(gng: GraphNodeGraph, inst: list[int]) -> tuple[int, ...]:
    return tuple(o for g in inst for o in gng.nodes[g].ops)


def _positional_signature(graph: OpGraph, labeler: OpLabeler, aligned: Sequence[int]) -> tuple:
    """Each operator's label and, per operand, ``(position of its producer, output index)`` when
    the producer is in ``aligned``, -1 when it is not, None for a literal."""
    pos = {o: i for i, o in enumerate(aligned)}
    ops, tensors, ids = graph.ops, graph.tensors, labeler.ids
    return tuple([
        (ids[o], tuple([
            None if t is None
            else (pos[p], ops[p].outputs.index(t)) if (p := tensors[t].producer) in pos else -1
            for t in ops[o].inputs]))
        for o in aligned])


def _saved(tr: _Trial, ix: _Index) -> int:
    """Operators a class saves from the search: all its operators but one representative's."""
    return tr.covered - sum(ix.nops[g] for g in tr.inst[0])


def _orient(ix: _Index, best: _Trial, seeds: list[int], claimed: bytearray,
            min_size: int) -> tuple[_Trial, int]:
    """Grow ``seeds`` in the other order too; keep the growth that saves more operators, then
    the one with fewer bytes crossing instance boundaries. Returns it and the growths run."""
    other = "consumers" if best.order == "producers" else "producers"
    inst, blame = _grow(ix, seeds, claimed, other)
    alt = _Trial(best.seed_label, other, inst, _cover(ix, inst), blame=blame)
    if _saved(alt, ix) >= _saved(best, ix) and len(alt.inst[0]) >= min_size:
        best.boundary = _boundary_bytes(ix, best.inst)
        alt.boundary = _boundary_bytes(ix, alt.inst)
        if (_saved(alt, ix), -alt.boundary) > (_saved(best, ix), -best.boundary):
            return alt, 1
    return best, 1


def _subsumed(seeds: Sequence[int], r: _Trial, where: dict[int, int]) -> bool:
    """Whether ``seeds`` sit at one position of every instance of the grown ``r``. Such seeds
    enter ``r``'s occurrences at another node, and are not grown again: the growth is taken to
    reach the same maximal pattern (it does on GPT, MoE, Wide-ResNet and MLP, where growing them
    anyway changes no class)."""
    if len(seeds) != len(r.inst):
        return False
    p = where.get(seeds[0])
    return p is not None and all(where.get(s) == p for s in seeds)


def _greedy_round(ix: _Index, groups: list[dict[int, list[int]]], claimed: bytearray,
                  min_support: int, min_size: int, seeds_per_level: int, complete_gain: float) -> tuple[_Trial | None, int, list[tuple[int, int]]]:
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
        mass: dict[int, int] = {}
        for lab, free in grp.items():
            c = len(free)
            mass[c] = mass.get(c, 0) + sum(ix.nops[g] for g in free)
            cur = best_for_count.get(c)
            if cur is None or (max(ix.flops[g] for g in free), -free[0]) > (
                    max(ix.flops[g] for g in grp[cur]), -grp[cur][0]):
                best_for_count[c] = lab
        for c in sorted(mass, key=lambda c: (-mass[c], -c))[:seeds_per_level]:
            lab = best_for_count[c]
            key = tuple(grp[lab])
            if key not in seen:
                seen.add(key)
                cands.append((level, lab))
    trials = 0
    results: list[_Trial] = []
    where: list[dict[int, int]] = []  # per result: GraphNode -> its position in its instance
    for level, lab in cands:
        seeds = groups[level][lab]
        if any(_subsumed(seeds, r, w) for r, w in zip(results, where)):
            continue
        inst, blame = _grow(ix, seeds, claimed, "producers")
        where.append({g: p for m in inst for p, g in enumerate(m)})
        trials += 1
        results.append(_Trial((level, lab), "producers", inst, _cover(ix, inst), blame=blame))
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
        cand = _Trial(best.seed_label, "producers", inst, _cover(ix, inst), blame=blame)
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
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    gng = graphnodes if graphnodes is not None else group_graphnodes(graph)
    timings["graphnodes"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    ix = _Index(gng)
    wl_levels = ix.wl(wl_rounds)
    timings["signatures"] = time.perf_counter() - t1

    t2 = time.perf_counter()
    claimed = bytearray(ix.n)
    found: list[_Trial] = []
    trials = 0
    by_label: list[dict[int, list[int]]] = []
    for wl in wl_levels:
        bl: dict[int, list[int]] = {}
        for g, lab in enumerate(wl):
            bl.setdefault(lab, []).append(g)
        by_label.append({lab: m for lab, m in bl.items() if len(m) >= min_support})
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
    timings["grow"] = time.perf_counter() - t2

    t3 = time.perf_counter()
    labeler = gng.labeler or OpLabeler(graph)
    classes: list[RepeatedClass] = []
    for tr in found:
        aligned = [_aligned_ops(gng, members) for members in tr.inst]
        keep = list(range(len(aligned)))
        if verify:
            # position-by-position isomorphism to the representative (exact, linear); isomorphic
            # instances then share the representative's canonical hash
            ref = _positional_signature(graph, labeler, aligned[0])
            keep = [j for j in keep if _positional_signature(graph, labeler, aligned[j]) == ref]
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
    classes = [RepeatedClass(i, c.hash, c.instances, c.aligned, c.graphnodes)
               for i, c in enumerate(classes)]
    timings["verify"] = time.perf_counter() - t3

    assigned = bytearray(len(graph.ops))
    for c in classes:
        for inst in c.instances:
            for o in inst:
                assigned[o] = 1
    unassigned = tuple(o for o in range(len(graph.ops)) if not assigned[o])
    folded = sum(c.size for c in classes) + len(unassigned)
    fold_ratio = len(graph.ops) / folded if folded else 1.0
    timings["total"] = time.perf_counter() - t0
    return MiningResult(classes=classes, fold_ratio=fold_ratio, unassigned=unassigned,
                        timings=timings, num_ops=len(graph.ops), graphnodes=gng, trials=trials)
