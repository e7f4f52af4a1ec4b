"""Ready-made ``split_bytes=`` for sources whose splits name files or directories.

    @finalckpt_stage(splits=days, split_bytes=file_bytes("s3://bucket/flights/day={split}/"))
    def ingest(ctx): ...

A source that declares its splits' bytes sizes its first auto batch from them (no one-split
probe: ``core.split_bytes``). ``file_bytes`` reads them from the file system (fsspec: local
paths, ``s3://``, ``gs://``, ``abfs://`` ...) where the stage's Spark driver runs, once per split
and attempt: a file's size, or a directory's total under it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import fsspec

#: What ``file_bytes(path)`` puts the split id in, e.g. ``"/data/day={split}.parquet"``.
SPLIT_FIELD = "{split}"


@dataclass(frozen=True)
class FileBytes:
    """Bytes of the file or directory a split names (None when it does not exist).

    ``path``: None (the split id is the path or URL), a template with ``{split}``, or a function
    of the split id; ``storage_options``: fsspec's, for the file system of the path.
    """

    path: str | Callable[[str], str] | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.path, str) and SPLIT_FIELD not in self.path:
            raise ValueError(
                f"file_bytes path {self.path!r} has no {SPLIT_FIELD} field: the split id goes "
                f"there (e.g. '/data/day={SPLIT_FIELD}.parquet'), or pass a function of the "
                "split id"
            )
        if not (self.path is None or isinstance(self.path, str) or callable(self.path)):
            raise ValueError(
                f"file_bytes path must be None, a str with {SPLIT_FIELD} or a function of the "
                f"split id, got {self.path!r}"
            )

    def location(self, split: str) -> str:
        """The path or URL of one split."""
        if self.path is None:
            return split
        if isinstance(self.path, str):
            return self.path.replace(SPLIT_FIELD, split)
        return str(self.path(split))

    def __call__(self, split: str) -> int | None:
        """The bytes under the split's path; None if nothing is there (size unknown)."""
        fs, path = fsspec.core.url_to_fs(self.location(split), **dict(self.storage_options))
        try:
            if not fs.exists(path):  # some file systems size a missing path as 0 bytes
                return None
            return int(fs.du(path, total=True))
        except FileNotFoundError:
            return None


def file_bytes(path: str | Callable[[str], str] | None = None, **storage_options: Any) -> FileBytes:
    """A ``split_bytes=`` reading each split's bytes from the file or directory it names: the
    split id itself (None), ``path`` with ``{split}`` replaced by it, or ``path(split)``.
    """
    return FileBytes(path, storage_options)
