"""Two-phase-commit sinks: stage output, pre-commit it at a checkpoint, commit it exactly once."""

from airflow_finalckpt.sinks.base import (
    AlreadyCommittedError,
    ForeignTransactionError,
    InvalidIdentifierError,
    NotPrecommittedError,
    SinkError,
    SinkTransactionError,
    TwoPhaseCommitSink,
    partition_slice,
    validate_identifier,
)
from airflow_finalckpt.sinks.delta import DeltaTableSink
from airflow_finalckpt.sinks.iceberg import IcebergTableSink
from airflow_finalckpt.sinks.parquet import ParquetTableSink
from airflow_finalckpt.sinks.sql import SqlTableSink

__all__ = [
    "AlreadyCommittedError",
    "DeltaTableSink",
    "ForeignTransactionError",
    "IcebergTableSink",
    "InvalidIdentifierError",
    "NotPrecommittedError",
    "ParquetTableSink",
    "SinkError",
    "SinkTransactionError",
    "SqlTableSink",
    "TwoPhaseCommitSink",
    "partition_slice",
    "validate_identifier",
]
