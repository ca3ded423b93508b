"""The flat operand arrays equal the graph's operators and tensors, field by field."""

import pytest

import autoplan
from autoplan.tracing._operands import operand_arrays


@pytest.mark.parametrize("name", ["gpt", "wide_resnet", "mlp"])
def test_operand_arrays_are_the_graphs_wiring(name):
    graph = autoplan.trace(autoplan.models.get(name, "tiny"))
    arr = operand_arrays(graph)
    ops, tensors = graph.ops, graph.tensors
    assert arr.count.tolist() == [len(op.inputs) for op in ops]
    assert arr.start.tolist() == [0] + [sum(len(op.inputs) for op in ops[:i + 1])
                                        for i in range(len(ops))]
    flat = [(op.id, t) for op in ops for t in op.inputs]
    assert any(t is None for _, t in flat)  # literals occur, as -1
    assert arr.tensor.tolist() == [-1 if t is None else t for _, t in flat]
    assert arr.reader.tolist() == [i for i, _ in flat]
    # a tensor's producer (read off the results) is the one the tensor names
    assert arr.producer.tolist() == [t.producer for t in tensors]
    assert arr.made_by.tolist() == [-1 if t is None else tensors[t].producer for _, t in flat]
    assert arr.out_count.tolist() == [len(op.outputs) for op in ops]
    assert arr.output.tolist() == [t for op in ops for t in op.outputs]
    assert arr.out_start[-1] == len(arr.output)
