"""Validate rendered Kubeflow Trainer objects against the pinned typed API models.

The models in ``kubeflow-trainer-api`` (pinned to the installed Trainer line, 2.3.x) check types, but their
``from_dict`` silently drops fields they don't know. A manifest with a typo (``numNode``) or a field from
another Trainer line (v2.1's ``podTemplateOverrides``) would therefore "validate" and then be ignored or
rejected by the cluster. So validation is a round trip: parse with the typed model, serialise again, and
require the result to equal the input. Anything dropped, renamed or coerced is reported by its path.
"""

from __future__ import annotations

from typing import Any

import pydantic
from kubeflow_trainer_api import models

API_GROUP = "trainer.kubeflow.org"
API_VERSION = f"{API_GROUP}/v1alpha1"
TRAINER_API_PIN = "kubeflow-trainer-api==2.3.0"

#: kind -> typed model of the pinned Trainer API.
MODELS: dict[str, type[pydantic.BaseModel]] = {
    "TrainJob": models.TrainerV1alpha1TrainJob,
    "ClusterTrainingRuntime": models.TrainerV1alpha1ClusterTrainingRuntime,
    "TrainingRuntime": models.TrainerV1alpha1TrainingRuntime,
}


class SchemaError(ValueError):
    """A manifest does not match the pinned Trainer API. The message lists every offending path."""


def _diff(want: Any, got: Any, path: str, out: list[str], pin: str = TRAINER_API_PIN) -> None:
    """Collect the paths where the round-tripped object ``got`` differs from the input ``want``."""
    if isinstance(want, dict) and isinstance(got, dict):
        for key in want:
            sub = f"{path}.{key}" if path else str(key)
            if key not in got:
                out.append(f"{sub}: unknown field (not in the {pin} schema) or dropped")
            else:
                _diff(want[key], got[key], sub, out, pin)
        for key in got:
            if key not in want:
                out.append(f"{path}.{key}: added by the model (input had no such field)")
    elif isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            out.append(f"{path}: list of {len(want)} items became {len(got)} (empty or invalid items dropped)")
        for i, (w, g) in enumerate(zip(want, got)):
            _diff(w, g, f"{path}[{i}]", out, pin)
    elif want != got or type(want) is not type(got):
        out.append(f"{path}: {want!r} became {got!r} (wrong type or value for the schema)")


def roundtrip(obj: dict[str, Any]) -> pydantic.BaseModel:
    """Parse ``obj`` with the typed model for its kind and require a lossless round trip.

    Returns the typed model. Raises :class:`SchemaError` naming every unknown, dropped or mistyped field.
    """
    if not isinstance(obj, dict):
        raise SchemaError(f"expected a mapping (a Kubernetes object), got {type(obj).__name__}")
    kind = obj.get("kind")
    if kind not in MODELS:
        raise SchemaError(f"kind={kind!r}: expected one of {', '.join(MODELS)}")
    if obj.get("apiVersion") != API_VERSION:
        raise SchemaError(
            f"{kind}: apiVersion={obj.get('apiVersion')!r}, expected {API_VERSION!r} "
            f"(the Trainer v2 line pinned by {TRAINER_API_PIN})"
        )
    try:
        typed = MODELS[kind].from_dict(obj)
    except pydantic.ValidationError as e:
        # from_dict validates nested models one by one: name the model the field belongs to
        problems = [f"{e.title}.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
        raise SchemaError(f"{kind} does not match {TRAINER_API_PIN}:\n  " + "\n  ".join(problems)) from None
    except (TypeError, ValueError, AttributeError) as e:
        raise SchemaError(f"{kind} does not match {TRAINER_API_PIN}: {e}") from None
    out: list[str] = []
    _diff(obj, typed.to_dict(), "", out)
    if out:
        raise SchemaError(
            f"{kind} {obj.get('metadata', {}).get('name', '?')!r} does not round-trip through "
            f"{TRAINER_API_PIN}:\n  " + "\n  ".join(out)
        )
    return typed


def validate(obj: dict[str, Any]) -> dict[str, Any]:
    """Round-trip check (see :func:`roundtrip`); returns ``obj`` unchanged for chaining."""
    roundtrip(obj)
    return obj


def roundtrip_core(obj: dict[str, Any]) -> None:
    """The same lossless round trip for a built-in Kubernetes object (StatefulSet, Job, NetworkPolicy, ...), through
    the pinned ``kubernetes`` client's typed models (``V1<kind>``): a typo'd or misplaced field is dropped by the
    model and reported here; a missing required field or a wrong type fails the parse. Raises :class:`SchemaError`."""
    from kubernetes import client

    api = client.ApiClient()
    kind = obj.get("kind", "")
    model = getattr(client, f"V1{kind}", None)
    if model is None or not str(obj.get("apiVersion", "")).endswith("v1"):
        raise SchemaError(
            f"kind={kind!r} apiVersion={obj.get('apiVersion')!r}: no V1{kind} model in the kubernetes client"
        )
    try:
        typed = api._ApiClient__deserialize(obj, f"V1{kind}")  # the client's own JSON -> model path
    except (TypeError, ValueError) as e:
        raise SchemaError(f"{kind} {obj.get('metadata', {}).get('name', '?')!r}: {e}") from None
    out: list[str] = []
    _diff(obj, api.sanitize_for_serialization(typed), "", out, "kubernetes client")
    if out:
        raise SchemaError(
            f"{kind} {obj.get('metadata', {}).get('name', '?')!r} does not round-trip through the "
            f"kubernetes client's V1{kind}:\n  " + "\n  ".join(out)
        )
