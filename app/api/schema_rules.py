"""Rules between fields that /schema/openapi.json states beside the bodies' own types, so that what the schema
calls valid is what the server accepts:

- an imported message carries `tool_calls` only as an assistant, and `tool_call_id` exactly when it is a tool's
  (app.api.bodies.Export.tree refuses the rest);
- a message that turns tools off (`"tools": null`) sets neither `tool_choice` nor `parallel_tool_calls`
  (app.domain.tools.plan refuses them without tools).
"""

from __future__ import annotations

from litestar.openapi.spec import OpenAPI, OpenAPIType, Schema

_NULL = Schema(type=OpenAPIType.NULL)

IMPORTED_MESSAGE = Schema(
    all_of=[
        Schema(
            any_of=[
                Schema(properties={"role": Schema(const="assistant")}),
                Schema(properties={"tool_calls": _NULL}),
            ],
            description="`tool_calls` only on assistant messages",
        ),
        Schema(
            any_of=[
                Schema(
                    properties={"role": Schema(const="tool"), "tool_call_id": Schema(type=OpenAPIType.STRING)},
                    required=["tool_call_id"],
                ),
                Schema(properties={"role": Schema(schema_not=Schema(const="tool")), "tool_call_id": _NULL}),
            ],
            description="`tool_call_id` on tool messages, and only there",
        ),
    ]
)

TOOLS_OFF = Schema(
    any_of=[
        Schema(properties={"tools": Schema(schema_not=_NULL)}),
        Schema(properties={"tool_choice": _NULL, "parallel_tool_calls": _NULL}),
    ],
    description="with `tools` null, neither `tool_choice` nor `parallel_tool_calls`",
)

RULES = {"ImportedMessage": IMPORTED_MESSAGE, "SendBody": TOOLS_OFF}


def add_rules(openapi: OpenAPI) -> None:
    """Add RULES to their bodies' component schemas (in place): a body missing from `openapi` is left out."""
    schemas = openapi.components.schemas if openapi.components else None
    for name, rule in RULES.items():
        body = (schemas or {}).get(name)
        if isinstance(body, Schema):
            body.all_of = [*(body.all_of or []), rule]
