#!/usr/bin/env bash
# Set up everything airflow-finalckpt needs on a fresh machine: checks Java 17 and Python 3.11,
# creates .venv, installs the package with all extras (Airflow 3.3, PySpark, PostgreSQL driver,
# the example data set, the Celery provider, dev tools) and checks that `import pyspark` works.
# The versions come from constraints/newest.txt (the newest the ranges allow, resolved and
# tested; FINALCKPT_CONSTRAINTS=<file> picks another, e.g. constraints/floors.txt). VENV=<dir>
# sets up another virtualenv than .venv and FINALCKPT_EXTRAS=<a,b> other extras (scripts/lane.sh
# does, for CI's floors and Spark 3.5 lanes); FINALCKPT_REQUIREMENTS="<req> ..." installs optional
# packages in no extra beside it (the floors lane: the amazon provider), under the same constraints.
# The package itself is installed editable (`pip install -e`: the dev flow, an edit takes effect at
# once) unless FINALCKPT_INSTALL=wheel: then its wheel, as a platform installs it (CI's lanes);
# FINALCKPT_WHEEL=<file> names a wheel built already (scripts/test.sh builds one for both lanes),
# else scripts/build_wheel.sh builds one here.
# Idempotent: a second run only re-installs when pyproject.toml or the constraints changed (and,
# for a wheel install, the package alone when the wheel's files changed).
# The plugin's UI (ui/, React) is built with npm into the package (scripts/build_ui.sh: Node >= 20
# and npm needed; a no-op when ui/ is unchanged since the last build).
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

# the UI bundle first: an editable install serves it from here, a wheel ships it
./scripts/build_ui.sh

VENV=${VENV:-.venv}
CONSTRAINTS=${FINALCKPT_CONSTRAINTS:-constraints/newest.txt}
EXTRAS=${FINALCKPT_EXTRAS:-airflow,spark,postgres,examples,lakehouse,lineage,celery,dev}
read -r -a REQUIREMENTS <<<"${FINALCKPT_REQUIREMENTS:-}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi

INSTALL=${FINALCKPT_INSTALL:-editable}
case "$INSTALL" in
  editable | wheel) ;;
  *) echo "error: FINALCKPT_INSTALL=$INSTALL: editable or wheel" >&2; exit 2 ;;
esac
wheel=${FINALCKPT_WHEEL:-}
wheel_tmp=
trap 'rm -rf "$wheel_tmp"' EXIT
# the wheel to install: FINALCKPT_WHEEL, or one built with this virtualenv's setuptools
need_wheel() {
  if [ -z "$wheel" ]; then
    wheel_tmp=$(mktemp -d -t finalckpt-wheel-XXXX)
    wheel=$(./scripts/build_wheel.sh "$VENV/bin/python" "$wheel_tmp")
  fi
}

# The wheel's RECORD (every file's sha256) identifies its contents; the zip's timestamps do not.
wheel_record() {
  "$VENV/bin/python" - "$1" <<'PY'
import hashlib, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as archive:
    [name] = [n for n in archive.namelist() if n.endswith(".dist-info/RECORD")]
    print(hashlib.sha256(archive.read(name)).hexdigest())
PY
}

stamp=$VENV/.finalckpt-installed
# what is installed, so that a change re-installs (the default's key is unchanged since before
# FINALCKPT_INSTALL and FINALCKPT_REQUIREMENTS: an existing .venv is not re-installed for them)
key=$EXTRAS
[ "$INSTALL" = editable ] || key+=" $INSTALL"
[ "${#REQUIREMENTS[@]}" -eq 0 ] || key+=" ${REQUIREMENTS[*]}"
want=$( (cat pyproject.toml "$CONSTRAINTS"; echo "$key") | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "==> installing airflow-finalckpt[$EXTRAS] ($INSTALL) ${REQUIREMENTS[*]} into $VENV, constraints $CONSTRAINTS (first time: a few minutes)"
  "$VENV/bin/python" -m pip install --quiet --upgrade "pip>=24" "setuptools>=77,<81" wheel
  if [ "$INSTALL" = editable ]; then
    "$VENV/bin/python" -m pip install --quiet -c "$CONSTRAINTS" -e ".[$EXTRAS]" "${REQUIREMENTS[@]}"
  else
    need_wheel
    # uninstalled first, so this wheel's files replace any earlier install of version 0.1.0
    "$VENV/bin/python" -m pip uninstall --quiet --yes airflow-finalckpt 2>/dev/null
    "$VENV/bin/python" -m pip install --quiet -c "$CONSTRAINTS" "$wheel[$EXTRAS]" "${REQUIREMENTS[@]}"
    wheel_record "$wheel" > "$VENV/.finalckpt-wheel"
  fi
  echo "$want" > "$stamp"
fi

if [ "$INSTALL" = wheel ]; then
  # The package alone whenever the wheel's files changed: its version number stays 0.1.0, so pip
  # would keep what is installed (an older wheel).
  need_wheel
  record=$(wheel_record "$wheel")
  if [ "$(cat "$VENV/.finalckpt-wheel" 2>/dev/null)" != "$record" ]; then
    echo "==> installing $(basename "$wheel") into $VENV (the package only)"
    "$VENV/bin/python" -m pip install --quiet --no-deps --force-reinstall "$wheel"
    echo "$record" > "$VENV/.finalckpt-wheel"
  fi
  # -P: not the current directory on sys.path, so a checkout cannot stand in for the install
  "$VENV/bin/python" -P - <<'PY'
import importlib.metadata as md
import json, pathlib, sysconfig
import airflow_finalckpt
where = pathlib.Path(airflow_finalckpt.__file__).resolve()
site = pathlib.Path(sysconfig.get_paths()["purelib"]).resolve()
assert where.is_relative_to(site), f"airflow_finalckpt imports from {where}, not from {site}"
origin = json.loads(md.distribution("airflow-finalckpt").read_text("direct_url.json") or "{}")
assert str(origin.get("url", "")).endswith(".whl"), f"not installed from a wheel: {origin}"
PY
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
