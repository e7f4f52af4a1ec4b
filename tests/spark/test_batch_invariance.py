"""A seeded sample of the batch-invariance matrix (``batch_invariance.py``): every shape once
with a crash and a resume, at a batching chosen by the seed, plus one cell the contract refuses;
all in the suite's one SparkSession. ``FINALCKPT_INVARIANCE_SEED`` picks another sample;
``scripts/batch-invariance.sh`` runs the whole matrix.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from batch_invariance import (
    SHAPES_BY_NAME,
    Cell,
    Env,
    expected_refusal,
    make_env,
    run_cell,
    sample_cells,
)
from invariance_shapes import SHAPES, Shape
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from airflow_finalckpt.spark.stage import BatchContext, SparkStageLogic, Transform

SEED = int(os.environ.get("FINALCKPT_INVARIANCE_SEED", "24"))
CELLS = sample_cells(SEED)


@pytest.fixture(scope="module")
def env(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Env:
    return make_env(spark, Path(tmp_path_factory.mktemp("invariance")))


def test_the_sample_covers_every_shape_with_a_crash_and_a_refusal() -> None:
    assert len(SHAPES) >= 12
    crashing = {c.shape for c in CELLS if not expected_refusal(SHAPES_BY_NAME[c.shape], c.batching)}
    assert crashing == set(SHAPES_BY_NAME)
    assert any(expected_refusal(SHAPES_BY_NAME[c.shape], c.batching) for c in CELLS)
    assert sample_cells(SEED) == CELLS  # seeded: the same sample every run


@pytest.mark.parametrize("cell", CELLS, ids=lambda cell: cell.name)
def test_committed_output_equals_the_plain_job_or_is_refused(env: Env, cell: Cell) -> None:
    result = run_cell(env, cell)
    expected = "refused" if expected_refusal(SHAPES_BY_NAME[cell.shape], cell.batching) else None
    assert result.outcome in ((expected,) if expected else ("passed", "refused")), result.detail


def _driver_side_counts(_inputs: object) -> tuple[Transform, None]:
    """A per-key count computed on the driver: its plan is a local relation, so only the
    driver-action rule can see that it depends on the batch."""

    def transform(ctx: BatchContext) -> DataFrame:
        rows = ctx.read_parts().groupBy("key").agg(F.count(F.lit(1)).alias("n")).collect()
        return ctx.spark.createDataFrame(rows, "key string, n long")

    return transform, None


def test_the_matrix_catches_a_result_that_depends_on_batching(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness can fail: with the rule driver-action-on-batch planted off (the plan check
    blind to driver-side actions), per-batch counts committed as the result differ from the
    plain job's, and the cell says how."""
    hidden = Shape("driver_side_counts", _driver_side_counts)
    SHAPES_BY_NAME[hidden.name] = hidden
    monkeypatch.setattr(SparkStageLogic, "_saw_action", lambda *_args: None)
    try:
        result = run_cell(env, Cell(hidden.name, "1", "first"))
    finally:
        del SHAPES_BY_NAME[hidden.name]
    assert result.outcome == "failed"
    assert "rows committed, plain job" in result.detail
