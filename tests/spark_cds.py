"""A class-data-sharing (CDS) archive of a Spark driver's classes for every Spark JVM the suite
starts (``tests/conftest.py``: the session's, the dag.test, campaign and spark-submit drivers,
the e2e clusters' stage tasks).

Every stage task of an e2e cluster, and every driver subprocess of the other tiers, starts its
own Spark driver JVM, and most of a short driver's start is loading and verifying the same
~15 000 classes. A dynamic CDS archive
(JDK 13+: ``-XX:ArchiveClassesAtExit`` once, ``-XX:SharedArchiveFile`` after) maps them
pre-parsed instead: on the shared 2-core machine at load 28, a ``local[2]`` session started in
13-15 s instead of 32-38 s and its first job ran in 6-7 s instead of 23-27 s.

The archive is built once per machine (a small Spark job, ~20 s quiet, ~90 s under load; one
builder at a time, the other pytest process waits for it under a file lock) and
cached under ``~/.cache/airflow-finalckpt/cds`` (``FINALCKPT_E2E_CDS_DIR``), keyed by the JVM,
its flags and the pyspark jars. A JVM whose class path or JDK does not match the archive
ignores it (``-Xshare:auto``), so a stale archive costs nothing but the speed-up.
``FINALCKPT_E2E_CDS=0`` turns it off.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

#: A job touching what the stages use: Arrow both ways, Parquet, shuffles, windows, joins.
_WORKLOAD = """
import sys
import pandas as pd
from pyspark.sql import SparkSession, Window, functions as F
out = sys.argv[1]
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.execution.arrow.pyspark.enabled", "true").getOrCreate())
df = spark.createDataFrame(pd.DataFrame({"k": ["a", "b", "c"] * 20, "v": range(60)}))
df = df.withColumn("t", F.timestamp_seconds(F.col("v") * 60))
agg = df.groupBy("k", F.window("t", "10 minutes")).agg(F.sum("v").alias("s"), F.count("*"))
agg.write.mode("overwrite").parquet(out + "/p")
back = spark.read.parquet(out + "/p").join(df.groupBy("k").agg(F.max("v").alias("m")), "k")
back = back.withColumn("r", F.row_number().over(Window.partitionBy("k").orderBy("s")))
back.toPandas()
spark.stop()
"""


def _cache_dir() -> Path:
    configured = os.environ.get("FINALCKPT_E2E_CDS_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "airflow-finalckpt" / "cds"


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def _archive_key(java: str, base_opts: str) -> str:
    """The JVM (its version text), the flags and the pyspark jars the archive was made with."""
    import pyspark

    version = subprocess.run(
        [java, "-version"], capture_output=True, text=True, timeout=60, check=False
    ).stderr
    jars = sorted(p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    digest = hashlib.sha256(
        "\n".join([java, version, base_opts, pyspark.__file__, *jars]).encode()
    ).hexdigest()
    return digest[:16]


@functools.cache
def spark_cds_option(base_opts: str) -> str | None:
    """``-XX:SharedArchiveFile=<archive>`` to append to ``SPARK_SUBMIT_OPTS`` (the archive is
    built first if needed), or None when it is turned off or cannot be built."""
    if os.environ.get("FINALCKPT_E2E_CDS", "1") == "0":
        return None
    java = _java()
    if java is None:
        return None
    try:
        archive = _cache_dir() / f"spark-{_archive_key(java, base_opts)}.jsa"
        if not archive.exists():
            archive.parent.mkdir(parents=True, exist_ok=True)
            with open(archive.with_name(f".{archive.name}.lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # the other lane's pytest builds it: wait
                if not archive.exists():
                    _build(archive, base_opts)
    except Exception as exc:  # no archive: the tasks' JVMs start as before
        print(f"[airflow-e2e] no CDS archive for the Spark drivers: {exc}", file=sys.stderr)
        return None
    return f"-XX:SharedArchiveFile={archive}"


def with_spark_cds(opts: str) -> str:
    """``opts`` with the archive's option appended (unchanged if it already names an archive,
    or when there is none)."""
    if "-XX:SharedArchiveFile=" in opts:
        return opts
    option = spark_cds_option(opts)
    return f"{opts} {option}".strip() if option else opts


def _build(archive: Path, base_opts: str) -> None:
    """Run the workload once with ``-XX:ArchiveClassesAtExit``; publish the archive atomically
    (concurrent builders each write their own file)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f".{archive.name}.{uuid.uuid4().hex[:8]}")
    with tempfile.TemporaryDirectory(prefix="finalckpt-cds-") as work:
        env = {
            **os.environ,
            "SPARK_SUBMIT_OPTS": f"{base_opts} -XX:ArchiveClassesAtExit={partial}".strip(),
        }
        proc = subprocess.run(
            [sys.executable, "-c", _WORKLOAD, work],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    try:
        if proc.returncode != 0 or not partial.exists():
            tail = "\n".join(proc.stderr.splitlines()[-5:])
            raise RuntimeError(f"the CDS workload failed ({proc.returncode}): {tail}")
        os.replace(partial, archive)
    finally:
        partial.unlink(missing_ok=True)
