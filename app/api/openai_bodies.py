"""The OpenAI shim's request bodies as msgspec Structs (decoded by app.api.bodies.decode, unsupported=True).

`null` counts as not given, as OpenAI treats it. OpenAI parameters Forge does not implement are typed
`None`: sent with a value they are refused by name (`unsupported_parameter`); so is any unknown field.

Every count a client sends (n, best_of, max_tokens, logprobs, stop strings, logit_bias entries, messages,
text parts, prompt tokens) is bounded here, so it is refused while the body is decoded, before anything is
sized from it (a list of n choices, a stream per choice). The bounds that are the engine's own
(SamplingParams.validate: n, logprobs, stop) are repeated here, not loosened: tests/unit/test_request_bounds.py
keeps the two in step. What depends on the prompt (its length against the context) is checked per request.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from app.api.bodies import Int
from app.api.response_format import ResponseFormatField
from app.api.tools import CallId, ToolCalls, ToolChoiceField, ToolDefs, message_dict

MAX_N = 16  # samples per request (SamplingParams.validate's bound)
MAX_STOP = 16  # stop strings (SamplingParams.validate's bound)
STOP_MAX_CHARS = 1024
MAX_TOP_LOGPROBS = 20  # chat: alternatives per token (SamplingParams.validate's `logprobs` bound)
MAX_COMPLETION_LOGPROBS = 5  # completions: OpenAI's bound
MAX_LOGIT_BIAS = 300  # entries (OpenAI's bound)
MAX_TOKENS = 1 << 20  # the model's context is the real bound, checked per request against the prompt
MAX_MESSAGES = 4096
MAX_PARTS = 256  # text parts of one message
TEXT_MAX_CHARS = 1 << 20  # one message, one text part or a prompt string (the body is at most 8 MiB anyway)
MAX_PROMPT_TOKENS = 1 << 16  # a prompt given as token ids; the context is the real bound
TOKEN_ID_MAX = 999_999_999  # any vocabulary's id fits; the engine checks the model's own

Penalty = Annotated[float, Meta(ge=-2, le=2)]
Samples = Annotated[int, Meta(ge=1, le=MAX_N)]
MaxTokens = Annotated[int, Meta(ge=1, le=MAX_TOKENS)]
TokenId = Annotated[int, Meta(ge=0, le=TOKEN_ID_MAX)]
Bias = Annotated[float, Meta(ge=-100, le=100)]
Text = Annotated[str, Meta(max_length=TEXT_MAX_CHARS)]
Stop = Annotated[str, Meta(min_length=1, max_length=STOP_MAX_CHARS)]
TokenIds = Annotated[list[TokenId], Meta(min_length=1, max_length=MAX_PROMPT_TOKENS)]
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


class TextPart(Struct, forbid_unknown_fields=True):
    type: Literal["text"]
    text: Text


class ChatMessage(Struct, forbid_unknown_fields=True, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # null only beside tool_calls (app.api.tools.check_messages)
    content: Text | Annotated[list[TextPart], Meta(max_length=MAX_PARTS)] | None = None
    name: None = None
    tool_calls: ToolCalls | None = None
    tool_call_id: CallId | None = None
    refusal: None = None
    # null in an assistant message sent back as the SDK dumps it (model_dump() without exclude_none)
    function_call: None = None
    audio: None = None
    annotations: None = None

    def plain(self) -> dict[str, Any]:
        text = (
            self.content
            if isinstance(self.content, str) or self.content is None
            else "".join(p.text for p in self.content)
        )
        if self.tool_calls is None and self.tool_call_id is None:
            return {"role": CHAT_ROLES[self.role], "content": text}
        return message_dict(self, text, CHAT_ROLES[self.role])


class StreamOptions(Struct, forbid_unknown_fields=True):
    include_usage: bool | None = None


class Sampling(Struct, forbid_unknown_fields=True, kw_only=True):
    """What /v1/chat/completions and /v1/completions share."""

    model: str
    max_tokens: MaxTokens | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    n: Samples | None = None
    stop: Stop | Annotated[list[Stop], Meta(max_length=MAX_STOP)] | None = None
    seed: Int | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # token id (as a string) -> bias
    logit_bias: Annotated[dict[TokenId, Bias], Meta(max_length=MAX_LOGIT_BIAS)] | None = None
    user: Annotated[str, Meta(max_length=256)] | None = None  # logged
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    response_format: ResponseFormatField | None = None  # with Forge's `regex` and `grammar` kinds
    # Forge extensions the engine honours (vLLM spells the first three the same way)
    top_k: Annotated[int, Meta(ge=0, le=1 << 20)] | None = None  # 0: off; past the vocabulary: off
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    # the engine takes (0, 10]; below 0.01 a logit divided by it can overflow to inf
    repetition_penalty: Annotated[float, Meta(ge=0.01, le=10)] | None = None
    speculative: Literal["off", "ngram"] | None = None  # None: the server's --speculative
    # Refused by name when given.
    functions: None = None
    function_call: None = None
    suffix: None = None
    service_tier: None = None
    store: None = None
    metadata: None = None
    modalities: None = None
    audio: None = None
    prediction: None = None
    reasoning_effort: None = None


class ChatRequest(Sampling, kw_only=True):
    """`POST /v1/chat/completions`."""

    messages: Annotated[list[ChatMessage], Meta(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    tools: ToolDefs | None = None  # app.api.tools
    tool_choice: ToolChoiceField | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(Sampling, kw_only=True):
    """`POST /v1/completions`. `prompt`: a string, token ids, or a batch of exactly one of those."""

    # msgspec allows one array type in a union: the shapes of the list are told apart in app.api.openai.parse
    prompt: Text | Annotated[list[Text | TokenId | TokenIds], Meta(min_length=1, max_length=MAX_PROMPT_TOKENS)]
    echo: bool | None = None
    best_of: Samples | None = None
    logprobs: Annotated[int, Meta(ge=0, le=MAX_COMPLETION_LOGPROBS)] | None = None
    # Refused by name when given (ChatRequest takes them).
    tools: None = None
    tool_choice: None = None
    parallel_tool_calls: None = None
