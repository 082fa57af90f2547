"""The prepared GPU check (scripts/gpu_check.py) on this machine: its dry run (NumPy backend, a tiny synthetic
shape) goes through the same stages and writes the folder a GPU run brings back; and the summary's bounds and
targets from given results."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

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
    assert len(files) <= 8 and all((out / f).is_file() for f in files)  # a small folder to copy back
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


def test_the_8b_goes_first_and_a_stage_the_budget_cannot_cover_is_skipped_not_started(tmp_path, monkeypatch):
    """Stages stubbed (each 'takes' what NEED says by moving the clock): the 8B's model, bench and PyTorch run
    before parity and the smaller shapes, and a stage that needs more than is left never starts."""
    gc = _script()
    now, started = [0.0], []
    monkeypatch.setattr(gc.time, "monotonic", lambda: now[0])

    def run(name: str, seconds: float, value: Any = "") -> Any:
        started.append(name)
        now[0] += seconds
        return value

    monkeypatch.setattr(gc, "probe", lambda check: run("probe", 1, {}))
    monkeypatch.setattr(
        gc, "make_model", lambda check, shape, models, tok: run(f"synth-{shape}", gc.need("synth", shape), tmp_path)
    )
    monkeypatch.setattr(
        gc, "worker_stage", lambda check, kind, a, shape, log, t: run(f"{kind}-{shape}", gc.need(kind, shape))
    )
    monkeypatch.setattr(gc, "pytest_stage", lambda check, test, log, t, env=None: run(log.split(".")[0], 50))
    budget = 1 + sum(gc.need(k, "llama-3.1-8b") for k in ("synth", "bench", "torch")) + 50 + 10
    out = tmp_path / "out"
    gc.main(["--out", str(out), "--models", str(tmp_path / "models"), "--budget-s", str(budget), "--backend", "cupy"])
    assert started[:5] == ["probe", "synth-llama-3.1-8b", "bench-llama-3.1-8b", "torch-llama-3.1-8b", "parity"]
    stages = json.loads((out / "results.json").read_text())["stages"]
    assert stages["engine"]["status"] == "skipped (budget)" and "engine" not in started
    assert stages["synth-llama-3.2-1b"]["status"] == "skipped (budget)"
    assert all(s["status"] in ("ok", "skipped (budget)") for s in stages.values()), stages
    assert gc.model_path(tmp_path, "llama-3.1-8b").name == "llama-3.1-8b-v128256-q4_0.gguf"


def test_a_worker_stopped_part_way_leaves_its_figures_in_the_results(tmp_path):
    """The bench worker writes its JSON after every section: a worker killed at its timeout still gives those."""
    gc = _script()
    check = gc.Check(tmp_path / "out", tmp_path, 100, dry_run=True)

    def killed(cmd: list[str], log: str, timeout: float, env: Any = None) -> tuple[int, str]:
        part = Path(cmd[cmd.index("--json-out") + 1])
        gc.write_json(part, {"prefill_tok_s": 100.0, "decode_tok_s": 50.0, "weight_bytes": 10})
        return 124, "killed"

    check.run = killed
    check.stage("bench-tiny", 10, lambda t: gc.worker_stage(check, "bench", [], "tiny", "bench.log", t))
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["stages"]["bench-tiny"]["status"] == "failed"
    assert "partial figures kept" in results["stages"]["bench-tiny"]["detail"]
    assert results["shapes"]["tiny"]["bench"] == {
        "prefill_tok_s": 100.0,
        "decode_tok_s": 50.0,
        "weight_bytes": 10,
        "partial": True,
    }
