"""The ASGI application of ``ledgerq serve``: routes, limits, auth, error shapes, OpenAPI.

FastAPI, because it makes the OpenAPI document from the same typed models that check the
responses (one source for the contract and its enforcement) and runs on Starlette's
maintained ASGI core; uvicorn serves it.

Layers, outermost first: security headers; the body-size limit (413 before any parsing);
the Host check on a loopback bind (against DNS rebinding); CORS only when origins are
configured; then the routes. Every refusal is ``{"detail": "<one line>"}``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware

from ledgerq.errors import DatabaseError
from ledgerq.web import dashboard, entities_api, queue_api, tasks_api
from ledgerq.web.config import ServeConfig
from ledgerq.web.limits import BodyLimit
from ledgerq.web.models import Error, MoveBody, RetryBody, TaskApplicationBody
from ledgerq.web.security import SecurityHeaders


def _registry(config: ServeConfig) -> Any:
    if config.specs is None:
        return None
    from pathlib import Path

    from ledgerq.lifecycle.registry import load_registry
    from ledgerq.queue.moves import check

    return check(load_registry(Path(config.specs)))


def _validation_message(exc: RequestValidationError) -> str:
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first.get('msg', 'invalid')}"


def _document_tasks(doc: dict[str, Any], kinds: dict[str, Any]) -> None:
    """Each recorded Python task's arguments as a schema ``TaskArgs.<name>`` (its own
    definitions beside it, as ``TaskArgs.<name>.<def>``), listed on ``POST /api/tasks``
    (``x-ledgerq-tasks``): what ``args`` must be when ``action_kind`` names that task."""
    if not kinds:
        return
    schemas = doc["components"]["schemas"]
    listed: dict[str, Any] = {}
    for name, kind in sorted(kinds.items()):
        prefix = f"TaskArgs.{name}"
        parameters = json.loads(json.dumps(kind.parameters).replace(
            '"#/$defs/', f'"#/components/schemas/{prefix}.'))
        for sub, schema in parameters.pop("$defs", {}).items():
            schemas[f"{prefix}.{sub}"] = schema
        schemas[prefix] = parameters
        listed[name] = {"$ref": f"#/components/schemas/{prefix}"}
    post = doc["paths"].get("/api/tasks", {}).get("post")
    if post is not None:
        post["x-ledgerq-tasks"] = listed
        post["description"] = (post.get("description", "") + "\n\nRecorded Python tasks "
                               "(`action_kind`: the schema `args` must match): "
                               + ", ".join(sorted(listed)))


def create_app(config: ServeConfig) -> FastAPI:
    """The app for ``config`` (checked first: no token off loopback is refused)."""
    config.check()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from ledgerq.queue.submission import task_kinds
        from ledgerq.store.db import StateDB

        registry = _registry(config)
        async with AsyncExitStack() as stack:
            db = await stack.enter_async_context(StateDB(
                config.db, registry=registry, pooled=config.pooled,
                listen_url=config.listen_url))
            reads = db if config.read_db is None else await stack.enter_async_context(
                StateDB(config.read_db, registry=registry, readonly=True))
            if config.specs is None:  # judged by what the database records, as the CLI is
                for handle in (db,) if reads is db else (db, reads):
                    handle.adopt_recorded()
            app.state.db, app.state.read_db = db, reads
            # The Python tasks apps recorded, for the OpenAPI document (as they were
            # when the server started).
            app.state.task_kinds = await task_kinds.recorded(db)
            app.openapi_schema = None
            yield

    app = FastAPI(title="ledgerq", version="1", lifespan=lifespan,
                  description="The ledgerq queue over HTTP: submit, list, show and cancel "
                  "tasks; workers, stats, specs, verify; Prometheus metrics.",
                  docs_url=None, redoc_url=None)
    app.state.config = config
    app.include_router(tasks_api.router)
    app.include_router(queue_api.router)
    app.include_router(entities_api.router)
    app.include_router(dashboard.router)
    app.mount("/static", dashboard.static_files(), name="static")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"detail": str(exc.detail)}, exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _validation_message(exc)}, 422)

    @app.exception_handler(DatabaseError)
    async def unavailable(request: Request, exc: DatabaseError) -> JSONResponse:
        # The message may name the database file or URL: not for the client.
        return JSONResponse({"detail": "the database is unavailable"}, 503)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version,
                              description=app.description, routes=app.routes)
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            ref = "#/components/schemas/{model}"
            schemas.setdefault("Error", Error.model_json_schema())
            # Parameter refusals are answered as {"detail": "<one line>"} like every other
            # refusal (see bad_request): the document says so, not FastAPI's default.
            for operation in (op for item in doc["paths"].values() for op in item.values()):
                refused = operation.get("responses", {}).get("422")
                if refused is not None and "HTTPValidationError" in str(refused):
                    operation["responses"]["422"] = {
                        "description": "A parameter is invalid.", "content": {
                            "application/json": {"schema": {"$ref": ref.format(
                                model="Error")}}}}
            for unused in ("HTTPValidationError", "ValidationError"):
                schemas.pop(unused, None)
            for model in (TaskApplicationBody, RetryBody, MoveBody):
                body = model.model_json_schema(ref_template=ref)
                schemas.update(body.pop("$defs", {}))
                schemas[model.__name__] = body
            _document_tasks(doc, getattr(app.state, "task_kinds", {}))
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    if config.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                           allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "Idempotency-Key"])
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=config.hosts())
    app.add_middleware(BodyLimit, limit=config.max_body_bytes, token=config.token)
    app.add_middleware(SecurityHeaders)
    return app
