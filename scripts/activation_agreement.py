"""How closely an activation mode of the numba backend follows the transformers float32 reference
(tests/fixtures/smollm2_reference.json) on the default model's fixture prompts.

    .venv/bin/python scripts/activation_agreement.py [--activations q8]

Per prompt:
- greedy: 32 tokens (EOS ignored) through the engine; how many leading ids equal the reference's;
- teacher-forced: the prompt, then the reference's 32 ids fed one token a step (the decode path,
  where every product has one row); at each step the max logit against the reference's top-1
  logit, and whether the argmax is the reference's id; plus the first position's top-5 logits.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from engine.llm_engine import EngineConfig, LLMEngine
from engine.loader import load_model
from engine.model.llama import LlamaModel
from engine.types import GenerationRequest, SamplingParams
from kernels import get_backend
from kernels.attention_meta import build_attention_metadata

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "smollm2_reference.json"


def greedy_ids(core: LLMEngine, prompt: list[int], n: int) -> list[int]:
    core.add_request(
        GenerationRequest(
            list(prompt), SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, speculative="off")
        )
    )
    ids: list[int] = []
    while core.has_work():
        ids += [t for ev in core.step() for t in ev.token_ids]
    return ids


def teacher_forced(core: LLMEngine, prompt: list[int], forced: list[int]) -> np.ndarray:
    """Logits [len(forced), vocab]: after the prompt (one prefill), then after each forced token but the last,
    one a step."""
    bs, model = core.blocks.block_size, core.model
    ids = prompt + forced
    table = list(range(-(-len(ids) // bs)))
    out, lo = [], 0
    for hi in range(len(prompt), len(ids)):
        meta = build_attention_metadata([hi - lo], [hi], [table], bs, model.backend)
        out.append(
            model.forward(
                np.asarray(ids[lo:hi]), np.arange(lo, hi), meta, core.runner.kv_caches, np.asarray([hi - lo - 1])
            )[0]
        )
        lo = hi
    return np.stack(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--activations", default="q8")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    ref = json.loads(FIXTURE.read_text())
    loaded = load_model("default")
    model = LlamaModel(loaded.config, loaded.weights, get_backend("numba", args.threads, args.activations))
    core = LLMEngine(loaded, model, EngineConfig(kv_memory=64 << 20))
    worst_top1 = worst_top5 = 0.0
    for i, case in enumerate(ref["prompts"]):
        want = case["greedy32_no_eos_stop_ids"]
        got = greedy_ids(core, case["prompt_ids"], len(want))
        lead = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
        logits = teacher_forced(core, case["prompt_ids"], want)
        top1 = np.abs(logits.max(axis=1) - np.asarray(case["greedy32_no_eos_stop_top1_logit"], np.float64)).max()
        top5 = case["first_position_top5"]
        d5 = np.abs(logits[0][top5["ids"]] - np.asarray(top5["values"])).max()
        argmax_ok = int((logits.argmax(axis=1) == np.asarray(want)).sum())
        worst_top1, worst_top5 = max(worst_top1, top1), max(worst_top5, d5)
        print(
            f"prompt {i}: greedy ids equal for the first {lead}/{len(want)}; teacher-forced argmax equal "
            f"{argmax_ok}/{len(want)}, max |top-1 logit diff| {top1:.4f}, first-position top-5 {d5:.4f}"
        )
    print(f"worst: top-1 logit {worst_top1:.4f}, first-position top-5 {worst_top5:.4f}")


if __name__ == "__main__":
    main()
