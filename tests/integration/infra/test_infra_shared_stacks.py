"""Intent of the network and storage stacks (created bucket: EKS app; imported bucket: ParallelCluster app)."""

from __future__ import annotations

from aws_cdk.assertions import Match

from tests.support.infra import Synthesized, resources_of_type


def test_private_network_with_nat_flow_logs_and_endpoints(eks: Synthesized) -> None:
    t = eks.template("Network")
    t.resource_count_is("AWS::EC2::NatGateway", 1)
    t.has_resource_properties("AWS::EC2::FlowLog", {"TrafficType": "REJECT"})
    t.has_resource_properties(
        "AWS::EC2::VPCEndpoint",
        {
            "VpcEndpointType": "Gateway",
            "ServiceName": {"Fn::Join": ["", ["com.amazonaws.", {"Ref": "AWS::Region"}, ".s3"]]},
        },
    )
    services = [
        str(r["Properties"]["ServiceName"])
        for _, r in resources_of_type(eks.templates["Network"], "AWS::EC2::VPCEndpoint")
        if r["Properties"].get("VpcEndpointType") == "Interface"
    ]
    for suffix in (".ecr.api", ".ecr.dkr", ".sts"):
        assert any(suffix in s for s in services), suffix
    t.has_resource_properties("AWS::EC2::Subnet", {"MapPublicIpOnLaunch": False, "CidrBlock": "10.0.64.0/18"})


def test_bucket_is_encrypted_ssl_only_versioned_private_and_logged(eks: Synthesized) -> None:
    t = eks.template("Storage")
    t.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "BucketEncryption": {
                "ServerSideEncryptionConfiguration": [{"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
            },
            "VersioningConfiguration": {"Status": "Enabled"},
            "PublicAccessBlockConfiguration": {
                "BlockPublicAcls": True,
                "BlockPublicPolicy": True,
                "IgnorePublicAcls": True,
                "RestrictPublicBuckets": True,
            },
            "LoggingConfiguration": {"DestinationBucketName": Match.any_value(), "LogFilePrefix": "data-bucket/"},
        },
    )
    t.has_resource_properties(
        "AWS::S3::BucketPolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [Match.object_like({"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}})]
                )
            }
        },
    )
    t.has_resource("AWS::S3::Bucket", {"DeletionPolicy": "Retain"})


def test_lustre_persistent2_with_auto_import_and_export(eks: Synthesized) -> None:
    t = eks.template("Storage")
    t.has_resource_properties(
        "AWS::FSx::FileSystem",
        {
            "FileSystemType": "LUSTRE",
            "FileSystemTypeVersion": "2.15",
            "StorageCapacity": 1200,
            "LustreConfiguration": Match.object_like(
                {"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 250}
            ),
        },
    )
    events = ["NEW", "CHANGED", "DELETED"]
    t.has_resource_properties(
        "AWS::FSx::DataRepositoryAssociation",
        {
            "FileSystemPath": "/",
            "S3": {"AutoImportPolicy": {"Events": events}, "AutoExportPolicy": {"Events": events}},
        },
    )


def test_lustre_security_group_rules_cover_988_and_1018_1023(eks: Synthesized) -> None:
    res = eks.templates["Storage"]["Resources"]
    groups = {
        r["Properties"]["GroupDescription"].split(":")[0]: k
        for k, r in res.items()
        if r["Type"] == "AWS::EC2::SecurityGroup"
    }
    server, client = groups["FSx for Lustre file system"], groups["Lustre clients (GPU nodes, head node)"]

    def ports(target: str, source: str) -> set[tuple[int, int]]:
        return {
            (r["Properties"]["FromPort"], r["Properties"]["ToPort"])
            for r in res.values()
            if r["Type"] == "AWS::EC2::SecurityGroupIngress"
            and r["Properties"]["IpProtocol"] == "tcp"
            and r["Properties"]["GroupId"] == {"Fn::GetAtt": [target, "GroupId"]}
            and r["Properties"]["SourceSecurityGroupId"] == {"Fn::GetAtt": [source, "GroupId"]}
        }

    assert ports(server, client) == {(988, 988), (1018, 1023)}
    assert ports(client, server) == {(988, 988), (1018, 1023)}
    assert ports(server, server) == {(988, 1023)}  # added by the FSx L2 for server-to-server traffic
    assert not any("CidrIp" in r["Properties"] for r in res.values() if r["Type"] == "AWS::EC2::SecurityGroupIngress")


def test_ecr_scans_on_push_with_immutable_tags_and_no_expiry(eks: Synthesized) -> None:
    eks.template("Storage").has_resource_properties(
        "AWS::ECR::Repository",
        {
            "ImageScanningConfiguration": {"ScanOnPush": True},
            "ImageTagMutability": "IMMUTABLE",
            "LifecyclePolicy": Match.absent(),  # nothing expires an image a job may pull (test_infra_deploy.py)
        },
    )


def test_imported_bucket_is_linked_with_its_prefix_and_not_created(pcluster: Synthesized) -> None:
    t = pcluster.template("Storage")
    t.resource_count_is("AWS::S3::Bucket", 0)
    t.has_resource_properties(
        "AWS::FSx::DataRepositoryAssociation", {"DataRepositoryPath": "s3://example-existing-training-bucket/t5/"}
    )


def test_explicit_env_with_explicit_azs_needs_no_context_lookup() -> None:
    import aws_cdk as cdk
    from aws_cdk.assertions import Template

    from stacks.network_stack import NetworkStack

    app = cdk.App()
    stack = NetworkStack(
        app,
        "Net",
        env=cdk.Environment(account="123456789012", region="eu-west-1"),
        cidr="10.1.0.0/16",
        max_azs=2,
        availability_zones=("eu-west-1b", "eu-west-1c"),
        nat_gateways=1,
    )
    subnets = Template.from_stack(stack).find_resources("AWS::EC2::Subnet")
    # Without the override ec2.Vpc would look the AZs up (offline: placeholder names like dummy1a).
    assert sorted({s["Properties"]["AvailabilityZone"] for s in subnets.values()}) == ["eu-west-1b", "eu-west-1c"]
