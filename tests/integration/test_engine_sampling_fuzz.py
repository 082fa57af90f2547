"""Hypothesis over `SamplingParams`' whole documented ranges (engine/types.py), at the engine on the default
model and the default (numba) backend: valid parameters always end with exactly n final events, finite
logprobs and no error; invalid ones raise InvalidRequest naming the field (never another exception), before
anything is queued. Seeded and bounded: the same examples on every run."""

from __future__ import annotations

import asyncio
import math

import pytest
from engine_helpers import make_core
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from engine import Engine, GenerationRequest, InvalidRequest, SamplingParams
from engine.speculative import SpecConfig
from engine.types import ResponseFormat

VOCAB = 49152  # the default model's
HANG_S = 120  # a hang detector only


@pytest.fixture(scope="module")
def engine(default_model):
    """Its own event loop: Hypothesis runs plain functions, and each example drives the façade to the end."""
    eng = Engine(make_core(default_model, kv_memory=64 << 20, speculative=SpecConfig(row_cost=0.0)), threads=2)
    loop = asyncio.new_event_loop()
    yield eng, loop
    loop.run_until_complete(eng.shutdown())
    loop.close()


def reals(lo: float, hi: float, **kw) -> st.SearchStrategy[float]:
    """Floats in [lo, hi], the bounds and the tiniest values included."""
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False, **kw) | st.sampled_from([lo, hi])


FORMATS = [
    None,
    ResponseFormat("json_object"),
    ResponseFormat("regex", r"(yes|no)( indeed)?"),
    ResponseFormat("grammar", 'start: "a" | "b" "c"'),
]


@st.composite
def valid_params(draw) -> SamplingParams:
    response_format = draw(st.sampled_from(FORMATS))
    return SamplingParams(
        max_tokens=draw(st.integers(1, 3)),  # long replies only cost time; the bound is tested below
        temperature=draw(st.just(0.0) | reals(0.0, 100.0)),
        top_k=draw(st.integers(0, VOCAB + 1) | st.sampled_from([0, 1, 2**31, 2**63])),
        top_p=draw(reals(0.0, 1.0, exclude_min=True).filter(lambda v: v > 0)),
        min_p=draw(reals(0.0, 1.0)),
        repetition_penalty=draw(reals(0.01, 10.0)),
        presence_penalty=draw(reals(-2.0, 2.0)),
        frequency_penalty=draw(reals(-2.0, 2.0)),
        logit_bias=draw(st.dictionaries(st.integers(0, VOCAB - 1), reals(-100.0, 100.0), max_size=8)),
        seed=draw(st.none() | st.integers(-(2**64), 2**64)),
        stop=draw(st.lists(st.text(min_size=1, max_size=6), max_size=16)),
        stop_token_ids=draw(st.lists(st.integers(0, VOCAB - 1), max_size=4)),
        ignore_eos=response_format is None and draw(st.booleans()),
        logprobs=draw(st.none() | st.integers(0, 20)),
        n=draw(st.integers(1, 16)),
        response_format=response_format,
        speculative=draw(st.sampled_from([None, "off", "ngram"])),
    )


PROMPTS = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12)


@seed(19)
@settings(
    max_examples=8,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(batch=st.lists(st.tuples(PROMPTS, valid_params()), min_size=1, max_size=4))
def test_valid_parameters_always_end_every_sample_with_finite_logprobs(engine, batch) -> None:
    eng, loop = engine
    reqs = [GenerationRequest(prompt, params) for prompt, params in batch]

    async def one(req: GenerationRequest) -> dict[int, str]:
        ends: dict[int, str] = {}
        async for ev in eng.generate(req):
            assert ev.index not in ends
            for lp in ev.logprobs or []:
                assert math.isfinite(lp.logprob) and lp.logprob <= 0.0, lp
                assert min(1, req.params.logprobs) <= len(lp.top) <= req.params.logprobs, lp
                assert all(math.isfinite(v) and v <= 0.0 for _, v in lp.top), lp
            if ev.final:
                assert ev.error is None, ev.error
                ends[ev.index] = ev.finish_reason
        return ends

    async def run_all() -> list[dict[int, str]]:
        return await asyncio.wait_for(asyncio.gather(*(one(r) for r in reqs)), HANG_S)

    for req, ends in zip(reqs, loop.run_until_complete(run_all())):
        assert sorted(ends) == list(range(req.params.n)), (req.params, ends)
        assert set(ends.values()) <= {"stop", "length"}, ends


# One field out of its documented range (or of the wrong type) at a time; the others stay valid.
BAD = {
    "max_tokens": st.integers(max_value=0) | st.sampled_from([1.0, "4", None, True]),
    "temperature": st.floats(max_value=-1e-300)
    | st.floats(min_value=100.0, exclude_min=True)
    | st.sampled_from([math.nan, math.inf, -math.inf, "1", None, True]),
    "top_k": st.integers(max_value=-1) | st.sampled_from([1.5, "3", None]),
    "top_p": st.floats(max_value=0.0) | st.floats(min_value=1.0, exclude_min=True) | st.sampled_from([math.nan, None]),
    "min_p": st.floats(max_value=-1e-300) | st.floats(min_value=1.0, exclude_min=True) | st.just(math.nan),
    "repetition_penalty": st.floats(max_value=0.01, exclude_max=True)
    | st.floats(min_value=10.0, exclude_min=True)
    | st.sampled_from([5e-324, math.inf]),
    "presence_penalty": st.floats(max_value=-2.0, exclude_max=True) | st.floats(min_value=2.0, exclude_min=True),
    "frequency_penalty": st.floats(max_value=-2.0, exclude_max=True) | st.floats(min_value=2.0, exclude_min=True),
    "logprobs": st.integers(max_value=-1) | st.integers(min_value=21) | st.sampled_from([1.0, "2", True]),
    "n": st.integers(max_value=0) | st.integers(min_value=17) | st.sampled_from([10**9, 2**63, 2.0, "2", None]),
    "seed": st.sampled_from([1.5, "7", math.nan]),
    "stop": st.lists(st.text(min_size=1), min_size=17, max_size=20) | st.sampled_from([[""], "stop", [1], None]),
    "stop_token_ids": st.lists(st.integers(VOCAB, 2**63) | st.integers(max_value=-1), min_size=1, max_size=3)
    | st.lists(st.integers(0, VOCAB - 1), min_size=65, max_size=70)
    | st.sampled_from([None, 7, "2", [1.5], [True]]),
    "logit_bias": st.dictionaries(st.integers(VOCAB, 2**63) | st.integers(max_value=-1), st.just(1.0), min_size=1)
    | st.dictionaries(
        st.integers(0, VOCAB - 1), st.floats(min_value=100.0, exclude_min=True) | st.just(math.nan), min_size=1
    )
    | st.sampled_from([[], {"1": 1.0}, None]),
    "speculative": st.text().filter(lambda v: v not in ("off", "ngram")),
    "response_format": st.sampled_from([ResponseFormat("xml"), "json_object", {"type": "json_object"}]),
}


@seed(19)
@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data(), field=st.sampled_from(sorted(BAD)))
def test_invalid_parameters_raise_invalid_request_naming_the_field(engine, data, field) -> None:
    eng, loop = engine
    params = SamplingParams(max_tokens=1, n=data.draw(st.integers(1, 16)))
    setattr(params, field, data.draw(BAD[field]))
    req = GenerationRequest([1, 2, 3], params)

    async def submit() -> None:
        eng.generate(req)

    with pytest.raises(InvalidRequest) as info:
        loop.run_until_complete(submit())
    assert info.value.param == field
    assert eng.stats()["waiting"] == 0


@seed(19)
@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 16), max_tokens=st.integers(1, 2**63), prompt=st.integers(1, 2000))
def test_counts_at_their_bounds_are_checked_against_the_kv_budget_before_anything_is_sized(
    engine, n, max_tokens, prompt
) -> None:
    eng, _ = engine
    req = GenerationRequest([1] * prompt, SamplingParams(max_tokens=max_tokens, n=n))
    try:
        eng.core.validate(req)  # checks only: nothing is allocated from n or max_tokens
    except InvalidRequest as exc:
        assert exc.param in ("n", "max_tokens", "messages"), exc
        assert n > 1 or exc.param == "messages"  # one sample always fits: a long reply stops at the context's end
        assert (exc.param == "messages") == (prompt >= eng.max_context)
