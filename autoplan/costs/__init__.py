"""Costs: clusters and their device models, measured profiles, curve fits and HLO text reading."""
