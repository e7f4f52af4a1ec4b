#!/usr/bin/env bash
# The whole batch-invariance matrix on real Spark (tests/spark/batch_invariance.py): every
# transform shape x batch_size 1, 2, all, auto cold, auto warm x a crash after the first batch /
# inside the last batch, then a resume; the committed output must equal the plain job over the
# whole input, or the stage must refuse where the contract says so. Prints a line per cell and
# the figures (cells, passed, refused, failed, seconds); exits 1 if a cell failed.
#   --sample SEED   only the seeded sample CI runs (tests/spark/test_batch_invariance.py)
#   --shape NAME    only these shapes (repeatable)
#   --workdir DIR   keep the run's stores, checkpoints and tables there (default: a temp dir)
set -euo pipefail
cd "$(dirname "$0")/.."
# the suite's JVM flags (tests/conftest.py): C1 only, one GC thread
export SPARK_SUBMIT_OPTS=${SPARK_SUBMIT_OPTS:-"-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}
exec .venv/bin/python tests/spark/batch_invariance.py "$@"
