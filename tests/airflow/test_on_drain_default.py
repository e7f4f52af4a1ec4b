"""Which sources a stop with drain cuts, resolved from a real Airflow DAG (issue 25): in the
branching example ``weather`` is a dimension (``enrich`` reads it whole through
``ctx.upstream``; its primary input is ``ingest``), so it completes its input on a drain;
``ingest`` is a fact source and stops; an explicit ``on_drain`` wins; a bad one is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_finalckpt.examples.nycflights13.branching import build_branching_dag
from airflow_finalckpt.operators.drain import drain_behaviour
from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator


def test_dimensions_complete_and_fact_sources_stop(tmp_path: Path) -> None:
    dag = build_branching_dag(
        "on_drain_default", input_dir=str(tmp_path / "in"), output_dir=str(tmp_path / "out"), days=3
    )
    stages = {t.task_id: t for t in dag.tasks if isinstance(t, FinalCheckpointStageOperator)}
    behaviour = {
        task_id: drain_behaviour(t, FinalCheckpointStageOperator) for task_id, t in stages.items()
    }
    assert behaviour["weather"] == "complete"
    assert behaviour["ingest"] == "stop"
    assert {behaviour[s] for s in ("enrich", "delay_windows", "carrier_daily")} == {"stop"}
    stages["weather"].on_drain = "stop"  # an explicit choice wins
    assert drain_behaviour(stages["weather"], FinalCheckpointStageOperator) == "stop"


def test_a_bad_on_drain_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"stage 'w': on_drain must be one of \['stop', 'complete'\]"
    ):
        FinalCheckpointStageOperator(task_id="w", transform=print, on_drain="finish")
