"""Folding the search space: GraphNodes and repeated-subgraph mining (TAPAS), cones, critical
nodes and segments (TePDist), the optimisation levels (exhaustive, hierarchical, folded) and the
clustering of operators into layers.

Public names are re-exported by :mod:`autoplan.search`; the modules here are private.
"""
