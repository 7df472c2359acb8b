"""Kubernetes objects for the EKS platform, rendered as plain dicts (no CDK, no cluster access)."""
