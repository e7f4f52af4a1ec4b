// The JSON the plugin's REST routes answer (airflow_finalckpt/control/service.py's models).

export type RunState =
  | "not_started"
  | "running"
  | "stopping"
  | "suspended"
  | "draining"
  | "drained"
  | "finished";

export const RUN_STATES: RunState[] = [
  "running",
  "stopping",
  "suspended",
  "draining",
  "drained",
  "finished",
  "not_started",
];

export type Lifecycle = "NOT_STARTED" | "RUNNING" | "FINISHED" | "SUSPENDED" | "CLOSED";

export interface StopSummary {
  request_id: number;
  mode: "drain" | "savepoint";
  state: "REQUESTED" | "COMPLETED" | "FAILED" | "RESUMED";
  savepoint_id: number | null;
  savepoint_path: string | null;
  requested_by: string | null;
  requested_at: number;
  finished_at: number | null;
  failure_reason: string | null;
}

export interface RunSummary {
  pipeline_key: string;
  dag_runs: [string, string][];
  state: RunState;
  stages_total: number;
  stages_closed: number;
  done_splits: number;
  total_splits: number;
  latest_checkpoint_id: number | null;
  restored_from: string | null;
  unread_splits: number;
  stop: StopSummary | null;
  started_at: number | null;
  ended_at: number | null;
}

export interface StageSummary {
  stage_id: string;
  upstream: string[];
  lifecycle: Lifecycle;
  status: string;
  epoch: number;
  done_splits: number;
  total_splits: number | null;
  closed_checkpoint_id: number | null;
  drained: boolean | null;
  unread_splits: number | null;
  batches: string | null;
}

export interface CheckpointSummary {
  checkpoint_id: number;
  kind: string;
  reason: string;
  state: string;
  triggered_at: number;
  completed_at: number | null;
  duration_s: number | null;
  size_bytes: number | null;
  metadata_path: string | null;
  failure_reason: string | null;
  failure_kind: string | null;
  stage_statuses: Record<string, string>;
}

export interface PipelineDetail {
  summary: RunSummary;
  stages: StageSummary[];
  checkpoints: CheckpointSummary[];
  checkpoints_total: number;
}

export interface RunPage {
  runs: RunSummary[];
  total_entries: number;
  state_counts: Record<string, number>;
  limit: number;
  offset: number;
}

export interface DagAccess {
  dag_id: string;
  can_edit: boolean;
}
