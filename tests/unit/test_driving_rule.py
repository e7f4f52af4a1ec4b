"""One DAG run drives a pipeline at a time (``core.driving.check_drive``), on plain values."""

from __future__ import annotations

import pytest

from airflow_finalckpt.core.driving import DagRunRef, check_drive
from airflow_finalckpt.core.errors import PipelineDrivenError, is_permanent

OLD = DagRunRef("d", "run1", joined_at=10.0)
NEW = DagRunRef("d", "run2", joined_at=None)  # a continuation's first task: not linked yet


def test_the_first_run_drives_and_the_driver_goes_on() -> None:
    assert check_drive("k", None, OLD, [], take_over=False) is True
    assert check_drive("k", OLD, DagRunRef("d", "run1", 10.0), ["a"], take_over=False) is False


def test_a_continuation_is_refused_while_the_driver_runs_naming_it() -> None:
    with pytest.raises(PipelineDrivenError) as err:
        check_drive("k", OLD, NEW, ["delay_windows"], take_over=False)
    text = str(err.value)
    assert "driven by DAG run 'run1' of DAG 'd'" in text and "'delay_windows'" in text
    assert '{"take_over": true}' in text and "mark it failed" in text
    assert is_permanent(err.value)


def test_a_continuation_takes_over_explicitly_or_when_nothing_runs() -> None:
    assert check_drive("k", OLD, NEW, ["delay_windows"], take_over=True) is True
    assert check_drive("k", OLD, NEW, [], take_over=False) is True


def test_an_older_run_never_takes_the_pipeline_back() -> None:
    driver = DagRunRef("d", "run2", joined_at=20.0)
    for live, take_over in (([], False), ([], True), (["a"], True)):
        with pytest.raises(PipelineDrivenError, match="was taken over by DAG run 'run2'"):
            check_drive("k", driver, OLD, live, take_over=take_over)
    unlinked = DagRunRef("d", "run2", joined_at=None)  # the new driver between claim and link
    with pytest.raises(PipelineDrivenError, match="was taken over"):
        check_drive("k", unlinked, OLD, [], take_over=False)
