"""Tracing a training step: the jaxpr walk, the operator graph, workloads and the analyses of the traced step (its signature, how the batch flows, the primitives)."""
