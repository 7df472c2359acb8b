"""A ParallelCluster redeploy never stops the three etcd members at once (issue #53 item 2): a change to a member
script or to the etcd release changes the settings parameter the members read at boot, and no member's
properties (CloudFormation stops and starts an instance whose user data changes: all three together would take
the coordinator down)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Template

from stacks import versions
from stacks.components import etcd_members
from stacks.components.etcd_members import BOOT_SCRIPT, EtcdMembers


def _members_stack(app: cdk.App, name: str) -> cdk.Stack:
    """Only the members, in a stack of their own in an imported VPC (seconds, not the whole app)."""
    stack = cdk.Stack(app, name, env=cdk.Environment(account="123456789012", region="us-east-1"))
    vpc = ec2.Vpc.from_vpc_attributes(
        stack, "Vpc", vpc_id="vpc-1", availability_zones=["us-east-1a", "us-east-1b"], private_subnet_ids=["s-1", "s-2"]
    )
    clients = ec2.SecurityGroup.from_security_group_id(stack, "Clients", "sg-1")
    EtcdMembers(stack, "Etcd", vpc=vpc, subnets=vpc.private_subnets, client_security_groups=[clients])
    return stack


LAUNCH_TEMPLATE = "AWS::EC2::LaunchTemplate"


@functools.cache
def members_template() -> dict[str, Any]:
    """The members' stack's template, synthesized once per process for the files that only read it."""
    return Template.from_stack(_members_stack(cdk.App(), "Members")).to_json()


def _of_type(template: dict[str, Any], type_: str) -> dict[str, Any]:
    return {k: r for k, r in template["Resources"].items() if r["Type"] == type_}


def test_a_script_or_release_change_changes_no_member(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = cdk.App()
    first = _members_stack(app, "Before")
    changed = tmp_path / "tls.py"
    changed.write_text(etcd_members.MEMBER_FILES["tls.py"].read_text() + "\n# a fix\n")
    monkeypatch.setitem(etcd_members.MEMBER_FILES, "tls.py", changed)
    monkeypatch.setattr(versions, "ETCD_VERSION", "3.6.99")
    second = _members_stack(app, "After")
    before, after = (Template.from_stack(stack).to_json() for stack in (first, second))
    groups, templates = _of_type(before, "AWS::AutoScaling::AutoScalingGroup"), _of_type(before, LAUNCH_TEMPLATE)
    assert len(groups) == 3 and len(templates) == 3
    assert _of_type(after, "AWS::AutoScaling::AutoScalingGroup") == groups  # no member is replaced
    assert _of_type(after, LAUNCH_TEMPLATE) == templates  # nor gets a new launch template version
    assert all("UpdatePolicy" not in g for g in groups.values())  # a new version would replace no running member
    settings = lambda t: json.dumps(_of_type(t, "AWS::SSM::Parameter"))  # noqa: E731
    assert settings(after) != settings(before) and "3.6.99" in settings(after)  # read at their next boot
    for template in templates.values():  # the user data names no script object and no release
        user_data = json.dumps(template["Properties"]["LaunchTemplateData"]["UserData"])
        assert "s3://" not in user_data and versions.ETCD_VERSION not in user_data


FAKE_AWS = r'''#!/usr/bin/env python3
"""aws ssm get-parameter (the settings in $FAKE_SETTINGS) and aws s3 cp (s3://bucket/KEY -> $FAKE_S3/KEY)."""
import os, shutil, sys
a = sys.argv[1:]
if a[:2] == ["ssm", "get-parameter"]:
    print(open(os.environ["FAKE_SETTINGS"]).read())
elif a[:2] == ["s3", "cp"]:
    src, dst = [x for x in a[2:] if not x.startswith("-") and x != "us-east-1"][-2:]
    shutil.copy(os.path.join(os.environ["FAKE_S3"], src.split("/", 3)[3]), dst)
else:
    sys.exit(f"fake aws: unexpected {a}")
'''


def test_boot_step_fetches_the_scripts_and_runs_the_member_with_the_settings(tmp_path: Path) -> None:
    """boot.sh, as the setup unit runs it: the scripts come from the settings' S3 URLs, member.sh gets its
    arguments in member.sh's order (a member.sh that records them stands in for the real one)."""
    s3 = tmp_path / "s3"
    s3.mkdir()
    (s3 / "member.sh").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$RECORD"\n')
    (s3 / "member_address.sh").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$RECORD.address"\n')
    (s3 / "tls.py").write_text("# tls\n")
    (s3 / "certs.py").write_text("# certs\n")
    (s3 / "repair.py").write_text("# a module under its package path\n")
    settings = {
        "scripts": {
            **{n: f"s3://cdk-assets/{n}" for n in ("member.sh", "member_address.sh", "tls.py", "certs.py")},
            "training/launch/rendezvous/member_repair.py": "s3://cdk-assets/repair.py",
        },
        "ips": "10.0.1.10,10.0.2.10,10.0.1.11",
        "interfaces": "eni-0a,eni-0b,eni-0c",
        "client_port": "2379",
        "peer_port": "2380",
        "version": "3.6.14",
        "arch": "arm64",
        "sha256": "a" * 64,
        "members_secret": "arn:members",
        "client_secret": "arn:client",
        "root_secret": "arn:root",
    }
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "aws").write_text(FAKE_AWS)
    (bin_dir / "aws").chmod(0o755)
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_SETTINGS": str(tmp_path / "settings.json"),
        "FAKE_S3": str(s3),
        "RECORD": str(tmp_path / "args"),
    }
    assets = tmp_path / "opt"
    proc = subprocess.run(
        ["bash", str(BOOT_SCRIPT), "1", "/t5/settings", "us-east-1", str(assets)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in assets.iterdir()) == [
        "certs.py",
        "member.sh",
        "member_address.sh",
        "tls.py",
        "training",
    ]
    # member 1's own interface and address, attached before its member starts
    assert (tmp_path / "args.address").read_text().splitlines() == ["eni-0b", "10.0.2.10", "us-east-1"]
    assert (assets / "training/launch/rendezvous/member_repair.py").read_text() == "# a module under its package path\n"
    assert (tmp_path / "args").read_text().splitlines() == [
        "1",
        "10.0.1.10,10.0.2.10,10.0.1.11",
        "2379",
        "2380",
        "3.6.14",
        "arm64",
        "a" * 64,
        "arn:members",
        "arn:client",
        "us-east-1",
        str(assets),
        "arn:root",
    ]
