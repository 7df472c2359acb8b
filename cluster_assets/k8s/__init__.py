"""Kubernetes path: build/submit the Kubeflow Trainer TrainJob, chaos on EKS, and an offline contract emulator.

Modules: ``trainjob`` (typed TrainJob builder), ``schema`` (round trip through the pinned Trainer API models),
``cluster`` (kubeconfig, pre-flight checks, watch), ``submit`` (CLI), ``emulator`` (runs the rendered
runtime + TrainJob as local processes with Trainer v2.3's env and JobSet failure semantics), ``chaos``
(EKS chaos harness), ``report`` (metrics JSONL analysis shared by both). ``runtime`` (our
ClusterTrainingRuntime) belongs to the EKS stack.
"""
