"""The API reference page at /schema: RapiDoc (web/vendor/rapidoc-min.js) over /schema/openapi.json.

Litestar's own RapiDoc page loads the viewer, a favicon and fonts from CDNs; this one uses only what the
server serves, so it works offline and under the strict CSP (app/api/gate.py: SCHEMA_CSP)."""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.openapi.plugins import OpenAPIRenderPlugin

VIEWER = "/static/vendor/rapidoc-min.js"


class ApiReference(OpenAPIRenderPlugin):
    def __init__(self) -> None:
        super().__init__(path="/", favicon='<link rel="icon" href="data:,">')

    def render(self, request: Request, openapi_schema: dict[str, Any]) -> bytes:
        title = openapi_schema["info"]["title"]
        return f"""<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>{title} API reference</title>
  {self.favicon}
  {self.style}
  <script type="module" src="{VIEWER}"></script>
</head>
<body>
  <rapi-doc spec-url="{self.get_openapi_json_route(request)}" load-fonts="false" show-header="false"
            regular-font="system-ui, sans-serif" mono-font="ui-monospace, monospace" render-style="read"
            use-path-in-nav-bar="true" show-method-in-nav-bar="as-colored-text"></rapi-doc>
</body>
</html>""".encode()
