"""Where a planted secret must not be: the tests that plant a password or token and then look
for it in every file a run left behind."""

from __future__ import annotations

from pathlib import Path


def files_holding(root: Path, secret: str, *, skip_symlinks: bool = False) -> list[str]:
    """The files under ``root`` whose bytes hold ``secret`` (``skip_symlinks``: a Spark
    worker's directory links the jars it was given; their targets are not the run's output)."""
    return [
        str(p)
        for p in root.rglob("*")
        if p.is_file()
        and not (skip_symlinks and p.is_symlink())
        and secret.encode() in p.read_bytes()
    ]
