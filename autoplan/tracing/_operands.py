"""Operand arrays: per-graph numpy arrays of the operator wiring, for analyses that vectorise.

A traced training step has tens of thousands of operators; passes written as Python loops over
them dominate the folded search of a deep model. :func:`operand_arrays` flattens the operands once
per graph (CSR layout), so that layer signatures and segment crossings are computed with numpy.
"""

from __future__ import annotations

import itertools
from operator import attrgetter
from typing import NamedTuple

import numpy as np

from autoplan._memo import per_owner
from autoplan.tracing._graph import OpGraph

__all__ = ["OperandArrays", "operand_arrays", "index_in_run", "runs"]


class OperandArrays(NamedTuple):
    """The operands of all operators, flattened in operator order.

    Attributes:
        count: per operator, its number of operands (literals included).
        start: per operator, the offset of its first operand in ``tensor`` (length ops + 1).
        tensor: per operand, the tensor id, or -1 for a literal.
        reader: per operand, the id of the operator reading it.
        producer: per tensor, the id of the operator making it (-1: a graph input).
        made_by: per operand, the id of the operator making it (-1: a literal or a graph
            input).
        out_count: per operator, its number of results.
        out_start: per operator, the offset of its first result in ``output`` (length ops + 1).
        output: per result, the tensor id (operators in order, each one's results in order).
    """

    count: np.ndarray
    start: np.ndarray
    tensor: np.ndarray
    reader: np.ndarray
    producer: np.ndarray
    made_by: np.ndarray
    out_count: np.ndarray
    out_start: np.ndarray
    output: np.ndarray


def _make(graph: OpGraph) -> OperandArrays:
    inputs = list(map(attrgetter("inputs"), graph.ops))
    count = np.fromiter(map(len, inputs), np.int64, len(inputs))
    start = np.zeros(len(inputs) + 1, dtype=np.int64)
    np.cumsum(count, out=start[1:])
    flat = list(itertools.chain.from_iterable(inputs))
    if None in flat:
        # (in one C-level pass: a literal, None, becomes NaN; tensor ids are far below 2**53,
        # so floats hold them exactly)
        as_float = np.array(flat, dtype=np.float64)
        as_float[np.isnan(as_float)] = -1.0
        tensor = as_float.astype(np.int64)
    else:
        tensor = np.asarray(flat, dtype=np.int64).reshape(-1)
    reader = np.repeat(np.arange(len(inputs), dtype=np.int64), count)
    outputs = list(map(attrgetter("outputs"), graph.ops))
    out_count = np.fromiter(map(len, outputs), np.int64, len(outputs))
    out_start = np.zeros(len(outputs) + 1, dtype=np.int64)
    np.cumsum(out_count, out=out_start[1:])
    output = np.fromiter(itertools.chain.from_iterable(outputs), np.int64, int(out_start[-1]))
    # each tensor's producer is the operator listing it among its results (-1: none)
    producer = np.full(len(graph.tensors), -1, dtype=np.int64)
    producer[output] = np.repeat(np.arange(len(outputs), dtype=np.int64), out_count)
    made_by = np.full(len(tensor), -1, dtype=np.int64)
    made = tensor >= 0
    made_by[made] = producer[tensor[made]]
    return OperandArrays(count, start, tensor, reader, producer, made_by, out_count, out_start,
                         output)


@per_owner
def operand_arrays(graph: OpGraph) -> OperandArrays:
    """The graph's :class:`OperandArrays` (made once per graph)."""
    return _make(graph)


def index_in_run(counts: np.ndarray) -> np.ndarray:
    """For runs of the given lengths laid end to end: each element's index in its run."""
    return np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts,
                                                                    counts)


def runs(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The indices ``starts[i] .. starts[i] + counts[i] - 1``, run after run: the flat positions
    of some operators' operands (``runs(arr.start[ops], arr.count[ops])``) or results
    (``runs(arr.out_start[ops], arr.out_count[ops])``)."""
    return np.repeat(starts, counts) + index_in_run(counts)
