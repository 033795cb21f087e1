"""The read routes beside tasks: workers, stats, specs (with diagrams), verify, health,
metrics."""

from __future__ import annotations

import math
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response

from ledgerq.lifecycle.diagrams import mermaid
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.projections.log import verify
from ledgerq.queue.reads import queue_stats, run_status
from ledgerq.web import metrics
from ledgerq.web.auth import require_costly_read, require_read
from ledgerq.web.diagram import edge_label, edges_of, render_svg
from ledgerq.web.models import (
    Error,
    Health,
    Row,
    SpecDetail,
    SpecSummary,
    Stats,
    VerifyOut,
    WorkerOut,
)
from ledgerq.web.responses import READ, reads_of

router = APIRouter()
read = [Depends(require_read)]


@router.get("/api/workers", response_model=list[WorkerOut], dependencies=read,
            tags=["queue"], summary="Workers and their heartbeat age", responses=READ)
async def workers(request: Request) -> list[dict[str, Any]]:
    return [w.__dict__ for w in (await queue_stats(reads_of(request))).workers]


@router.get("/api/schedules", response_model=list[Row], dependencies=read, tags=["queue"],
            summary="Schedules with their next fire time and last fire", responses=READ)
async def schedules(request: Request) -> list[dict[str, Any]]:
    from ledgerq.queue.moves import SCHEDULE_ENTITY
    from ledgerq.queue.scheduling.scheduler import schedule_overview

    db = reads_of(request)
    if SCHEDULE_ENTITY not in db.registry.entities:
        return []  # specs from before schedules: nothing to list
    return await schedule_overview(db)


@router.get("/api/stats", response_model=Stats, dependencies=read, tags=["queue"],
            summary="Counts per status, oldest queued age, workers, stuck runs",
            responses=READ)
async def stats(request: Request) -> dict[str, Any]:
    db = reads_of(request)
    return {**(await queue_stats(db)).to_dict(), "as_of": await db.replica_as_of()}


def _summary(policy: EntityPolicy) -> dict[str, Any]:
    return {"entity": policy.name, "table": policy.table, "description": policy.description,
            "states": list(policy.states),
            "terminal": [s for s in policy.states if s in policy.terminal]}


def _policy(request: Request, entity: str) -> EntityPolicy:
    try:
        return reads_of(request).registry.entity(entity)
    except ValueError:
        raise HTTPException(404, "no such entity") from None


Entity = Annotated[str, Path(max_length=128)]
_NO_ENTITY = {**READ, 404: {"model": Error, "description": "No such entity."}}


@router.get("/api/specs", response_model=list[SpecSummary], dependencies=read,
            tags=["specs"], summary="Every entity the loaded specs declare", responses=READ)
async def specs(request: Request) -> list[dict[str, Any]]:
    return [_summary(p) for p in reads_of(request).registry.policies()]


@router.get("/api/specs/{entity}", response_model=SpecDetail, dependencies=read,
            tags=["specs"], summary="One entity's lifecycle: states, edges, reason codes, "
            "mermaid text", responses=_NO_ENTITY)
async def spec(request: Request, entity: Entity) -> dict[str, Any]:
    policy = _policy(request, entity)
    return {**_summary(policy),
            "initial": [s for s in policy.states if s in policy.initial],
            "state_descriptions": dict(policy.states),
            "edges": [{"source": s, "target": t, "label": edge_label(policy, s, t)}
                      for s, t in edges_of(policy)],
            "reason_codes": dict(policy.reason_codes), "mermaid": mermaid(policy)}


@router.get("/api/specs/{entity}/diagram.svg", dependencies=read, tags=["specs"],
            summary="One entity's lifecycle drawn as SVG (on the server)",
            response_class=Response,
            responses={**_NO_ENTITY, 200: {"content": {"image/svg+xml": {
                "schema": {"type": "string"}}}, "description": "The diagram."}})
async def diagram(request: Request, entity: Entity,
                  counts: Annotated[bool, Query(description="Label each state with its "
                                                "rows' count.")] = False) -> Response:
    policy = _policy(request, entity)
    numbers = await reads_of(request).entity(policy.name).counts() if counts else None
    return Response(render_svg(policy, numbers), media_type="image/svg+xml")


def _plain(value: Any) -> Any:
    """JSON cannot carry NaN or infinity: a drifted float that is one becomes its text."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


@router.get("/api/verify", response_model=VerifyOut,
            dependencies=[Depends(require_costly_read)], tags=["queue"],
            summary="Compare every projection row with the fold of its facts",
            responses=READ)
async def verify_route(request: Request) -> dict[str, Any]:
    report = await verify(reads_of(request))
    drift = []
    for d in report.drift:
        # A damaged database reports its own path as the entity id: the API names no file.
        entity_id = "(the database)" if d.entity_type == "database" else d.entity_id
        text = str(d).replace(d.entity_id, entity_id) if d.entity_type == "database" \
            else str(d)
        drift.append({"entity_type": d.entity_type, "entity_id": entity_id,
                      "problem": d.problem, "column": d.column,
                      "expected": _plain(d.expected), "actual": _plain(d.actual),
                      "text": text})
    return {"ok": report.ok, "rows": report.rows, "facts": report.facts, "drift": drift}


@router.get("/healthz", response_model=Health, tags=["ops"],
            summary="Liveness: the database answers a read (no token needed)",
            responses={400: READ[400], 503: READ[503]})
async def healthz(request: Request) -> dict[str, Any]:
    db = reads_of(request)
    await run_status(db, "healthz")
    return {"ok": True, "dialect": db.dialect}


@router.get("/metrics", dependencies=read, tags=["ops"], response_class=Response,
            summary="Prometheus metrics (text exposition format)",
            responses={**READ, 200: {"content": {metrics.CONTENT_TYPE: {
                "schema": {"type": "string"}}}, "description": "The metrics."}})
async def metrics_route(request: Request) -> Response:
    snapshot = await metrics.take_snapshot(reads_of(request))
    return Response(metrics.render(snapshot), media_type=metrics.CONTENT_TYPE)
