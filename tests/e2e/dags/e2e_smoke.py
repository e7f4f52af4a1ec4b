"""DAGs that prove the e2e harness (tests/e2e/test_harness.py); not part of the product.

* ``e2e_smoke_kill``: ``sleeper`` appends progress lines to ``conf["progress_file"]``. Its first
  try never finishes on its own (the test SIGKILLs it); the retry finishes after a few ticks.
* ``e2e_smoke_defer``: ``deferred`` defers to the standard provider's TimeDeltaTrigger (run by
  the triggerer) and resumes on a worker in ``resume``, logging both steps to the same file.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger
from airflow.sdk import DAG, BaseOperator, task


def _append(path: str, line: str) -> None:
    with Path(path).open("a") as out:
        out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())


with DAG(
    dag_id="e2e_smoke_kill",
    schedule=None,
    catchup=False,
    tags=["e2e"],
):

    @task(retries=1, retry_delay=timedelta(seconds=1))
    def sleeper(**context: Any) -> None:
        conf = context["dag_run"].conf or {}
        path = conf["progress_file"]
        attempt = context["ti"].try_number
        ticks = int(conf.get("first_try_ticks", 600)) if attempt == 1 else int(conf.get("ticks", 3))
        _append(path, f"attempt={attempt} pid={os.getpid()} start")
        for i in range(ticks):
            time.sleep(0.5)
            _append(path, f"attempt={attempt} tick={i}")
        _append(path, f"attempt={attempt} done")

    sleeper()


class DeferOnce(BaseOperator):
    """Defers once to a TimeDeltaTrigger, then finishes on a worker (execute -> resume)."""

    def __init__(self, *, seconds: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seconds = seconds

    def execute(self, context: Any) -> None:
        conf = context["dag_run"].conf or {}
        seconds = float(conf.get("seconds", self.seconds))
        _append(
            conf["progress_file"], f"deferring try={context['ti'].try_number} pid={os.getpid()}"
        )
        self.defer(trigger=TimeDeltaTrigger(timedelta(seconds=seconds)), method_name="resume")

    def resume(self, context: Any, event: Any = None) -> str:
        conf = context["dag_run"].conf or {}
        _append(conf["progress_file"], f"resumed try={context['ti'].try_number} event={event!r}")
        return "resumed"


with DAG(
    dag_id="e2e_smoke_defer",
    schedule=None,
    catchup=False,
    tags=["e2e"],
):
    DeferOnce(task_id="deferred", seconds=4)
