"""How long a landing directory takes to list: ``python -m benchmarks.landing_listing
[--files 100000] [--dir PATH] [--store-url URL]``.

Creates ``--files`` empty ``.parquet`` files in 100 subdirectories (once; reused when the
directory already holds them), then times, for an empty cursor and for a cursor that consumed
all files but 1,000: the listing (``LandingDirectory.list_new``, one recursive fsspec
``find(detail=True)``), the range rule (``plan_range``) and, with ``--store-url``, the whole
claim through the store (cursor read, listing, range recorded). Prints one JSON line per case.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from airflow_finalckpt.core.source_cursor import Cursor, advance, new_cursor, plan_range
from airflow_finalckpt.sources import LandingDirectory


def make_files(root: Path, count: int) -> None:
    """``count`` empty files in 100 subdirectories (skipped if they exist)."""
    if len(list(root.glob("d*/f*.parquet"))) >= count:
        return
    for i in range(count):
        sub = root / f"d{i % 100:02d}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i:07d}.parquet").touch()


def timed(label: str, files: int, fn):  # type: ignore[no-untyped-def]
    started, cpu = time.perf_counter(), time.process_time()
    value = fn()
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    # CPU seconds of this process too: on a loaded machine the wall time is mostly waiting
    print(
        json.dumps(
            {"case": label, "files": files, "seconds": round(seconds, 3), "cpu_s": round(cpu, 3)}
        )
    )
    return value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--store-url", default=None)
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="landing-bench-"))
    make_files(root, args.files)
    source = LandingDirectory(str(root), pattern="*.parquet")
    empty = new_cursor("bench", "landing")
    listing = timed("list, empty cursor", args.files, lambda: source.list_new(empty))
    rng = timed("plan_range, empty cursor", args.files, lambda: plan_range(empty, listing))
    consumed: Cursor = advance(empty, rng, rng.splits[:-1000])
    timed("list, all but 1000 consumed", args.files, lambda: source.list_new(consumed))
    if args.store_url:
        from airflow_finalckpt.sources.claims import claim_splits
        from airflow_finalckpt.store.engine import make_engine
        from airflow_finalckpt.store.migrate import ensure_schema

        engine = make_engine(args.store_url)
        ensure_schema(engine)
        key = f"bench-{time.time_ns()}"
        timed(
            "claim through the store, fresh cursor",
            args.files,
            lambda: claim_splits(engine, source, pipeline_key=key, stage_id=key),
        )


if __name__ == "__main__":
    main()
