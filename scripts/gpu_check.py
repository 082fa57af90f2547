"""The prepared GPU check: one command on a lent GPU machine proves parity and measures speed (docs/gpu.md).

Stages, each timed and recorded, none able to stop the others: the machine (versions, the GPU, imports, a measured
copy bandwidth and float16 matmul rate); then the 8B, the headline: its synthetic model (engine/loader/synth.py, the
tokenizer from a small carried GGUF, padded to Llama 3's 128256 ids), Forge's bench workload (engine/bench.py,
--quick, plus aggregate decode at 64 sequences) in a process of its own, and PyTorch (transformers'
LlamaForCausalLM, bf16, random weights, `generate`) on the same shape in another; then the CuPy parity tests and the
CuPy engine test, each in its own pytest process; then the smaller shapes. Everything lands in one folder of at most
8 files: summary.md (the table), results.json, check.log and one log per kind of stage. results.json is rewritten
after every stage and the bench worker writes its figures after every section of the workload, so a run cut short
keeps what it measured. A stage starts only when the budget left covers what it needs (NEED); otherwise it is
"skipped (budget)", and the summary is always written.

`--dry-run` runs the same code on a machine without a GPU: NumPy backend, a tiny synthetic shape, PyTorch on the CPU
if it is installed (tests/integration/test_gpu_check_dry_run.py).

Also the workers: `gpu_check.py bench-worker ...` and `gpu_check.py torch-worker ...` (one shape each, JSON out).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHAPES = ("llama-3.1-8b", "llama-3.2-1b", "smollm2-135m")  # the headline first
DRY_SHAPE = "tiny"
# Vocabularies padded to the real model's (engine/loader/synth.py): its embedding gather, output product and sampling
# over Llama 3's 128256 ids. Other shapes keep the tokenizer's 49152, as llama.cpp was timed on.
VOCAB = {"llama-3.1-8b": 128256}
# The dry run's shape: every kernel path of a Llama model, small enough to bench in seconds on a CPU.
TINY_CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}
AGGREGATE = (8, 32, 64)
PREFILL_TOKENS = 500  # engine/bench.py's prefill prompt
STAGES = ("synth", "parity", "engine", "bench", "torch")
# Seconds a stage may take at most (the overall budget may leave it less).
CAPS = {"synth": 120, "parity": 240, "engine": 180, "bench": 150, "torch": 120}
# Seconds a stage is expected to need to finish, per shape where the shape matters (estimates: results.json records
# what each took). A stage starts only with at least this much budget left.
NEED: dict[str, dict[str, float]] = {
    "synth": {"llama-3.1-8b": 60, "llama-3.2-1b": 15, "smollm2-135m": 5, DRY_SHAPE: 5},
    "bench": {"llama-3.1-8b": 100, "llama-3.2-1b": 60, "smollm2-135m": 45, DRY_SHAPE: 30},
    "torch": {"llama-3.1-8b": 90, "llama-3.2-1b": 45, "smollm2-135m": 30, DRY_SHAPE: 15},
    "parity": {"": 60},
    "engine": {"": 60},
}
VERSIONS = (
    "numpy",
    "cupy-cuda13x",
    "cupy-cuda12x",
    "torch",
    "transformers",
    "llguidance",
    "gguf",
    "tokenizers",
    "numba",
    "jinja2",
    "safetensors",
    "pytest",
)
IMPORTS = ("engine", "engine.structured", "engine.loader.synth", "kernels.cupy_backend", "engine.bench")


# ---- the orchestrator ---------------------------------------------------------------------------------------


class Check:
    """The results folder, the log, the time budget and the results gathered so far."""

    def __init__(self, out: Path, scratch: Path, budget_s: float, dry_run: bool) -> None:
        self.out, self.scratch, self.dry_run = out, scratch, dry_run  # scratch: models and workers' JSON
        self.deadline = time.monotonic() + budget_s
        self.results: dict[str, Any] = {
            "dry_run": dry_run,
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "budget_s": budget_s,
            "stages": {},
            "shapes": {},
        }
        out.mkdir(parents=True, exist_ok=True)
        self._log = open(out / "check.log", "a", buffering=1)

    def log(self, line: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        self._log.write(f"[{stamp}] {line}\n")
        print(f"[{stamp}] {line}", flush=True)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def stage(self, name: str, cap_s: float, fn: Callable[[float], Any], need_s: float = 10.0) -> Any:
        """Run fn(timeout_s) as stage `name` unless less than `need_s` is left of the budget (then it is "skipped
        (budget)": never started to be killed half-way); record ok/seconds/detail and save, never raise."""
        left = self.left()
        if left < need_s:
            detail = f"needs ~{need_s:.0f} s, {max(left, 0):.0f} s left"
            self.results["stages"][name] = {"status": "skipped (budget)", "detail": detail}
            self.log(f"{name}: skipped (budget), {detail}")
            self.save()
            return None
        timeout = min(cap_s, left)
        self.log(f"{name}: start (at most {timeout:.0f} s)")
        t0 = time.monotonic()
        try:
            value = fn(timeout)
            status, detail = "ok", value if isinstance(value, str) else ""
        except StageSkipped as exc:
            value, status, detail = None, "skipped", str(exc)
        except Exception as exc:  # a failed stage is a result: record it and go on
            value, status, detail = None, "failed", f"{type(exc).__name__}: {exc}"
        seconds = time.monotonic() - t0
        self.results["stages"][name] = {"status": status, "seconds": round(seconds, 1), "detail": detail}
        self.log(f"{name}: {status} in {seconds:.1f} s{': ' + detail if detail else ''}")
        self.save()
        return value

    def run(self, cmd: list[str], log_name: str, timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
        """Run cmd (its own process group), appending its output to log_name; (exit status, last lines)."""
        path = self.out / log_name
        with open(path, "a") as f:
            f.write(f"\n===== {' '.join(cmd)}\n")
            f.flush()
            start = f.tell()
            proc = subprocess.Popen(
                cmd,
                cwd=REPO,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", **(env or {})},
            )
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = 124
                f.write(f"\n===== killed after {timeout:.0f} s\n")
        with open(path) as f:
            f.seek(start)
            tail = f.read()[-4000:]
        return rc, tail

    def save(self) -> None:
        write_json(self.out / "results.json", self.results)


def write_json(path: Path, value: Any) -> None:
    """Replace `path` by `value` as JSON at once (a temp file renamed): a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=2, default=str))
    os.replace(tmp, path)


def need(stage: str, shape: str = "") -> float:
    """Seconds stage `stage` (of `shape`) is expected to need (NEED; the largest shape's figure for one not listed)."""
    table = NEED[stage]
    return table.get(shape, max(table.values()))


def model_path(models: Path, shape: str) -> Path:
    vocab = VOCAB.get(shape)
    return models / f"{shape}{f'-v{vocab}' if vocab else ''}-q4_0.gguf"


class StageSkipped(Exception):
    """A stage that cannot run here (a missing tool, a model that was not made); not a failure."""


def probe(check: Check) -> dict[str, Any]:
    """Versions, the GPU, the engine's imports, and what bounds the speed: copy bandwidth and float16 matmul rate."""
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "versions": {},
        "imports": {},
    }
    for dist in VERSIONS:
        try:
            info["versions"][dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    for mod in IMPORTS:
        try:
            importlib.import_module(mod)
            info["imports"][mod] = "ok"
        except Exception as exc:
            info["imports"][mod] = f"{type(exc).__name__}: {exc}"
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.memory", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        info["nvidia_smi"] = (smi.stdout or smi.stderr).strip()
    from kernels import cupy_unavailable_reason

    info["cupy_unavailable"] = cupy_unavailable_reason()
    if info["cupy_unavailable"] is None and not check.dry_run:
        info.update(_gpu_rates())
    else:
        info.update(_host_rates())
    return info


def _gpu_rates() -> dict[str, Any]:
    import cupy as cp

    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    out: dict[str, Any] = {
        "device": props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"]),
        "sms": props["multiProcessorCount"],
        "memory_gib": props["totalGlobalMem"] / 2**30,
        "l2_mib": props.get("l2CacheSize", 0) / 2**20,
    }
    a = cp.empty(1 << 30, dtype=cp.uint8)
    b = cp.empty_like(a)
    for _ in range(3):
        b[...] = a
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(10):
        b[...] = a
    stop.record()
    stop.synchronize()
    ms = cp.cuda.get_elapsed_time(start, stop)
    out["copy_gb_s"] = 2 * a.nbytes * 10 / (ms / 1e3) / 1e9  # bytes read and written
    del a, b
    n = 8192
    x = cp.random.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
    for _ in range(2):
        x @ x
    start.record()
    for _ in range(5):
        x @ x
    stop.record()
    stop.synchronize()
    out["f16_matmul_tflops"] = 2 * n**3 * 5 / (cp.cuda.get_elapsed_time(start, stop) / 1e3) / 1e12
    del x
    cp.get_default_memory_pool().free_all_blocks()
    return out


def _host_rates() -> dict[str, Any]:
    """The dry run's stand-ins for the GPU's bounds: a host memory copy and a float32 matmul."""
    import numpy as np

    a = np.ones(1 << 26, dtype=np.uint8)
    b = np.empty_like(a)
    np.copyto(b, a)
    t = time.perf_counter()
    for _ in range(5):
        np.copyto(b, a)
    copy = 2 * a.nbytes * 5 / (time.perf_counter() - t) / 1e9
    x = np.ones((512, 512), dtype=np.float32)
    t = time.perf_counter()
    for _ in range(5):
        x @ x
    flops = 2 * 512**3 * 5 / (time.perf_counter() - t) / 1e12
    return {
        "device": f"host ({platform.processor() or platform.machine()}), dry run",
        "copy_gb_s": copy,
        "f16_matmul_tflops": flops,
    }


def make_model(check: Check, shape: str, models: Path, tokenizer: Path | None) -> Path:
    from engine.loader.synth import preset, shape_from_hf, write_synthetic

    path = model_path(models, shape)
    if path.exists():
        return path
    spec = shape_from_hf(dict(TINY_CONFIG), DRY_SHAPE) if shape == DRY_SHAPE else preset(shape)
    r = write_synthetic(spec, "q4_0", path, seed=0, tokenizer_source=tokenizer, vocab_size=VOCAB.get(shape))
    check.results["shapes"].setdefault(shape, {})["synth"] = {
        "file_mb": r.file_bytes / 1e6,
        "params": r.params,
        "vocab": VOCAB.get(shape),
        "seconds": round(r.seconds, 1),
    }
    return path


def pytest_stage(check: Check, test: str, log: str, timeout: float, env: dict[str, str] | None = None) -> str:
    """One test file in a pytest process of its own (a GPU test file leaves state behind: streams, pools). Plugins
    are not autoloaded (neither file needs one; some take seconds to import), except the timeout plugin if present."""
    cmd = [sys.executable, "-m", "pytest", test, "-q", "-rfEs", "-s", "-p", "no:cacheprovider"]
    if importlib.util.find_spec("pytest_timeout"):
        cmd += ["-p", "pytest_timeout"]
    rc, tail = check.run(cmd, log, timeout, {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", **(env or {})})
    summary = _pytest_summary(tail)
    if rc not in (0, 5):  # 5: nothing collected
        raise RuntimeError(f"pytest exit {rc}: {summary}")
    if "passed" not in summary:
        raise StageSkipped(summary)
    return summary


def _pytest_summary(tail: str) -> str:
    lines = [ln.strip("= ") for ln in tail.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", ln)]
    return lines[-1] if lines else (tail.strip().splitlines() or ["no output"])[-1]


def worker_stage(check: Check, kind: str, args: list[str], shape: str, log: str, timeout: float) -> str:
    part = check.scratch / f"{kind}-{shape}.json"
    part.unlink(missing_ok=True)
    rc, tail = check.run(
        [sys.executable, str(Path(__file__).resolve()), f"{kind}-worker", "--json-out", str(part), *args], log, timeout
    )
    if part.exists():  # complete, or what a worker that stopped part-way had measured (it writes as it goes)
        result = json.loads(part.read_text())
        if rc != 0:
            result["partial"] = True
        check.results["shapes"].setdefault(shape, {})[kind] = result
    if rc != 0 or not part.exists():
        last = [ln for ln in tail.splitlines() if ln.strip()][-1:] or ["no output"]
        if rc == 3:
            raise StageSkipped(last[0])
        raise RuntimeError(f"exit {rc}: {last[0]}{' (partial figures kept)' if part.exists() else ''}")
    return ""


def main_check(args: argparse.Namespace) -> int:
    out = Path(args.out or os.environ.get("OUT") or REPO / "gpu-results").resolve()
    models = Path(args.models).resolve()
    models.mkdir(parents=True, exist_ok=True)
    check = Check(out, models, args.budget_s, args.dry_run)
    stages = set(args.stages.split(",")) if args.stages else set(STAGES)
    shapes = args.shapes.split(",") if args.shapes else ([DRY_SHAPE] if args.dry_run else list(SHAPES))
    backend = args.backend or ("numpy" if args.dry_run else "cupy")
    check.results.update(backend=backend, shape_list=shapes)
    tokenizer = Path(args.tokenizer) if args.tokenizer else None
    if tokenizer is None and (REPO / ".gpu-wheels" / "tokenizer.gguf").exists():
        tokenizer = REPO / ".gpu-wheels" / "tokenizer.gguf"
    check.log(
        f"GPU check: out {out}, backend {backend}, shapes {shapes}, budget {args.budget_s:.0f} s"
        f"{' (dry run)' if args.dry_run else ''}"
    )
    try:
        check.results["machine"] = check.stage("probe", 90, lambda _: probe(check), need_s=0)
        model: dict[str, Path | None] = {}

        def synth(shape: str) -> None:
            path = model_path(models, shape)
            if "synth" in stages or not path.exists():
                model[shape] = check.stage(
                    f"synth-{shape}",
                    CAPS["synth"],
                    lambda _: make_model(check, shape, models, tokenizer),
                    need("synth", shape),
                )
            else:
                model[shape] = path

        def speed(shape: str) -> None:
            """The shape's model, Forge's bench and PyTorch's, in that order."""
            if shape not in model:
                synth(shape)
            path = model.get(shape)
            if "bench" in stages and path is not None:
                bench_args = ["--model", str(path), "--backend", backend] + ([] if args.full else ["--quick"])
                if args.dry_run:  # one BLAS thread: two collapse on a CPU that others are using
                    bench_args += ["--kv-memory", "64MiB", "--threads", "1"]
                check.stage(
                    f"bench-{shape}",
                    CAPS["bench"],
                    lambda t, a=bench_args, s=shape: worker_stage(check, "bench", a, s, "bench.log", t),
                    need("bench", shape),
                )
            if "torch" in stages:
                torch_args = ["--shape", shape, "--device", "cpu" if args.dry_run else "cuda"]
                torch_args += [] if args.full else ["--quick"]
                chat = check.results["shapes"].get(shape, {}).get("bench", {}).get("chat_prompt_tokens")
                if chat:
                    torch_args += ["--chat-tokens", str(chat)]
                check.stage(
                    f"torch-{shape}",
                    CAPS["torch"],
                    lambda t, a=torch_args, s=shape: worker_stage(check, "torch", a, s, "torch.log", t),
                    need("torch", shape),
                )

        speed(shapes[0])  # the headline before anything that could use up the budget
        if "parity" in stages:
            check.stage(
                "parity",
                CAPS["parity"],
                lambda t: pytest_stage(check, "tests/unit/test_kernels_cupy_parity.py", "parity.log", t),
                need("parity"),
            )
        if "engine" in stages:
            engine_shape = DRY_SHAPE if args.dry_run else "smollm2-135m"  # its NumPy reference must stay cheap
            if engine_shape not in model:
                synth(engine_shape)

            def engine(t: float) -> str:
                if model.get(engine_shape) is None:
                    raise StageSkipped(f"no {engine_shape} model")
                return pytest_stage(
                    check,
                    "tests/integration/test_cupy_engine.py",
                    "engine.log",
                    t,
                    {"FORGE_GPU_TEST_MODEL": str(model[engine_shape])},
                )

            check.stage("engine", CAPS["engine"], engine, need("engine"))
        for shape in shapes[1:]:
            speed(shape)
    finally:
        check.results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        check.save()
        (out / "summary.md").write_text(summary_markdown(check.results))
        check.log(f"summary: {out / 'summary.md'}")
    failed = [name for name, s in check.results["stages"].items() if s["status"] == "failed"]
    return 1 if failed else 0


# ---- the summary ---------------------------------------------------------------------------------------------


def bounds(bench: dict[str, Any], machine: dict[str, Any]) -> dict[str, float | None]:
    """What the machine allows Forge's numbers at most (rates) or at least (TTFT): decode reads every weight byte
    once a step (weight bytes / copy bandwidth; n sequences share a step), prefill is bound by matmul throughput."""
    bw = (machine.get("copy_gb_s") or 0) * 1e9
    peak = (machine.get("f16_matmul_tflops") or 0) * 1e12
    w, params = bench.get("weight_bytes"), bench.get("num_params")
    out: dict[str, float | None] = {}
    step = w / bw if w and bw else None
    out["decode_tok_s"] = 1 / step if step else None
    for n in AGGREGATE:
        out[f"aggregate_{n}"] = n / step if step else None
    out["prefill_tok_s"] = peak / (2 * params) if peak and params else None
    chat = bench.get("chat_prompt_tokens")
    if step and peak and params and chat:
        out["ttft_ms"] = max(step, 2 * params * chat / peak) * 1000
    else:
        out["ttft_ms"] = None
    return out


def rows_for(
    shape: dict[str, Any], machine: dict[str, Any]
) -> list[tuple[str, float | None, float | None, float | None, bool]]:
    """(metric, Forge, bound, PyTorch, lower_is_better) for one shape."""
    b, t = shape.get("bench") or {}, shape.get("torch") or {}
    agg, tagg = b.get("aggregate_tok_s") or {}, t.get("aggregate_tok_s") or {}
    bd = bounds(b, machine)
    rows = [
        (
            f"prefill tok/s ({PREFILL_TOKENS} tokens)",
            b.get("prefill_tok_s"),
            bd["prefill_tok_s"],
            t.get("prefill_tok_s"),
            False,
        ),
        (
            f"TTFT ms ({b.get('chat_prompt_tokens', '?')}-token chat prompt)",
            b.get("ttft_ms"),
            bd["ttft_ms"],
            t.get("ttft_ms"),
            True,
        ),
        ("decode tok/s, 1 sequence", b.get("decode_tok_s"), bd["decode_tok_s"], t.get("decode_tok_s"), False),
    ]
    rows += [
        (f"aggregate tok/s, {n} sequences", agg.get(str(n)), bd[f"aggregate_{n}"], tagg.get(str(n)), False)
        for n in AGGREGATE
    ]
    return rows


def _fmt(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _ratio(a: float | None, b: float | None, lower_is_better: bool) -> str:
    if not a or not b:
        return "—"
    return f"{(b / a if lower_is_better else a / b):.2f}"


def summary_markdown(r: dict[str, Any]) -> str:
    m = r.get("machine") or {}
    lines = [
        f"# Forge GPU check{' (DRY RUN: no GPU, numbers mean nothing)' if r.get('dry_run') else ''}",
        "",
        f"- device: {m.get('device', '?')}; {m.get('nvidia_smi', 'no nvidia-smi')}",
        f"- measured: copy {_fmt(m.get('copy_gb_s'))} GB/s (read + written), float16 matmul "
        f"{_fmt(m.get('f16_matmul_tflops'))} TFLOP/s",
        f"- backend {r.get('backend')}, started {r.get('started')}, finished {r.get('finished')}",
        f"- versions: {', '.join(f'{k} {v}' for k, v in (m.get('versions') or {}).items())}",
        "",
        "## Stages",
        "",
        "| stage | status | seconds | detail |",
        "|---|---|---|---|",
    ]
    for name, s in r.get("stages", {}).items():
        detail = str(s.get("detail", "")).replace("|", "/").replace("\n", " ")[:200]
        lines.append(f"| {name} | {s['status']} | {s.get('seconds', '')} | {detail} |")
    bad_imports = {k: v for k, v in (m.get("imports") or {}).items() if v != "ok"}
    if bad_imports:
        lines += ["", "Imports that failed: " + "; ".join(f"{k}: {v}" for k, v in bad_imports.items())]
    for name, shape in r.get("shapes", {}).items():
        b = shape.get("bench") or {}
        lines += ["", f"## {name}: Forge ({r.get('backend')}) beside its bound and PyTorch", ""]
        if b:
            lines.append(
                f"weights {b.get('weight_bytes', 0) / 1e6:,.0f} MB read a decode step, "
                f"{b.get('num_params', 0) / 1e9:.2f} B parameters, loaded in {b.get('load_s', 0):.1f} s; "
                f"bound = weight bytes / copy bandwidth (decode), parameters x 2 / matmul rate (prefill)"
            )
            lines.append("")
        lines += [
            "| metric | Forge | bound | Forge of bound | PyTorch bf16 generate | Forge vs PyTorch (>1: Forge better) |",
            "|---|---|---|---|---|---|",
        ]
        for metric, forge, bound, torch_v, low in rows_for(shape, m):
            lines.append(
                f"| {metric} | {_fmt(forge)} | {_fmt(bound)} | {_ratio(forge, bound, low)} | {_fmt(torch_v)} "
                f"| {_ratio(forge, torch_v, low)} |"
            )
    lines += ["", "## Targets", ""] + [f"- {t}" for t in targets(r)]
    return "\n".join(lines) + "\n"


def targets(r: dict[str, Any]) -> list[str]:
    """The issue's targets, each PASS / MISS / not measured."""
    out, stages, shapes, m = [], r.get("stages", {}), r.get("shapes", {}), r.get("machine") or {}
    for name in ("parity", "engine"):
        s = stages.get(name)
        out.append(f"{name} tests: {s['status'] + ' (' + str(s.get('detail')) + ')' if s else 'not run'}")

    def verdict(ok: bool | None, text: str) -> str:
        return f"{'not measured' if ok is None else 'PASS' if ok else 'MISS'}: {text}"

    d135 = (shapes.get("smollm2-135m", {}).get("bench") or {}).get("decode_tok_s")
    out.append(
        verdict(None if d135 is None else d135 >= 1000, f"135M single-stream decode >= 1,000 tok/s ({_fmt(d135)})")
    )
    b8 = shapes.get("llama-3.1-8b", {}).get("bench") or {}
    floor8 = bounds(b8, m)["decode_tok_s"] if b8 else None
    d8 = b8.get("decode_tok_s")
    out.append(
        verdict(
            None if not (d8 and floor8) else d8 >= 0.5 * floor8,
            f"8B Q4_0 single-stream decode >= 50% of its bound ({_fmt(d8)} of {_fmt(floor8)} tok/s)",
        )
    )
    for name, shape in shapes.items():
        f64 = ((shape.get("bench") or {}).get("aggregate_tok_s") or {}).get("64")
        t64 = ((shape.get("torch") or {}).get("aggregate_tok_s") or {}).get("64")
        out.append(
            verdict(
                None if not (f64 and t64) else f64 >= t64,
                f"{name}: aggregate at 64 sequences >= PyTorch generate ({_fmt(f64)} vs {_fmt(t64)} tok/s)",
            )
        )
    return out


# ---- workers ----------------------------------------------------------------------------------------------------


async def _aggregate(engine: Any, n: int, decode_len: int) -> float:
    """Tokens/s while n sequences decode together (engine/bench.py's window: all decoding, until the first ends)."""
    from engine.bench import _raw_prompt, _run

    await engine.reset_prefix_cache()
    runs = await asyncio.gather(*(_run(engine, _raw_prompt(engine, 32, 100 + n + i), decode_len) for i in range(n)))
    t0 = max(run["stamps"][0] for run in runs)
    t1 = min(run["stamps"][-1] for run in runs)
    window = sum(sum(t0 < s <= t1 for s in run["stamps"]) for run in runs)
    return window / (t1 - t0) if t1 > t0 else 0.0


def bench_worker(args: argparse.Namespace) -> dict[str, Any]:
    """`forge bench`'s workload (engine/bench.py) on one model in this process, plus aggregate decode at 64
    sequences."""
    from engine import Engine
    from engine.bench import _bench

    t0 = time.perf_counter()
    engine = Engine.load(
        model=args.model,
        backend=args.backend,
        kv_memory=args.kv_memory,
        speculative="off",
        threads=args.threads,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )  # decode graphs (CuPy) are captured here, outside every timed window
    info = engine.model_info
    loaded = {
        "load_s": time.perf_counter() - t0,
        "weight_bytes": info["weight_bytes"],
        "num_params": info["num_params"],
    }

    def report(partial: dict[str, Any]) -> None:  # after every section: a worker stopped later keeps these
        partial.pop("chat_turns", None)
        write_json(Path(args.json_out), {**partial, **loaded})

    report({})

    async def main() -> dict[str, Any]:
        try:
            result = await _bench(engine, args.quick, False, report)
            for n in AGGREGATE:
                if str(n) not in result["aggregate_tok_s"]:
                    result["aggregate_tok_s"][str(n)] = await _aggregate(engine, n, result["decode_tokens"])
                    report(dict(result))
            return result
        finally:
            await engine.shutdown()

    result = asyncio.run(main())
    result.update(loaded)
    result.pop("chat_turns", None)
    print(
        json.dumps({k: result[k] for k in ("prefill_tok_s", "ttft_ms", "decode_tok_s", "aggregate_tok_s")}),
        file=sys.stderr,
    )
    return result


def torch_worker(args: argparse.Namespace) -> dict[str, Any]:
    """PyTorch's eager `generate` on the same shape: transformers' LlamaForCausalLM, random weights, greedy."""
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as exc:
        print(f"PyTorch peer skipped: {exc}", file=sys.stderr)
        raise SystemExit(3) from None
    from engine.loader.synth import PRESET_CONFIGS, SYNTH_VOCAB

    vocab = VOCAB.get(args.shape, SYNTH_VOCAB)

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("PyTorch peer skipped: torch sees no CUDA device", file=sys.stderr)
        raise SystemExit(3)
    cfg = dict(TINY_CONFIG) if args.shape == DRY_SHAPE else dict(PRESET_CONFIGS[args.shape])
    cfg.pop("rope_scaling", None)  # the same work per token; its spelling differs between transformers versions
    config = LlamaConfig(**cfg, vocab_size=vocab)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    try:
        try:
            torch.set_default_dtype(dtype)  # made in bf16 on the device: no float32 copy of an 8B model
        except (TypeError, RuntimeError):
            pass  # made in float32 and converted below: twice the memory for a moment
        with device:
            model = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    model = model.to(dtype)
    gen = torch.Generator(device="cpu").manual_seed(1)
    decode_len = 32 if args.quick else 128

    def ids(length: int, batch: int = 1) -> Any:
        return torch.randint(3, SYNTH_VOCAB, (batch, length), generator=gen).to(device)  # ids text can give

    def timed(fn: Callable[[], Any]) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.inference_mode():
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    def generate(x: Any, new: int) -> Any:
        return model.generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
        )

    timed(lambda: generate(ids(32), 4))  # warm-up
    prompt = ids(PREFILL_TOKENS)
    timed(lambda: model(prompt))
    out: dict[str, Any] = {
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(device),
        "params": sum(p.numel() for p in model.parameters()),
        "prefill_tok_s": PREFILL_TOKENS / min(timed(lambda: model(prompt)) for _ in range(2)),
        "ttft_ms": 1000 * min(timed(lambda: generate(ids(args.chat_tokens), 1)) for _ in range(3)),
        "decode_tokens": decode_len,
    }

    def rate(batch: int) -> float:
        x = ids(32, batch)
        timed(lambda: generate(x, 2))  # this batch size's first kernels and allocations, outside the timing
        one, many = timed(lambda: generate(x, 1)), timed(lambda: generate(x, decode_len))
        return batch * (decode_len - 1) / (many - one) if many > one else 0.0

    out["decode_tok_s"] = rate(1)
    out["aggregate_tok_s"] = {str(n): rate(n) for n in AGGREGATE}
    if device.type == "cuda":
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    print(json.dumps(out), file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("bench-worker", "torch-worker"):
        p = argparse.ArgumentParser(prog=f"gpu_check.py {argv[0]}")
        p.add_argument("--json-out", required=True)
        p.add_argument("--quick", action="store_true")
        if argv[0] == "bench-worker":
            p.add_argument("--model", required=True)
            p.add_argument("--backend", default="cupy")
            p.add_argument("--kv-memory", default="1GiB")
            p.add_argument("--threads", type=int, default=None)
        else:
            p.add_argument("--shape", required=True)
            p.add_argument("--device", default="cuda")
            p.add_argument("--chat-tokens", type=int, default=40)
        args = p.parse_args(argv[1:])
        result = (bench_worker if argv[0] == "bench-worker" else torch_worker)(args)
        write_json(Path(args.json_out), result)
        return 0
    p = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--dry-run", action="store_true", help="no GPU: NumPy backend, a tiny shape, PyTorch on the CPU if present"
    )
    p.add_argument("--out", default=None, help="results folder (default: $OUT, else ./gpu-results)")
    p.add_argument("--models", default="/tmp/forge-gpu-models", help="where the synthetic GGUFs are written")
    p.add_argument(
        "--tokenizer",
        default=None,
        help="a GGUF whose tokenizer the synthetic models carry "
        "(default: .gpu-wheels/tokenizer.gguf, else the default model)",
    )
    p.add_argument(
        "--shapes", default=None, help=f"comma-separated (default: {','.join(SHAPES)}; dry run: {DRY_SHAPE})"
    )
    p.add_argument("--stages", default=None, help=f"comma-separated subset of {','.join(STAGES)} (default: all)")
    p.add_argument("--backend", default=None, help="Forge's backend (default: cupy; dry run: numpy)")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop starting stages after this many seconds")
    p.add_argument("--full", action="store_true", help="forge bench's full workload instead of --quick")
    return main_check(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
