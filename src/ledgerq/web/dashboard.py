"""The dashboard: one static page and its script and style, shipped inside the package.

No build step and no CDN: ``static/`` holds plain files served as they are. The page
renders with DOM calls only (``textContent``, never ``innerHTML``), so a task's argv,
stderr or id is shown as text whatever it contains; it polls the API once a second with
the token a login form keeps in ``sessionStorage`` (never in the URL).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).with_name("static")

router = APIRouter()


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html")


def static_files() -> StaticFiles:
    return StaticFiles(directory=STATIC)
