"""Chaos harness: kill workers and nodes of a local elastic job and prove nothing is lost.

``python -m training.chaos --help``; ``make chaos-test`` runs every scenario. See docs/failover.md.
"""
