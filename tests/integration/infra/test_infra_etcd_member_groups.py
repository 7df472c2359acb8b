"""A terminated ParallelCluster etcd member comes back with no operator action (issue #53 item 3): each member is
an Auto Scaling group of one in its own subnet, its fixed address a network interface the stack owns that the
member's boot step (member_address.sh) attaches to whichever instance the group runs; the members' role may attach
those three interfaces only, to member instances only. The replacement starts without data and rejoins through
the start-time repair (tests/integration/failover/test_member_repair.py; boot.sh runs member_address.sh, then
member.sh: test_infra_etcd_member_redeploy.py)."""

from __future__ import annotations

import json
import re
import os
import subprocess
from pathlib import Path

import pytest
from aws_cdk.assertions import Match, Template

from stacks.components.etcd_members import MEMBER_ASSETS
from tests.integration.infra.test_infra_etcd_member_redeploy import _of_type, members_template

ADDRESS_SCRIPT = MEMBER_ASSETS / "member_address.sh"


@pytest.fixture(scope="module")
def template() -> Template:
    return Template.from_json(members_template())


def test_each_member_is_a_group_of_one_in_its_interfaces_subnet(template: Template) -> None:
    t = template.to_json()
    enis = _of_type(t, "AWS::EC2::NetworkInterface")
    groups = _of_type(t, "AWS::AutoScaling::AutoScalingGroup")
    templates = _of_type(t, "AWS::EC2::LaunchTemplate")
    assert len(enis) == len(groups) == len(templates) == 3
    assert not _of_type(t, "AWS::EC2::Instance")  # a bare instance is not replaced when it is lost
    (profile,) = _of_type(t, "AWS::IAM::InstanceProfile")
    (member_sg,) = [
        lid
        for lid, r in _of_type(t, "AWS::EC2::SecurityGroup").items()
        if r["Properties"]["GroupDescription"].startswith("etcd members")
    ]
    subnets = set()
    for i in range(3):
        group = groups[next(lid for lid in groups if f"Member{i}Group" in lid)]["Properties"]
        eni = enis[next(lid for lid in enis if f"Member{i}Eni" in lid)]["Properties"]
        assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"]) == ("1", "1", "1")
        assert group["VPCZoneIdentifier"] == [eni["SubnetId"]]  # pinned to its address's subnet (AZ)
        subnets.add(eni["SubnetId"])
        template_id = group["LaunchTemplate"]["LaunchTemplateId"]["Ref"]
        assert group["LaunchTemplate"]["Version"] == {"Fn::GetAtt": [template_id, "LatestVersionNumber"]}
        data = templates[template_id]["Properties"]["LaunchTemplateData"]
        assert data["MetadataOptions"]["HttpTokens"] == "required"  # IMDSv2 only
        assert all(m["Ebs"]["Encrypted"] for m in data["BlockDeviceMappings"])
        assert data["IamInstanceProfile"] == {"Arn": {"Fn::GetAtt": [profile, "Arn"]}}
        assert data["SecurityGroupIds"] == [{"Fn::GetAtt": [member_sg, "GroupId"]}] == eni["GroupSet"]
        user_data = json.dumps(data["UserData"])
        assert f"/opt/t5-etcd/boot.sh {i} " in user_data
        # the setup runs through systemd, again after a failure (a replacement waiting for its address)
        assert "Restart=on-failure" in user_data and "systemctl start --no-block t5-etcd-setup.service" in user_data
    assert len(subnets) == 2  # the members spread over the two given subnets
    template.resource_properties_count_is(
        "AWS::AutoScaling::AutoScalingGroup",
        {
            "MinSize": "1",
            "MaxSize": "1",
            "DesiredCapacity": "1",
            "HealthCheckType": "EC2",
            "LaunchTemplate": Match.any_value(),
        },
        3,
    )


def test_the_members_may_attach_their_own_interfaces_to_member_instances_only(template: Template) -> None:
    t = template.to_json()
    enis = sorted(_of_type(t, "AWS::EC2::NetworkInterface"))
    (profile,) = _of_type(t, "AWS::IAM::InstanceProfile")
    attach = [
        s
        for policy in _of_type(t, "AWS::IAM::Policy").values()
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
        if "ec2:AttachNetworkInterface" in json.dumps(s["Action"])
    ]
    by_sid = {s["Sid"]: s for s in attach}
    assert set(by_sid) == {"AttachTheMembersAddresses", "AttachToMemberInstancesOnly"}
    interfaces = by_sid["AttachTheMembersAddresses"]
    assert interfaces["Action"] == "ec2:AttachNetworkInterface" and "Condition" not in interfaces
    named = sorted(
        ref for r in interfaces["Resource"] for ref in re.findall(r'"Ref": "([^"]+)"', json.dumps(r)) if "::" not in ref
    )
    assert named == enis  # by ARN, the three members' interfaces and nothing else
    assert all(":network-interface/" in json.dumps(r) for r in interfaces["Resource"])
    instances = by_sid["AttachToMemberInstancesOnly"]
    assert ":instance/*" in json.dumps(instances["Resource"])
    assert instances["Condition"] == {"ArnEquals": {"ec2:InstanceProfile": {"Fn::GetAtt": [profile, "Arn"]}}}
    # boot.sh finds its interface in the settings (the user data stays the same on every deploy)
    (parameter,) = _of_type(t, "AWS::SSM::Parameter").values()
    value = json.dumps(parameter["Properties"]["Value"])
    assert '\\"interfaces\\":' in value and all(eni in value for eni in enis)


# ------------------------------------------------------------------------- member_address.sh, as boot.sh runs it
FAKE_AWS = r"""#!/bin/sh
# aws ec2 attach-network-interface: refused (InUse) while $STATE/busy counts down, then attached (the metadata
# service and `ip` then show it); every call logged to $STATE/calls
echo "$*" >> "$STATE/calls"
busy=$(cat "$STATE/busy")
if [ "$busy" -gt 0 ]; then
  echo $((busy - 1)) > "$STATE/busy"
  echo "An error occurred (InvalidNetworkInterface.InUse) when calling the AttachNetworkInterface operation:" \
       "Interface: [eni-0123456789abcdef0] in use." >&2
  exit 254
fi
printf eni-0123456789abcdef0 > "$STATE/attached"
"""
FAKE_CURL = r"""#!/bin/sh
# the instance metadata service: a token for PUT, else the path after /latest/meta-data/
case "$*" in *PUT*) printf token; exit 0 ;; esac
for last; do :; done
case "${last#*/latest/meta-data/}" in
  instance-id) printf i-0new ;;
  network/interfaces/macs/) echo 0a:00:00:00:00:01/; [ -f "$STATE/attached" ] && echo 0a:00:00:00:00:02/ ;;
  network/interfaces/macs/0a:00:00:00:00:01/interface-id) printf eni-primary ;;
  network/interfaces/macs/0a:00:00:00:00:02/interface-id) cat "$STATE/attached" ;;
  *) exit 22 ;;
esac
exit 0
"""
FAKE_IP = r"""#!/bin/sh
echo "1: lo    inet 127.0.0.1/8 scope host lo"
echo "2: ens5    inet 10.0.1.200/24 brd 10.0.1.255 scope global dynamic ens5"
[ -f "$STATE/attached" ] && echo "3: ens6    inet 10.0.1.10/24 brd 10.0.1.255 scope global ens6"
exit 0
"""


def _run_address(tmp_path: Path, busy: int, *args: str, wait_s: int = 30) -> subprocess.CompletedProcess:
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    if not bin_dir.exists():
        bin_dir.mkdir()
        state.mkdir()
        for name, text in (("aws", FAKE_AWS), ("curl", FAKE_CURL), ("ip", FAKE_IP)):
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
    (state / "busy").write_text(str(busy))
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STATE": str(state),
        "T5_ADDRESS_POLL_S": "0.05",
        "T5_ADDRESS_WAIT_S": str(wait_s),
    }
    args = args or ("eni-0123456789abcdef0", "10.0.1.10", "us-east-1")
    return subprocess.run(["bash", str(ADDRESS_SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)


def _calls(tmp_path: Path) -> list[str]:
    calls = tmp_path / "state" / "calls"
    return calls.read_text().splitlines() if calls.exists() else []


def test_a_replacement_takes_the_address_once_the_lost_instance_lets_go(tmp_path: Path) -> None:
    proc = _run_address(tmp_path, busy=3)  # the instance it replaces still holds the interface for 3 tries
    assert proc.returncode == 0, proc.stderr
    calls = _calls(tmp_path)
    assert len(calls) == 4 and set(calls) == {
        "ec2 attach-network-interface --region us-east-1 --network-interface-id eni-0123456789abcdef0 "
        "--instance-id i-0new --device-index 1 --output text"
    }
    assert "waiting to attach eni-0123456789abcdef0: An error occurred (InvalidNetworkInterface.InUse)" in proc.stdout
    assert "10.0.1.10 is up" in proc.stdout
    # the next boot of the same instance (a reboot): attached already, nothing asked of EC2
    proc = _run_address(tmp_path, busy=0)
    assert proc.returncode == 0, proc.stderr
    assert len(_calls(tmp_path)) == 4 and "attached to i-0new already" in proc.stdout


def test_an_interface_never_let_go_fails_the_setup_with_ec2s_refusal(tmp_path: Path) -> None:
    proc = _run_address(tmp_path, busy=10**6, wait_s=0)
    assert proc.returncode == 1
    (line,) = proc.stderr.splitlines()
    assert "could not attach eni-0123456789abcdef0 (10.0.1.10) to i-0new in 0 s" in line and "InUse" in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("i-0123", "10.0.1.10", "us-east-1"), "ENI 'i-0123' is not a network interface id (eni-...)"),
        (("eni-0123456789abcdef0", "10.0.1", "us-east-1"), "MY_IP '10.0.1' is not an IPv4 address"),
    ],
)
def test_bad_arguments_are_named(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    proc = _run_address(tmp_path, 0, *args)
    assert proc.returncode == 2 and message in proc.stderr and not _calls(tmp_path)
