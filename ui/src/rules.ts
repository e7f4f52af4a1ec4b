// What the views draw, as pure functions over plain values (tested in rules.test.ts).
import type { Lifecycle, RunState, RunSummary, StageSummary } from "./types";

/** Airflow's colour palettes (its Chakra theme's semantic tokens: `running` is cyan, ...). */
export type Palette =
  | "running"
  | "success"
  | "failed"
  | "queued"
  | "deferred"
  | "up_for_reschedule"
  | "none"
  | "teal"
  | "amber"
  | "orange";

/** A run's state: Airflow's own palettes where the state is Airflow's (running, success),
 * and distinct ones for ours; a drain that left input unread is not a finished run. */
export function runPalette(run: Pick<RunSummary, "state" | "unread_splits">): Palette {
  switch (run.state) {
    case "running":
      return "running";
    case "finished":
      return "success";
    case "drained":
      return run.unread_splits > 0 ? "amber" : "teal";
    case "draining":
      return "teal";
    case "stopping":
      return "up_for_reschedule";
    case "suspended":
      return "deferred";
    default:
      return "none";
  }
}

const RUN_WORDS: Record<RunState, string> = {
  not_started: "not started",
  running: "running",
  stopping: "stopping (savepoint)",
  suspended: "suspended",
  draining: "draining",
  drained: "drained",
  finished: "finished",
};

export function runWord(run: Pick<RunSummary, "state" | "unread_splits">): string {
  if (run.state === "drained" && run.unread_splits > 0) {
    return `drained · ${run.unread_splits} unread`;
  }
  return RUN_WORDS[run.state] ?? run.state;
}

export function stateWord(state: RunState): string {
  return RUN_WORDS[state] ?? state;
}

/** A stage in one word, from its lifecycle: what it is doing, not its checkpoint status. */
export function stageWord(stage: Pick<StageSummary, "lifecycle" | "drained" | "unread_splits">): string {
  const words: Record<Lifecycle, string> = {
    NOT_STARTED: "not started",
    RUNNING: "running",
    FINISHED: "finishing",
    SUSPENDED: "suspended",
    CLOSED: "finished",
  };
  if (stage.lifecycle === "CLOSED" && stage.drained) {
    return stage.unread_splits ? `drained · ${stage.unread_splits} unread` : "drained";
  }
  return words[stage.lifecycle] ?? stage.lifecycle.toLowerCase();
}

export function stagePalette(stage: Pick<StageSummary, "lifecycle" | "drained" | "unread_splits">): Palette {
  switch (stage.lifecycle) {
    case "RUNNING":
      return "running";
    case "FINISHED":
      return "teal";
    case "SUSPENDED":
      return "deferred";
    case "CLOSED":
      return stage.drained && stage.unread_splits ? "amber" : "success";
    default:
      return "none";
  }
}

/** A checkpoint status (FLIP-147's words) in words, with its palette. */
export const STATUS_WORDS: Record<string, [string, Palette]> = {
  FULLY_FINISHED: ["fully finished", "success"],
  PARTIALLY_FINISHED: ["partially finished", "orange"],
  RUNNING: ["running", "running"],
  NOT_STARTED: ["not started", "none"],
};

export function checkpointStatePalette(state: string): Palette {
  switch (state) {
    case "COMPLETED":
      return "success";
    case "PENDING":
      return "running";
    case "DISCARDED":
      return "none";
    default:
      return "failed";
  }
}

/** Every stage downstream of `stageId` (which a recompute resets with it), in graph order. */
export function downstreamOf(stages: StageSummary[], stageId: string): string[] {
  const reached = new Set([stageId]);
  const out: string[] = [];
  for (const stage of stages) {
    if (!reached.has(stage.stage_id) && stage.upstream.some((u) => reached.has(u))) {
      reached.add(stage.stage_id);
      out.push(stage.stage_id);
    }
  }
  return out;
}

/** Why a stage cannot be recomputed now, or null if it can: a recompute forgets progress,
 * so it needs progress to forget and nothing in flight that would race it (a running or
 * stopping run), and a drained run's input was cut short on purpose. */
export function recomputeBlocker(state: RunState, stages: StageSummary[], stageId: string): string | null {
  const stage = stages.find((s) => s.stage_id === stageId);
  if (!stage) return "unknown stage";
  if (stage.lifecycle === "NOT_STARTED") return "it has not started: nothing to recompute";
  if (state === "stopping" || state === "draining") return "a stop is in progress";
  if (state === "drained") return "the run was drained: it ends here";
  if (state === "not_started") return "the run has not started";
  const affected = new Set([stageId, ...downstreamOf(stages, stageId)]);
  if (stages.some((s) => affected.has(s.stage_id) && s.lifecycle === "RUNNING")) {
    return "it or a stage downstream of it is running: stop the run first";
  }
  return null;
}

export type Action = "drain" | "savepoint" | "resume";

/** The actions a run's state allows (the REST routes refuse the others with 409). */
export function allowedActions(state: RunState): Set<Action> {
  if (state === "running" || state === "not_started") return new Set(["drain", "savepoint"]);
  if (state === "suspended") return new Set(["resume"]);
  return new Set();
}

export function formatDuration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined) return "—";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 120) return `${seconds.toFixed(1)} s`;
  if (seconds < 7200) return `${(seconds / 60).toFixed(1)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

export function formatSize(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined) return "—";
  let value = bytes;
  for (const unit of ["B", "KiB", "MiB", "GiB"]) {
    if (value < 1024 || unit === "GiB") {
      return unit === "B" ? `${value} B` : `${value.toFixed(1)} ${unit}`;
    }
    value /= 1024;
  }
  return `${bytes} B`;
}

/** A UNIX time in the time zone the user picked in Airflow (24 h, to the second). */
export function formatTime(seconds: number | null | undefined, timeZone: string): string {
  if (seconds === null || seconds === undefined) return "—";
  const parts = new Intl.DateTimeFormat("en-CA", {
    timeZone,
    year: "numeric",
    month: "2-digit",
    day: "2-digit",
    hour: "2-digit",
    minute: "2-digit",
    second: "2-digit",
    hourCycle: "h23",
    timeZoneName: "short",
  }).formatToParts(new Date(seconds * 1000));
  const get = (type: string) => parts.find((p) => p.type === type)?.value ?? "";
  return `${get("year")}-${get("month")}-${get("day")} ${get("hour")}:${get("minute")}:${get("second")} ${get("timeZoneName")}`;
}

export function runDuration(run: Pick<RunSummary, "started_at" | "ended_at">, now: number): number | null {
  if (run.started_at === null) return null;
  return Math.max(0, (run.ended_at ?? now) - run.started_at);
}

/** The run's Pipeline tab inside Airflow's UI (a path for Airflow's router). */
export function runTabPath(dagId: string, runId: string): string {
  return `/dags/${encodeURIComponent(dagId)}/runs/${encodeURIComponent(runId)}/plugin/finalckpt-pipeline`;
}

export interface ListParams {
  search: string;
  states: RunState[];
  sort: "linked" | "started" | "duration" | "state" | "key";
  order: "asc" | "desc";
  limit: number;
  offset: number;
}

export function listQuery(p: ListParams): string {
  const q = new URLSearchParams();
  if (p.search.trim()) q.set("q", p.search.trim());
  for (const s of p.states) q.append("state", s);
  q.set("sort", p.sort);
  q.set("order", p.order);
  q.set("limit", String(p.limit));
  q.set("offset", String(p.offset));
  return q.toString();
}

/** "Showing 26–50 of 250" (or "No runs match"). */
export function showing(offset: number, count: number, total: number): string {
  if (total === 0) return "No pipeline runs match";
  return `Showing ${offset + 1}–${offset + count} of ${total}`;
}
