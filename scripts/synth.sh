#!/usr/bin/env bash
# make synth PLATFORM=eks|parallelcluster [ARGS="-c key=value ..."]
# Synthesize the CDK app offline (no AWS credentials, no context lookups) with the project's pinned CDK CLI
# (package.json/package-lock.json: aws-cdk 2.1148.1, installed into node_modules on first use).
# Templates go to cdk.out/<platform>/. cdk-nag AwsSolutions runs during synth (unacknowledged findings fail
# it); cfn-lint then checks every template (errors fail, warnings are counted).
# Extra arguments go to `cdk synth` (e.g. -c gpuInstanceType=p4d.24xlarge -c gpuNodes=4). Unknown context keys
# (any spelling), -c without a value and a platform key other than PLATFORM are refused first (exit 2).
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
  echo "Context keys: .venv/bin/python app.py --help"
  exit 0
fi
cd "$(dirname "$0")/.."
source scripts/cdk_lib.sh
cdk_platform synth

scripts/venv.sh >/dev/null  # the app runs in the project venv (cdk.json: .venv/bin/python app.py)
# CDK ignores unknown keys and `-c key` without a value; refuse them (and -c platform != PLATFORM) first.
.venv/bin/python -m stacks.synth_check "$platform" "$@"

cdk_cli_ready

out="cdk.out/$platform"
rm -rf -- "$out"  # never lint a template left over from an earlier synth
echo "[synth] cdk synth PLATFORM=$platform -> $out" >&2
start=$(date +%s.%N)
node_modules/.bin/cdk synth --quiet --no-lookups --output "$out" -c "platform=$platform" "$@"
end=$(date +%s.%N)
for t in "$out"/*.template.json; do
  printf '  %-56s %7d bytes\n' "$t" "$(wc -c < "$t")"
done
awk -v s="$start" -v e="$end" -v p="$platform" 'BEGIN { printf "synth time (%s): %.1f s\n", p, e - s }'
.venv/bin/python - "$out/validation-report.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
n = sum(len(p.get("violations", [])) for p in report.get("pluginReports", []))
print(f"cdk-nag AwsSolutions: {n} unacknowledged findings (acknowledged ones and reasons: docs/deploy.md)")
PY

# cfn-lint exit status is a bit mask: 2 = errors, 4 = warnings, 8 = informational.
rc=0
lint=$(.venv/bin/cfn-lint --format parseable "$out"/*.template.json) || rc=$?
errors=$(grep -c ':E[0-9]' <<<"$lint" || true)
warnings=$(grep -c ':W[0-9]' <<<"$lint" || true)
rules=$(grep -o ':[EW][0-9]*:' <<<"$lint" | tr -d ':' | sort | uniq -c | awk '{printf "%s%s x%s", sep, $2, $1; sep=", "}')
echo "cfn-lint: $errors errors, $warnings warnings${rules:+ ($rules)}"
if [ $((rc & 2)) -ne 0 ] || [ "$errors" -ne 0 ]; then
  echo "$lint" >&2
  echo "error: cfn-lint found errors in $out" >&2
  exit 1
fi
