"""The conformance cases (tests/fixtures/tool_cases.json, adapted from BFCL) through the shared server: every
complete call is valid against its tool's schema. Accuracy is printed by scripts/tool_conformance.py, not asserted."""

from __future__ import annotations

import openai

from scripts.tool_conformance import load_cases, report, run
from tests.integration.conftest import API_KEY, ServerProcess


async def test_every_complete_call_of_the_conformance_cases_is_valid(server: ServerProcess):
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=600)
    # Every third case (each category kept), one call a case (no parallel), all in one batch: quick enough for
    # the suite; the script runs all of them.
    cases = load_cases()[::3]
    results = await run(client, cases, max_tokens=64, concurrency=len(cases), parallel=False)
    await client.close()
    print(report(results))
    assert len(results) == 12 and {r["category"] for r in results} == {"simple", "multiple", "parallel"}
    assert all(r["calls"] for r in results), "tool_choice 'required' gave a reply without calls"
    assert sum(r["complete"] for r in results) >= 10  # most replies fit 64 tokens: the check has teeth
    invalid = [r for r in results if r["valid"] != r["complete"]]
    assert not invalid, invalid
