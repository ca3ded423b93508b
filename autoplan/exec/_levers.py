"""The memory levers of a plan's stages, as the stage executor applies them.

A pipeline plan's stage may carry a ZeRO level and rematerialised layers (``Stage.zero``,
``Stage.zero_axes``, ``Stage.remat_layers``, chosen by the search under the memory limit; see
:mod:`autoplan.search.pipeline._levers`). The stage executor applies them so:

* **Rematerialisation.** The forward operators of a rematerialised layer still run in the
  stage's forward task, but the values they make are no longer handed to the backward: each
  backward (and ZB-H1 weight) task that reads one runs the layer's forward operators that make
  it again, from the layer's inputs, just before the first of its operators that reads them
  (:func:`recompute`). What the forward task keeps for the backward of such a layer drops to what
  the layer reads from outside itself (its inputs, and values of other layers), as with
  ``jax.checkpoint`` around each layer. The operators run again are the step's own, with their
  sharding constraints, so the numbers are the same. The recomputation reads its inputs through
  ``lax.optimization_barrier``, as ``jax.checkpoint`` does (:data:`Recompute.barriers`): where
  the forward and the backward are one program (gradient accumulation's scanned step), so XLA
  does not merge it with the forward; in a pipeline's backward task, which holds no forward, it
  changes nothing.
* **ZeRO** over the stage's ``zero_axes`` (:func:`autoplan.plans._spec.zero_spec` for how a
  tensor is split): from level 1 the optimizer state is kept sharded between steps, from level 2
  the gradient accumulators too (each micro-batch's gradient is added into its shard: a
  reduce-scatter), and at level 3 the parameters; the operators then compute on the layouts the
  plan chose for them, so XLA gathers a sharded parameter where an operator reads it whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax

from autoplan.exec._interpret import FlatOp, Lit

__all__ = ["Recompute", "recompute", "evaluate_with_barriers"]


@dataclass
class Recompute:
    """A task's operators with the rematerialised layers' forward operators run again.

    Attributes:
        ops: the operators, recomputed ones included, in the order to run them.
        barriers: position in ``ops`` -> the tensors to pass through ``optimization_barrier``
            before the operator at that position runs (the inputs of a recomputation).
        recomputed: how many operators run again.
    """

    ops: list[FlatOp]
    barriers: dict[int, tuple[int, ...]] = field(default_factory=dict)
    recomputed: int = 0


def recompute(ops: Sequence[FlatOp], reads: Callable[[FlatOp], bool],
              made: Mapping[int, FlatOp], layer_of: Mapping[int, str]) -> Recompute:
    """``ops`` with, before the first operator that ``reads`` (a backward operator) a value in
    ``made`` (tensor -> the rematerialised layer's forward operator that makes it), the
    operators of that value's layer that make it again from what the layer reads from outside
    itself. Operators and values are the traced step's; ``layer_of`` maps operator ids of
    ``made`` to their layer."""
    out: list[FlatOp] = []
    barriers: dict[int, tuple[int, ...]] = {}
    have: set[int] = set()  # values recomputed so far
    count = 0
    position = {op.id: i for i, op in enumerate(dict.fromkeys(made.values()))}
    for op in ops:
        if reads(op):
            need = [t for t in op.inputs
                    if not isinstance(t, Lit) and t in made and t not in have]
            if need:
                again = _closure(need, made, layer_of, have)
                again.sort(key=lambda o: position[o.id])
                outs = {t for o in again for t in o.outputs}
                ins = tuple(dict.fromkeys(t for o in again for t in o.inputs
                                          if not isinstance(t, Lit) and t not in outs))
                barriers[len(out)] = ins
                out.extend(again)
                have |= outs
                count += len(again)
        out.append(op)
    return Recompute(out, barriers, count)


def _closure(need: Iterable[int], made: Mapping[int, FlatOp], layer_of: Mapping[int, str],
             have: set[int]) -> list[FlatOp]:
    """The forward operators that make ``need`` again, within each value's own layer."""
    found: dict[int, FlatOp] = {}
    stack = list(need)
    while stack:
        p = made[stack.pop()]
        if p.id in found:
            continue
        found[p.id] = p
        for u in p.inputs:
            if (not isinstance(u, Lit) and u in made and u not in have
                    and layer_of[made[u].id] == layer_of[p.id]):
                stack.append(u)
    return list(found.values())


def evaluate_with_barriers(prog: Any, env: dict[int, Any], ops: Sequence[FlatOp],
                           barriers: Mapping[int, tuple[int, ...]], hook: Any) -> dict[int, Any]:
    """``prog.evaluate`` of ``ops``, passing the tensors of ``barriers[i]`` through
    ``lax.optimization_barrier`` before the operator at position ``i``."""
    if not barriers:
        return prog.evaluate(env, ops, hook)
    start = 0
    for i in sorted(barriers):
        prog.evaluate(env, ops[start:i], hook)
        ts = [t for t in barriers[i] if t in env]
        if ts:
            env.update(zip(ts, jax.lax.optimization_barrier(tuple(env[t] for t in ts))))
        start = i
    return prog.evaluate(env, ops[start:], hook)
