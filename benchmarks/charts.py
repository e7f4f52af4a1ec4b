"""PNG charts from the results JSON (``python -m benchmarks.charts [DIR]``).

Needs matplotlib (the ``dev`` extra); without it every chart is skipped with a message and the
JSON results stay complete.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

MISSING_MATPLOTLIB = (
    "charts skipped: matplotlib is not installed (pip install matplotlib, or the dev extra); "
    "the JSON results are complete without them"
)


def _pyplot() -> Any | None:
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _load(out: Path, name: str) -> dict[str, Any] | None:
    path = out / f"{name}.json"
    if not path.is_file():
        return None
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc if doc.get("cases") else None


def _subtitle(doc: dict[str, Any]) -> str:
    machine = doc.get("machine", {})
    mode = "quick" if doc.get("quick") else "full"
    return (
        f"{machine.get('cores')} cores, Python {machine.get('python')}, Spark "
        f"{machine.get('spark')}, {doc.get('timestamp', '')[:10]}, {mode} run"
    )


def chart_scale(plt: Any, doc: dict[str, Any], path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    series: dict[str, list[tuple[int, float, float]]] = {}
    for case in doc["cases"]:
        params, med = case["params"], case["medians"]
        key = f"{params['backend']}, {params['series']}"
        series.setdefault(key, []).append(
            (params["stages"], med["seconds_per_checkpoint"], med.get("ack_s_mean", 0.0))
        )
    for key, points in sorted(series.items()):
        points.sort()
        xs = [p[0] for p in points]
        left.plot(xs, [p[1] for p in points], marker="o", label=key)
        right.plot(xs, [p[2] * 1000 for p in points], marker="o", label=key)
    all_x = sorted({p[0] for pts in series.values() for p in pts})
    if all_x:
        first = min(series.values(), key=lambda pts: pts[0][1])[0]
        left.plot(
            all_x,
            [first[1] * x / first[0] for x in all_x],
            linestyle="--",
            color="grey",
            label="linear reference",
        )
    left.set(
        xscale="log",
        yscale="log",
        xlabel="stages in the graph",
        ylabel="seconds per checkpoint (median)",
        title="Cost of one checkpoint (1/16 of the stages acknowledge)",
    )
    right.set(
        xscale="log",
        xlabel="stages in the graph",
        ylabel="ms per acknowledgement (record_batch)",
        title="Cost of one acknowledgement (flat = linear total)",
    )
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Coordinator scale: {_subtitle(doc)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_latency(plt: Any, doc: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 4.8))
    cases = doc["cases"]
    scenarios = list(dict.fromkeys(c["params"]["scenario"] for c in cases))
    intervals = list(dict.fromkeys(c["params"]["interval_s"] for c in cases))
    width = 0.8 / max(len(scenarios), 1)
    for i, scenario in enumerate(scenarios):
        p50 = []
        p95 = []
        for interval in intervals:
            case = next(
                c
                for c in cases
                if c["params"]["scenario"] == scenario and c["params"]["interval_s"] == interval
            )
            p50.append(case["medians"]["p50_s"])
            p95.append(case["medians"]["p95_s"])
        xs = [x + i * width for x in range(len(intervals))]
        ax.bar(xs, p50, width, label=f"{scenario}: p50")
        ax.scatter(xs, p95, marker="_", s=300, color="black", zorder=3)
    refs = [interval / 2 for interval in intervals]
    ax.scatter(
        [x + width * (len(scenarios) - 1) / 2 for x in range(len(intervals))],
        refs,
        marker="v",
        color="red",
        label="waiting for the next periodic checkpoint (interval/2, computed)",
        zorder=3,
    )
    ax.axhline(1.0, color="grey", linestyle="--", label="target p50 < 1 s")
    ax.set_yscale("log")
    ax.set_xticks([x + width * (len(scenarios) - 1) / 2 for x in range(len(intervals))])
    ax.set_xticklabels([f"interval {i:g} s" for i in intervals])
    ax.set_ylabel("seconds from end of input to close (log)")
    ax.set_title("Final-checkpoint latency (bars p50, black ticks p95)")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.suptitle(_subtitle(doc), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_overhead(plt: Any, doc: dict[str, Any], path: Path) -> None:
    stages = ("ingest", "enrich", "delay_windows", "publish")
    cases = doc["cases"]
    fig, ax = plt.subplots(figsize=(9.5, 4.8))
    labels = [c["name"] for c in cases]
    bottoms = [0.0] * len(cases)
    for stage in stages:
        heights = [c["medians"].get(f"{stage}_s", 0.0) for c in cases]
        ax.bar(labels, heights, bottom=bottoms, label=stage)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    for x, case in enumerate(cases):
        label = f"{case['medians']['seconds']:.1f} s"
        if "protocol_s" in case["medians"]:
            label += f"\n(protocol calls {case['medians']['protocol_s']:.1f} s)"
        ax.text(x, bottoms[x], label, ha="center", va="bottom", fontsize=8)
    ax.set_ylim(top=max(bottoms) * 1.18 if bottoms else None)
    ratios = doc.get("ratios", {})
    parts = []
    for key, value in ratios.items():
        if key.startswith("ours_over_plain/") and key.count("/") == 1 and value is not None:
            label = key.split("/", 1)[1]
            after = ratios.get(f"{key}/after_ingest")
            parts.append(
                f"{label}: {value:.2f}" + (f" ({after:.2f} after ingest)" if after else "")
            )
    ax.set_ylabel("median wall seconds")
    ax.set_title(
        f"Steady state, no failures, auto batches: ours/plain {', '.join(parts)}",
        fontsize=9,
    )
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(_subtitle(doc), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_resume(plt: Any, doc: dict[str, Any], path: Path) -> None:
    cases = [c for c in doc["cases"] if c["name"].startswith("crash@")]
    sides = (
        ("ours_seconds", "ours: resume"),
        ("ideal_s", "ideal: only unfinished work"),
        ("retry_s", "plain: Airflow retry of the task"),
        ("rerun_s", "plain: rerun the DAG"),
    )
    fig, ax = plt.subplots(figsize=(9, 4.8))
    width = 0.8 / len(sides)
    for i, (metric, label) in enumerate(sides):
        xs = [x + i * width for x in range(len(cases))]
        ax.bar(xs, [c["medians"].get(metric, 0.0) for c in cases], width, label=label)
    ax.set_xticks([x + width * (len(sides) - 1) / 2 for x in range(len(cases))])
    ax.set_xticklabels(
        [
            f"crash at {c['name'].split('@')[1]} of enrich "
            f"(actual {c['medians'].get('ours_finished_fraction', 0):.0%})\n"
            f"redone splits: ours {c['medians'].get('ours_redone_splits', 0):.0f}, "
            f"retry {c['medians'].get('retry_redone_splits', 0):.0f}"
            for c in cases
        ],
        fontsize=8,
    )
    ax.set_ylabel("recovery wall seconds (median)")
    ax.set_title("Recovery after a crash mid-enrich")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(_subtitle(doc), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_waiters(plt: Any, doc: dict[str, Any], path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    polls = [c for c in doc["cases"] if not c["name"].startswith("fan-in/")]
    fans = [c for c in doc["cases"] if c["name"].startswith("fan-in/")]
    for backend in sorted({c["params"]["backend"] for c in polls}):
        mine = sorted(
            (c["params"]["waiters"], c["medians"]["round_s"])
            for c in polls
            if c["params"]["backend"] == backend
        )
        left.plot([m[0] for m in mine], [m[1] for m in mine], marker="o", label=backend)
    poll = doc.get("parameters", {}).get("poll_interval_s", 0.5)
    left.axhline(poll, color="grey", linestyle="--", label=f"poll interval {poll:g} s")
    left.set(
        xscale="log",
        yscale="log",
        xlabel="finished stages waiting (deferred)",
        ylabel="seconds for one poll of every waiter",
        title="Triggerer: one poll round (above the line = falls behind)",
    )
    for backend in sorted({c["params"]["backend"] for c in fans}):
        fan = sorted(
            (
                c["params"]["finishing"],
                c["medians"]["finishes_s"],
                c["medians"]["sibling_boundary_s"],
            )
            for c in fans
            if c["params"]["backend"] == backend
        )
        xs = [m[0] for m in fan]
        right.plot(xs, [m[1] for m in fan], marker="o", label=f"{backend}: all finishes")
        right.plot(
            xs,
            [m[2] for m in fan],
            marker="s",
            linestyle=":",
            label=f"{backend}: sibling's next batch boundary",
        )
    right.set(
        xscale="log",
        yscale="log",
        xlabel="stages finishing while a sibling runs",
        ylabel="seconds",
        title="Fan-in: one eager checkpoint per finish, all pending",
    )
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Waiting stages: {_subtitle(doc)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_stop(plt: Any, doc: dict[str, Any], path: Path) -> None:
    metrics = {
        "savepoint": (
            ("savepoint_s", "request -> savepoint complete"),
            ("suspended_s", "request -> stage suspended"),
        ),
        "drain": (
            ("source_finished_s", "request -> source stage finished"),
            ("drained_savepoint_s", "request -> drained savepoint complete"),
        ),
    }
    cases = doc["cases"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    labels, seconds, batches, names, colors = [], [], [], [], []
    palette = ("tab:blue", "tab:orange")
    for case in cases:
        med = case["medians"]
        mode, press = case["params"]["mode"], case["params"]["press"]
        for i, (metric, name) in enumerate(metrics[mode]):
            short = {"source_finished_s": "source done", "drained_savepoint_s": "drained sp"}
            labels.append(f"{mode}\npress {press}\n{short.get(metric, metric[:-2])}")
            seconds.append(med.get(metric, 0.0))
            batches.append(med.get(metric, 0.0) / med["batch_s"] if med.get("batch_s") else 0.0)
            names.append(name)
            colors.append(palette[i])
    xs = list(range(len(labels)))
    left.bar(xs, seconds, color=colors)
    left.scatter(
        [x for x, c in zip(xs, colors, strict=True) if c == palette[0]],
        [c["medians"]["batch_s"] for c in cases],
        marker="_",
        s=900,
        color="black",
        label="duration of the split batch being processed at the press",
    )
    left.set_yscale("log")
    left.set_ylabel("median seconds after the stop request")
    right.bar(xs, batches, color=colors)
    right.axhline(1.0, color="grey", linestyle="--", label="one split batch")
    right.set_yscale("log")
    right.set_ylabel("in split batches (of the stopped stage)")
    for ax in (left, right):
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, fontsize=7)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
    left.set_title("Stop latency (drained savepoint waits for all downstream work)", fontsize=9)
    right.set_title("Target: savepoint / source finished <= 1 batch + a few s", fontsize=9)
    fig.suptitle(f"Stop with savepoint / drain: {_subtitle(doc)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_curve(plt: Any, doc: dict[str, Any], path: Path) -> None:
    cases = [c for c in doc["cases"] if c["name"].startswith("ours@")]
    xs = [float(c["params"]["target_batch_s"]) for c in cases]
    ratios = doc.get("ratios", {})
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    for suffix, label in (("", "whole pipeline"), ("/after_ingest", "enrich..publish")):
        ys = [ratios.get(f"ours_over_plain/{x:g}s{suffix}") or 0.0 for x in xs]
        left.plot(xs, ys, marker="o", label=label)
    left.axhline(1.10, color="grey", linestyle="--", linewidth=1, label="1.10")
    left.axhline(1.0, color="black", linewidth=0.5)
    left.set_xscale("log")
    left.set_xlabel("target_batch_s")
    left.set_ylabel("ours / plain (median wall time)")
    left.set_title("Overhead, no failures", fontsize=9)
    for metric, label in (
        ("max_batch_s", "worst case: longest batch"),
        ("expected_redo_s", "expected (crash at a random moment)"),
    ):
        right.plot(xs, [c["medians"].get(metric, 0.0) for c in cases], marker="o", label=label)
    right.set_xscale("log")
    right.set_xlabel("target_batch_s")
    right.set_ylabel("seconds of work redone after a crash")
    right.set_title("Redone work after a crash (= stop-with-savepoint wait)", fontsize=9)
    for ax in (left, right):
        ax.minorticks_off()
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x:g}" for x in xs])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Auto batches vs target duration: {_subtitle(doc)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


CHARTS: dict[str, Callable[[Any, dict[str, Any], Path], None]] = {
    "coordinator_scale": chart_scale,
    "triggerer_load": chart_waiters,
    "final_checkpoint_latency": chart_latency,
    "steady_state_overhead": chart_overhead,
    "resume_savings": chart_resume,
    "stop_latency": chart_stop,
    "batch_target_curve": chart_curve,
    "steady_state_overhead_x10": chart_overhead,
    "steady_state_overhead_x100": chart_overhead,
    "resume_savings_x100": chart_resume,
}


def render_all(out: Path) -> list[str]:
    """Render every chart whose JSON is present; returns what was done, one line each."""
    plt = _pyplot()
    if plt is None:
        return [MISSING_MATPLOTLIB]
    messages = []
    for name, chart in CHARTS.items():
        doc = _load(out, name)
        if doc is None:
            continue
        path = out / f"{name}.png"
        try:
            chart(plt, doc, path)
            messages.append(f"chart {path}")
        except Exception as exc:  # a chart must never lose the results
            messages.append(f"chart {name} failed: {type(exc).__name__}: {exc}")
    return messages


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "results"
    for line in render_all(target):
        print(line)
