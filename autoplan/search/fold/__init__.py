"""Folding the search space: GraphNodes and repeated-subgraph mining (TAPAS), cones, critical
nodes and segments (TePDist), the search levels (exhaustive, hierarchical, folded) and the
grouping of operators into pipeline layers.

Public names are re-exported by :mod:`autoplan.algorithms`; the modules here are private.
"""
