"""The browser UI's files from web/: / (chat), /admin (admin page), /static/* (everything else)."""
from __future__ import annotations

from pathlib import Path

from litestar import Request, get
from litestar.response import File
from litestar.static_files import create_static_files_router

from app.api.errors import ServiceError

WEB_DIR = Path(__file__).resolve().parents[2] / "web"


def _page(name: str) -> File:
    path = WEB_DIR / name
    if not path.is_file():
        raise ServiceError("not_found", f"the UI file web/{name} is missing from this installation")
    return File(path, content_disposition_type="inline", media_type="text/html; charset=utf-8")


@get("/", include_in_schema=False)
async def index() -> File:
    return _page("index.html")


@get("/admin", include_in_schema=False)
async def admin_page(request: Request) -> File:
    return _page("admin.html")


static_router = create_static_files_router(path="/static", directories=[WEB_DIR], include_in_schema=False)
