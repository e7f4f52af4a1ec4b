// The stage graph, left to right by depth (longest path), boxes coloured by what each stage
// is doing, in Airflow's state colours. Same layout as the server-rendered page.
import { stagePalette, stageWord } from "./rules";
import type { StageSummary } from "./types";

const BOX_W = 190;
const BOX_H = 64;
const GAP_X = 60;
const GAP_Y = 24;
const PAD = 12;

export function layout(stages: StageSummary[]) {
  const depth = new Map<string, number>();
  const known = new Set(stages.map((s) => s.stage_id));
  for (const stage of stages) {
    const ups = stage.upstream.filter((u) => known.has(u));
    depth.set(stage.stage_id, 1 + Math.max(-1, ...ups.map((u) => depth.get(u) ?? 0)));
  }
  const columns = new Map<number, string[]>();
  for (const stage of stages) {
    const d = depth.get(stage.stage_id) ?? 0;
    columns.set(d, [...(columns.get(d) ?? []), stage.stage_id]);
  }
  const pos = new Map<string, [number, number]>();
  for (const [col, ids] of columns) {
    ids.forEach((id, row) => pos.set(id, [PAD + col * (BOX_W + GAP_X), PAD + row * (BOX_H + GAP_Y)]));
  }
  const cols = Math.max(...columns.keys()) + 1;
  const rows = Math.max(...[...columns.values()].map((ids) => ids.length));
  const edges: { key: string; d: string }[] = [];
  for (const stage of stages) {
    const [x2, y2] = pos.get(stage.stage_id)!;
    for (const up of stage.upstream) {
      const from = pos.get(up);
      if (!from) continue;
      const [sx, sy, ex, ey] = [from[0] + BOX_W, from[1] + BOX_H / 2, x2, y2 + BOX_H / 2];
      const mid = (sx + ex) / 2;
      edges.push({ key: `${up}->${stage.stage_id}`, d: `M${sx},${sy} C${mid},${sy} ${mid},${ey} ${ex - 2},${ey}` });
    }
  }
  return { width: PAD * 2 + cols * BOX_W + (cols - 1) * GAP_X, height: PAD * 2 + rows * (BOX_H + GAP_Y) - GAP_Y, pos, edges };
}

export function StageGraph({ stages }: { stages: StageSummary[] }) {
  if (stages.length === 0) return <p className="muted">No stages registered yet.</p>;
  const g = layout(stages);
  return (
    <div className="graph" tabIndex={0} aria-label="stage graph (scrolls)">
      <svg className="stage-graph" role="img" aria-label="stage graph" width={g.width} height={g.height} viewBox={`0 0 ${g.width} ${g.height}`}>
        <defs>
          <marker id="fck-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">
            <path d="M0,0 L10,5 L0,10 z" style={{ fill: "var(--chakra-colors-fg-muted, #64748b)" }} />
          </marker>
        </defs>
        {g.edges.map((e) => (
          <path key={e.key} className="edge" d={e.d} fill="none" strokeWidth={1.5} markerEnd="url(#fck-arrow)" />
        ))}
        {stages.map((s) => {
          const [x, y] = g.pos.get(s.stage_id)!;
          const total = s.total_splits === null ? "?" : String(s.total_splits);
          const progress = `${s.done_splits}/${total}`;
          const share = s.total_splits ? Math.min(1, s.done_splits / s.total_splits) : 0;
          const word = stageWord(s);
          return (
            <g
              key={s.stage_id}
              className="stage"
              data-stage-id={s.stage_id}
              data-status={s.status}
              data-progress={progress}
              data-lifecycle={s.lifecycle}
              data-palette={stagePalette(s)}
            >
              <title>{`${s.stage_id}: ${word}, ${progress} splits, epoch ${s.epoch}${s.batches ? `; ${s.batches}` : ""}`}</title>
              <rect className="box" x={x} y={y} width={BOX_W} height={BOX_H} rx={8} strokeWidth={2} />
              <rect className="bar-bg" x={x + 10} y={y + BOX_H - 12} width={BOX_W - 20} height={5} rx={2} />
              <rect className="bar" x={x + 10} y={y + BOX_H - 12} width={(BOX_W - 20) * share} height={5} rx={2} />
              <text x={x + 10} y={y + 20} className="stage-name">
                {s.stage_id.length > 22 ? `${s.stage_id.slice(0, 21)}…` : s.stage_id}
              </text>
              <text x={x + BOX_W - 10} y={y + 20} textAnchor="end" className="stage-progress">
                {progress}
              </text>
              <text x={x + 10} y={y + 39} className="stage-status">
                {word}
              </text>
            </g>
          );
        })}
      </svg>
    </div>
  );
}
