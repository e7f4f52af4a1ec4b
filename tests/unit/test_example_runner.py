"""The example runner's ``--crash-mid-enrich`` reports only what really happened.

``describe_crash`` turns the first DAG run's state, the crash marker and enrich's stored
progress into the line the runner prints; it claims a mid-enrich crash only when all three
agree. One day of data (one enrich split) is refused before anything runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_finalckpt.examples.nycflights13.run import describe_crash, main


def test_a_crash_that_fired_mid_enrich_is_reported_with_the_stored_progress() -> None:
    report = describe_crash(
        "failed", {"fired": True, "after_batches": 1}, "RUNNING", finished=1, total=2
    )
    assert report.fired
    assert report.message == (
        "first DAG run failed: the injected crash fired in enrich after 1 batch(es); "
        "enrich is RUNNING with 1 of 2 splits recorded"
    )


def test_a_crash_that_could_not_fire_is_not_reported_as_a_crash() -> None:
    reason = "stage enrich processes its 2 split(s) in 1 batch(es); the crash needs a batch 2"
    report = describe_crash(
        "success", {"fired": False, "reason": reason}, "CLOSED", finished=2, total=2
    )
    assert not report.fired
    assert report.message.startswith(f"the injected crash did not fire ({reason})")
    assert "enrich is CLOSED with 2 of 2 splits recorded" in report.message


@pytest.mark.parametrize(
    ("state", "lifecycle", "finished"),
    [
        ("success", "CLOSED", 2),  # the DAG run succeeded after all
        ("failed", "RUNNING", 0),  # nothing of enrich was recorded: not "mid" enrich
        ("failed", "FINISHED", 2),  # every split was recorded
    ],
)
def test_a_fired_crash_without_a_partial_enrich_is_not_claimed(
    state: str, lifecycle: str, finished: int
) -> None:
    report = describe_crash(state, {"fired": True, "after_batches": 1}, lifecycle, finished, 2)
    assert not report.fired and "not the mid-enrich failure" in report.message


def test_no_marker_means_enrich_never_ran() -> None:
    report = describe_crash("failed", None, "NOT_STARTED", finished=0, total=None)
    assert not report.fired and "enrich never ran" in report.message


def test_one_day_is_refused_before_anything_runs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--days", "1", "--crash-mid-enrich", "--home", "/nonexistent/never-created"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--crash-mid-enrich needs --days >= 2" in err and "enrich has one split" in err


def test_each_pipeline_key_gets_its_own_output_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second run of the example (a new pipeline key) must not append to the first run's
    tables, or its check against the reference fails; a key never escapes ``output/``."""
    from airflow_finalckpt.examples.nycflights13 import run

    environ: dict[str, str] = {}
    monkeypatch.setattr(run.os, "environ", environ)
    run._configure_environment(tmp_path, 3, True, "nycflights13-1234abcd")
    assert environ["FINALCKPT_EXAMPLE_OUTPUT"] == str(tmp_path / "output" / "nycflights13-1234abcd")
    assert environ["FINALCKPT_EXAMPLE_LAKEHOUSE"] == "1"
    for key in ("..", "../x", "a/b", "."):
        name = run.output_dir_name(key)
        assert "/" not in name and name not in ("", ".", "..")
