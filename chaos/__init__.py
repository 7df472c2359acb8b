"""Chaos harness: kill workers and nodes of a local elastic job and prove nothing is lost.

``python -m chaos.local --help``; ``make chaos-test`` runs every scenario. See docs/failover.md.
"""
