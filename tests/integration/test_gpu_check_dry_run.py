"""The prepared GPU check (scripts/gpu_check.py) on this machine: its dry run (NumPy backend, a tiny synthetic
shape) goes through the same stages and writes the folder a GPU run brings back; and the summary's bounds and
targets from given results."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_writes_the_results_folder_and_its_summary(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "gpu_check.py"),
            "--dry-run",
            "--out",
            str(out),
            "--models",
            str(tmp_path / "models"),
            "--stages",
            "synth,parity,bench,torch",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert {"summary.md", "results.json", "check.log", "bench.log", "parity.log"} <= set(files)
    assert len(files) <= 8 and all((out / f).is_file() for f in files)  # what the device tool brings back
    results = json.loads((out / "results.json").read_text())
    stages = results["stages"]
    assert stages["probe"]["status"] == stages["synth-tiny"]["status"] == stages["bench-tiny"]["status"] == "ok", stages
    assert (
        stages["parity"]["status"] == "skipped" and "skipped" in stages["parity"]["detail"]
    )  # no GPU: every test skips
    assert stages["torch-tiny"]["status"] in ("ok", "skipped"), stages["torch-tiny"]
    bench = results["shapes"]["tiny"]["bench"]
    assert bench["backend"] == "numpy" and bench["decode_tok_s"] > 0 and bench["weight_bytes"] > 0
    assert set(bench["aggregate_tok_s"]) == {"8", "32", "64"} and min(bench["aggregate_tok_s"].values()) > 0
    summary = (out / "summary.md").read_text()
    assert "DRY RUN" in summary and "## tiny: Forge (numpy)" in summary
    row = next(line for line in summary.splitlines() if line.startswith("| aggregate tok/s, 64 sequences"))
    forge, bound = row.split("|")[2:4]
    assert forge.strip() != "—" and bound.strip() != "—"


def test_bounds_and_targets_from_results():
    gc = _script()
    machine = {"copy_gb_s": 3000.0, "f16_matmul_tflops": 700.0, "device": "NVIDIA H100"}
    small = {
        "weight_bytes": 1.0e8,
        "num_params": 1.35e8,
        "chat_prompt_tokens": 40,
        "decode_tok_s": 1200.0,
        "prefill_tok_s": 20000.0,
        "ttft_ms": 5.0,
        "aggregate_tok_s": {"8": 5000, "32": 9000, "64": 12000},
    }
    big = dict(small, weight_bytes=4.7e9, num_params=8.0e9, decode_tok_s=200.0)
    b = gc.bounds(big, machine)
    assert abs(b["decode_tok_s"] - 3000e9 / 4.7e9) < 1e-6 and abs(b["aggregate_64"] - 64 * 3000e9 / 4.7e9) < 1e-3
    assert abs(b["prefill_tok_s"] - 700e12 / 16e9) < 1e-3
    results = {
        "machine": machine,
        "backend": "cupy",
        "stages": {"parity": {"status": "ok", "detail": "140 passed"}},
        "shapes": {
            "smollm2-135m": {"bench": small, "torch": {"aggregate_tok_s": {"64": 15000}}},
            "llama-3.1-8b": {"bench": big, "torch": {"aggregate_tok_s": {"64": 4000}}},
        },
    }
    lines = gc.targets(results)
    assert any(t.startswith("PASS: 135M single-stream decode") for t in lines)
    assert any(t.startswith("MISS: 8B Q4_0 single-stream decode") for t in lines)  # 200 < half of 638
    assert any(t.startswith("MISS: smollm2-135m: aggregate at 64") for t in lines)
    assert any(t.startswith("PASS: llama-3.1-8b: aggregate at 64") for t in lines)
    assert any(t.startswith("engine tests: not run") for t in lines)
    summary = gc.summary_markdown(results)
    assert "| decode tok/s, 1 sequence | 200 | 638 | 0.31 |" in summary
