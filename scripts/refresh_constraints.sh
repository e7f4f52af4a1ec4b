#!/usr/bin/env bash
# Re-resolve constraints/newest.txt: the newest releases pyproject.toml's ranges allow, with
# pyspark and pyspark-client on one version (PYSPARK, default: the newest pyspark-client
# release, which the Spark provider needs). Resolution only (pip --dry-run --report), nothing is
# installed. Then run ./scripts/setup.sh and the suite before committing the new file.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
PYSPARK=${PYSPARK:-$("$PYTHON" -m pip index versions pyspark-client 2>/dev/null \
  | sed -n 's/^pyspark-client (\(.*\))$/\1/p')}
[ -n "$PYSPARK" ] || { echo "error: no pyspark-client version found; set PYSPARK=x.y.z" >&2; exit 1; }
report=$(mktemp -t finalckpt-resolve-XXXX.json)
"$PYTHON" -m pip install --dry-run --ignore-installed -q --report "$report" \
  "pyspark==$PYSPARK" "pyspark-client==$PYSPARK" "setuptools>=77,<81" \
  -e ".[airflow,spark,postgres,examples,lakehouse,lineage,dev]" >/dev/null
{
  echo "# CI's newest-allowed lane: pyproject.toml's ranges resolved on $(date -u +%F) (Python"
  echo "# $("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')) with pyspark and pyspark-client on one version ($PYSPARK)."
  echo "# scripts/setup.sh installs with it; scripts/refresh_constraints.sh wrote it. docs/compatibility.md."
  "$PYTHON" - "$report" <<'PY'
import json, sys
rows = sorted(
    (f"{i['metadata']['name']}=={i['metadata']['version']}" for i in json.load(open(sys.argv[1]))["install"]
     if i["metadata"]["name"].lower() != "airflow-finalckpt"),
    key=str.lower,
)
print("\n".join(rows))
PY
} > constraints/newest.txt
rm -f "$report"
# the driver-side lane: the same pins, pyspark 3.5 (SPARK35) and no pyspark-client
SPARK35=${SPARK35:-$(sed -n 's/^pyspark==\(3\.5\.[0-9]*\)$/\1/p' constraints/spark35.txt 2>/dev/null)}
PY4J=${PY4J:-$(sed -n 's/^py4j==//p' constraints/spark35.txt 2>/dev/null)}
{
  echo "# CI's spark35 lane (scripts/lane.sh spark35): constraints/newest.txt with pyspark $SPARK35 and"
  echo "# no pyspark-client (no Airflow there) and its py4j. scripts/refresh_constraints.sh wrote it."
  # py4j: the one pyspark $SPARK35 pins (PY4J)
  { grep -v '^#' constraints/newest.txt | grep -v -e '^pyspark-client==' -e '^py4j==' \
      | sed "s/^pyspark==.*/pyspark==$SPARK35/"; echo "py4j==$PY4J"; } | sort -f
} > constraints/spark35.txt
echo "==> constraints/newest.txt: $(grep -vc '^#' constraints/newest.txt) pins, pyspark $PYSPARK"
