"""The pipeline search's micro-batches: the global batch of a traced step, the step traced at
micro-batch size, and the micro-batch counts searched (the default, the window of divisors
around it and the second, finer screening round).

See :mod:`~autoplan.search.pipeline._pipeline` (steps 1 and 7 of its docstring).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from autoplan._errors import SearchError, TraceError
from autoplan._memo import per_owner, per_owner_and_args
from autoplan.tracing._graph import OpGraph
from autoplan.tracing._rescale import rescaled_graph
from autoplan.tracing._trace import trace_workload
from autoplan.tracing._workload import Workload, _param_names, abstract_leaf

__all__ = ["batch_size", "microbatch_workload_args", "traced", "microbatch_counts",
           "finer_counts", "check_microbatches", "MICROBATCH_WINDOW", "MicrobatchTraceError"]


#: The searched micro-batch counts: the divisors of the batch, from the default / this
#: factor to the default x this factor (2 on clusters of more than
#: :data:`~autoplan.search.pipeline._pipeline.AUTO_ALL_HOSTS` hosts, where every count's stage
#: DP is large).
MICROBATCH_WINDOW = 8


def batch_size(graph: OpGraph) -> int:
    """The global batch of a traced step: the leading dimension its batch inputs (graph inputs of
    kind ``batch``) share (their greatest common divisor; 1 when it has none)."""
    dims = [graph.tensors[gi.tensor].shape[0] for gi in graph.inputs
            if gi.kind == "batch" and graph.tensors[gi.tensor].shape]
    return math.gcd(*dims) if dims else 1


class MicrobatchTraceError(TraceError):
    """The step traced whole but not at micro-batch size: its arguments of kind ``batch`` were
    split and the others kept whole, and the step did not accept that (an argument that holds
    examples but is not of kind ``batch``, or a batch size written into the step)."""


def microbatch_workload_args(args: tuple, arg_kinds: tuple[str, ...], microbatches: int,
                             names: Sequence[str] | None = None) -> tuple:
    """The step's arguments with every batch leaf's leading dimension divided by ``microbatches``.

    Raises:
        MicrobatchTraceError: a batch leaf has no leading dimension that ``microbatches``
            divides (a scalar in the batch: a count or a step number), named by its argument
            (``names``: :func:`_arg_names`) and path.
    """
    out = []
    for i, (a, kind) in enumerate(zip(args, arg_kinds)):
        if kind != "batch":
            out.append(a)
            continue

        def shrink(path, x, i=i):
            x = abstract_leaf(x)  # (a Python number in the batch has no shape of its own)
            shape = tuple(x.shape)
            if not shape or shape[0] % microbatches:
                name = names[i] if names is not None else f"argument {i}"
                raise MicrobatchTraceError(
                    f"pipeline: the batch cannot be split into {microbatches} micro-batches: "
                    f"{name}{jax.tree_util.keystr(path)} (of kind 'batch') has shape {shape}, "
                    f"no leading dimension of examples that {microbatches} divides. Fix: pass "
                    "values that hold "
                    "for the whole batch (a count, a step number) in an argument of their own, "
                    "of kind 'input' (autoplan.Workload(step, args, arg_kinds=...)), or search "
                    "without micro-batches (pipeline=False, or microbatches=1).")
            return jax.ShapeDtypeStruct((shape[0] // microbatches,) + shape[1:], x.dtype)

        out.append(jax.tree_util.tree_map_with_path(shrink, a))
    return tuple(out)


@per_owner
def traced(workload: Workload) -> OpGraph:
    """``trace(workload)``, once per workload object (the search, its baselines and the pipeline
    search share it; a zoo workload's with every object of its spec)."""
    return trace_workload(workload)


def _traces(workload: Workload, microbatches: int) -> tuple[OpGraph, OpGraph]:
    """The full-batch and micro-batch graphs of a workload (once per workload object: the
    pipeline search and the Megatron TP x PP baseline use the same ones)."""
    full = traced(workload)
    if microbatches == 1:
        return full, full
    return full, _microbatch_trace(workload, microbatches)


@per_owner_and_args
def _microbatch_trace(workload: Workload, microbatches: int) -> OpGraph:
    """The graph of one micro-batch's step (of ``microbatches``), once per workload object and
    micro-batch count: derived from the full trace and the first count traced where the two
    determine it (:func:`~autoplan.tracing._rescale.rescaled_graph`: the same graph, without
    tracing again), else traced."""
    named = _arg_names(workload)
    args = microbatch_workload_args(workload.args, workload.arg_kinds, microbatches, named)
    first = _traced_counts(workload)
    for base, part in first.items():
        got = rescaled_graph(traced(workload), part, base, microbatches)
        if got is not None:
            return got
    try:
        graph = trace_workload(workload, args, name=traced(workload).name)
    except TraceError as err:
        raise MicrobatchTraceError(_split_message(workload, named, microbatches, err)) from err
    if not first:
        first[microbatches] = graph
    return graph


@per_owner
def _traced_counts(workload: Workload) -> dict[int, OpGraph]:
    """``{count: graph}`` of the first micro-batch count traced of a workload (the others are
    derived from it where they can be)."""
    return {}


def _arg_names(workload: Workload) -> list[str]:
    """Each positional argument's name in the step's signature (``argument i`` without one)."""
    return [nm or f"argument {i}"
            for i, nm in enumerate(_param_names(workload.fn, len(workload.args)))]


def _split_message(workload: Workload, named: Sequence[str], microbatches: int,
                   err: TraceError) -> str:
    """What the micro-batch trace split, what it kept whole, what JAX said, and the fix."""
    split = [nm for nm, k in zip(named, workload.arg_kinds) if k == "batch"]
    whole = [f"{nm} ({k})" for nm, k in zip(named, workload.arg_kinds) if k != "batch"]
    batch = batch_size(traced(workload))
    kinds = ", ".join(repr(k) for k in workload.arg_kinds)
    cause = err.__cause__
    said = (f"{type(cause).__name__}: {cause}" if cause is not None else str(err)).rstrip(".")
    return (f"pipeline: the step could not be traced at micro-batch size: its arguments of kind "
            f"'batch' ({', '.join(split) or 'none'}) were split into {microbatches} micro-batches "
            f"of {batch // microbatches} examples and the others were kept whole "
            f"({', '.join(whole) or 'none'}). JAX said: {said}. Fix: give every argument that holds "
            f"examples the kind 'batch' (autoplan.Workload(step, args, arg_kinds=({kinds})) with "
            "those changed), do not write the batch size into the step, or search without "
            "micro-batches (pipeline=False, or microbatches=1).")


def _aligned(a: OpGraph, b: OpGraph) -> bool:
    """Whether two traces of one step at different batch sizes have the same operators and
    tensors in the same order (so ids carry over)."""
    return (len(a.ops) == len(b.ops) and len(a.tensors) == len(b.tensors)
            and all(x.primitive == y.primitive for x, y in zip(a.ops, b.ops)))


def _default_microbatches(batch: int, max_stages: int) -> int:
    """Enough micro-batches to keep the bubble small and the activations of the in-flight
    micro-batches modest: the largest power of two <= min(128, batch / 4) that divides the batch
    (at least 2 when the batch allows: for an odd batch its smallest divisor above 1 that is not
    the batch itself, 3 for a batch of 9).

    Examples:
        >>> [_default_microbatches(b, 8) for b in (1024, 1536, 6, 9, 7)]
        [128, 128, 2, 3, 1]
    """
    cap = max(1, min(128, batch // 4))
    b = 1
    while b * 2 <= cap and batch % (b * 2) == 0:
        b *= 2
    if b == 1:
        b = next((d for d in range(2, math.isqrt(batch) + 1) if batch % d == 0), 1)
    return b


def microbatch_counts(batch: int, default: int, window: int = MICROBATCH_WINDOW) -> list[int]:
    """The searched micro-batch counts: every divisor of ``batch`` within ``window`` of
    ``default``, ascending (``default`` among them).

    Examples:
        >>> microbatch_counts(1536, 128)  # Alpa's 24 for Wide-ResNet among them
        [16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768]
        >>> microbatch_counts(9, 1), microbatch_counts(1024, 128, 2)
        ([1, 3], [64, 128, 256])
    """
    lo, hi = -(-default // window), min(batch, default * window)
    out = {default}
    d = 1
    while d * d <= batch:  # the divisors in pairs (d, batch / d)
        if batch % d == 0:
            out.update(b for b in (d, batch // d) if lo <= b <= hi)
        d += 1
    return sorted(out)


def finer_counts(counts: Sequence[int], coarse: Sequence[int], lead: int) -> list[int]:
    """The second screening round: the ``counts`` strictly between the ``coarse`` counts on
    either side of ``lead`` (the best of the first round), not screened yet.

    Examples:
        >>> finer_counts([16, 24, 32, 48, 64, 96, 128], [16, 32, 64, 128], 32)
        [24, 48]
        >>> finer_counts([1, 3], [1], 1)
        [3]
    """
    i = list(coarse).index(lead)
    lo = coarse[i - 1] if i > 0 else 0
    hi = coarse[i + 1] if i + 1 < len(coarse) else math.inf
    return [B for B in counts if lo < B < hi and B not in coarse]


def check_microbatches(value: Any) -> None:
    """Raise :class:`SearchError` unless ``value`` is None, ``"auto"`` or a positive integer."""
    if value is None or value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise SearchError(f"search: microbatches should be a positive integer, 'auto' or None. "
                          f"Got {value!r}. Fix: microbatches='auto' searches the count, an "
                          "integer fixes it (it must divide the batch).")
