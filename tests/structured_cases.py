"""JSON schemas of increasing complexity for the structured-output tests (engine and service).

Strings, numbers and arrays are bounded so that a sampled reply always completes well within
the tests' max_tokens; the grammar, not the model, decides what a valid reply is."""

from __future__ import annotations

POINT = {
    "type": "object",
    "properties": {
        "x": {"type": "integer", "minimum": -9, "maximum": 9},
        "y": {"type": "integer", "minimum": -9, "maximum": 9},
    },
    "required": ["x", "y"],
    "additionalProperties": False,
}

SCHEMAS: dict[str, dict] = {
    "flat": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999}, "active": {"type": "boolean"}},
                "required": ["id", "active"],
                "additionalProperties": False,
            }
        },
        "required": ["user"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3}
        },
        "required": ["tags"],
        "additionalProperties": False,
    },
    "enum": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"type": "string", "enum": ["S", "M", "L"]},
        },
        "required": ["color", "size"],
        "additionalProperties": False,
    },
    "anyof": {
        "type": "object",
        "properties": {
            "value": {
                "anyOf": [
                    {"type": "integer", "minimum": 0, "maximum": 9},
                    {"type": "string", "maxLength": 6},
                    {"type": "null"},
                ]
            }
        },
        "required": ["value"],
        "additionalProperties": False,
    },
    "ref_pattern": {
        "$defs": {"point": POINT},
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
            "start": {"$ref": "#/$defs/point"},
            "path": {"type": "array", "items": {"$ref": "#/$defs/point"}, "minItems": 1, "maxItems": 2},
        },
        "required": ["code", "start", "path"],
        "additionalProperties": False,
    },
}

PROMPT = "Reply with a small JSON object that matches this description: {name}."
