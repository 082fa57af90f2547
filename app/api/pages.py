"""The browser UI's files from web/: / (chat), /admin (admin page), /static/* (everything else)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from litestar import Request, get
from litestar.file_system import BaseLocalFileSystem
from litestar.response import File
from litestar.static_files import create_static_files_router
from litestar.types import PathType
from litestar.types.file_types import FileInfo

from app.domain.errors import ServiceError

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


class _WebFiles(BaseLocalFileSystem):
    """web/ as the static router sees it: a name the OS cannot look up (a NUL byte, too long, a file taken for a
    folder, no permission) is simply not there, a 404 rather than Litestar's 500. The router itself keeps every
    path inside web/ (normalised, then compared)."""

    async def info(self, path: PathType, **kwargs: Any) -> FileInfo:
        try:
            return await super().info(path, **kwargs)
        except (OSError, ValueError):
            raise FileNotFoundError(str(path)) from None


static_router = create_static_files_router(
    path="/static", directories=[WEB_DIR], file_system=_WebFiles(), include_in_schema=False
)
