"""Tables of the coordination store.

Every table is prefixed ``finalckpt_`` so the store can share a database with Airflow without
ever touching Airflow's tables. The Alembic migrations in ``store/migrations`` must create exactly
this schema (a test compares them).
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

KEY = String(250)
PIPELINE_FK = "finalckpt_pipelines.pipeline_key"

pipelines = Table(
    "finalckpt_pipelines",
    metadata,
    Column("pipeline_key", KEY, primary_key=True),
    Column("graph", JSON, nullable=False),
    Column("fingerprint", String(64), nullable=False),
    Column("next_checkpoint_id", BigInteger, nullable=False, default=1),
    Column("retain_checkpoints", Integer, nullable=False, default=3),
    Column("checkpoint_timeout_s", Float, nullable=False, default=600.0),
    Column("restored_from", Text, nullable=True),
    # The DAG run that drives the pipeline (``core.driving``): NULL until a stage task starts.
    Column("driver_dag_id", KEY, nullable=True),
    Column("driver_run_id", KEY, nullable=True),
    # The pipeline of the re-created DAG run that replaced this one (``core.run_instance``).
    Column("superseded_by", KEY, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

stages = Table(
    "finalckpt_stages",
    metadata,
    Column("pipeline_key", KEY, primary_key=True),
    Column("stage_id", KEY, primary_key=True),
    Column("lifecycle", String(20), nullable=False),
    Column("epoch", BigInteger, nullable=False, default=0),
    Column("total_splits", Integer, nullable=True),
    # Durable progress (a StageSnapshot as JSON): finished splits, state handles, watermark.
    # Written after every split batch, so a new attempt redoes at most the in-flight batch.
    Column("progress", JSON, nullable=False),
    Column("finish_threshold", BigInteger, nullable=True),
    Column("final_snapshot", JSON, nullable=True),
    Column("closed_checkpoint_id", BigInteger, nullable=True),
    # What a checkpoint records of a finished stage, written with its final snapshot (it never
    # changes after): end_of_data, watermark and the final snapshot's finished split count, so
    # a completion reads these small values instead of evaluating JSON paths in every finished
    # stage's final snapshot (NULL: before finish, or written by a version without it; None is
    # written as SQL NULL, not JSON null, so "IS NULL" finds both).
    Column("final_end", JSON(none_as_null=True), nullable=True),
    # The stage's entry in a metadata v2 ``fully_finished`` block, without transactions, as
    # canonical JSON text (``codec.finished_entry_text``), encoded and validated once when the
    # final snapshot is written; a completion splices the stage's uncommitted transactions in.
    # NULL: not finished, written by a version without it, or no split count to record.
    Column("final_entry", Text, nullable=True),
    # The try that returned the stage CLOSED to Airflow (``core.rerun.TaskTry`` as JSON), so a
    # later try of that task in that DAG run knows it was cleared after it succeeded; NULL:
    # not published yet, reset since, or closed before revision 0006.
    Column("published_by", JSON(none_as_null=True), nullable=True),
    Column("updated_at", Float, nullable=False),
    # The attempt lease of a RUNNING stage (epoch seconds): its attempt renews it while it runs
    # and sets it in the past when it fails; once it is past, the attempt is gone and the
    # coordinator answers checkpoints for it from its durable progress (core.plan.
    # attempts_gone). NULL: no lease (a new attempt before its first renewal, an older
    # version's attempt): alive. Any epoch change clears it.
    Column("lease_until", Float, nullable=True),
    ForeignKeyConstraint(["pipeline_key"], [PIPELINE_FK], ondelete="CASCADE"),
)

checkpoints = Table(
    "finalckpt_checkpoints",
    metadata,
    Column("pipeline_key", KEY, primary_key=True),
    Column("checkpoint_id", BigInteger, primary_key=True, autoincrement=False),
    Column("kind", String(20), nullable=False),
    Column("reason", String(20), nullable=False),
    Column("state", String(20), nullable=False, index=True),
    Column("plan", JSON, nullable=False),
    Column("acks_pending", Integer, nullable=False),
    Column("triggered_at", Float, nullable=False),
    Column("completed_at", Float, nullable=True),
    Column("failure_reason", Text, nullable=True),
    Column("metadata_path", Text, nullable=True),
    Column("size_bytes", BigInteger, nullable=True),
    # Why an ABORTED checkpoint failed (core.failure.CheckpointFailureReason); the detail text
    # stays in failure_reason.
    Column("failure_kind", String(20), nullable=True),
    ForeignKeyConstraint(["pipeline_key"], [PIPELINE_FK], ondelete="CASCADE"),
)

acks = Table(
    "finalckpt_acks",
    metadata,
    Column("pipeline_key", KEY, primary_key=True),
    Column("checkpoint_id", BigInteger, primary_key=True, autoincrement=False),
    Column("stage_id", KEY, primary_key=True),
    Column("epoch", BigInteger, nullable=False),
    Column("by_finish", Boolean, nullable=False, default=False),
    Column("snapshot", JSON, nullable=False),
    Column("acked_at", Float, nullable=False),
    ForeignKeyConstraint(
        ["pipeline_key", "checkpoint_id"],
        ["finalckpt_checkpoints.pipeline_key", "finalckpt_checkpoints.checkpoint_id"],
        ondelete="CASCADE",
    ),
    # "Which checkpoints did this stage acknowledge" (the newest one, whether it acked one):
    # the primary key starts with the checkpoint id, so without it that scans every ack kept.
    Index("ix_finalckpt_acks_stage", "pipeline_key", "stage_id", "checkpoint_id"),
)

#: Who must still acknowledge a pending checkpoint: one row per (checkpoint, stage) of its
#: plan's ``to_ack``, deleted by the stage's acknowledgement and with the checkpoint once it is
#: no longer pending. An acknowledgement touches O(1) rows here (by the stage index), never the
#: plan's JSON.
acks_due = Table(
    "finalckpt_acks_due",
    metadata,
    Column("pipeline_key", KEY, primary_key=True),
    Column("checkpoint_id", BigInteger, primary_key=True, autoincrement=False),
    Column("stage_id", KEY, primary_key=True),
    ForeignKeyConstraint(
        ["pipeline_key", "checkpoint_id"],
        ["finalckpt_checkpoints.pipeline_key", "finalckpt_checkpoints.checkpoint_id"],
        ondelete="CASCADE",
    ),
    Index("ix_finalckpt_acks_due_stage", "pipeline_key", "stage_id", "checkpoint_id"),
)

transactions = Table(
    "finalckpt_transactions",
    metadata,
    Column("pipeline_key", KEY, primary_key=True),
    Column("stage_id", KEY, primary_key=True),
    Column("sink_id", KEY, primary_key=True),
    Column("txn_id", KEY, primary_key=True),
    Column("epoch", BigInteger, nullable=False),
    # The first checkpoint that covers this pre-committed transaction (NULL until one does).
    Column("checkpoint_id", BigInteger, nullable=True),
    Column("state", String(20), nullable=False),
    Column("payload", JSON, nullable=False),
    Column("updated_at", Float, nullable=False),
    ForeignKeyConstraint(["pipeline_key"], [PIPELINE_FK], ondelete="CASCADE"),
)

stop_requests = Table(
    "finalckpt_stop_requests",
    metadata,
    Column("request_id", Integer, primary_key=True, autoincrement=True),
    Column("pipeline_key", KEY, nullable=False, index=True),
    Column("mode", String(20), nullable=False),
    Column("state", String(20), nullable=False),
    Column("savepoint_id", BigInteger, nullable=True),
    Column("requested_by", String(250), nullable=True),
    Column("requested_at", Float, nullable=False),
    Column("finished_at", Float, nullable=True),
    Column("failure_reason", Text, nullable=True),
    ForeignKeyConstraint(["pipeline_key"], [PIPELINE_FK], ondelete="CASCADE"),
)

#: The Airflow DAG runs a pipeline run spans (a retry or resume keeps its run; a restore adds
#: one). Lets the UI, REST and CLI find a pipeline from ``DAG_ID RUN_ID`` without Airflow's DB.
dag_runs = Table(
    "finalckpt_dag_runs",
    metadata,
    Column("dag_id", KEY, primary_key=True),
    Column("run_id", KEY, primary_key=True),
    Column("pipeline_key", KEY, nullable=False, index=True),
    Column("created_at", Float, nullable=False),
    # What the Task SDK told the run's tasks of their DAG run instance (``core.run_instance``)
    # and the default key's generation of this run id (NULL: 1).
    Column("run_instance", JSON, nullable=True),
    Column("generation", Integer, nullable=True),
    ForeignKeyConstraint(["pipeline_key"], [PIPELINE_FK], ondelete="CASCADE"),
)

#: Which pipeline committed which logical date into which sink (a sink without a declared slice
#: appends, so a second pipeline of one date doubles it: the task log warns, see
#: ``store.sink_dates``).
sink_dates = Table(
    "finalckpt_sink_dates",
    metadata,
    Column("sink", KEY, primary_key=True),
    Column("logical_date", String(64), primary_key=True),
    Column("pipeline_key", KEY, primary_key=True),
    Column("stage_id", KEY, nullable=False),
    Column("committed_at", Float, nullable=False),
    ForeignKeyConstraint(["pipeline_key"], [PIPELINE_FK], ondelete="CASCADE"),
)

#: The committed read position of each incremental source (``core.source_cursor.Cursor``): a
#: snapshot id or version read completely, the files read beyond it, and how many times it
#: advanced (``version``: every advance is a compare and set on it). Not a pipeline's row: it
#: outlives the pipelines that advanced it.
source_cursors = Table(
    "finalckpt_source_cursors",
    metadata,
    Column("cursor_id", KEY, primary_key=True),
    Column("kind", String(20), nullable=False),
    Column("position", BigInteger, nullable=True),
    Column("consumed", JSON, nullable=False),
    Column("version", BigInteger, nullable=False, default=0),
    Column("advanced_by", KEY, nullable=True),
    Column("updated_at", Float, nullable=False),
)

#: The range each pipeline run reads of a source, recorded when its source stage first starts
#: (``core.source_cursor.RecordedRange``): OPEN until the transition that closes the
#: pipeline's last stage advances the cursor over it (COMMITTED); RECOMPUTE: a rerun's copy.
#: Committed ranges outlive their pipeline (a rerun of the same logical date reads them
#: again); deleting a pipeline deletes its OPEN and RECOMPUTE ranges (its range is given back).
source_ranges = Table(
    "finalckpt_source_ranges",
    metadata,
    Column("cursor_id", KEY, primary_key=True),
    Column("pipeline_key", KEY, primary_key=True),
    Column("stage_id", KEY, nullable=False),
    Column("state", String(20), nullable=False),
    Column("range", JSON, nullable=False),
    # the splits the cursor advanced over when fewer than the range's (a drained run)
    Column("read", JSON(none_as_null=True), nullable=True),
    Column("dag_id", KEY, nullable=True),
    Column("run_id", KEY, nullable=True),
    Column("logical_date", String(64), nullable=True),
    Column("created_at", Float, nullable=False),
    Column("settled_at", Float, nullable=True),
    Index("ix_finalckpt_source_ranges_pipeline", "pipeline_key"),
)

#: Secrets the deployment generates for itself (issue 37): the random code signing key used
#: when ``[finalckpt] code_signing_key`` is unset. The store is the one place every worker and
#: every driver of a deployment reaches and nobody outside it reads (checkpoint storage may be
#: a shared bucket; workers share no local disk).
deployment_secrets = Table(
    "finalckpt_deployment_secrets",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)
