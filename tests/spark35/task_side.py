"""The Airflow task's half of a submission, without Airflow: the job spec and the pickled code.

    python task_side.py <input dir> <storage uri> <store url> <pipeline key>

Run by tests/spark35 with FINALCKPT_TASK_SIDE_PYTHON (a pyspark 4.x virtualenv: the code is
pickled by 4.x's cloudpickle and unpickled by the driver's 3.5), else by the test's own Python.
Prints the job spec's URI.
"""

from __future__ import annotations

import sys

import cloudpickle

from airflow_finalckpt.config import mask_url
from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.examples.nycflights13.data import open_layout
from airflow_finalckpt.examples.nycflights13.local import example_graph
from airflow_finalckpt.examples.nycflights13.stages import ingest_transform
from airflow_finalckpt.runtime.assembly import StageJob
from airflow_finalckpt.runtime.runner import CommitMode, StageSpec
from airflow_finalckpt.spark.job import DriverJob, Files
from airflow_finalckpt.spark.sealed_spec import seal_spec
from airflow_finalckpt.spark.secrets import code_key, seal_code
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.deployment_secrets import CODE_SIGNING_KEY, ensure_secret
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema


def main(input_dir: str, storage_uri: str, store_url: str, key: str) -> str:
    layout = open_layout(input_dir)
    engine = make_engine(store_url)
    ensure_schema(engine)
    Coordinator(engine, key).register(example_graph())  # the DAG's stage graph, as a task does
    spec = StageSpec(
        pipeline_key=key,
        stage_id="ingest",
        splits=layout.split_ids,
        batch_size=2,
        checkpoint_interval_s=3600.0,
        commit_mode=CommitMode.PROGRESSIVE,
    )
    storage = CheckpointStorage(storage_uri)
    job = DriverJob.for_stage(
        StageJob(spec=spec, upstream_manifests={}, hints_scope=None),
        submission_id="spark35-1",
        storage_uri=storage.root_uri,
        store_url_masked=mask_url(store_url),
        # a closure over the input directory: pickled by value, as a DAG file's function is
        code={"transform": "pickle", "on_finish": None},
        spark_conf={},
    )
    files = Files(storage, key, "ingest")
    code = cloudpickle.dumps({"transform": ingest_transform(input_dir)})
    # sealed as the operator seals it (no [finalckpt] code_signing_key: the deployment's
    # generated key, kept in the store, where the driver finds it)
    signing_key = ensure_secret(engine, CODE_SIGNING_KEY)
    sealed = seal_code(code, code_key(signing_key))
    files.write(job.submission_id, "code.pkl", sealed)
    return files.write(job.submission_id, "spec.json", seal_spec(job, sealed, signing_key))


if __name__ == "__main__":
    print(main(*sys.argv[1:5]))
