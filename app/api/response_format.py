"""`response_format` in request bodies: OpenAI's `text` / `json_object` / `json_schema` plus Forge's `regex` and
`grammar`, as a tagged union of msgspec Structs (decoded with the rest of the body, app.api.bodies.decode), the
engine's ResponseFormat each one stands for (`plain`), compiled by app.domain.response_format before anything is
answered or stored.

Bounds that keep hostile constraints cheap to refuse: a schema is at most SCHEMA_MAX_BYTES of JSON and
SCHEMA_MAX_DEPTH levels deep, a pattern or grammar at most SOURCE_MAX_CHARS. What the engine cannot compile or
enforce is refused by the engine, as a ServiceError naming `response_format`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import msgspec
from msgspec import Meta, Struct

from app.domain import response_format as domain
from app.domain.errors import ServiceError
from app.domain.response_format import PARAM, SCHEMA_MAX_BYTES, SCHEMA_MAX_DEPTH, schema_depth
from engine.types import ResponseFormat

if TYPE_CHECKING:
    from engine import Engine

SOURCE_MAX_CHARS = 64 << 10
Source = Annotated[str, Meta(min_length=1, max_length=SOURCE_MAX_CHARS)]


class _Kind(Struct, tag_field="type", forbid_unknown_fields=True, kw_only=True):
    def engine(self) -> ResponseFormat | None:
        """The engine's constraint (None: free text)."""
        raise NotImplementedError


class TextFormat(_Kind, tag="text"):
    """Free text (as if `response_format` were left out)."""

    def engine(self) -> None:
        return None


class JsonObjectFormat(_Kind, tag="json_object"):
    """Any JSON object."""

    def engine(self) -> ResponseFormat:
        return ResponseFormat("json_object")


class JsonSchemaSpec(Struct, forbid_unknown_fields=True, kw_only=True):
    """OpenAI's `json_schema` object. `strict` is accepted either way: the schema is always enforced."""

    schema: dict[str, Any]
    name: Annotated[str, Meta(max_length=64)] | None = None
    description: Annotated[str, Meta(max_length=1024)] | None = None
    strict: bool | None = None

    def __post_init__(self) -> None:
        where, param = f"'{PARAM}.json_schema.schema'", f"{PARAM}.json_schema.schema"
        if len(msgspec.json.encode(self.schema)) > SCHEMA_MAX_BYTES:  # first: it bounds the walk below
            raise ServiceError(
                "invalid_parameter", f"{where} is larger than {SCHEMA_MAX_BYTES // 1024} KiB of JSON", param=param
            )
        if schema_depth(self.schema) > SCHEMA_MAX_DEPTH:
            raise ServiceError(
                "invalid_parameter", f"{where} is nested more than {SCHEMA_MAX_DEPTH} levels deep", param=param
            )


class JsonSchemaFormat(_Kind, tag="json_schema"):
    """JSON valid under `json_schema.schema`."""

    json_schema: JsonSchemaSpec

    def engine(self) -> ResponseFormat:
        # msgspec keeps the schema's key order: properties are generated in the order given.
        return ResponseFormat("json_schema", msgspec.json.encode(self.json_schema.schema).decode())


class RegexFormat(_Kind, tag="regex"):
    """Forge: a full match of a regular expression."""

    pattern: Source

    def engine(self) -> ResponseFormat:
        return ResponseFormat("regex", self.pattern)


class GrammarFormat(_Kind, tag="grammar"):
    """Forge: a match of a Lark grammar's `start` rule (llguidance's dialect)."""

    lark: Source

    def engine(self) -> ResponseFormat:
        return ResponseFormat("grammar", self.lark)


ResponseFormatField = TextFormat | JsonObjectFormat | JsonSchemaFormat | RegexFormat | GrammarFormat


def plain(field: ResponseFormatField | None) -> ResponseFormat | None:
    """The engine's constraint a body's `response_format` stands for (None: free text)."""
    return field.engine() if field is not None else None


async def compile_response_format(engine: Engine, field: ResponseFormatField | None) -> ResponseFormat | None:
    """The engine's constraint for a body's `response_format`, compiled now (app.domain.response_format)."""
    return await domain.compile_response_format(engine, plain(field))
