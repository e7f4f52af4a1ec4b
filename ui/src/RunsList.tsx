// The Pipelines page: every pipeline run the user may read, searchable, filterable by state,
// sortable, paged on the server; polled and patched in place.
import { useEffect, useMemo, useState } from "react";

import { AirflowLink, Badge, ErrorMessage } from "./common";
import { useAirflowTimezone, useNow, usePoll } from "./hooks";
import type { ListParams } from "./rules";
import { formatDuration, formatTime, listQuery, runDuration, runPalette, runTabPath, runWord, showing, stateWord } from "./rules";
import { RUN_STATES, type RunPage, type RunState } from "./types";

const PAGE_SIZES = [25, 50, 100];
const COLUMNS: [ListParams["sort"] | null, string][] = [
  ["key", "Pipeline"],
  ["state", "State"],
  [null, "DAG runs"],
  ["started", "Started"],
  ["duration", "Duration"],
  [null, "Stages closed"],
  [null, "Splits done"],
  [null, "Latest checkpoint"],
  [null, "Last stop"],
];

export function RunsList() {
  const [searchInput, setSearchInput] = useState("");
  const [params, setParams] = useState<ListParams>({ search: "", states: [], sort: "linked", order: "desc", limit: 25, offset: 0 });
  const tz = useAirflowTimezone();
  const now = useNow();

  // the search asks the server once typing pauses, from the first page
  useEffect(() => {
    const timer = setTimeout(() => setParams((p) => (p.search === searchInput ? p : { ...p, search: searchInput, offset: 0 })), 300);
    return () => clearTimeout(timer);
  }, [searchInput]);

  const path = useMemo(() => `runs?${listQuery(params)}`, [params]);
  const { data, error } = usePoll<RunPage>(path, 5000);

  const toggleState = (state: RunState) =>
    setParams((p) => ({
      ...p,
      offset: 0,
      states: p.states.includes(state) ? p.states.filter((s) => s !== state) : [...p.states, state],
    }));
  const sortBy = (sort: ListParams["sort"]) =>
    setParams((p) => ({ ...p, sort, offset: 0, order: p.sort === sort && p.order === "desc" ? "asc" : "desc" }));
  // the caption and the pager describe the page shown (the answer), not the one asked for
  const total = data?.total_entries ?? 0;
  const shownOffset = data?.offset ?? 0;
  const shownLimit = data?.limit ?? params.limit;
  const pages = Math.max(1, Math.ceil(total / shownLimit));
  const page = Math.floor(shownOffset / shownLimit) + 1;
  const loading = data !== null && (data.offset !== params.offset || data.limit !== params.limit);

  return (
    <div className="fck-runs">
      <h1>Pipeline runs</h1>
      <div className="toolbar" role="search">
        <input
          type="search"
          aria-label="Search by DAG, run or pipeline key"
          placeholder="Search by DAG, run or pipeline key"
          value={searchInput}
          onChange={(e) => setSearchInput(e.target.value)}
        />
        <div className="toolbar" role="group" aria-label="Filter by state">
          {RUN_STATES.map((state) => (
            <button
              key={state}
              type="button"
              className="chip-toggle"
              data-palette={runPalette({ state, unread_splits: 0 })}
              data-state-filter={state}
              aria-pressed={params.states.includes(state)}
              onClick={() => toggleState(state)}
            >
              {stateWord(state)} <span className="muted">{data?.state_counts[state] ?? 0}</span>
            </button>
          ))}
        </div>
      </div>
      {error ? <ErrorMessage error={error} stale={data !== null && error.retryable} /> : null}
      {data === null && !error ? <p className="muted">Loading…</p> : null}
      {data !== null ? (
        <>
          <p className="muted" data-testid="showing">
            {showing(shownOffset, data.runs.length, total)}
            {params.states.length ? ` (state: ${params.states.map(stateWord).join(", ")})` : ""}
          </p>
          <div className="table-wrap" aria-busy={loading}>
            <table className="runs">
              <thead>
                <tr>
                  {COLUMNS.map(([sort, label]) => (
                    <th key={label} aria-sort={sort && params.sort === sort ? (params.order === "asc" ? "ascending" : "descending") : undefined}>
                      {sort ? (
                        <button type="button" onClick={() => sortBy(sort)} data-sort={sort}>
                          {label}
                          {params.sort === sort ? (params.order === "asc" ? " ▲" : " ▼") : ""}
                        </button>
                      ) : (
                        label
                      )}
                    </th>
                  ))}
                </tr>
              </thead>
              <tbody>
                {data.runs.map((run) => {
                  const newest = run.dag_runs[run.dag_runs.length - 1];
                  return (
                    <tr key={run.pipeline_key} data-pipeline-key={run.pipeline_key} data-run-state={run.state}>
                      <td>
                        {newest ? (
                          <AirflowLink to={runTabPath(newest[0], newest[1])} className="pipeline-key">
                            {run.pipeline_key}
                          </AirflowLink>
                        ) : (
                          run.pipeline_key
                        )}
                      </td>
                      <td>
                        <Badge palette={runPalette(run)} data-run-state={run.state}>
                          {runWord(run)}
                        </Badge>
                      </td>
                      <td>
                        {run.dag_runs.map(([dagId, runId], i) => (
                          <span key={`${dagId}/${runId}`}>
                            {i > 0 ? ", " : null}
                            <AirflowLink to={runTabPath(dagId, runId)} className="dag-run">
                              {dagId} / {runId}
                            </AirflowLink>
                          </span>
                        ))}
                      </td>
                      <td className="num">{formatTime(run.started_at, tz)}</td>
                      <td className="num">{formatDuration(runDuration(run, now))}</td>
                      <td className="num">
                        {run.stages_closed}/{run.stages_total}
                      </td>
                      <td className="num">
                        {run.done_splits}/{run.total_splits}
                      </td>
                      <td className="num">{run.latest_checkpoint_id ?? "—"}</td>
                      <td>{run.stop ? `${run.stop.mode} · ${run.stop.state.toLowerCase()}` : "—"}</td>
                    </tr>
                  );
                })}
              </tbody>
            </table>
          </div>
          <div className="pager">
            <button type="button" disabled={params.offset === 0 || loading} onClick={() => setParams((p) => ({ ...p, offset: Math.max(0, p.offset - p.limit) }))}>
              Previous
            </button>
            <span data-testid="page">
              Page {page} of {pages}
            </span>
            <button
              type="button"
              disabled={params.offset + params.limit >= total || loading}
              onClick={() => setParams((p) => ({ ...p, offset: p.offset + p.limit }))}
            >
              Next
            </button>
            <label>
              Rows per page{" "}
              <select value={params.limit} onChange={(e) => setParams((p) => ({ ...p, limit: Number(e.target.value), offset: 0 }))}>
                {PAGE_SIZES.map((n) => (
                  <option key={n} value={n}>
                    {n}
                  </option>
                ))}
              </select>
            </label>
          </div>
        </>
      ) : null}
    </div>
  );
}
