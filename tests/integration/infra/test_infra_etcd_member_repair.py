"""The ParallelCluster members can repair themselves (issue #53 item 3): boot.sh gets the start-time repair's
modules from the settings, and the members' role may read root's password, which the repair logs in with. The
repair itself: tests/integration/failover/test_member_repair.py; the units run for real through it:
tests/e2e/infra/test_infra_pcluster.py."""

from __future__ import annotations

import json


from tests.integration.infra.test_infra_etcd_member_redeploy import _of_type, members_template

REPAIR_MODULES = {f"training/launch/rendezvous/{m}" for m in ("__init__.py", "client.py", "member_repair.py")}


def test_the_settings_name_the_repair_and_roots_secret_and_the_members_may_read_it() -> None:
    template = members_template()
    (parameter,) = _of_type(template, "AWS::SSM::Parameter").values()
    value = json.dumps(parameter["Properties"]["Value"])  # a Fn::Join of the JSON text and tokens
    for path in REPAIR_MODULES:
        assert f'\\"{path}\\":' in value, path
    (root_secret,) = [
        k
        for k, r in _of_type(template, "AWS::SecretsManager::Secret").items()
        if "GenerateSecretString" in r["Properties"]
    ]
    assert '\\"root_secret\\":' in value and root_secret in value
    (profile,) = _of_type(template, "AWS::IAM::InstanceProfile").values()
    (role,) = profile["Properties"]["Roles"]
    readers = [
        statement
        for policy in _of_type(template, "AWS::IAM::Policy").values()
        if role in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        if "secretsmanager:GetSecretValue" in json.dumps(statement["Action"])
    ]
    assert any(root_secret in json.dumps(s["Resource"]) for s in readers)
