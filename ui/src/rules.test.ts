import { describe, expect, it } from "vitest";

import {
  allowedActions,
  downstreamOf,
  formatDuration,
  formatTime,
  listQuery,
  recomputeBlocker,
  runPalette,
  runTabPath,
  runWord,
  showing,
  stagePalette,
  stageWord,
} from "./rules";
import type { StageSummary } from "./types";

function stage(stage_id: string, upstream: string[], lifecycle: StageSummary["lifecycle"], extra: Partial<StageSummary> = {}): StageSummary {
  return {
    stage_id,
    upstream,
    lifecycle,
    status: "RUNNING",
    epoch: 1,
    done_splits: 0,
    total_splits: 3,
    closed_checkpoint_id: null,
    drained: null,
    unread_splits: null,
    batches: null,
    ...extra,
  };
}

const GRAPH = [
  stage("ingest", [], "CLOSED"),
  stage("enrich", ["ingest"], "CLOSED"),
  stage("aggregate", ["enrich"], "SUSPENDED"),
  stage("publish", ["aggregate"], "NOT_STARTED"),
  stage("audit", ["ingest"], "CLOSED"),
];

describe("states in Airflow's colours and words", () => {
  it("uses Airflow's own palettes for its own states", () => {
    expect(runPalette({ state: "running", unread_splits: 0 })).toBe("running");
    expect(runPalette({ state: "finished", unread_splits: 0 })).toBe("success");
  });
  it("tells a drain that left input unread from a finished run", () => {
    const cut = { state: "drained" as const, unread_splits: 4 };
    expect(runPalette(cut)).not.toBe(runPalette({ state: "finished", unread_splits: 0 }));
    expect(runWord(cut)).toBe("drained · 4 unread");
    expect(stageWord({ lifecycle: "CLOSED", drained: true, unread_splits: 4 })).toBe("drained · 4 unread");
    expect(stagePalette({ lifecycle: "CLOSED", drained: true, unread_splits: 4 })).toBe("amber");
    expect(stagePalette({ lifecycle: "CLOSED", drained: false, unread_splits: null })).toBe("success");
  });
  it("says what a stage does, not its checkpoint status", () => {
    expect(stageWord({ lifecycle: "RUNNING", drained: null, unread_splits: null })).toBe("running");
    expect(stageWord({ lifecycle: "FINISHED", drained: null, unread_splits: null })).toBe("finishing");
  });
});

describe("recompute", () => {
  it("resets the stage's downstream stages in graph order", () => {
    expect(downstreamOf(GRAPH, "enrich")).toEqual(["aggregate", "publish"]);
    expect(downstreamOf(GRAPH, "ingest")).toEqual(["enrich", "aggregate", "publish", "audit"]);
  });
  it("is allowed only where it can apply", () => {
    expect(recomputeBlocker("suspended", GRAPH, "enrich")).toBeNull();
    expect(recomputeBlocker("finished", GRAPH, "audit")).toBeNull();
    expect(recomputeBlocker("suspended", GRAPH, "publish")).toMatch(/not started/);
    expect(recomputeBlocker("drained", GRAPH, "enrich")).toMatch(/drained/);
    expect(recomputeBlocker("stopping", GRAPH, "enrich")).toMatch(/stop is in progress/);
    const running = GRAPH.map((s) => (s.stage_id === "aggregate" ? { ...s, lifecycle: "RUNNING" as const } : s));
    expect(recomputeBlocker("running", running, "enrich")).toMatch(/running/);
    expect(recomputeBlocker("running", running, "audit")).toBeNull(); // not upstream of aggregate
  });
  it("leaves stop and resume to the states that allow them", () => {
    expect([...allowedActions("running")].sort()).toEqual(["drain", "savepoint"]);
    expect([...allowedActions("suspended")]).toEqual(["resume"]);
    expect(allowedActions("drained").size).toBe(0);
  });
});

describe("formatting", () => {
  it("shows times in the zone Airflow's UI uses", () => {
    expect(formatTime(0, "UTC")).toBe("1970-01-01 00:00:00 UTC");
    expect(formatTime(0, "Asia/Tokyo")).toMatch(/^1970-01-01 09:00:00 /);
    expect(formatTime(null, "UTC")).toBe("—");
  });
  it("shows durations in a unit read at a glance", () => {
    expect(formatDuration(0.25)).toBe("250 ms");
    expect(formatDuration(42)).toBe("42.0 s");
    expect(formatDuration(600)).toBe("10.0 min");
    expect(formatDuration(null)).toBe("—");
  });
  it("builds the list's query and its caption", () => {
    expect(listQuery({ search: " a b ", states: ["running", "drained"], sort: "started", order: "asc", limit: 25, offset: 50 })).toBe(
      "q=a+b&state=running&state=drained&sort=started&order=asc&limit=25&offset=50",
    );
    expect(showing(50, 25, 250)).toBe("Showing 51–75 of 250");
    expect(showing(0, 0, 0)).toBe("No pipeline runs match");
  });
  it("links a run to its Pipeline tab inside Airflow", () => {
    expect(runTabPath("my dag", "manual__2026-01-01T00:00:00+00:00")).toBe(
      "/dags/my%20dag/runs/manual__2026-01-01T00%3A00%3A00%2B00%3A00/plugin/finalckpt-pipeline",
    );
  });
});
