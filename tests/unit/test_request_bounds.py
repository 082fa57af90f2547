"""The request schema's bounds (app/api/openai_bodies.py) against the engine's own (SamplingParams.validate), and
the OpenAPI document against the Structs it describes: what the decoder refuses, the document says."""

from __future__ import annotations

import msgspec
import pytest

from app.api import bodies
from app.api import openai_bodies as ob
from app.api.errors import status_of
from app.main import create_app
from engine.types import InvalidRequest, SamplingParams

VOCAB = 49152


def _engine_accepts(**params) -> bool:
    try:
        SamplingParams(**params).validate(VOCAB)
        return True
    except InvalidRequest:
        return False


@pytest.mark.parametrize(
    "field, top, value",
    [
        ("n", ob.MAX_N, lambda k: k),
        ("logprobs", ob.MAX_TOP_LOGPROBS, lambda k: k),
        ("stop", ob.MAX_STOP, lambda k: [f"s{i}" for i in range(k)]),
    ],
)
def test_schema_bounds_are_the_engines(field: str, top: int, value) -> None:
    assert _engine_accepts(**{field: value(top)})
    assert not _engine_accepts(**{field: value(top + 1)})


def test_decoder_refuses_past_every_bound_by_name() -> None:
    base = {"model": "m", "prompt": "x"}
    for field, past in [
        ("n", ob.MAX_N + 1),
        ("best_of", 10**9),
        ("max_tokens", 2**63),
        ("logprobs", 6),
        ("top_k", -1),
        ("stop", ["s"] * (ob.MAX_STOP + 1)),
        ("logit_bias", {str(i): 1 for i in range(ob.MAX_LOGIT_BIAS + 1)}),
        ("prompt", [1] * (ob.MAX_PROMPT_TOKENS + 1)),
        ("repetition_penalty", 5e-324),
    ]:
        with pytest.raises(bodies.ServiceError) as e:
            bodies.decode(msgspec.json.encode({**base, field: past}), ob.CompletionRequest, unsupported=True)
        assert status_of(e.value) == 400 and e.value.param == field


def _structs() -> list[type]:
    found, todo = (
        set(),
        [
            bodies.SessionFields,
            bodies.Export,
            bodies.SendBody,
            bodies.EditBody,
            bodies.Empty,
            ob.ChatRequest,
            ob.CompletionRequest,
        ],
    )
    while todo:
        t = todo.pop()
        if t in found:
            continue
        found.add(t)
        info = msgspec.inspect.type_info(t)
        stack = [f.type for f in info.fields]
        while stack:
            x = stack.pop()
            if isinstance(x, msgspec.inspect.StructType):
                todo.append(x.cls)
            for attr in ("types", "item_type", "value_type"):
                v = getattr(x, attr, None)
                stack.extend(v if isinstance(v, tuple) else [v] if v is not None else [])
    return sorted(found, key=lambda t: t.__name__)


def test_openapi_says_which_bodies_refuse_extra_fields_and_their_bounds() -> None:
    doc = create_app().openapi_schema.to_schema()
    schemas = doc["components"]["schemas"]
    for struct in _structs():
        forbid = msgspec.inspect.type_info(struct).forbid_unknown_fields
        assert (schemas[struct.__name__].get("additionalProperties") is False) == forbid, struct.__name__
    completion = schemas["CompletionRequest"]["properties"]
    n = [s for s in completion["n"]["oneOf"] if s.get("type") == "integer"][0]
    assert (n["minimum"], n["maximum"]) == (1, ob.MAX_N)
    bias = [s for s in completion["logit_bias"]["oneOf"] if s.get("type") == "object"][0]
    assert bias["maxProperties"] == ob.MAX_LOGIT_BIAS and bias["propertyNames"]["pattern"]
    temperature = [s for s in completion["temperature"]["oneOf"] if s.get("type") == "number"][0]
    assert temperature["minimum"] == 0  # Litestar alone drops bounds of 0
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for status, response in op["responses"].items():
                if status.startswith(("4", "5")) and not (path == "/ready" and status == "503"):
                    assert response["content"]["application/json"]["schema"] == {
                        "$ref": "#/components/schemas/ErrorBody"
                    }, (method, path, status)
