r"""Alpa's intra-operator ILP: choose one sharding strategy per operator to minimise step time.

Formulation (Zheng et al., Alpa, OSDI 2022, Section 4.2, Eq. 1). For the operator graph
:math:`G=(V,E)`, with :math:`k_v` strategies at node :math:`v`:

.. math::

    \min_{s}\; \sum_{v \in V} s_v^\top (c_v + d_v) \;+\; \sum_{(u,v) \in E} s_u^\top R_{uv}\, s_v

where :math:`s_v \in \{0,1\}^{k_v}` is one-hot (:math:`\sum_i s_{v,i} = 1`), :math:`c_v` the
strategies' own communication (the collectives of Alpa's table: all-reduce, reduce-scatter ...),
:math:`d_v` their compute time (FLOPs over the devices doing distinct work; replicated work costs
the full FLOPs), and :math:`R_{uv}[i,j]` the time to reshard the tensor ``u`` produces under its
strategy ``i`` into the spec ``v``'s strategy ``j`` needs (:mod:`autoplan.search.intra._reshard`). The
quadratic term is linearised with edge variables :math:`e_{uv} \in [0,1]^{k_u \times k_v}`, only
where both ends have more than one strategy:

.. math::

    \sum_{i,j} e_{uv,ij} = 1, \qquad \sum_j e_{uv,ij} = s_{u,i}, \qquad \sum_i e_{uv,ij} = s_{v,j}

Alpa writes the row and column constraints as ``<=``; with :math:`\sum e = 1` and one-hot
:math:`s` they are the same, and with them :math:`e` is forced to the product
:math:`s_u s_v^\top` even when relaxed to be continuous, so only the :math:`s` are integer.

Exact reductions applied before solving (each keeps the optimum unchanged):

* **follower merging** (Alpa): elementwise, broadcast, reshape, transpose, slice, pad, convert,
  reductions ... follow one operand (the largest, i.e. the one that can be tiled most); their
  strategy is a function of that operand's producer's strategy, so they share its variable; their
  costs and their other operands' resharding fold into it. Operators with no variable operand
  (``iota``, masks made from literals) are *free*: produced locally in whatever spec is needed.
* **edge compression**: an edge's cost depends only on the specs at its two ends, so the edge
  variables range over the distinct (source spec, destination spec) pairs rather than strategy
  pairs; all-zero edges are dropped, and edges whose cost matrix is separable
  (:math:`R_{ij} = a_i + b_j`, e.g. when one end has a single spec) fold into node costs.
* **elimination** (without a memory budget): a node with at most two neighbours is solved out
  (one neighbour: :math:`c_u[i] \mathrel{+}= \min_j c_v[j] + R[i,j]`; two: a new edge
  :math:`R'[i,k] = \min_j c_v[j] + R_1[i,j] + R_2[j,k]`), repeatedly, and recovered after the
  solve; a strategy that costs at least as much as another at its node and on every incident
  edge, whatever the neighbours do, is dropped (dominance).

:func:`evaluate` recomputes the objective of any complete assignment from first principles (no
compression or elimination); the tests check the solver's optimum against brute force with it.

Graph inputs (parameters, optimizer state, batch) have their own spec variables; each pays a
small penalty proportional to its replicated bytes (Alpa's trick to prefer sharding weights when
it costs nothing else; for a batch it prefers the split the consumers use over a replicated
batch that they slice for free). A training step's outputs that are updated
inputs (output leaf ``[k]<path>`` of the same shape as input ``<path>`` of argument ``k-1``) are
charged the resharding back to that input's spec, so a sharded weight update (reduce-scatter the
gradient, update a sharded optimizer state, all-gather the parameters) is a plan the ILP can
choose.

Memory: with ``memory_budget`` the live bytes per device (inputs plus the forward activations that
backward operators read) must fit: :math:`\sum_v s_v^\top m_v \le M_{budget}`. This sum is separable, so
the least memory any plan needs is :math:`\sum_v \min_i m_{v,i}`, computed exactly without an
ILP; a budget below it raises :class:`~autoplan.InfeasiblePlanError` with that value.

Sub-graphs: ``ops`` restricts the ILP to some operators (a segment); tensors they read from
outside become boundary variables, and ``fixed`` fixes any tensor's spec at the boundary (a
tensor read from outside gets exactly that spec; a tensor produced inside is charged the
resharding to it once per use outside the sub-graph, as the whole graph reshards per consumer).
``pins`` fixes graph inputs' specs, keyed by a regular expression over input names or by an
input's tensor id (:mod:`autoplan.search.intra._pins`).

References:
    Zheng, Li, Zhang, Zhuang, Chen, Huang, Wang, Xu, Zhuo, Xing, Gonzalez, Stoica. "Alpa:
    Automating Inter- and Intra-Operator Parallelism for Distributed Deep Learning", OSDI 2022.
    The XLA auto-sharding pass that descends from it (``auto_sharding.cc``) for follower merging.

Modules:
    :mod:`~autoplan.search.intra._ilp_problem`: :class:`ILPProblem` and :func:`build_problem`
    (nodes, follower merging, costs, compressed edges).
    :mod:`~autoplan.search.intra._ilp_reduce`: the exact reductions (elimination, dominance,
    separable edges).
    :mod:`~autoplan.search.intra._ilp_solve`: the matrix model, :func:`solve_ilp` and
    :class:`ILPSolution`.
    :mod:`~autoplan.search.intra._ilp_cost`: :func:`evaluate`, :func:`cost_strategies` and
    :func:`shared_reshards`.
    This module gathers their public names.
"""

from autoplan.search.intra._ilp_cost import cost_strategies, evaluate, shared_reshards
from autoplan.search.intra._ilp_problem import ILPProblem, build_problem, updated_input_pairs
from autoplan.search.intra._ilp_solve import ILPSolution, UnsupportedPrimitiveWarning, solve_ilp

__all__ = [
    "ILPSolution",
    "ILPProblem",
    "UnsupportedPrimitiveWarning",
    "build_problem",
    "solve_ilp",
    "evaluate",
    "updated_input_pairs",
    "shared_reshards",
    "cost_strategies",
]
