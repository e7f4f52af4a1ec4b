"""What a garbage collection did: the report ``collect_garbage`` returns (``finalckpt gc``
prints it) and why something was kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from airflow_finalckpt.core.errors import FinalCheckpointError


class GcBlockedError(FinalCheckpointError):
    """Garbage collection cannot tell what is referenced, so it deletes nothing."""


class KeepReason(StrEnum):
    """Why a unit was kept: something references it, it is too young, or a batch may be
    writing it.
    """

    REFERENCED = "referenced"
    GRACE = "grace"
    IN_FLIGHT = "in_flight"


@dataclass(frozen=True)
class GcEntry:
    """A unit deleted (or, in a dry run, to be deleted); path relative to the pipeline dir."""

    path: str
    is_dir: bool
    files: int
    bytes: int


@dataclass(frozen=True)
class KeptEntry:
    """A unit kept, why, and the detail (the references, its age)."""

    path: str
    reason: KeepReason
    detail: str


@dataclass(frozen=True)
class GcReport:
    """What one collection deleted (or would), kept, noted and failed to delete."""

    pipeline_key: str
    pipeline_dir: str
    dry_run: bool
    grace_s: float
    deleted: tuple[GcEntry, ...] = ()
    kept: tuple[KeptEntry, ...] = ()
    notes: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    @property
    def bytes_freed(self) -> int:
        """Bytes of the deleted units."""
        return sum(e.bytes for e in self.deleted)

    @property
    def files_deleted(self) -> int:
        """Files in the deleted units."""
        return sum(e.files for e in self.deleted)

    @property
    def dirs_deleted(self) -> int:
        """Deleted units that were directories."""
        return sum(1 for e in self.deleted if e.is_dir)

    @property
    def deleted_paths(self) -> list[str]:
        """Paths of the deleted units, relative to the pipeline dir."""
        return [e.path for e in self.deleted]

    def kept_because(self, reason: KeepReason) -> dict[str, str]:
        """Path -> detail of the units kept for ``reason``."""
        return {k.path: k.detail for k in self.kept if k.reason is reason}

    def summary(self) -> str:
        """One line for the log."""
        verb = "would delete" if self.dry_run else "deleted"
        return (
            f"gc of {self.pipeline_key}: {verb} {len(self.deleted)} entries "
            f"({self.files_deleted} files, {self.bytes_freed} bytes), kept {len(self.kept)}"
            + (f", {len(self.errors)} errors" if self.errors else "")
        )

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON (``finalckpt gc --json``)."""
        return {
            "pipeline_key": self.pipeline_key,
            "pipeline_dir": self.pipeline_dir,
            "dry_run": self.dry_run,
            "grace_s": self.grace_s,
            "bytes_freed": self.bytes_freed,
            "files_deleted": self.files_deleted,
            "dirs_deleted": self.dirs_deleted,
            "deleted": [
                {"path": e.path, "is_dir": e.is_dir, "files": e.files, "bytes": e.bytes}
                for e in self.deleted
            ],
            "kept": [
                {"path": k.path, "reason": k.reason.value, "detail": k.detail} for k in self.kept
            ],
            "notes": list(self.notes),
            "errors": list(self.errors),
        }
