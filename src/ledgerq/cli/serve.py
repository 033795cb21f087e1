"""``ledgerq serve``: the HTTP API, the dashboard and /metrics, served by uvicorn."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from ledgerq.cli.app import app
from ledgerq.cli.db import DbOption, db_path, pooler_options, root_specs
from ledgerq.cli.failures import die
from ledgerq.store.db import is_postgres

#: A token file holds one token on its first line; anything this long is not one.
MAX_TOKEN_FILE_BYTES = 64 * 1024


def read_token(token_file: Path | None) -> str | None:
    """The token from --token-file (its first line), else $LEDGERQ_API_TOKEN, else None."""
    from ledgerq.web.config import TOKEN_ENV

    if token_file is not None:
        try:
            with token_file.open("rb") as f:
                # Bounded: /dev/zero or a wrong path to a large file must not be read whole.
                raw = f.read(MAX_TOKEN_FILE_BYTES + 1)
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            die(f"--token-file: cannot read {token_file}: {exc}")
        if len(raw) > MAX_TOKEN_FILE_BYTES:
            die(f"--token-file: {token_file} is larger than {MAX_TOKEN_FILE_BYTES} bytes; "
                "it should hold the token on its first line")
        lines = text.splitlines()
        token = lines[0].strip() if lines else ""
        if not token:
            die(f"--token-file: the first line of {token_file} is empty")
        return token
    return os.environ.get(TOKEN_ENV) or None


@app.command()
def serve(
    ctx: typer.Context,
    host: Annotated[str, typer.Option("--host", help="Address to bind (a non-loopback "
                                      "address needs a token).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535)] = 8765,
    token_file: Annotated[Path | None, typer.Option(
        "--token-file", help="A file holding the API token (else $LEDGERQ_API_TOKEN).",
        show_default=False, dir_okay=False)] = None,
    public_read: Annotated[bool, typer.Option(
        "--public-read", help="Reads (GET) need no token; writes still do.")] = False,
    max_body: Annotated[int, typer.Option("--max-body", min=1,
                                          help="Largest request body in bytes (413 above).")
                        ] = 1024 * 1024,
    cors_origin: Annotated[list[str] | None, typer.Option(
        "--cors-origin", help="An origin allowed by CORS. Repeatable (default: CORS off).",
        show_default=False)] = None,
    read_db: Annotated[str | None, typer.Option(
        "--read-db", metavar="URL", envvar="LEDGERQ_READ_DB",
        help="A PostgreSQL read replica's URL (env LEDGERQ_READ_DB): the API's reads and "
             "the dashboard come from it (stats say how current it is), writes go to "
             "--db.", show_default=False)] = None,
    db: DbOption = None,
) -> None:
    """Serve the HTTP API (/api, /openapi.json), the live dashboard (/) and /metrics.

    Without a token the server is read-only and refuses to bind anything but loopback.
    """
    from ledgerq.errors import InvalidInput, MissingExtra
    from ledgerq.extras import require

    try:
        require("server")
    except MissingExtra as exc:
        die(str(exc))
    from ledgerq.web import ServeConfig, create_app

    specs = root_specs(ctx)
    path = db_path(ctx, db)
    if read_db is not None and not (is_postgres(path) and is_postgres(read_db)):
        die("--read-db: a read replica is PostgreSQL's; give postgresql:// URLs for both "
            "--db and --read-db")
    config = ServeConfig(db=path, token=read_token(token_file), read_db=read_db,
                         **pooler_options(ctx, path),
                         public_read=public_read, host=host, port=port,
                         max_body_bytes=max_body, cors_origins=tuple(cors_origin or ()),
                         specs=str(specs) if specs is not None else None)
    try:
        web = create_app(config)
    except InvalidInput as exc:
        die(str(exc))
    if config.token is None:
        sys.stderr.write("ledgerq serve: no API token: read-only (writes answer 403)\n")
    sys.stderr.flush()
    from ledgerq.web.server import run as serve_http

    serve_http(web, host=host, port=port)
