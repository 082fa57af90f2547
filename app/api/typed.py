"""The app's Request class: a handler's `data` is decoded straight into its declared Struct by
app.api.bodies.decode (fields named in every refusal, no intermediate dicts for hostile JSON to inflate);
Litestar then passes the Struct through and documents it in the OpenAPI schema."""

from __future__ import annotations

from typing import Any

from litestar import Request

from app.api.bodies import decode


class TypedRequest(Request):
    async def json(self) -> Any:
        field = self.route_handler.parsed_data_field
        into = field.annotation if field is not None else Any
        return decode(await self.body(), into, unsupported=self.scope["path"].startswith("/v1/"))
