// The checkpoint history, newest first, with the cap said ("showing 50 of 312"), savepoint
// paths selectable, and every stage's status in each checkpoint.
import { Badge } from "./common";
import { checkpointStatePalette, formatDuration, formatSize, formatTime, STATUS_WORDS } from "./rules";
import type { CheckpointSummary } from "./types";

export function Checkpoints({
  checkpoints,
  total,
  stageOrder,
  tz,
  onMore,
}: {
  checkpoints: CheckpointSummary[];
  total: number;
  stageOrder: string[];
  tz: string;
  onMore: (() => void) | null;
}) {
  if (checkpoints.length === 0) return <p className="muted">No checkpoint has been triggered yet.</p>;
  return (
    <>
      <p className="muted" data-testid="checkpoints-showing">
        {checkpoints.length < total ? `Showing the newest ${checkpoints.length} of ${total}` : `All ${total}`} checkpoints and savepoints{" "}
        {onMore ? (
          <button type="button" onClick={onMore}>
            Show more
          </button>
        ) : null}
      </p>
      <div className="table-wrap">
        <table className="checkpoints">
          <thead>
            <tr>
              <th>id</th>
              <th>kind</th>
              <th>reason</th>
              <th>state</th>
              <th>triggered</th>
              <th>duration</th>
              <th>size</th>
              <th>stage status</th>
            </tr>
          </thead>
          <tbody>
            {checkpoints.map((ck) => {
              const order = [...stageOrder.filter((s) => s in ck.stage_statuses), ...Object.keys(ck.stage_statuses).filter((s) => !stageOrder.includes(s)).sort()];
              return (
                <tr key={ck.checkpoint_id} data-checkpoint-id={ck.checkpoint_id} data-kind={ck.kind} data-state={ck.state}>
                  <td className="num">{ck.checkpoint_id}</td>
                  <td>
                    {ck.kind.replace("_", " ")}
                    {ck.kind !== "checkpoint" && ck.metadata_path ? (
                      <div>
                        <code className="savepoint-path">{ck.metadata_path}</code>
                      </div>
                    ) : null}
                  </td>
                  <td>{ck.reason.toLowerCase().replace(/_/g, " ")}</td>
                  <td>
                    <Badge palette={checkpointStatePalette(ck.state)}>{ck.state.toLowerCase()}</Badge>
                    {ck.failure_reason ? (
                      <div className="failure">
                        {ck.failure_kind ? `${ck.failure_kind}: ` : ""}
                        {ck.failure_reason}
                      </div>
                    ) : null}
                  </td>
                  <td className="num">{formatTime(ck.triggered_at, tz)}</td>
                  <td className="num">{formatDuration(ck.duration_s)}</td>
                  <td className="num">{formatSize(ck.size_bytes)}</td>
                  <td>
                    <div className="chips">
                      {order.map((stageId) => {
                        const [word, palette] = STATUS_WORDS[ck.stage_statuses[stageId]] ?? [ck.stage_statuses[stageId], "none"];
                        return (
                          <span key={stageId} title={`${stageId}: ${word}`}>
                            <Badge palette={palette}>{stageId}</Badge>
                          </span>
                        );
                      })}
                    </div>
                  </td>
                </tr>
              );
            })}
          </tbody>
        </table>
      </div>
    </>
  );
}
