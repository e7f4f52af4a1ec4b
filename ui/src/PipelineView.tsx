// The Pipeline tab of a DAG run: the run's state and facts, stop/resume (and recompute in a
// menu) for users who may edit the DAG's runs, the stage graph and the checkpoint history.
// Polled and patched in place: a selected savepoint path, the focused button and the graph's
// scroll position survive every update.
import { useEffect, useRef, useState } from "react";

import { ApiError, postJson, runPath } from "./api";
import { Checkpoints } from "./Checkpoints";
import { AirflowLink, Badge, ErrorMessage } from "./common";
import { type Ask, ConfirmDialog } from "./Confirm";
import { useAirflowTimezone, useNow, usePoll } from "./hooks";
import type { Action, Palette } from "./rules";
import {
  allowedActions,
  downstreamOf,
  formatDuration,
  formatTime,
  recomputeBlocker,
  runDuration,
  runPalette,
  runTabPath,
  runWord,
  stagePalette,
  stageWord,
} from "./rules";
import { StageGraph } from "./StageGraph";
import type { CheckpointSummary, DagAccess, PipelineDetail, StageSummary } from "./types";

const ACTIONS: { action: Action; label: string; palette: Palette; title: string; text: string }[] = [
  {
    action: "drain",
    label: "Stop with drain",
    palette: "failed",
    title: "Stop with drain?",
    text:
      "Sources stop reading new input, every event-time window fires, all stages finish and commit, and the DAG run ends. " +
      "Unread input is left unread. A drained run cannot be resumed.",
  },
  {
    action: "savepoint",
    label: "Stop with savepoint",
    palette: "deferred",
    title: "Stop with savepoint?",
    text:
      "Running stages stop at their next split batch without finishing, a savepoint is written and Spark is released. " +
      "Resume later with nothing lost and nothing duplicated.",
  },
  {
    action: "resume",
    label: "Resume",
    palette: "running",
    title: "Resume?",
    text: "The suspended run continues from its savepoint in this DAG run.",
  },
];
const HISTORY = 50;

interface Message {
  text: string;
  palette: Palette;
}

export function PipelineView({ dagId, runId }: { dagId: string; runId: string }) {
  const tz = useAirflowTimezone();
  const now = useNow();
  const path = runPath(dagId, runId);
  const detail = usePoll<PipelineDetail>(path, (d) => (d.summary.state === "finished" || d.summary.state === "drained" ? 15_000 : 2_000));
  const access = usePoll<DagAccess>(`dags/${encodeURIComponent(dagId)}/access`, 60_000);
  const [historyLimit, setHistoryLimit] = useState(HISTORY);
  const history = usePoll<{ checkpoints: CheckpointSummary[]; total_entries: number }>(
    historyLimit > HISTORY ? `${path}/checkpoints?limit=${historyLimit}` : null,
    5_000,
  );
  const [ask, setAsk] = useState<Ask | null>(null);
  const [message, setMessage] = useState<Message | null>(null);
  const [menuOpen, setMenuOpen] = useState(false);
  const sentFrom = useRef<string | null>(null);
  const data = detail.data;
  const state = data?.summary.state;

  // a "requested" message stays until the run leaves the state it was sent from
  useEffect(() => {
    if (sentFrom.current !== null && state && state !== sentFrom.current && state !== "stopping" && state !== "draining") {
      sentFrom.current = null;
      setMessage((m) => (m?.palette === "running" ? null : m));
    }
  }, [state]);

  if (!data) {
    return (
      <div className="fck-pipeline">
        <h1>Pipeline of {dagId} / {runId}</h1>
        {detail.error ? (
          <>
            <ErrorMessage error={detail.error} />
            {detail.error.reason === "not_started" ? <p className="muted">This page updates when the first stage starts.</p> : null}
            {detail.stopped && detail.error.status === 404 ? (
              <p className="muted">
                <AirflowLink to="/plugin/finalckpt">All pipeline runs</AirflowLink>
              </p>
            ) : null}
          </>
        ) : (
          <p className="muted">Loading…</p>
        )}
      </div>
    );
  }

  const { summary, stages } = data;
  const stop = summary.stop;
  const canEdit = access.data?.can_edit === true;
  const allowed = allowedActions(summary.state);

  const send = (what: string, body: unknown, done: string) => {
    sentFrom.current = summary.state;
    setMessage({ text: "Sending…", palette: "running" });
    postJson(`${path}/${what}`, body)
      .then(() => setMessage({ text: done, palette: "running" }))
      .catch((err: unknown) => {
        sentFrom.current = null;
        const e = err instanceof ApiError ? err : new ApiError(String(err), 0);
        setMessage({ text: `${e.message} (HTTP ${e.status})`, palette: "failed" });
      })
      .finally(detail.refresh);
  };
  const askAction = (a: (typeof ACTIONS)[number]) =>
    setAsk({
      title: a.title,
      text: a.text,
      confirm: a.label,
      onConfirm: () =>
        a.action === "resume"
          ? send("resume", {}, "Resume requested.")
          : send("stop", { mode: a.action }, `${a.label} requested: waiting for the savepoint…`),
    });
  const askRecompute = (stage: StageSummary) => {
    const down = downstreamOf(stages, stage.stage_id);
    const also = down.length ? ` and the ${down.length} stage(s) downstream of it (${down.join(", ")})` : "";
    setMenuOpen(false);
    setAsk({
      title: `Recompute ${stage.stage_id}?`,
      text:
        `This forgets the progress of ${stage.stage_id}${also}. Clear their tasks in Airflow next: they run again from scratch. ` +
        "Committed output stays; sinks that declare a slice replace it when the recompute commits, the others append.",
      confirm: `Recompute ${stage.stage_id}`,
      onConfirm: () =>
        send("reset", { stage_id: stage.stage_id }, `Stage ${stage.stage_id} reset: clear its task and the tasks downstream of it in Airflow to recompute them.`),
    });
  };
  const checkpoints = history.data && historyLimit > HISTORY ? history.data.checkpoints : data.checkpoints;
  const total = history.data && historyLimit > HISTORY ? history.data.total_entries : data.checkpoints_total;

  return (
    <div className="fck-pipeline">
      <section className="header" data-run-state={summary.state}>
        <h1>
          <span>Pipeline {summary.pipeline_key}</span>
          <Badge palette={runPalette(summary)} data-run-state={summary.state}>
            {runWord(summary)}
          </Badge>
        </h1>
        {detail.error ? <ErrorMessage error={detail.error} stale={detail.error.retryable} /> : null}
        <dl className="facts">
          <dt>DAG run</dt>
          <dd>
            {dagId} / {runId}
          </dd>
          {summary.dag_runs.length > 1 ? (
            <>
              <dt>DAG runs of this pipeline</dt>
              <dd>
                {summary.dag_runs.map(([d, r], i) => (
                  <span key={`${d}/${r}`}>
                    {i > 0 ? ", " : null}
                    <AirflowLink to={runTabPath(d, r)}>{`${d} / ${r}`}</AirflowLink>
                  </span>
                ))}
              </dd>
            </>
          ) : null}
          <dt>started</dt>
          <dd>{formatTime(summary.started_at, tz)}</dd>
          <dt>duration</dt>
          <dd>
            {formatDuration(runDuration(summary, now))}
            {summary.ended_at === null && summary.started_at !== null ? " so far" : ""}
          </dd>
          <dt>stages</dt>
          <dd>
            {summary.stages_closed}/{summary.stages_total} finished
          </dd>
          <dt>splits</dt>
          <dd>
            {summary.done_splits}/{summary.total_splits} done
          </dd>
          <dt>latest completed checkpoint</dt>
          <dd>{summary.latest_checkpoint_id ?? "—"}</dd>
          {summary.restored_from ? (
            <>
              <dt>restored from</dt>
              <dd>
                <code>{summary.restored_from}</code>
              </dd>
            </>
          ) : null}
          {summary.unread_splits ? (
            <>
              <dt>unread input</dt>
              <dd>{summary.unread_splits} split(s) left unread by the drain</dd>
            </>
          ) : null}
        </dl>
        {stop ? (
          <dl className="facts stop">
            <dt>last stop</dt>
            <dd>
              {stop.mode === "drain" ? "stop with drain" : "stop with savepoint"} · {stop.state.toLowerCase()}
              {stop.state === "RESUMED" ? (stop.requested_by ? ` by ${stop.requested_by}` : "") : stop.requested_by ? `, requested by ${stop.requested_by}` : ""}
            </dd>
            <dt>stop requested</dt>
            <dd>{formatTime(stop.requested_at, tz)}</dd>
            {stop.finished_at !== null ? (
              <>
                <dt>{stop.mode === "drain" ? "drained savepoint done" : "savepoint done"}</dt>
                <dd>
                  {formatTime(stop.finished_at, tz)} ({formatDuration(stop.finished_at - stop.requested_at)})
                </dd>
              </>
            ) : null}
            {stop.savepoint_id !== null ? (
              <>
                <dt>savepoint</dt>
                <dd>
                  {stop.savepoint_id}
                  {stop.savepoint_path ? (
                    <>
                      {" · "}
                      <code className="savepoint-path">{stop.savepoint_path}</code>
                    </>
                  ) : null}
                </dd>
              </>
            ) : null}
            {stop.failure_reason ? (
              <>
                <dt>failed</dt>
                <dd className="failure">{stop.failure_reason}</dd>
              </>
            ) : null}
          </dl>
        ) : (
          <p className="muted">No stop has been requested.</p>
        )}
        {canEdit ? (
          <div className="toolbar actions">
            {ACTIONS.map((a) => (
              <button
                key={a.action}
                type="button"
                className="solid action"
                data-palette={a.palette}
                data-action={a.action}
                disabled={!allowed.has(a.action)}
                onClick={() => askAction(a)}
              >
                {a.label}
              </button>
            ))}
            <div className="menu">
              <button type="button" aria-haspopup="menu" aria-expanded={menuOpen} onClick={() => setMenuOpen((o) => !o)}>
                More ▾
              </button>
              {menuOpen ? (
                <div role="menu" aria-label="More actions">
                  {stages.map((s) => {
                    const why = recomputeBlocker(summary.state, stages, s.stage_id);
                    return (
                      <button key={s.stage_id} type="button" role="menuitem" disabled={why !== null} title={why ?? undefined} onClick={() => askRecompute(s)}>
                        Recompute {s.stage_id}…{why ? <span className="why">{why}</span> : null}
                      </button>
                    );
                  })}
                </div>
              ) : null}
            </div>
          </div>
        ) : access.data ? (
          <p className="muted read-only">Read only: stopping, resuming and recomputing need permission to edit this DAG's runs.</p>
        ) : null}
        {message ? (
          <div id="message" className="message" role="status" data-palette={message.palette}>
            {message.text}
          </div>
        ) : null}
      </section>
      <section>
        <h2>Stages</h2>
        <div className="legend">
          {(["NOT_STARTED", "RUNNING", "FINISHED", "SUSPENDED", "CLOSED"] as const).map((lifecycle) => (
            <Badge key={lifecycle} palette={stagePalette({ lifecycle, drained: false, unread_splits: null })}>
              {stageWord({ lifecycle, drained: false, unread_splits: null })}
            </Badge>
          ))}
          <Badge palette="amber">drained · input unread</Badge>
        </div>
        <StageGraph stages={stages} />
      </section>
      <section>
        <h2>Checkpoint history</h2>
        <Checkpoints
          checkpoints={checkpoints}
          total={total}
          stageOrder={stages.map((s) => s.stage_id)}
          tz={tz}
          onMore={checkpoints.length < total && historyLimit < 1000 ? () => setHistoryLimit((n) => Math.min(1000, n + 100)) : null}
        />
      </section>
      <ConfirmDialog ask={ask} onClose={() => setAsk(null)} />
    </div>
  );
}
