"""``@task.finalckpt_stage``: a pipeline stage written as a decorated transform function."""

from airflow_finalckpt.decorators.stage import StageDecorator, finalckpt_stage

__all__ = ["StageDecorator", "finalckpt_stage"]
