"""`forge generate` and `forge chat` as a user runs them: real processes, the default model."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kernels import cupy_unavailable_reason
from kernels.cpu import CpuCaps

FORGE = str(Path(sys.executable).parent / "forge")


def forge(*args: str, stdin: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [FORGE, *args, "--threads", "1"], input=stdin, capture_output=True, text=True, timeout=timeout
    )


def test_generate_json_reproduces_reference_greedy_ids(reference):
    case = reference["prompts"][0]
    run = forge("generate", "--temperature", "0", "--max-tokens", "32", "--json", case["messages"][0]["content"])
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["prompt_token_ids"] == case["prompt_ids"]
    assert out["token_ids"] == case["generated_ids"]
    assert out["text"] == case["generated_text_skip_special"]
    assert out["finish_reason"] == "stop"
    assert out["usage"] == {
        "prompt_tokens": case["n_prompt"],
        "cached_tokens": 0,
        "completion_tokens": case["n_generated"],
    }
    assert 0 < out["timings"]["ttft"] <= out["timings"]["total"]


def test_generate_streams_text_and_raw_mode_skips_the_template():
    run = forge("generate", "--raw", "--temperature", "0", "--max-tokens", "6", "--json", "Once upon a time")
    out = json.loads(run.stdout)
    assert out["prompt_token_ids"][0] != 1  # no <|im_start|>: the prompt went in as written
    assert out["finish_reason"] == "length" and len(out["token_ids"]) == 6
    streamed = forge(
        "generate", "--raw", "--temperature", "0", "--max-tokens", "6", "--speculative", "off", "Once upon a time"
    )
    assert streamed.returncode == 0
    assert streamed.stdout.rstrip("\n") == out["text"]  # speculation (the default) changes nothing


def test_chat_keeps_history_and_reuses_the_cache():
    run = forge("chat", "--temperature", "0", "--max-tokens", "12", stdin="Hello!\nWhat did I just say?\n/exit\n")
    assert run.returncode == 0, run.stderr
    stats = [line for line in run.stderr.splitlines() if "prompt tokens cached" in line]
    assert len(stats) == 2
    cached_turn2 = int(stats[1].split(",")[1].split("/")[0])
    assert cached_turn2 >= 32  # the first turn's full blocks came from the cache


def test_bad_input_gets_a_clear_message_and_exit_code():
    missing = forge("generate", "--model", "/nope/model.gguf", "hi")
    assert missing.returncode == 2
    assert "/nope/model.gguf" in missing.stderr and "Traceback" not in missing.stderr
    bad_temp = forge("generate", "--temperature", "-1", "hi")
    assert bad_temp.returncode == 2
    assert "temperature" in bad_temp.stderr and "Traceback" not in bad_temp.stderr
    bad_mode = forge("generate", "--speculative", "eagle", "hi")
    assert bad_mode.returncode == 2 and "--speculative" in bad_mode.stderr and "ngram" in bad_mode.stderr


def test_serve_on_a_busy_port_says_so_before_loading_the_model(tmp_path):
    db = tmp_path / "forge.db"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = forge("serve", "--port", str(port), "--db", f"sqlite+aiosqlite:///{db}", "--log-level", "info")
    assert run.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in run.stderr and "Traceback" not in run.stderr
    assert "loaded" not in run.stderr and not db.exists()  # neither the model nor the database was touched


@pytest.mark.skipif(cupy_unavailable_reason() is None, reason="a CUDA GPU is usable here: cupy would run")
def test_backend_cupy_without_a_gpu_fails_at_once_and_auto_says_why_it_chose_numba():
    for args in (("generate", "--backend", "cupy", "hi"), ("serve", "--backend", "cupy", "--port", "1")):
        run = forge(*args, timeout=60)
        assert run.returncode != 0, args
        assert "kernel backend 'cupy' is not usable here" in run.stderr and "Traceback" not in run.stderr, run.stderr
        assert "compiling CPU kernels" not in run.stderr  # it failed before loading anything
    run = forge("generate", "--temperature", "0", "--max-tokens", "1", "hi")
    assert run.returncode == 0, run.stderr
    here = CpuCaps.detect().label
    assert f"kernel backend: numba with 1 threads on {here} (auto: no usable GPU, " in run.stderr
    assert "kernel route " in run.stderr and " ok (error " in run.stderr  # the start-up gate's checks


def test_activations_flag_reaches_the_kernels_and_is_checked(reference):
    case = reference["prompts"][0]  # its first two candidates are 0.08 apart: int8 activations flip them
    run = forge(
        "generate",
        "--activations",
        "q8",
        "--temperature",
        "0",
        "--max-tokens",
        "4",
        "--json",
        case["messages"][0]["content"],
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["token_ids"] != case["generated_ids"][:4]
    for args, env, message in (
        (("bench", "--backend", "numpy", "--activations", "q8"), {}, "need the numba backend"),
        (("serve", "--port", "0"), {"FORGE_ACTIVATIONS": "q4"}, "activations must be one of f32, q8, got 'q4'"),
    ):
        bad = subprocess.run([FORGE, *args], capture_output=True, text=True, timeout=120, env={**os.environ, **env})
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_synth_writes_a_model_that_generate_runs(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "hidden_size": 256,
                "intermediate_size": 512,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "tie_word_embeddings": True,
            }
        )
    )
    out = tmp_path / "tiny.gguf"
    synth = subprocess.run(
        [FORGE, "synth", "--config", str(config), "--quant", "q4_k", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert synth.returncode == 0, synth.stderr
    assert f"wrote {out}" in synth.stdout and out.is_file()
    run = forge("generate", "--model", str(out), "--raw", "--temperature", "0", "--max-tokens", "4", "--json", "Hello")
    assert run.returncode == 0, run.stderr
    assert len(json.loads(run.stdout)["token_ids"]) == 4  # seed 0, greedy: no EOS among them
    bad = subprocess.run(
        [FORGE, "synth", "--shape", "gpt-5", "--out", str(out)], capture_output=True, text=True, timeout=60, check=False
    )
    assert bad.returncode == 2 and "unknown shape 'gpt-5'" in bad.stderr and "Traceback" not in bad.stderr
