"""The synthesized EKS stack runs its etcd administration from the image it builds, never the training image
(issue #53 item 1)."""

from __future__ import annotations

import json

from cluster_assets.k8s import etcd
from cluster_facts.versions import ETCD_ADMIN_BASE_IMAGE, ETCD_IMAGE
from tests.support.infra import Synthesized, resources_of_type


def _with_subs(resource: dict) -> list[dict]:
    """The resource's Kubernetes objects with each ``Fn::Sub`` shown as its text (an asset's image URI is one)."""
    raw = resource["Properties"]["Manifest"]
    if isinstance(raw, dict):
        raw = "".join(
            p if isinstance(p, str) else p["Fn::Sub"] if "Fn::Sub" in p else "<token>" for p in raw["Fn::Join"][1]
        )
    return json.loads(raw)


def _admin_images(eks: Synthesized) -> dict[str, str]:
    images = {}
    for _, r in resources_of_type(eks.templates["Eks"], "Custom::AWSCDK-EKS-KubernetesResource"):
        for m in _with_subs(r):
            if m["kind"] == "Job" and m["metadata"].get("namespace") == etcd.ETCD_NAMESPACE:
                images["bootstrap"] = m["spec"]["template"]["spec"]["containers"][0]["image"]
            if m["kind"] == "CronJob":
                images["renewal"] = m["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["image"]
    return images


def test_bootstrap_and_renewal_run_the_stacks_admin_image_asset(eks: Synthesized) -> None:
    asset = eks.platform_app.platform.etcd.admin_image
    images = _admin_images(eks)
    assert set(images) == {"bootstrap", "renewal"}
    for what, image in images.items():
        # CDK's container-asset repository, tagged with the asset's digest: not the training repository's tag
        assert "/cdk-hnb659fds-container-assets-" in image and image.endswith(f":{asset.asset_hash}"), (what, image)
        assert not image.endswith(":0.1.0"), what  # the context's imageTag (the training image)
    # the asset the deploy builds: cluster_assets/etcd_admin_image/ on the pinned base, for the x86_64 system nodes
    (manifest,) = eks.outdir.glob(f"{eks.platform_app.platform.artifact_id}.assets.json")
    docker = json.loads(manifest.read_text())["dockerImages"][asset.asset_hash]["source"]
    assert (
        docker["dockerBuildArgs"] == {"BASE_IMAGE": ETCD_ADMIN_BASE_IMAGE, "ETCD_IMAGE": ETCD_IMAGE}
        and docker["platform"] == "linux/amd64"
    )
    staged = eks.outdir / docker["directory"]
    assert sorted(p.name for p in staged.iterdir()) == ["Dockerfile", "requirements.txt"]
