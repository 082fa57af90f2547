"""`POST /v1/embeddings` from outside: the official `openai` client against the shared real server (uvicorn,
default model): shapes, unit norms, batch invariance, base64 equal to float, token-id inputs, usage, refusals
as OpenAI-style 4xx bodies, and many requests at once."""

from __future__ import annotations

import asyncio
import base64

import httpx
import numpy as np
import openai
import pytest

from tests.integration.conftest import ServerProcess

TEXTS = [
    "The cat sat on the mat.",
    "A kitten rested on the rug.",
    "Stock markets fell sharply today.",
    "Rain is expected tomorrow afternoon.",
]
HIDDEN = 576  # SmolLM2-135M's hidden size


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=server.api_key, max_retries=0, timeout=120)


def vectors(resp) -> np.ndarray:
    assert [d.index for d in resp.data] == list(range(len(resp.data)))
    return np.array([d.embedding for d in resp.data], dtype=np.float32)


def test_shapes_norms_usage_and_batch_invariance(client, loaded_default) -> None:
    batch = client.embeddings.create(model="default", input=TEXTS, encoding_format="float")
    assert batch.object == "list" and batch.model == loaded_default.name
    got = vectors(batch)
    assert got.shape == (len(TEXTS), HIDDEN)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    tokens = [loaded_default.tokenizer.encode(t, add_special=True) for t in TEXTS]
    assert batch.usage.prompt_tokens == batch.usage.total_tokens == sum(map(len, tokens))
    alone = np.array(
        [vectors(client.embeddings.create(model="default", input=t, encoding_format="float"))[0] for t in TEXTS]
    )
    assert np.abs(alone - got).max() < 1e-5
    # token ids: one input as a list of ids, several as lists of lists; the same vectors as the text
    one = client.embeddings.create(model="default", input=tokens[2], encoding_format="float")
    assert np.abs(vectors(one)[0] - got[2]).max() < 1e-5 and one.usage.prompt_tokens == len(tokens[2])
    several = client.embeddings.create(model="default", input=tokens, encoding_format="float")
    assert np.abs(vectors(several) - got).max() < 1e-5
    sims = got @ got.T  # the two sentences about a cat on a mat are the closest pair
    assert sims[0, 1] > max(sims[0, 2], sims[0, 3], sims[1, 2], sims[1, 3])


def test_base64_is_the_same_float32_vector(client) -> None:
    floats = vectors(client.embeddings.create(model="default", input=TEXTS[:2], encoding_format="float"))
    raw = client.embeddings.create(model="default", input=TEXTS[:2], encoding_format="base64")
    decoded = np.array([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in raw.data])
    assert decoded.shape == (2, HIDDEN) and np.array_equal(decoded, floats)
    default = vectors(client.embeddings.create(model="default", input=TEXTS[:2]))  # the client's own base64 path
    assert np.array_equal(default, floats)


@pytest.mark.parametrize(
    "body,status,param",
    [
        ({"input": ""}, 400, "input"),
        ({"input": []}, 400, "input"),
        ({"input": [[]]}, 400, "input[0]"),
        ({"input": ["a", 5]}, 400, "input"),
        ({"input": [[1, 2], "a"]}, 400, "input"),
        ({"input": [-1]}, 400, "input[0]"),
        ({"input": [49152]}, 400, "input"),  # one past the vocabulary
        ({"input": ["x"] * 2049}, 400, "input"),
        ({"input": "hi", "dimensions": 64}, 400, "dimensions"),
        ({"input": "hi", "encoding_format": "int8"}, 400, "encoding_format"),
        ({"input": "hi", "pooling": "max"}, 400, "pooling"),
        ({"input": "hi", "model": "gpt-4"}, 404, "model"),
        ({"input": list(range(1, 9000))}, 400, "input"),  # past the 8192-token context, no truncation asked
    ],
)
def test_bad_input_is_a_4xx_naming_the_field(server: ServerProcess, body, status, param) -> None:
    r = httpx.post(server.url + "/v1/embeddings", json={"model": "default", **body}, headers=server.auth, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["type"]
    if body.get("input") == list(range(1, 9000)):
        assert err["code"] == "context_length_exceeded" and "truncate" in err["message"]


def test_the_models_own_size_is_accepted_as_dimensions(client) -> None:
    resp = client.embeddings.create(model="default", input="hi", dimensions=HIDDEN, encoding_format="float")
    assert len(resp.data[0].embedding) == HIDDEN


async def test_many_concurrent_requests_each_get_their_own_vectors(server: ServerProcess) -> None:
    aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=server.api_key, max_retries=0, timeout=120)
    try:
        alone = [
            vectors(await aclient.embeddings.create(model="default", input=t, encoding_format="float"))[0]
            for t in TEXTS
        ]
        calls = [
            aclient.embeddings.create(
                model="default", input=[TEXTS[i % 4], TEXTS[(i + 1) % 4]], encoding_format="float"
            )
            for i in range(24)
        ]
        for i, resp in enumerate(await asyncio.gather(*calls)):
            got = vectors(resp)
            assert np.abs(got[0] - alone[i % 4]).max() < 1e-5 and np.abs(got[1] - alone[(i + 1) % 4]).max() < 1e-5
    finally:
        await aclient.close()


def test_the_api_key_guards_the_route_and_the_schema_documents_it(server: ServerProcess) -> None:
    r = httpx.post(server.url + "/v1/embeddings", json={"model": "default", "input": "hi"}, timeout=60)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    op = httpx.get(server.url + "/schema/openapi.json", timeout=60).json()["paths"]["/v1/embeddings"]["post"]
    assert op["requestBody"]["content"]["application/json"]["schema"]
    assert {"200", "400", "401", "404", "503"} <= set(op["responses"])
