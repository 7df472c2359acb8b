"""What a destroy leaves behind, and the keys of the logs and secrets, on the synthesized templates (#53 items 7, 8):
the etcd namespace goes before the EBS CSI driver (which deletes the members' volumes), the kubectl handler's
functions log to log groups the stack owns (retention, deleted with it), ParallelCluster deletes its log group;
the EKS control-plane log group and the ParallelCluster etcd secrets are encrypted with keys the stack owns, each
usable only by what needs it (checkov CKV_AWS_158, CKV_AWS_149)."""

from __future__ import annotations

from typing import Any

from tests.support.infra import Synthesized, manifests, resources_of_type


def _depends_on(template: dict[str, Any], logical_id: str) -> set[str]:
    deps = template["Resources"][logical_id].get("DependsOn", [])
    return set([deps] if isinstance(deps, str) else deps)


def _key_of(template: dict[str, Any], resource: dict[str, Any]) -> dict[str, Any]:
    """The stack's AWS::KMS::Key that ``resource`` names in KmsKeyId (GetAtt Arn or Ref)."""
    ref = resource["Properties"]["KmsKeyId"]
    logical = ref["Fn::GetAtt"][0] if "Fn::GetAtt" in ref else ref["Ref"]
    key = template["Resources"][logical]
    assert key["Type"] == "AWS::KMS::Key" and key["Properties"]["EnableKeyRotation"] is True
    return key


def test_the_etcd_namespace_is_deleted_before_the_ebs_csi_driver(eks: Synthesized) -> None:
    t = eks.templates["Eks"]
    (namespace_id,) = [
        lid
        for lid, r in resources_of_type(t, "Custom::AWSCDK-EKS-KubernetesResource")
        if any(m["kind"] == "Namespace" and m["metadata"]["name"] == "t5-etcd" for m in manifests(r))
    ]
    (addon_id,) = [
        lid
        for lid, r in resources_of_type(t, "AWS::EKS::Addon")
        if r["Properties"]["AddonName"] == "aws-ebs-csi-driver"
    ]
    # CloudFormation deletes in the reverse order of DependsOn: the namespace (claims, volumes) first, the driver after
    assert addon_id in _depends_on(t, namespace_id)


def test_the_kubectl_handlers_log_to_log_groups_the_stack_owns(eks: Synthesized) -> None:
    t = eks.templates["Eks"]
    functions = {lid: r for lid, r in resources_of_type(t, "AWS::Lambda::Function") if "KubectlProvider" in lid}
    assert len(functions) == 2  # the kubectl/helm handler and its custom-resource provider
    groups = dict(resources_of_type(t, "AWS::Logs::LogGroup"))
    for lid, fn in functions.items():
        ref = fn["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
        group = groups[ref]
        assert group["Properties"]["RetentionInDays"] == 30 and group["DeletionPolicy"] == "Delete", lid
        assert group["Properties"]["LogGroupName"].startswith("/aws/lambda/t5ft-gpu-kubectl-")


def test_the_eks_log_groups_have_a_key_only_cloudwatch_logs_may_use_for_them(eks: Synthesized) -> None:
    t = eks.templates["Eks"]
    groups = {r["Properties"]["LogGroupName"]: r for _, r in resources_of_type(t, "AWS::Logs::LogGroup")}
    ours = [n for n in groups if n == "/aws/eks/t5ft-gpu/cluster" or n.startswith("/aws/lambda/t5ft-gpu-kubectl-")]
    assert len(ours) == 3
    (key_id,) = {groups[n]["Properties"]["KmsKeyId"]["Fn::GetAtt"][0] for n in ours}  # one key for the three
    key = _key_of(t, groups[ours[0]])
    service = [s for s in key["Properties"]["KeyPolicy"]["Statement"] if "Service" in s.get("Principal", {})]
    (logs,) = service  # no other service may use the key
    assert logs["Principal"]["Service"] == {
        "Fn::Join": ["", ["logs.", {"Ref": "AWS::Region"}, ".", {"Ref": "AWS::URLSuffix"}]]
    }
    arns = logs["Condition"]["ArnLike"]["kms:EncryptionContext:aws:logs:arn"]
    assert [a["Fn::Join"][1][-1] for a in arns] == [  # these log groups only
        ":log-group:/aws/eks/t5ft-gpu/cluster",
        ":log-group:/aws/lambda/t5ft-gpu-kubectl-*",
    ]
    assert key["DeletionPolicy"] == "Delete"


def test_the_etcd_secrets_use_the_stacks_key_and_the_head_node_decrypts_through_secrets_manager_only(
    pcluster: Synthesized,
) -> None:
    t = pcluster.templates["ParallelCluster"]
    secrets = dict(resources_of_type(t, "AWS::SecretsManager::Secret"))
    assert len(secrets) == 3
    keys = {r["Properties"]["KmsKeyId"]["Fn::GetAtt"][0] for r in secrets.values()}
    (key_id,) = keys  # one key for the three, the stack's own
    _key_of(t, next(iter(secrets.values())))
    key = t["Resources"][key_id]
    # Who may use it: the members' role in the key policy, the head node's policy through IAM; every use through
    # Secrets Manager (kms:ViaService), but the account's administration of the key (CDK's default statement).
    statements = key["Properties"]["KeyPolicy"]["Statement"]
    named = {s["Principal"]["AWS"]["Fn::GetAtt"][0] for s in statements if "Fn::GetAtt" in s["Principal"]["AWS"]}
    assert len(named) == 1 and t["Resources"][named.pop()]["Type"] == "AWS::IAM::Role"
    assert all("kms:ViaService" in str(s.get("Condition")) for s in statements if s["Action"] != "kms:*")
    iam_readers = {}
    for lid, r in t["Resources"].items():
        if r["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            for st in r["Properties"]["PolicyDocument"]["Statement"]:
                if {"Fn::GetAtt": [key_id, "Arn"]} in (
                    st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
                ):
                    assert "kms:ViaService" in str(st.get("Condition")), (lid, st)
                    iam_readers[lid] = st["Action"]
    cfg = cr_config(pcluster)
    head_policies = [p["Policy"]["Ref"] for p in cfg["HeadNode"]["Iam"]["AdditionalIamPolicies"]]
    assert len(iam_readers) == 1 and set(iam_readers) <= set(head_policies)
    assert list(iam_readers.values()) == ["kms:Decrypt"]


def cr_config(pcluster: Synthesized) -> dict[str, Any]:
    (cr,) = [r for _, r in resources_of_type(pcluster.templates["ParallelCluster"], "Custom::PclusterCluster")]
    return cr["Properties"]["ClusterConfiguration"]


def test_parallelcluster_deletes_its_log_group_with_the_cluster(pcluster: Synthesized) -> None:
    cloudwatch = cr_config(pcluster)["Monitoring"]["Logs"]["CloudWatch"]
    assert cloudwatch == {"Enabled": True, "RetentionInDays": 30, "DeletionPolicy": "Delete"}
