"""`POST /v1/embeddings`, OpenAI's shape: one vector per input from the engine (`Engine.embed`): the model's last
hidden state (after its final norm) pooled by mean or last token (`--embedding-pooling`; a model's own GGUF
`pooling_type` wins) and L2-normalised.

Every count a client sends is bounded while the body is decoded (inputs, characters, token ids); what depends
on the model (token ids in its vocabulary, an input against its context, the request's tokens together) is
checked before anything runs. An input longer than the context is refused unless `truncate` is true (then
its first context-length tokens are embedded); nothing is cut silently.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Annotated, Literal

import numpy as np
from litestar import post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from msgspec import Meta, Struct

from app.api.openapi import BODY, KEYED, Documented, errors
from app.api.served import OnModel, on_model
from app.api.state import Ready
from app.domain.errors import ServiceError
from engine.types import EngineOverloaded, InvalidRequest

MAX_INPUTS = 2048  # strings or token-id lists in one request (OpenAI's bound)
INPUT_MAX_CHARS = 1 << 20  # one string (the body is at most 8 MiB anyway)
MAX_INPUT_TOKENS = 1 << 16  # one input given as token ids; the model's context is the real bound
MAX_TOTAL_TOKENS = 1 << 17  # a request's inputs together, once tokenized (truncated ones as cut)
TOKEN_ID_MAX = 999_999_999  # any vocabulary's id fits; the model's own is checked per request
OVERLOADED_RETRY_S = 1

InputText = Annotated[str, Meta(min_length=1, max_length=INPUT_MAX_CHARS)]
TokenId = Annotated[int, Meta(ge=0, le=TOKEN_ID_MAX)]
InputTokens = Annotated[list[TokenId], Meta(min_length=1, max_length=MAX_INPUT_TOKENS)]
# A list holds strings, token ids (one input) or token-id lists; several strings or lists count up to MAX_INPUTS.
InputList = Annotated[list[InputText | TokenId | InputTokens], Meta(min_length=1, max_length=MAX_INPUT_TOKENS)]


class EmbeddingRequest(Struct, forbid_unknown_fields=True, kw_only=True):
    """OpenAI's embeddings body, plus `truncate` (cut inputs longer than the context instead of refusing them)."""

    input: InputText | InputList
    model: Annotated[str, Meta(max_length=256)]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, Meta(ge=1, le=1 << 20)] | None = None  # only the model's own size
    user: Annotated[str, Meta(max_length=256)] | None = None
    truncate: bool | None = None


class Embedding(Struct, kw_only=True):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str  # base64: the float32 values' little-endian bytes


class EmbeddingUsage(Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(Struct, kw_only=True):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


def _invalid(message: str, param: str = "input") -> ServiceError:
    return ServiceError("invalid_parameter", message, param=param)


async def _token_ids(svc: OnModel, given: str | list) -> list[list[int]]:
    """The request's inputs as token-id lists: a string, strings, token ids (one input) or token-id lists."""
    if isinstance(given, str):
        given = [given]
    kinds = {str if isinstance(x, str) else int if isinstance(x, int) else list for x in given}
    if len(kinds) > 1:
        raise _invalid("'input' mixes strings, token ids and token-id lists; use one kind")
    if kinds == {int}:
        return [list(given)]
    if len(given) > MAX_INPUTS:
        raise _invalid(f"'input' holds {len(given)} items; at most {MAX_INPUTS} are allowed")
    if kinds == {list}:
        return [list(x) for x in given]
    encode = svc.engine.tokenizer.encode
    # tokenizing a large batch takes a while: not on the event loop
    ids = await asyncio.to_thread(lambda: [encode(text, True) for text in given])
    for i, x in enumerate(ids):
        if not x:
            raise _invalid(f"'input[{i}]' holds no token")
    return ids


@post("/v1/embeddings", status_code=200, responses=errors(*KEYED, *BODY, 404), operation_class=Documented)
async def embeddings(svc: NamedDependency[Ready], data: JSONBody[EmbeddingRequest]) -> EmbeddingList:
    """One L2-normalised vector per input. Inputs longer than the model's context are a 400 unless `truncate`."""
    on = await on_model(svc, data.model)  # held while its engine embeds
    try:
        return await _embed(on, data)
    finally:
        on.lease.release()


async def _embed(svc: OnModel, data: EmbeddingRequest) -> EmbeddingList:
    engine = svc.engine
    model = svc.model_id
    size = int(engine.model_info["hidden_size"])
    if data.dimensions is not None and data.dimensions != size:
        raise ServiceError(
            "unsupported_parameter",
            f"'dimensions' is not supported by this model: its embeddings "
            f"have {size} dimensions and cannot be shortened",
            param="dimensions",
        )
    inputs = await _token_ids(svc, data.input)
    context = int(engine.max_context)
    vocab = int(engine.tokenizer.vocab_size)
    for i, ids in enumerate(inputs):
        if len(ids) > context and not data.truncate:
            raise ServiceError(
                "context_length_exceeded",
                f"'input[{i}]' is {len(ids)} tokens; this model's maximum "
                f"context length is {context} tokens (send \"truncate\": true to cut it)",
                param="input",
            )
        if max(ids) >= vocab:
            raise _invalid(f"'input[{i}]' holds a token id outside this model's vocabulary [0, {vocab})")
    tokens = sum(min(len(ids), context) for ids in inputs)
    if tokens > MAX_TOTAL_TOKENS:
        raise _invalid(f"'input' is {tokens} tokens in all; at most {MAX_TOTAL_TOKENS} are allowed in one request")
    try:
        vectors = await engine.embed(inputs, svc.settings.embedding_pooling, truncate=bool(data.truncate))
    except InvalidRequest as e:
        raise _invalid(str(e), e.param or "input") from None
    except EngineOverloaded as e:
        raise ServiceError("overloaded", f"the server is overloaded: {e}", retry_after_s=OVERLOADED_RETRY_S) from None
    as_base64 = data.encoding_format == "base64"
    return EmbeddingList(
        object="list",
        model=model,
        usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens),
        data=[
            Embedding(
                object="embedding",
                index=i,
                embedding=base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode("ascii")
                if as_base64
                else v.tolist(),
            )
            for i, v in enumerate(vectors)
        ],
    )
