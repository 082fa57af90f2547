"""What /schema/openapi.json says beyond what Litestar reads off the handlers, so that a client generated from it
is right: the error body every refusal has (`errors()` for a route's decorator), the statuses each route can
answer, refused extra fields (`additionalProperties: false` from msgspec's `forbid_unknown_fields`), token-id
keys, optional bodies, SSE answers and the `Retry-After` of 429 / 503.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import msgspec
from litestar._openapi.schema_generation.plugins.struct import StructSchemaPlugin
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import OpenAPIHeader, OpenAPIMediaType, OpenAPIResponse, OpenAPIType, Operation, Schema
from litestar.openapi.spec.request_body import RequestBody
from msgspec import Struct

from app.api.errors import STATUS

if TYPE_CHECKING:
    Code = str  # one of STATUS's keys: the Literal below is built at run time, for the schema
else:
    Code = Literal[tuple(STATUS)]


class ErrorDetail(Struct, forbid_unknown_fields=True):
    message: str
    type: str  # OpenAI's kind: invalid_request_error, not_found_error, rate_limit_error, ...
    param: str | None  # the field at fault ("messages[0].role"), when one is
    code: Code  # stable; the WebSocket protocol's error codes too (docs/protocol.md)


class ErrorBody(Struct, forbid_unknown_fields=True):
    """Every refusal, as OpenAI's clients expect it."""

    error: ErrorDetail


WHY = {
    400: "Bad request: a body, parameter or path the server refuses; `error.param` names the field",
    401: "A missing or wrong API key (servers started with --api-key) or admin token",
    403: "A Host or Origin this server does not answer (DNS rebinding, cross-site requests)",
    404: "Not found: no such session, message or model (another key's sessions are not found either)",
    409: "Busy: a reply is being generated in the session",
    413: "The body is larger than the server accepts (8 MiB)",
    415: "A body sent without `Content-Type: application/json`",
    429: "Too many: the admission queue is full (see `Retry-After`)",
    503: "Not ready (the model is loading), or the wait in the admission queue passed its deadline (see `Retry-After`)",
}
EVERYWHERE = (400, 403)  # the gate: a path with NUL bytes or invalid UTF-8; a foreign Host or Origin
BODY = (413, 415)  # routes that take a JSON body
KEYED = (401, 503)  # routes behind the API key that need the model and database
GENERATION = (429, 503)  # routes that start a generation (admission queue)


def errors(*statuses: int) -> dict[int, ResponseSpec]:
    """`responses=` for a route decorator: the error body for `statuses` and those every route can answer."""
    return {
        s: ResponseSpec(data_container=ErrorBody, description=WHY[s], generate_examples=False)
        for s in sorted({*EVERYWHERE, *statuses})
    }


# One server-sent event, its fields as a client reads them (the `data` of Forge's events is JSON text).
_EVENTS = OpenAPIMediaType(
    schema=Schema(
        type=OpenAPIType.OBJECT,
        properties={
            "event": Schema(type=OpenAPIType.STRING),
            "data": Schema(type=OpenAPIType.STRING),
            "id": Schema(type=OpenAPIType.STRING),
            "retry": Schema(type=OpenAPIType.INTEGER, minimum=0),
        },
        description="Server-sent events",
    )
)
_RETRY = {
    "Retry-After": OpenAPIHeader(
        schema=Schema(type=OpenAPIType.INTEGER, minimum=0), description="Seconds to wait before trying again"
    )
}


@dataclass
class Documented(Operation):
    """An operation whose 429 and 503 answers may carry `Retry-After`."""

    def __post_init__(self) -> None:
        for status, response in (self.responses or {}).items():
            if status in ("429", "503") and isinstance(response, OpenAPIResponse):
                response.headers = {**(response.headers or {}), **_RETRY}


@dataclass
class JsonOrEvents(Documented):
    """200 is JSON, or with `"stream": true` server-sent events."""

    def __post_init__(self) -> None:
        super().__post_init__()
        ok = (self.responses or {}).get("200")
        if isinstance(ok, OpenAPIResponse):
            ok.content = {**(ok.content or {}), "text/event-stream": _EVENTS}


@dataclass
class Events(Documented):
    """200 is a stream of server-sent events."""

    def __post_init__(self) -> None:
        super().__post_init__()
        ok = (self.responses or {}).get("200")
        if isinstance(ok, OpenAPIResponse):
            ok.content = {"text/event-stream": _EVENTS}


@dataclass
class OptionalBody(Documented):
    """The JSON body may be left out."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.request_body, RequestBody):
            self.request_body.required = False


@dataclass
class OptionalBodyEvents(OptionalBody, Events):
    """Both: the body may be left out and 200 is a stream of server-sent events."""


class StructSchemas(StructSchemaPlugin):
    """Litestar's msgspec Struct schemas, told what msgspec enforces besides: unknown fields refused
    (`forbid_unknown_fields`), bounds Litestar leaves out (a bound of 0 is dropped as if unset; bounds of list
    items and dict values), integer keys of objects (token ids) and how many there may be."""

    def to_openapi_schema(self, field_definition: Any, schema_creator: Any) -> Schema:
        schema = super().to_openapi_schema(field_definition, schema_creator)
        info = msgspec.inspect.type_info(field_definition.type_)
        if getattr(info, "forbid_unknown_fields", False):
            schema.additional_properties = False
        for f in getattr(info, "fields", ()):
            _constrain((schema.properties or {}).get(f.encode_name), f.type)
        return schema


_JSON_TYPES = {
    msgspec.inspect.IntType: OpenAPIType.INTEGER,
    msgspec.inspect.FloatType: OpenAPIType.NUMBER,
    msgspec.inspect.StrType: OpenAPIType.STRING,
    msgspec.inspect.ListType: OpenAPIType.ARRAY,
    msgspec.inspect.DictType: OpenAPIType.OBJECT,
}


def _constrain(schema: Any, t: msgspec.inspect.Type) -> None:
    """Write msgspec's constraints of `t` into `schema` (Litestar's schema of the same type), recursively."""
    if not isinstance(schema, Schema):
        return
    if isinstance(t, msgspec.inspect.UnionType):
        for member in t.types:
            for sub in _of_type(schema, _JSON_TYPES.get(type(member))):
                _constrain(sub, member)
        return
    if isinstance(t, (msgspec.inspect.IntType, msgspec.inspect.FloatType)):
        for name, value in (
            ("minimum", t.ge),
            ("maximum", t.le),
            ("exclusive_minimum", t.gt),
            ("exclusive_maximum", t.lt),
        ):
            if value is not None:
                setattr(schema, name, value)
    elif isinstance(t, msgspec.inspect.StrType):
        for name, bound in (("min_length", t.min_length), ("max_length", t.max_length), ("pattern", t.pattern)):
            if bound is not None:
                setattr(schema, name, bound)
    elif isinstance(t, msgspec.inspect.ListType):
        if t.min_length is not None:
            schema.min_items = t.min_length
        if t.max_length is not None:
            schema.max_items = t.max_length
        _constrain(schema.items, t.item_type)
    elif isinstance(t, msgspec.inspect.DictType):
        _describe_dict(schema, t)
        _constrain(schema.additional_properties, t.value_type)


def _of_type(schema: Schema, json_type: OpenAPIType | None) -> list[Schema]:
    """The alternatives of `schema` (itself, or those of its oneOf / anyOf) of `json_type`."""
    if json_type is None:
        return []
    if schema.type == json_type:
        return [schema]
    subs = [s for s in [*(schema.one_of or []), *(schema.any_of or [])] if isinstance(s, Schema)]
    return [o for sub in subs for o in _of_type(sub, json_type)]


def _describe_dict(schema: Schema, kind: msgspec.inspect.DictType) -> None:
    if kind.max_length is not None:
        schema.max_properties = kind.max_length
    if kind.min_length is not None:
        schema.min_properties = kind.min_length
    key = kind.key_type
    if isinstance(key, msgspec.inspect.IntType):
        # JSON keys are strings: a decimal integer in msgspec's range (only [0, 10^k - 1] ranges are used)
        assert key.ge == 0 and key.le is not None and str(key.le + 1).strip("0") == "1", key
        digits = len(str(key.le))
        schema.property_names = Schema(type=OpenAPIType.STRING, pattern=f"^(0|[1-9][0-9]{{0,{digits - 1}}})$")
