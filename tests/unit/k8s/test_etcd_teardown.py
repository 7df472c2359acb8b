"""Tearing the EKS etcd down leaves no volume behind: the StatefulSet deletes its claims when it is deleted (and
the StorageClass then deletes the EBS volumes), and keeps them when scaled down; valid for the pinned models."""

from __future__ import annotations

from cluster_assets.k8s import etcd, schema


def test_deleting_the_members_deletes_their_claims_and_volumes():
    members = etcd.cluster_objects(admin_image="reg/t5:1", training_namespace="training", node_selector={})["members"]
    (sts,) = [o for o in members if o["kind"] == "StatefulSet"]
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Delete", "whenScaled": "Retain"}
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    (storage_class,) = [
        o
        for group in etcd.cluster_objects(admin_image="reg/t5:1", training_namespace="training").values()
        for o in group
        if o["kind"] == "StorageClass"
    ]
    assert claim["spec"]["storageClassName"] == storage_class["metadata"]["name"]
    assert storage_class["reclaimPolicy"] == "Delete"  # a deleted claim deletes its EBS volume
    schema.roundtrip_core(sts)  # the field is one the pinned kubernetes models know (none dropped)
