"""What an incremental source is to the stage operator: a cursor kind, an optional cursor id
and a listing of the files beyond a cursor. Listing is the only I/O; the rules of ranges and
cursors are ``core.source_cursor``'s.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from airflow_finalckpt.core.errors import InvalidStageArgumentError
from airflow_finalckpt.core.source_cursor import Cursor, Listing

#: A cursor id is a store key: letters, digits, '_', '.', '-' (at most 200).
CURSOR_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")


def is_incremental_source(value: Any) -> bool:
    """Whether a stage's ``splits`` is an incremental source (not a list or a callable)."""
    return isinstance(value, IncrementalSource)


class IncrementalSource(ABC):
    """A source stage's ``splits=`` that lists only what its cursor has not consumed.

    ``cursor_id``: the durable read position's name; default ``<dag_id>.<stage_id>`` (one
    cursor per DAG and stage). Give two DAGs reading one input their own ids (the default
    does), and give a DAG the id of an old one to continue its position.
    """

    #: ``core.source_cursor.CURSOR_KINDS``
    kind: ClassVar[str]
    #: recognized by ``core.arguments.check_splits`` without importing this package
    is_incremental_source: ClassVar[bool] = True

    def __init__(self, cursor_id: str | None = None) -> None:
        if cursor_id is not None and (
            not isinstance(cursor_id, str) or CURSOR_ID.fullmatch(cursor_id) is None
        ):
            raise InvalidStageArgumentError(
                f"{type(self).__name__}: cursor_id {cursor_id!r} must be 1-200 letters, digits, "
                "'_', '.' or '-'"
            )
        self.cursor_id = cursor_id

    @abstractmethod
    def list_new(self, cursor: Cursor) -> Listing:
        """The files beyond ``cursor`` up to the newest position, in reading order."""

    @abstractmethod
    def describe(self) -> str:
        """The source in a log line (no credentials)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"
