"""``/api/tasks``: submit, list, show and cancel runs (thin over the queue's functions)."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Path, Query, Request, Response

from ledgerq.errors import IdempotencyConflict, InvalidInput
from ledgerq.lifecycle.models import Actor
from ledgerq.lifecycle.registry import OUTCOMES
from ledgerq.queue.reads import (
    SUMMARY_COLUMNS,
    get_run,
    page_runs,
    run_history,
    stored_run_policy,
)
from ledgerq.queue.submission.application import check_text
from ledgerq.queue.submission.submit import cancel_task, submit_task
from ledgerq.web.auth import require_read, require_write
from ledgerq.web.limits import parse_json
from ledgerq.web.models import Cancelled, Created, Error, TaskDetail, TaskPage
from ledgerq.web.responses import READ, WRITE, db_of, reads_of

#: Who HTTP submissions and cancels are recorded as, on their facts.
SUBMITTER = Actor(type="system", id="ledgerq.http")
CANCELLER = Actor(type="operator", id="ledgerq.http")
#: A list item: the summary ``ledgerq ls`` shows, plus what the dashboard needs.
LIST_COLUMNS = (*SUMMARY_COLUMNS, "queued_at", "lease_expires_at", "error_detail",
                "idempotency_key")
MAX_LIMIT = 500

router = APIRouter(prefix="/api/tasks", tags=["tasks"])

_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/TaskApplicationBody"}}}}}


@router.post(
    "", status_code=201, response_model=Created, dependencies=[Depends(require_write)],
    openapi_extra=_BODY, summary="Submit a task",
    responses={**WRITE,
               200: {"model": Created, "description": "An equal repeat under the same "
                     "idempotency key: the original run's id; nothing written."},
               201: {"model": Created, "description": "Submitted."},
               409: {"model": Error, "description": "The idempotency key names a run "
                     "submitted with a different application; nothing written."},
               413: {"model": Error, "description": "The body exceeds the size limit."},
               415: {"model": Error, "description": "The body is not application/json."},
               422: {"model": Error, "description": "Refused as submit_task() refuses it "
                     "(its own message), or not JSON; nothing written."}})
async def submit(request: Request, response: Response,
                 idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None
                 ) -> Created:
    """A TaskApplication as JSON; the ``Idempotency-Key`` header (or the body's
    ``idempotency_key``) makes a repeat return the original run."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise HTTPException(415, "send the TaskApplication as application/json")
    from ledgerq.web.submission import application_from_json

    try:
        idempotency_key = utf8_header(idempotency_key, "Idempotency-Key")
        body = parse_json(await request.body(), request.app.state.config.max_json_depth)
        app = application_from_json(body, idempotency_key)
        db = db_of(request)
        at = time.time()
        # A keyed submit is timed by this call, so its row tells whether this call made
        # it; an unkeyed one always makes a row, and may share its transaction with the
        # submits of concurrent requests (ledgerq.queue.submission.joined), which a given time rules
        # out.
        keyed = app.idempotency_key is not None
        run_id = await submit_task(db, app, now=at if keyed else None, actor=SUBMITTER)
    except IdempotencyConflict as exc:
        raise HTTPException(409, str(exc)) from None
    except (InvalidInput, TypeError) as exc:
        raise HTTPException(422, str(exc)) from None
    if keyed:
        row = await get_run(db, run_id)
        # The row made by this call carries this call's timestamp; an equal repeat finds
        # the row another call made earlier (and wrote nothing).
        response.status_code = 201 if row["created_at"] == at else 200
    return Created(id=run_id)


@router.get("", response_model=TaskPage, dependencies=[Depends(require_read)],
            summary="List tasks, newest first",
            responses={**READ, 422: {"model": Error, "description": "A bad parameter."}})
async def list_tasks(
    request: Request,
    status: Annotated[list[str] | None, Query(description="Repeatable.")] = None,
    kind: Annotated[list[str] | None, Query(description="action_kind; repeatable.")] = None,
    target: Annotated[list[str] | None, Query(description="execution_target; repeatable.")
                      ] = None,
    queue: Annotated[list[str] | None, Query(description="The named queue; repeatable.")
                     ] = None,
    outcome: Annotated[list[str] | None, Query(
        description=f"Runs that ended this way ({', '.join(OUTCOMES)}), in whichever "
        "states the spec gives that outcome; repeatable.")] = None,
    cursor: Annotated[str | None, Query(max_length=512,
                                        description="next_cursor of the previous page.")
                      ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
) -> TaskPage:
    try:
        for name, values in (("status", status), ("kind", kind), ("target", target),
                             ("queue", queue), ("cursor", [cursor] if cursor else None)):
            for value in values or ():
                check_text(value, name)
        for name in outcome or ():
            if name not in OUTCOMES:
                raise InvalidInput(f"unknown outcome {name[:40]!r}; expected one of "
                                   f"{', '.join(OUTCOMES)}")
        if outcome:
            ended = sorted(stored_run_policy(reads_of(request)).states_with_outcome(*outcome))
            status = [s for s in status if s in ended] if status else ended
            if not status:
                return TaskPage(items=[], next_cursor=None)
        page = await page_runs(reads_of(request), statuses=status, kinds=kind, targets=target,
                               cursor=cursor, limit=limit, columns=LIST_COLUMNS,
                               queues=queue)
    except InvalidInput as exc:
        raise HTTPException(422, str(exc)) from None
    return TaskPage(items=page.items, next_cursor=page.next_cursor)


def utf8_header(value: str | None, name: str) -> str | None:
    """A header's value as the UTF-8 text the client sent. HTTP servers decode header
    bytes as Latin-1, so ``café`` arrives as ``cafÃ©``; read back as UTF-8 it is what the
    client meant (and equals the same text in a JSON body). Not UTF-8: InvalidInput."""
    if value is None or value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise InvalidInput(f"the {name} header is not UTF-8 text") from None


async def known_id(task_id: Annotated[str, Path(max_length=256,
                                                 description="The run's full id.")]) -> str:
    """A run id from the path; one no run can have (NUL, not UTF-8) is simply unknown,
    answered 404 like any other, never sent to the database."""
    try:
        check_text(task_id, "id")
    except InvalidInput:
        raise HTTPException(404, "no such run") from None
    return task_id


TaskId = Annotated[str, Depends(known_id)]


@router.get("/{task_id}", response_model=TaskDetail, dependencies=[Depends(require_read)],
            summary="One task: its row and its full fact history",
            responses={**READ, 404: {"model": Error, "description": "No such run."}})
async def show_task(request: Request, task_id: TaskId) -> dict[str, Any]:
    db = reads_of(request)
    try:
        run = await get_run(db, task_id)
    except LookupError:
        raise HTTPException(404, "no such run") from None
    return {"run": run, "history": await run_history(db, task_id)}


@router.post("/{task_id}/cancel", response_model=Cancelled,
             dependencies=[Depends(require_write)], summary="Cancel a task that has not ended",
             responses={**WRITE, 404: {"model": Error, "description": "No such run."},
                        409: {"model": Error, "description": "It had already ended; nothing "
                              "written."}})
async def cancel(request: Request, task_id: TaskId) -> Cancelled:
    db = db_of(request)
    try:
        done = await cancel_task(db, task_id, actor=CANCELLER, summary="cancelled over HTTP")
    except LookupError:
        raise HTTPException(404, "no such run") from None
    status = (await get_run(db, task_id))["status"]
    if not done:
        raise HTTPException(409, f"run {task_id} already ended ({status}); nothing cancelled")
    return Cancelled(id=task_id, cancelled=True, status=status)
