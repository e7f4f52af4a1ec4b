#!/usr/bin/env bash
# Build airflow-finalckpt's wheel, the artefact a platform installs, and print its path.
#
#   scripts/build_wheel.sh PYTHON OUTDIR
#
# CI's compatibility lanes install this wheel, not the checkout (scripts/lane.sh,
# docs/compatibility.md). PYTHON needs setuptools >= 68 and wheel (every virtualenv that
# scripts/setup.sh made has them): the build runs without build isolation and without an index,
# so it needs no network. It builds from a copy of what the wheel is made of (pyproject.toml,
# README.md, airflow_finalckpt/) in a temporary directory: setuptools writes build/ and
# *.egg-info next to the sources it builds, and two lanes building in the checkout at once would
# race on them (scripts/test.sh builds once and hands the one wheel to both lanes).
# The plugin's React bundle is built first (scripts/build_ui.sh: a no-op when ui/ is unchanged)
# and the wheel is checked to hold it: the wheel must not fall back to the iframe pages.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:?usage: scripts/build_wheel.sh PYTHON OUTDIR}
out=${2:?usage: scripts/build_wheel.sh PYTHON OUTDIR}
./scripts/build_ui.sh
src=$(mktemp -d -t finalckpt-wheel-src-XXXX)
trap 'rm -rf "$src"' EXIT
cp pyproject.toml README.md "$src/"
# the package without bytecode or a stale egg-info (what an editable install leaves)
tar -cf - --exclude=__pycache__ --exclude='*.pyc' --exclude='*.egg-info' --exclude=.build-stamp \
  airflow_finalckpt \
  | tar -xf - -C "$src"
mkdir -p "$out"
"$python" -m pip wheel --quiet --no-deps --no-build-isolation --no-index -w "$out" "$src" >&2
wheels=("$out"/airflow_finalckpt-*.whl)
if [ "${#wheels[@]}" -ne 1 ] || [ ! -f "${wheels[0]}" ]; then
  echo "error: expected one airflow_finalckpt wheel in $out, found: ${wheels[*]}" >&2
  exit 1
fi
if ! "$python" -c 'import sys, zipfile; sys.exit(sys.argv[2] not in zipfile.ZipFile(sys.argv[1]).namelist())' \
    "${wheels[0]}" airflow_finalckpt/plugins/api/static/ui/finalckpt-ui.js; then
  echo "error: ${wheels[0]} holds no UI bundle (plugins/api/static/ui/finalckpt-ui.js)" >&2
  exit 1
fi
realpath "${wheels[0]}"
