"""REST routes under ``/finalckpt/api``: pipeline runs, stop with drain / savepoint, resume,
restore. GET routes only read; every change is a POST. See docs/ui-and-api.md.
"""

from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field

from airflow_finalckpt.control import (
    CheckpointSummary,
    PipelineControl,
    PipelineDetail,
    PipelineRunState,
    ResetSummary,
    StopSummary,
    reset_stage,
)
from airflow_finalckpt.control.listing import ListQuery, PipelineRunPage, SortKey
from airflow_finalckpt.control.listing import list_runs as page_of_runs
from airflow_finalckpt.core.errors import UnknownRunError
from airflow_finalckpt.core.model import CheckpointKind, StopMode
from airflow_finalckpt.core.run_conf import ALLOW_DROP_STAGES_KEY
from airflow_finalckpt.core.split_list import DeclaredSplits
from airflow_finalckpt.plugins.api.audit import audited
from airflow_finalckpt.plugins.api.auth import (
    Principal,
    authenticate,
    authorize_dag,
    check_csrf,
    is_allowed,
    readable_dag,
)
from airflow_finalckpt.plugins.api.dags import dag_graph, dag_splits, pipeline_not_found

TAG_RUNS = "Pipeline runs"
TAG_CONTROL = "Stop and resume"
TAG_RESTORE = "Restore"
TAG_DAGS = "DAGs"


class ErrorDetail(BaseModel):
    """Every error answer: a message saying what is wrong and what to do."""

    detail: str = Field(examples=["pipeline 'flights.manual__1' is already stopping (savepoint)"])


class CheckpointList(BaseModel):
    """A pipeline run's checkpoints and savepoints, newest first."""

    checkpoints: list[CheckpointSummary]
    total_entries: int


class DagStage(BaseModel):
    """One stage task of a DAG: its stage id, its Airflow task and the stages it reads."""

    stage_id: str
    task_id: str
    upstream: list[str] = Field(description="Stage ids of the stages whose output it reads")
    splits: list[str] | None = Field(
        default=None,
        description="Its fixed list of split ids; null when the task computes them when it runs",
    )
    allow_split_list_change: bool = False


class DagStages(BaseModel):
    """The pipeline graph of a DAG as Airflow last parsed it (its latest serialized version)."""

    dag_id: str
    fingerprint: str = Field(
        description="sha256 of the graph's shape (stage ids and edges), as the store records it"
    )
    stages: list[DagStage] = Field(description="In topological order")


class DagAccess(BaseModel):
    """What the user may do with a DAG's pipeline runs (which buttons the page shows)."""

    dag_id: str
    can_edit: bool = Field(description="May stop, resume and recompute (edit the DAG's runs)")
    can_restore: bool = Field(description="May restore a savepoint (create and edit runs)")


class StopBody(BaseModel):
    """``drain``: finish everything, fire all windows, commit, end the DAG run successfully.
    ``savepoint``: suspend at the next split-batch boundary; resume later.
    """

    model_config = ConfigDict(extra="forbid")

    mode: StopMode


class ResetBody(BaseModel):
    """Which stage to recompute (it and every stage downstream of it are reset)."""

    model_config = ConfigDict(extra="forbid")

    stage_id: str = Field(min_length=1, examples=["aggregate"])


class RestoreBody(BaseModel):
    """Which savepoint to restore into a new DAG run, and which stages may lose progress."""

    model_config = ConfigDict(extra="forbid")

    savepoint_path: str = Field(
        min_length=1,
        description="A savepoint (or checkpoint) directory or its _metadata file",
        examples=["/data/checkpoints/flights.manual__1/chk-7"],
    )
    allow_drop_stages: list[Annotated[str, Field(min_length=1)]] = Field(
        default=[],
        description="Stages removed or renamed in the DAG whose progress may be dropped; "
        "without naming them such a change is refused (409)",
    )
    dry_run: bool = Field(
        default=False, description="Only check and answer the plan; no DAG run is created"
    )


class RestoreResponse(BaseModel):
    """The checked restore: the savepoint, the plan, and the new DAG run (none for a dry run)."""

    dag_id: str
    run_id: str | None = Field(
        description="The new DAG run (conf {'restore_from': path, 'allow_drop_stages': [...]}); "
        "null for a dry run"
    )
    savepoint_path: str
    checkpoint_id: int
    kind: CheckpointKind
    pipeline_key: str = Field(description="The pipeline the savepoint was taken of")
    allow_drop_stages: list[str] = []
    mode: str = Field(
        default="restore",
        description="'restore', or 'continue' when the store was already restored from this path",
    )
    plan: dict[str, Any] | None = Field(
        default=None,
        description="What the restore does per stage (skip / resume / fresh, finished splits, "
        "state mapped, dropped stages): the check the stage tasks run before writing",
    )


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    text = {
        401: "Not authenticated (no, invalid or expired token / session)",
        403: "Not allowed for this user on this DAG, or CSRF check failed",
        404: "Unknown DAG run (no stage of it has started) or unknown DAG",
        409: "Conflict with the run's state (finished, already stopping, not suspended, "
        "drained savepoint, savepoint of another pipeline)",
        422: "Invalid request body, or an unreadable savepoint",
        503: "airflow-finalckpt is not configured on the api-server",
    }
    return {code: {"model": ErrorDetail, "description": text[code]} for code in codes}


def requires(*methods: Any, entity: str = "RUN") -> Callable[..., Principal]:
    """Dependency: authenticated, CSRF-checked, and allowed ``methods`` on ``{dag_id}``'s
    ``entity`` (its runs unless told: ``TASK`` for its tasks).
    """

    def dependency(
        request: Request,
        dag_id: str,
        principal: Annotated[Principal, Depends(authenticate)],
    ) -> Principal:
        check_csrf(request, principal)
        authorize_dag(principal, dag_id, *methods, entity=entity)
        return principal

    return dependency


CanRead = Annotated[Principal, Depends(requires("GET"))]
#: read the DAG's tasks: what Airflow's own ``GET /api/v2/dags/{dag_id}/tasks`` asks
CanReadTasks = Annotated[Principal, Depends(requires("GET", entity="TASK"))]
CanEdit = Annotated[Principal, Depends(requires("PUT"))]
CanRestore = Annotated[Principal, Depends(requires("PUT", "POST"))]
Authenticated = Annotated[Principal, Depends(authenticate)]


def build_router(get_control: Callable[[], PipelineControl]) -> APIRouter:
    """The REST routes; ``get_control`` supplies the control service (tests pass their own)."""
    router = APIRouter(prefix="/api", responses=_errors(401, 403, 503))
    Control = Annotated[PipelineControl, Depends(get_control)]

    _add_list_route(router, get_control)

    @router.get(
        "/dags/{dag_id}/access",
        tags=[TAG_DAGS],
        summary="What the user may do with the DAG's pipeline runs",
        response_model=DagAccess,
    )
    def get_access(dag_id: str, principal: CanRead) -> DagAccess:
        """Whether the calling user may stop / resume / recompute (edit the DAG's runs) and
        restore (create and edit them): the page shows only the buttons the user may press.
        The change routes check the same permissions themselves. Needs permission to read the
        DAG's runs (403 otherwise).
        """
        return DagAccess(
            dag_id=dag_id,
            can_edit=is_allowed(principal, dag_id, "PUT"),
            can_restore=all(is_allowed(principal, dag_id, m) for m in ("PUT", "POST")),
        )

    @router.get(
        "/dags/{dag_id}/stages",
        tags=[TAG_DAGS],
        summary="A DAG's pipeline graph",
        response_model=DagStages,
        responses=_errors(404),
    )
    def get_stages(dag_id: str, _: CanReadTasks) -> DagStages:
        """The stage tasks of the DAG's latest parsed version, their stage ids and edges: what
        ``finalckpt restore`` checks a graph change against (Airflow's ``GET
        /api/v2/dags/{dag_id}/tasks`` does not answer stage ids). 404 if Airflow does not know
        the DAG. Needs permission to read the DAG's tasks.
        """
        graph = dag_graph(dag_id)
        declared = dag_splits(dag_id)
        none = DeclaredSplits(None)
        return DagStages(
            dag_id=dag_id,
            fingerprint=graph.fingerprint,
            stages=[
                DagStage(
                    stage_id=sid,
                    task_id=graph.stages[sid].airflow_task_id,
                    upstream=list(graph.upstream(sid)),
                    splits=_listed(declared.get(sid, none).splits),
                    allow_split_list_change=declared.get(sid, none).allow_change,
                )
                for sid in graph.topological_order()
            ],
        )

    @router.get(
        "/dags/{dag_id}/runs/{run_id}",
        tags=[TAG_RUNS],
        summary="Pipeline run detail",
        response_model=PipelineDetail,
        responses=_errors(404),
    )
    def get_run(dag_id: str, run_id: str, _: CanRead, control: Control) -> PipelineDetail:
        """The pipeline run of a DAG run: state, stop request, stages (status, split progress,
        lifecycle, upstream edges) and the latest checkpoints. A 404 says whether the DAG, the
        DAG run or only its pipeline is missing (header ``X-Finalckpt-Reason``).
        """
        try:
            return control.describe(dag_id, run_id)
        except UnknownRunError as exc:
            raise pipeline_not_found(dag_id, run_id) from exc

    @router.get(
        "/dags/{dag_id}/runs/{run_id}/checkpoints",
        tags=[TAG_RUNS],
        summary="Checkpoint history",
        response_model=CheckpointList,
        responses=_errors(404),
    )
    def get_checkpoints(
        dag_id: str,
        run_id: str,
        _: CanRead,
        control: Control,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> CheckpointList:
        """Checkpoints and savepoints, newest first: kind, reason, state, trigger and
        completion time, duration, size, and every stage's status in each.
        """
        detail = control.describe(dag_id, run_id, checkpoints=limit)
        return CheckpointList(
            checkpoints=detail.checkpoints, total_entries=detail.checkpoints_total
        )

    @router.post(
        "/dags/{dag_id}/runs/{run_id}/stop",
        tags=[TAG_CONTROL],
        summary="Stop with drain or with a savepoint",
        status_code=status.HTTP_202_ACCEPTED,
        response_model=StopSummary,
        responses=_errors(404, 409, 422),
    )
    def stop_run(
        dag_id: str, run_id: str, body: StopBody, principal: CanEdit, control: Control
    ) -> StopSummary:
        """Request a stop. The answer is the stop request (state ``REQUESTED``); poll the run
        until its state is ``suspended`` (savepoint) or ``drained`` (drain). Needs permission
        to edit the DAG's runs. Recorded in Airflow's audit log (event ``finalckpt.stop``).
        """
        with audited(principal, "stop", dag_id, run_id, {"mode": body.mode.value}) as entry:
            summary = control.stop(dag_id, run_id, body.mode, requested_by=principal.name)
            entry.result = stop_result(summary)
        return summary

    @router.post(
        "/dags/{dag_id}/runs/{run_id}/resume",
        tags=[TAG_CONTROL],
        summary="Resume a suspended run",
        response_model=StopSummary,
        responses=_errors(404, 409),
    )
    def resume_run(dag_id: str, run_id: str, principal: CanEdit, control: Control) -> StopSummary:
        """Continue a run suspended at a savepoint, in the same DAG run. A drained run cannot be
        resumed (409). Needs permission to edit the DAG's runs. Recorded in Airflow's audit
        log (event ``finalckpt.resume``).
        """
        with audited(principal, "resume", dag_id, run_id, {}) as entry:
            summary = control.resume(dag_id, run_id, requested_by=principal.name)
            entry.result = stop_result(summary)
        return summary

    _add_reset_route(router, get_control)

    @router.post(
        "/dags/{dag_id}/restore",
        tags=[TAG_RESTORE],
        summary="Restore a savepoint into a new DAG run",
        status_code=status.HTTP_201_CREATED,
        response_model=RestoreResponse,
        responses=_errors(404, 409, 422),
    )
    def restore(
        dag_id: str,
        body: RestoreBody,
        principal: CanRestore,
        control: Control,
        response: Response,
    ) -> RestoreResponse:
        """Check the savepoint (readable, not drained, of this DAG's pipeline) and the DAG's
        graph change (the rules the stage tasks apply before writing: 409 naming the stage and
        the rule), then trigger a new DAG run with conf ``{"restore_from": savepoint_path}``
        (and ``allow_drop_stages``). ``dry_run``: only the check and the plan. Needs permission
        to create and edit the DAG's runs. A restore (not a dry run) is recorded in Airflow's
        audit log (event ``finalckpt.restore``, with the new run's id).
        """
        run_id = None
        if body.dry_run:
            check = control.plan_restore(
                dag_id,
                body.savepoint_path,
                dag_graph,
                allow_drop_stages=body.allow_drop_stages,
                load_splits=dag_splits,
            )
            response.status_code = status.HTTP_200_OK  # nothing was created
        else:
            asked = {
                "savepoint_path": body.savepoint_path,
                "allow_drop_stages": body.allow_drop_stages,
            }
            with audited(principal, "restore", dag_id, None, asked) as entry:
                check = control.plan_restore(
                    dag_id,
                    body.savepoint_path,
                    dag_graph,
                    allow_drop_stages=body.allow_drop_stages,
                    load_splits=dag_splits,
                )
                run_id = trigger_restore_run(
                    dag_id, body.savepoint_path, principal, allow_drop_stages=body.allow_drop_stages
                )
                entry.run_id = run_id
                entry.result = {"checkpoint_id": check.checkpoint_id, "mode": check.mode}
        return RestoreResponse(
            dag_id=dag_id,
            run_id=run_id,
            savepoint_path=body.savepoint_path,
            checkpoint_id=check.checkpoint_id,
            kind=check.kind,
            pipeline_key=check.pipeline_key,
            allow_drop_stages=check.allow_drop_stages,
            mode=check.mode,
            plan=check.plan,
        )

    return router


def _add_list_route(router: APIRouter, get_control: Callable[[], PipelineControl]) -> None:
    """``GET /runs``: the Pipelines list's page (search, state filter, sort, paging)."""
    Control = Annotated[PipelineControl, Depends(get_control)]

    @router.get(
        "/runs",
        tags=[TAG_RUNS],
        summary="List pipeline runs",
        response_model=PipelineRunPage,
        responses=_errors(403),
    )
    def list_runs(
        principal: Authenticated,
        control: Control,
        dag_id: Annotated[str | None, Query(description="Only runs of this DAG")] = None,
        q: Annotated[
            str,
            Query(
                max_length=200,
                description="Words that must each occur in the pipeline key, a DAG id or a run id",
            ),
        ] = "",
        state: Annotated[
            list[PipelineRunState] | None, Query(description="Only runs in these states")
        ] = None,
        sort: Annotated[SortKey, Query(description="Order by")] = SortKey.LINKED,
        order: Annotated[Literal["asc", "desc"], Query()] = "desc",
        limit: Annotated[int, Query(ge=1, le=500)] = 100,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> PipelineRunPage:
        """One page of the pipeline runs of the DAGs whose runs the user may read (newest DAG
        run first unless ``sort`` says otherwise), the number matching the search and filter
        (``total_entries``) and the matching runs per state (``state_counts``).
        """
        if dag_id is not None:
            authorize_dag(principal, dag_id, "GET")
        query = ListQuery(
            search=q,
            states=frozenset(state or ()),
            sort=sort,
            descending=order == "desc",
            limit=limit,
            offset=offset,
        )
        return page_of_runs(control, query, readable_dag(principal), dag_id)


def _add_reset_route(router: APIRouter, get_control: Callable[[], PipelineControl]) -> None:
    """``POST .../reset``: recompute a stage on purpose (the same rights as stop/resume)."""
    Control = Annotated[PipelineControl, Depends(get_control)]

    @router.post(
        "/dags/{dag_id}/runs/{run_id}/reset",
        tags=[TAG_CONTROL],
        summary="Reset a stage so that it recomputes",
        response_model=ResetSummary,
        responses=_errors(404, 409, 422),
    )
    def reset_run_stage(
        dag_id: str, run_id: str, body: ResetBody, principal: CanEdit, control: Control
    ) -> ResetSummary:
        """Forget the progress of a stage and of the stages downstream of it, so that the
        next try of their tasks recomputes them (clear them in Airflow next: the answer names
        them). Committed output stays; sinks with a declared slice replace it when the
        recompute commits, the others append. 404 for an unknown run or stage, 409 while a
        stop with savepoint is in progress. Needs permission to edit the DAG's runs. Recorded in
        Airflow's audit log (event ``finalckpt.reset``).
        """
        with audited(principal, "reset", dag_id, run_id, {"stage_id": body.stage_id}) as entry:
            summary = reset_stage(
                control, dag_id, run_id, body.stage_id, requested_by=principal.name
            )
            entry.result = {"reset_stages": summary.reset_stages}
        return summary


def _listed(splits: tuple[str, ...] | None) -> list[str] | None:
    return None if splits is None else list(splits)


def stop_result(summary: StopSummary) -> dict[str, Any]:
    """What the audit log keeps of a stop or resume: the request, its state, the savepoint."""
    result: dict[str, Any] = {"stop_request_id": summary.request_id, "state": summary.state.value}
    if summary.savepoint_id is not None:
        result["savepoint_id"] = summary.savepoint_id
    return result


def trigger_restore_run(
    dag_id: str,
    savepoint_path: str,
    principal: Principal,
    *,
    allow_drop_stages: Sequence[str] = (),
) -> str:
    """Create a queued DAG run restoring ``savepoint_path``, the way Airflow's REST API does
    (``airflow.api.common.trigger_dag.trigger_dag``, in the api-server's own process). Stages
    dropped on purpose are named in the run's conf and its note.
    """
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.exceptions import DagNotFound
    from airflow.utils.types import DagRunTriggeredByType

    conf: dict[str, Any] = {"restore_from": savepoint_path}
    note = f"airflow-finalckpt: restore from {savepoint_path} (by {principal.name})"
    if allow_drop_stages:
        conf[ALLOW_DROP_STAGES_KEY] = list(allow_drop_stages)
        note += f"; progress of {', '.join(allow_drop_stages)} dropped on purpose"
    triggered_by = (
        DagRunTriggeredByType.UI if principal.via == "cookie" else DagRunTriggeredByType.REST_API
    )
    try:
        dag_run = trigger_dag(
            dag_id,
            triggered_by=triggered_by,
            triggering_user_name=principal.name,
            conf=conf,
            note=note,
        )
    except DagNotFound as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"DAG {dag_id!r} not found") from exc
    except ValueError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, f"DAG {dag_id!r}: {exc}") from exc
    if dag_run is None:  # pragma: no cover - trigger_dag returns the run or raises
        raise HTTPException(status.HTTP_409_CONFLICT, f"DAG {dag_id!r}: no run was created")
    return str(dag_run.run_id)
