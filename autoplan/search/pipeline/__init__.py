"""Inter-operator (pipeline) search: Alpa's stage-mesh DP, TePDist's DAG stage ILP, GPipe/1F1B
schedules and the pipeline search that ties them to the intra-operator plans of each stage.

Public names are re-exported by :mod:`autoplan.algorithms`; the modules here are private.
"""
