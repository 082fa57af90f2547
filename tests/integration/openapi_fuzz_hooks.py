"""Schemathesis hooks for tests/integration/test_openapi_fuzz.py (loaded through SCHEMATHESIS_HOOKS).

- Generation happens: half the bodies name the served model ("default") instead of a random string (a 404).
- Generation stays cheap: a length to generate between CHEAP_TOKENS and the model's context becomes CHEAP_TOKENS
  (valid stays valid; 0, 1, the schema's maximum and past it are sent as generated, and refused before any
  generation when over the context).
- Every call's wall time, status and operation go to the JSON-lines file named by FORGE_FUZZ_LOG, so the test can
  hold every answer (whole streams included) to a deadline.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import schemathesis

CHEAP_TOKENS = 2
CONTEXT = 8192  # the default model's; values past it are refused before generating, so they are kept
LENGTHS = ("max_tokens", "max_completion_tokens")
_started: dict[int, float] = {}


def _cheap(body: Any) -> None:
    if not isinstance(body, dict):
        return
    for name in LENGTHS:
        value = body.get(name)
        if type(value) is int and CHEAP_TOKENS < value <= CONTEXT:
            body[name] = CHEAP_TOKENS
    settings = body.get("settings")
    if isinstance(settings, dict):
        _cheap(settings)


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    _cheap(case.body)
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("model"), str) and len(json.dumps(body)) % 2:
        body["model"] = "default"  # valid stays valid; deterministic, so the seed still replays a run
    _started[id(case)] = time.monotonic()


@schemathesis.hook
def after_call(context: Any, case: Any, response: Any) -> None:
    took = time.monotonic() - _started.pop(id(case), time.monotonic())
    path = os.environ.get("FORGE_FUZZ_LOG")
    if path:
        with open(path, "a") as f:
            f.write(
                json.dumps({"op": f"{case.method} {case.path}", "status": response.status_code, "s": round(took, 3)})
                + "\n"
            )
