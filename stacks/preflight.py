"""make preflight PLATFORM=eks|parallelcluster: can the saved deploy get its GPUs, and in which AZ?

Read-only AWS calls, each result explained on one line:

* the AZ offer: ``ec2 describe-instance-type-offerings`` (location type availability-zone) for ``gpuInstanceType``;
* the capacity reservation (``capacityReservationId``): ``ec2 describe-capacity-reservations``: its instance type,
  state, AZ, free instances and type (On-Demand Capacity Reservation or Capacity Block, as ``capacityBlock`` says);
* the quota: ``service-quotas get-service-quota`` for the instance family's "Running On-Demand ... instances" vCPU
  quota against ``gpuNodes`` x the type's vCPUs (``ec2 describe-instance-types``). A hot spare is one more node:
  deploy ``gpuNodes`` >= nodes + 1 and this counts it.

The GPU AZ is chosen where the instance type is offered: the reservation's AZ if there is one, else the first AZ of
``availabilityZones`` if it is offered there, else the first AZ of the region that offers it. It is saved, first, in
``availabilityZones`` (with the region) in the saved deploy settings (cdk.context.json; stacks/deploy_config.py),
so the next ``make deploy`` puts the GPU subnet and FSx there. Once the network stack is deployed
(``cloudformation describe-stacks``), the GPU AZ is not moved: moving it would re-lay the subnets and FSx, which the
other stacks import; preflight fails instead and saves nothing (``make destroy`` first, or use capacity in the
deployed AZ). A Capacity Block's start and end are saved too (``capacityBlockStart``, ``capacityBlockEnd``; EKS: the
GPU node group scales with them). ``ARGS="-c key=value ..."`` (e.g. ``-c
capacityReservationId=cr-...``) are merged into the saved settings as ``make deploy`` merges them, and saved with it.

Exit 0: every check passed (AZ saved); 1: a check failed, or AWS could not be asked (no credentials, no region,
AWS unreachable, credentials refused: one line, :mod:`stacks.aws_access`); 2: the saved settings are invalid.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from datetime import timezone
from pathlib import Path
from typing import Any, Optional, Sequence

from stacks.config import ConfigError, InfraConfig
from stacks.deploy_config import ROOT, SAVED_FILE, merge_settings, save

#: Service Quotas codes of the "Running On-Demand <family> instances" vCPU quotas, by instance family letter(s).
ON_DEMAND_VCPU_QUOTAS = {
    "p": ("L-417A185B", "Running On-Demand P instances"),
    "g": ("L-DB2E81BA", "Running On-Demand G and VT instances"),
}
#: Reservation states whose instances can be launched now or at the block's start.
USABLE_RESERVATION_STATES = ("active", "scheduled", "payment-pending")

WOULD_CHECK = """[preflight] would check, with read-only AWS calls in the deploy's region:
  - which AZs offer {itype} (ec2 describe-instance-type-offerings), and choose the GPU AZ among them
  - the On-Demand vCPU quota of the instance family (service-quotas get-service-quota) against {nodes} x {itype}
  - {reservation}
  - whether the network stack is deployed (cloudformation describe-stacks): then the GPU AZ is not moved
  then save the chosen AZ (availabilityZones) and region in {saved}"""


@dataclass
class Report:
    """The checks' results, in order: (ok, line); the chosen AZ list to save, or None."""

    results: list[tuple[bool, str]] = field(default_factory=list)
    availability_zones: Optional[list[str]] = None
    region: str = ""
    #: A Capacity Block's (start, end), UTC ISO 8601, to save with the AZ (EKS scales the GPU nodes with it).
    capacity_block_window: Optional[tuple[str, str]] = None

    def add(self, ok: bool, line: str) -> None:
        self.results.append((ok, line))

    @property
    def ok(self) -> bool:
        return all(ok for ok, _ in self.results)

    def lines(self) -> list[str]:
        return [f"  {'ok  ' if ok else 'FAIL'}  {line}" for ok, line in self.results]


def quota_for(instance_type: str) -> tuple[str, str] | None:
    """(quota code, quota name) of the On-Demand vCPU quota that ``instance_type`` counts against, or None."""
    return ON_DEMAND_VCPU_QUOTAS.get(instance_type[0])


def choose_az(
    *, offered: Sequence[str], region_azs: Sequence[str], wanted: Sequence[str], reservation_az: Optional[str]
) -> tuple[Optional[str], str]:
    """The AZ for the GPU nodes and why (None and the reason when there is none).

    ``offered``: AZs offering the instance type; ``region_azs``: the region's AZs in order; ``wanted``: the saved
    ``availabilityZones`` (its first is the GPU AZ); ``reservation_az``: the reservation's AZ, if any."""
    if reservation_az:
        if reservation_az not in offered:
            return None, f"the reservation's AZ {reservation_az} does not offer the instance type"
        return reservation_az, f"{reservation_az}: the capacity reservation's AZ"
    if wanted:
        if wanted[0] in offered:
            return wanted[0], f"{wanted[0]}: the first of the saved availabilityZones, which offers it"
        first = next((az for az in region_azs if az in offered), None)
        return first, (
            f"{first}: the saved first AZ {wanted[0]} does not offer it; {first} is the region's first AZ that does"
            if first
            else f"the saved AZ {wanted[0]} does not offer it, nor does any other"
        )
    first = next((az for az in region_azs if az in offered), None)
    if first is None:
        return None, "no AZ of the region offers it: pick another region or gpuInstanceType"
    return first, f"{first}: the region's first AZ that offers it"


def azs_to_save(chosen: str, region_azs: Sequence[str], wanted: Sequence[str], max_azs: int) -> list[str]:
    """``max_azs`` AZs with ``chosen`` first (the GPU subnet and FSx), then the saved ones, then the region's."""
    out = [chosen]
    for az in (*wanted, *region_azs):
        if len(out) == max_azs:
            break
        if az not in out and az in region_azs:
            out.append(az)
    return out


def check_reservation(ec2: Any, config: InfraConfig, report: Report) -> Optional[str]:
    """Describe the reservation and report on it; returns its AZ (None if it cannot be used)."""
    rid = config.capacity_reservation_id
    try:
        (res,) = ec2.describe_capacity_reservations(CapacityReservationIds=[rid])["CapacityReservations"]
    except ec2.exceptions.ClientError as e:
        report.add(
            False, f"reservation {rid}: {e.response['Error'].get('Message', e)} (is it in this region and account?)"
        )
        return None
    az, state, itype = res["AvailabilityZone"], res["State"], res["InstanceType"]
    kind = res.get("ReservationType", "default")
    is_block = kind == "capacity-block"
    problems = []
    if itype != config.gpu_instance_type:
        problems.append(f"it reserves {itype}, not gpuInstanceType {config.gpu_instance_type}")
    if state not in USABLE_RESERVATION_STATES:
        problems.append(f"its state is {state}")
    if is_block != config.capacity_block:
        problems.append(
            f"it is {'a Capacity Block' if is_block else 'an On-Demand Capacity Reservation'}: set "
            f"capacityBlock={'true' if is_block else 'false'}"
        )
    free = res.get("TotalInstanceCount", 0) if state == "scheduled" else res.get("AvailableInstanceCount", 0)
    if free < config.gpu_nodes:
        problems.append(f"{free} instance(s) free, gpuNodes={config.gpu_nodes} needs {config.gpu_nodes}")
    summary = (
        f"reservation {rid}: {state} {'Capacity Block' if is_block else 'On-Demand Capacity Reservation'} "
        f"for {itype} in {az}, {free} free"
    )
    if is_block and res.get("StartDate") and res.get("EndDate"):
        summary += f", {res['StartDate']} to {res['EndDate']}"
        if config.platform == "eks":
            report.capacity_block_window = (_utc_text(res["StartDate"]), _utc_text(res["EndDate"]))
    report.add(not problems, summary + (": " + "; ".join(problems) if problems else ""))
    return az


def _utc_text(when: Any) -> str:
    """A botocore timestamp as the saved settings spell it (``2026-12-01T11:30:00Z``)."""
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def network_deployed(cloudformation: Any, stack_name: str) -> bool:
    """Whether the network stack exists (any state but deleted): its subnets and the FSx behind them are laid."""
    try:
        (stack,) = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    except cloudformation.exceptions.ClientError as e:
        if "does not exist" in str(e):
            return False
        raise
    return stack["StackStatus"] != "DELETE_COMPLETE"


def check_quota(ec2: Any, quotas: Any, config: InfraConfig, report: Report) -> None:
    """The On-Demand vCPU quota of the instance family against gpuNodes x vCPUs."""
    itype = config.gpu_instance_type
    (info,) = ec2.describe_instance_types(InstanceTypes=[itype])["InstanceTypes"]
    vcpus = info["VCpuInfo"]["DefaultVCpus"]
    need = vcpus * config.gpu_nodes
    known = quota_for(itype)
    if known is None:
        report.add(True, f"quota: no On-Demand vCPU quota known for {itype}; not checked")
        return
    code, name = known
    try:
        value = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
    except quotas.exceptions.NoSuchResourceException:
        value = quotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
    line = f'quota {code} "{name}": {value:g} vCPUs, gpuNodes={config.gpu_nodes} x {itype} ({vcpus} vCPUs) need {need}'
    if config.capacity_reservation_id:
        report.add(True, line + " (informational: a reservation's instances were counted when it was made)")
    elif value >= need:
        report.add(True, line)
    else:
        report.add(
            False,
            line + ": request an increase (Service Quotas console, or aws service-quotas "
            f"request-service-quota-increase --service-code ec2 --quota-code {code} "
            f"--desired-value {need}), or use a capacity reservation",
        )


def run_checks(config: InfraConfig, *, ec2: Any, quotas: Any, region: str, deployed: bool = False) -> Report:
    """Every check against the given clients (real, or stubbed in tests); decides the AZ. ``deployed``: the network
    stack exists, so the saved GPU AZ stays where it is."""
    report = Report(region=region)
    itype = config.gpu_instance_type
    offers = ec2.describe_instance_type_offerings(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [itype]}]
    )
    offered = sorted(o["Location"] for o in offers["InstanceTypeOfferings"])
    zones = ec2.describe_availability_zones(Filters=[{"Name": "zone-type", "Values": ["availability-zone"]}])
    region_azs = sorted(z["ZoneName"] for z in zones["AvailabilityZones"] if z.get("State") == "available")
    report.add(bool(offered), f"AZ offer: {itype} is offered in {', '.join(offered) or 'no AZ'} of {region}")
    reservation_az = None
    if config.capacity_reservation_id:
        reservation_az = check_reservation(ec2, config, report)
    check_quota(ec2, quotas, config, report)
    wanted = [az for az in config.availability_zones if az.startswith(region)]
    chosen, why = choose_az(offered=offered, region_azs=region_azs, wanted=wanted, reservation_az=reservation_az)
    if config.capacity_reservation_id and reservation_az is None:
        chosen, why = None, "the reservation could not be read"
    if chosen is not None and deployed and wanted and chosen != wanted[0]:
        report.add(
            False,
            f"GPU AZ: the deployed network stack {config.stack_name('network')} has the GPU subnet and FSx in "
            f"{wanted[0]}; moving to {chosen} would re-lay them and the FSx file system the other stacks import: "
            f"use capacity in {wanted[0]}, or make destroy PLATFORM={config.platform} first (nothing saved)",
        )
        report.capacity_block_window = None
        return report
    report.add(chosen is not None, f"GPU AZ: {why}")
    if chosen is not None:
        report.availability_zones = azs_to_save(chosen, region_azs, wanted, config.max_azs)
    return report


def save_choice(saved: dict[str, Any], report: Report, root: Path = ROOT) -> Path:
    """Write the saved settings (with this call's ``-c`` values) plus the chosen AZs, the region and a Capacity
    Block's window."""
    window = {}
    if report.capacity_block_window:
        window = dict(zip(("capacityBlockStart", "capacityBlockEnd"), report.capacity_block_window))
    return save({**saved, "availabilityZones": report.availability_zones, "region": report.region, **window}, root)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    platform = os.environ.get("PLATFORM") or "eks"
    platform = "parallelcluster" if platform == "slurm" else platform
    try:
        if platform not in ("eks", "parallelcluster"):
            raise ConfigError(f"PLATFORM={platform}: preflight supports PLATFORM=eks or PLATFORM=parallelcluster")
        plan = merge_settings(platform, argv, command="preflight")
        config = plan.config
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import botocore.exceptions  # noqa: PLC0415 - after the config check: bad settings fail fast

    from stacks.aws_access import AwsAccessError, aws_session, check_access  # noqa: PLC0415

    session = aws_session(config.region)
    reservation = (
        f"capacity reservation {config.capacity_reservation_id}: type, state, AZ, free instances "
        "(ec2 describe-capacity-reservations)"
        if config.capacity_reservation_id
        else "no capacity reservation is set (capacityReservationId): nothing to check there"
    )
    try:
        check_access(session, "make preflight")
    except AwsAccessError as e:
        print(
            WOULD_CHECK.format(
                itype=config.gpu_instance_type, nodes=config.gpu_nodes, reservation=reservation, saved=SAVED_FILE
            ),
            file=sys.stderr,
        )
        print(f"error: {e}", file=sys.stderr)
        return 1
    region = session.region_name
    print(f"[preflight] {platform}: {config.gpu_nodes} x {config.gpu_instance_type} in {region}", file=sys.stderr)
    try:
        deployed = network_deployed(session.client("cloudformation"), config.stack_name("network"))
        report = run_checks(
            config,
            ec2=session.client("ec2"),
            quotas=session.client("service-quotas"),
            region=region,
            deployed=deployed,
        )
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
        print(f"error: AWS refused a read-only call: {e}", file=sys.stderr)
        return 1
    print("\n".join(report.lines()), file=sys.stderr)
    if report.availability_zones:
        path = save_choice(plan.saved, report)
        print(
            f"[preflight] saved availabilityZones={report.availability_zones} and region={region} in "
            f"{path.name}: the next make deploy puts the GPU nodes and FSx in {report.availability_zones[0]}",
            file=sys.stderr,
        )
    if not report.ok:
        print("error: preflight found a problem (FAIL above); fix it before make deploy", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
