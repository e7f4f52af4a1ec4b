"""A landing directory on any fsspec filesystem: each file not consumed yet is one split.

A file is identified by its path, size and modification time, so a file rewritten in place is
read again as new input. Files whose path has a segment starting with ``_`` or ``.`` are
skipped (writers stage there, then rename into place: a file is read whole or not yet).
Listing is one recursive ``find(detail=True)`` (one paginated listing on object stores).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from airflow_finalckpt.core.errors import InvalidStageArgumentError, SourceRefusedError
from airflow_finalckpt.core.source_cursor import LANDING, Cursor, Listing, SourceFile
from airflow_finalckpt.sources.base import IncrementalSource


def _mtime(info: Mapping[str, Any]) -> str:
    """The modification time as fsspec backends report it (local ``mtime``, S3
    ``LastModified``, GCS ``updated``, memory ``created``); "" when there is none.
    """
    for key in ("mtime", "LastModified", "last_modified", "updated", "modified", "created"):
        value = info.get(key)
        if value is not None:
            return value.isoformat() if hasattr(value, "isoformat") else str(value)
    return ""


class LandingDirectory(IncrementalSource):
    """The files under ``url`` that match ``pattern`` (``fnmatch`` on the path relative to
    ``url``, ``*`` also crossing ``/``) and were not read by a committed run. Each split id is
    the file's URL (``ctx.splits``: ``spark.read.parquet(*ctx.splits)``).
    """

    kind = LANDING

    def __init__(
        self,
        url: str,
        pattern: str = "*",
        *,
        storage_options: Mapping[str, Any] | None = None,
        cursor_id: str | None = None,
    ) -> None:
        super().__init__(cursor_id)
        if not isinstance(url, str) or not url:
            raise InvalidStageArgumentError(
                f"LandingDirectory: url must be a path or URL, not {url!r}"
            )
        if not isinstance(pattern, str) or not pattern:
            raise InvalidStageArgumentError(
                f"LandingDirectory: pattern must be a glob such as '*.parquet', not {pattern!r}"
            )
        self.url = url
        self.pattern = pattern
        self.storage_options = dict(storage_options or {})

    def describe(self) -> str:
        """The directory and pattern."""
        return f"{self.url!r}, pattern={self.pattern!r}"

    def _fs(self) -> tuple[Any, str]:
        from fsspec.core import url_to_fs

        fs, root = url_to_fs(self.url, **self.storage_options)
        return fs, str(root).rstrip("/")

    def list_new(self, cursor: Cursor) -> Listing:
        """Every matching file the cursor has not consumed, by path."""
        fs, root = self._fs()
        if not fs.isdir(root):
            raise SourceRefusedError(
                f"landing directory {self.url!r} does not exist (or is not a directory); create "
                "it or fix the source's url"
            )
        found = fs.find(root, withdirs=False, detail=True)
        url = fs.unstrip_protocol(root)  # once: per file it costs as much as the listing
        files = []
        for path in sorted(found):
            if not path.startswith(root + "/"):
                continue
            relative = path[len(root) + 1 :]
            if any(part.startswith(("_", ".")) for part in relative.split("/")):
                continue
            if not fnmatch.fnmatchcase(relative, self.pattern):
                continue
            info = found[path]
            identity = f"{path}|{info.get('size')}|{_mtime(info)}"
            if identity in cursor.consumed:
                continue
            files.append(SourceFile(split_id=f"{url}/{relative}", identity=identity))
        return Listing(newest=None, files=tuple(files))
