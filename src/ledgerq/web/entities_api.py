"""``/api/entities``: any entity's rows, one row with its history, and a move (through
its handle, ``db.entity``; an entity the server's specs lack is judged by the spec the
database recorded)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from pydantic import ValidationError

from ledgerq.errors import Conflict, InvalidInput, NotFound
from ledgerq.lifecycle.entities import Entity
from ledgerq.lifecycle.models import Actor
from ledgerq.queue.submission.application import check_text
from ledgerq.web.auth import require_read, require_write
from ledgerq.web.limits import parse_json
from ledgerq.web.models import (
    EntityDetail,
    EntityPageOut,
    EntitySummaryOut,
    Error,
    MoveBody,
    Moved,
)
from ledgerq.web.responses import READ, WRITE, db_of, reads_of

#: Who a move over HTTP is recorded as: the operator holding the server's token.
MOVER = Actor(type="operator", id="ledgerq.http")

router = APIRouter(prefix="/api/entities", tags=["entities"])

_MISSING = {"model": Error, "description": "No such entity, or no such row."}


def _text(value: str, what: str) -> str:
    """A path value no row can have (NUL, not UTF-8) is simply unknown: 404."""
    try:
        check_text(value, what)
    except InvalidInput:
        raise HTTPException(404, f"no such {what}") from None
    return value


def _handle(request: Request, entity: str, *, writing: bool = False) -> Entity:
    db = db_of(request) if writing else reads_of(request)
    if entity not in db.registry.entities and _text(entity, "entity") not in db.recorded:
        raise HTTPException(404, f"no entity {entity[:64]!r}")
    return db.entity(entity)


EntityName = Annotated[str, Path(max_length=64, description="The entity (its spec's name).")]
EntityId = Annotated[str, Path(max_length=256, description="The row's id.")]


@router.get("", response_model=list[EntitySummaryOut], dependencies=[Depends(require_read)],
            summary="Every entity, with its rows per state", responses=READ)
async def entities(request: Request) -> list[dict[str, Any]]:
    db = reads_of(request)
    out = []
    for policy in db.registry.policies():
        out.append({"entity": policy.name, "table": policy.table,
                    "description": policy.description,
                    "counts": await db.entity(policy.name).counts(),
                    "terminal": [s for s in policy.states if s in policy.terminal]})
    return out


@router.get("/{entity}", response_model=EntityPageOut, dependencies=[Depends(require_read)],
            summary="An entity's rows, newest first",
            responses={**READ, 404: _MISSING,
                       422: {"model": Error, "description": "A bad parameter."}})
async def list_rows(request: Request, entity: EntityName,
                    status: Annotated[list[str] | None, Query(description="Repeatable.")
                                      ] = None,
                    cursor: Annotated[str | None, Query(max_length=512)] = None,
                    limit: Annotated[int, Query(ge=1, le=500)] = 50) -> EntityPageOut:
    rows = _handle(request, entity)
    try:
        for value in [*(status or ()), *([cursor] if cursor else [])]:
            check_text(value, "parameter")
        page = await rows.list(status=status, limit=limit, cursor=cursor)
    except InvalidInput as exc:
        raise HTTPException(422, str(exc)) from None
    return EntityPageOut(items=page.items, next_cursor=page.next_cursor)


@router.get("/{entity}/{entity_id}", response_model=EntityDetail,
            dependencies=[Depends(require_read)], summary="One row and its facts",
            responses={**READ, 404: _MISSING})
async def show_row(request: Request, entity: EntityName, entity_id: EntityId) -> dict[str, Any]:
    rows = _handle(request, entity)
    _text(entity_id, "row")
    try:
        row = await rows.get(entity_id)
    except NotFound:
        raise HTTPException(404, f"no {entity} {entity_id[:64]!r}") from None
    return {"row": row, "history": await rows.history(entity_id)}


_MOVE_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/MoveBody"}}}}}


@router.post("/{entity}/{entity_id}/move", response_model=Moved,
             dependencies=[Depends(require_write)], summary="Move one row (or send an event)",
             openapi_extra=_MOVE_BODY,
             responses={**WRITE, 404: _MISSING,
                        413: {"model": Error, "description": "The body exceeds the size "
                              "limit."},
                        415: {"model": Error, "description": "The body is not "
                              "application/json."},
                        409: {"model": Error, "description": "Not in the expected state, a "
                              "guard failed, or another writer moved it; nothing written."},
                        422: {"model": Error, "description": "The spec forbids the move "
                              "(the engine's message), or the body is not a MoveBody; "
                              "nothing written."}})
async def move_row(request: Request, entity: EntityName, entity_id: EntityId) -> Moved:
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise HTTPException(415, "send the move as application/json")
    try:
        raw = parse_json(await request.body(), request.app.state.config.max_json_depth)
        body = MoveBody.model_validate(raw)
    except (InvalidInput, ValidationError, TypeError, ValueError) as exc:
        raise HTTPException(422, f"not a move: {str(exc)[:300]}") from None
    rows = _handle(request, entity, writing=True)
    _text(entity_id, "row")
    if (body.state is None) == (body.event is None):
        raise HTTPException(422, "give exactly one of state and event")
    try:
        if body.event is not None:
            done = await rows.send(entity_id, body.event, actor=MOVER, reason=body.reason,
                                   patch=body.patch, expect=body.expect)
        else:
            done = await rows.move(entity_id, str(body.state), actor=MOVER,
                                   reason=body.reason, patch=body.patch, expect=body.expect)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except Conflict as exc:
        raise HTTPException(409, str(exc)) from None
    except (InvalidInput, ValueError, TypeError) as exc:
        raise HTTPException(422, str(exc)) from None
    return Moved(applied=done.applied, previous_state=done.previous_state,
                 current_state=done.current_state, transition_id=done.transition_id)
