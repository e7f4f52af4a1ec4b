"""docs/scheduling.md says which day a daily run is for; these are Airflow's rules it quotes.

A plain ``schedule="@daily"`` is Airflow 3's ``CronTriggerTimetable`` (``[scheduler]
create_cron_data_intervals`` defaults to False): a run's data interval is the single point at
which it is scheduled, so ``{{ data_interval_start | ds }}`` of the run at 00:00 on Jan 2 is
Jan 2, the day that just began. ``CronDataIntervalTimetable("@daily", ...)`` gives the run at
00:00 on Jan 2 the interval [Jan 1, Jan 2), so the same template names Jan 1, the day that
ended (and a manual run at T gets the interval that ends at T).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG
from airflow.timetables.base import TimeRestriction
from airflow.timetables.interval import CronDataIntervalTimetable
from airflow.timetables.trigger import CronTriggerTimetable

JAN_1 = pendulum.datetime(2024, 1, 1, tz="UTC")
JAN_2 = pendulum.datetime(2024, 1, 2, tz="UTC")
JAN_3 = pendulum.datetime(2024, 1, 3, tz="UTC")
RESTRICTION = TimeRestriction(earliest=JAN_2, latest=None, catchup=True)


def test_a_plain_daily_schedule_names_the_day_that_begins() -> None:
    dag = DAG("daily_intervals", schedule="@daily", start_date=JAN_2)
    assert type(dag.timetable).__name__ == "CronTriggerTimetable"
    timetable = CronTriggerTimetable("@daily", timezone="UTC")  # the scheduler's side of it
    info = timetable.next_dagrun_info(last_automated_data_interval=None, restriction=RESTRICTION)
    assert info is not None and info.data_interval is not None
    assert (info.run_after, info.data_interval.start, info.data_interval.end) == (JAN_2,) * 3
    manual = timetable.infer_manual_data_interval(run_after=JAN_2)  # dag.test(logical_date=T)
    assert (manual.start, manual.end) == (JAN_2, JAN_2)


def test_a_data_interval_timetable_names_the_day_that_ended() -> None:
    timetable = CronDataIntervalTimetable("@daily", timezone="UTC")
    info = timetable.next_dagrun_info(last_automated_data_interval=None, restriction=RESTRICTION)
    assert info is not None and info.data_interval is not None
    assert (info.run_after, info.data_interval.start, info.data_interval.end) == (
        JAN_3,
        JAN_2,
        JAN_3,
    )
    manual = timetable.infer_manual_data_interval(run_after=JAN_2)
    assert (manual.start, manual.end) == (JAN_1, JAN_2)
