"""Intra-operator sharding (Alpa's ILP): specs, per-operator strategies, resharding costs, the
ILP and its solver, pins, and the single-stage plan built from a solution.

Public names are re-exported by :mod:`autoplan.algorithms`; the modules here are private.
"""
