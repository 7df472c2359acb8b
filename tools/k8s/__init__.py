"""Kubernetes (EKS) tools: ``python -m tools.k8s.submit``; the API client the submit and chaos tools share."""
