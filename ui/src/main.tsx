// The entry point Airflow's UI loads (react_apps' bundle_url): one component for both apps,
// the Pipelines list (destination "nav") and a DAG run's Pipeline tab ("dag_run"): Airflow
// passes the route's dagId and runId to the second.
import { PipelineView } from "./PipelineView";
import { RunsList } from "./RunsList";
import { injectStyles } from "./styles";

export interface PluginProps {
  dagId?: string;
  runId?: string;
  taskId?: string;
  mapIndex?: string;
}

export default function FinalckptApp({ dagId, runId }: PluginProps) {
  injectStyles();
  return (
    <div className="fck" data-finalckpt-app={dagId && runId ? "pipeline" : "runs"}>
      {dagId && runId ? <PipelineView key={`${dagId}/${runId}`} dagId={dagId} runId={runId} /> : <RunsList />}
    </div>
  );
}

// Airflow's UI imports the bundle once and looks each app up by its name first: both names
// get the component, so the second app (already imported) renders too.
for (const name of ["Pipeline", "Pipelines"]) {
  Reflect.set(globalThis, name, FinalckptApp);
}
