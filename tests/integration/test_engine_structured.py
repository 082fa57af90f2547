"""Structured output on the real default model: JSON schemas, regexes and Lark grammars hold on
sampled replies; what cannot be enforced is refused up front."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from engine_helpers import chat_prompt, collect, make_core, run_all
from structured_cases import PROMPT, SCHEMAS

from engine.types import GenerationRequest, InvalidRequest, ResponseFormat, SamplingParams


@pytest.fixture(scope="module")
def core(default_model):
    return make_core(default_model, kv_memory=64 << 20)


def chat(core, text: str) -> list[int]:
    """A short chat prompt (a one-line system prompt instead of the template's default one)."""
    return chat_prompt(core, [{"role": "system", "content": "You are terse."}, {"role": "user", "content": text}])


def constrained(prompt, fmt, max_tokens=64, **kw) -> GenerationRequest:
    params = SamplingParams(max_tokens=max_tokens, response_format=fmt, **kw)
    return GenerationRequest(list(prompt), params)


def run_samples(core, reqs: list[GenerationRequest]) -> dict:
    """Every sample of every request: (request id, index) -> Result."""
    results: dict = {}
    for req in reqs:
        core.add_request(req)
    while core.has_work():
        collect(core.step(), results)
    return results


def test_six_schemas_five_seeds_at_temperature_one_all_validate(core):
    # n=5 samples per schema: five seeded streams (seed, index) sharing one prefill of the prompt.
    reqs = []
    for i, (name, schema) in enumerate(SCHEMAS.items()):
        fmt = ResponseFormat("json_schema", json.dumps(schema))
        req = constrained(chat(core, PROMPT.format(name=name)), fmt, max_tokens=96, temperature=1.0, seed=i, n=5)
        req.request_id = name
        reqs.append(req)
    results = run_samples(core, reqs)
    for name, schema in SCHEMAS.items():
        for i in range(5):
            r = results[(name, i)]
            assert r.final.finish_reason == "stop", f"{name}[{i}]: {r.final.finish_reason} {r.text!r}"
            jsonschema.validate(json.loads(r.text), schema)
    assert len({results[("flat", i)].text for i in range(5)}) > 1, "five seeded samples gave one reply"


def test_json_object_regex_and_lark_hold_on_sampled_replies(core):
    number_list = ResponseFormat("grammar", 'start: num ("," " "? num){0,3}\nnum: /-?[0-9]{1,3}/')
    cases = {  # any JSON object is unbounded: greedy, so that it ends
        "object": (
            ResponseFormat("json_object"),
            "Describe a cat as JSON with two fields.",
            lambda t: isinstance(json.loads(t), dict),
        ),
        "regex": (
            ResponseFormat("regex", r"(yes|no), because [a-z ]{3,20}\."),
            "Is the sky blue? Answer yes or no.",
            lambda t: re.fullmatch(r"(yes|no), because [a-z ]{3,20}\.", t) is not None,
        ),
        "lark": (
            number_list,
            "List a few small numbers.",
            lambda t: re.fullmatch(r"-?\d{1,3}(, ?-?\d{1,3}){0,3}", t) is not None,
        ),
    }
    reqs = []
    for name, (fmt, text, _) in cases.items():
        temperature, n = (0.0, 1) if name == "object" else (1.0, 4)
        req = constrained(chat(core, text), fmt, max_tokens=48, temperature=temperature, seed=11, n=n)
        req.request_id = name
        reqs.append(req)
    results = run_samples(core, reqs)
    for req in reqs:
        name, ok = req.request_id, cases[req.request_id][2]
        for i in range(req.params.n):
            r = results[(name, i)]
            assert r.final.finish_reason == "stop" and ok(r.text), f"{name}[{i}]: {r.final.finish_reason} {r.text!r}"


def test_max_tokens_cuts_a_constrained_reply_with_length(core):
    fmt = ResponseFormat("regex", "[a-z]{40}")
    r = next(
        iter(run_all(core, [constrained(chat(core, "Write letters."), fmt, max_tokens=3, temperature=0.0)]).values())
    )
    assert r.final.finish_reason == "length" and len(r.token_ids) == 3
    assert re.fullmatch("[a-z]+", r.text) and len(r.text) < 40


@pytest.mark.parametrize(
    ("fmt", "words"),
    [
        (ResponseFormat("json_schema", '{"type": "object", "properties": '), "not valid JSON"),
        (ResponseFormat("json_schema", '{"type": "array", "uniqueItems": true}'), "uniqueItems"),
        (ResponseFormat("json_schema", '{"not": {"type": "string"}}'), "not"),
        (ResponseFormat("json_schema", '{"type": "strin"}'), "strin"),
        (ResponseFormat("json_schema", '[1, 2]'), "JSON object"),
        (ResponseFormat("regex", "a(b"), "unclosed group"),
        (ResponseFormat("grammar", "start: foo"), "foo"),
        (ResponseFormat("grammar", "start: /[/"), "regex"),
        (ResponseFormat("yaml", "a: 1"), "response_format"),
    ],
)
def test_what_cannot_be_enforced_is_refused_up_front(core, fmt, words):
    with pytest.raises(InvalidRequest) as err:
        core.add_request(constrained([1, 2, 3], fmt))
    assert err.value.param == "response_format"
    assert words in str(err.value)
    assert "\n" not in str(err.value)
    assert not core.has_work()


def test_compiled_constraints_are_cached_and_matchers_are_independent(core):
    fmt = ResponseFormat("regex", "[0-9]{2}")
    assert core.grammars.compile(fmt) is core.grammars.compile(ResponseFormat("regex", "[0-9]{2}"))
    a, b = core.grammars.matcher(fmt), core.grammars.matcher(fmt)
    digit = core.tokenizer.encode("7")
    assert a.consume_tokens(digit) and a.consume_tokens(digit) and a.is_accepting()
    assert not b.is_accepting()  # b did not move with a
