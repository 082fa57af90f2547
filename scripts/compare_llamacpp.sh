#!/usr/bin/env bash
# Forge against llama.cpp on the same GGUF and threads, one after the other in one run, side by side
# with the ratios. On shared machines only figures taken in the same run compare; docs/performance.md
# says how the published tables were taken.
#
# llama.cpp is its own C++ `llama-bench` (prefill and single-stream decode) and, where built,
# `llama-batched-bench` (N sequences decoding at once), from the llama.cpp tree vendored in the
# llama-cpp-python 0.3.36 sdist. The first run builds them under $LLAMACPP_REF (needs cmake and a C++
# compiler; ~6 min on 2 cores); LLAMA_CPP_BIN=DIR uses binaries already built in DIR instead.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
usage="usage: scripts/compare_llamacpp.sh [--model FILE.gguf] [--threads N] [--reps N] [--quick] [-- FORGE_FLAGS...]
  --model FILE   a GGUF both programs load (default: Forge's default model, SmolLM2-135M-Instruct Q4_1)
  --threads N    threads for both (default 2)
  --reps N       llama-bench repetitions (default 3)
  --quick        forge bench --quick, and 32 generated tokens a test instead of 128 on both sides
  after --       extra flags for forge bench (e.g. --kv-memory 90MiB)
environment: LLAMA_CPP_BIN=DIR (an existing build's bin/, skips the build), LLAMACPP_REF=DIR (cache and
  results, default /tmp/llamacpp-ref), LLAMA_REPACK=0|1 (llama-bench --repack; default 0 on CPUs with AMX,
  whose repacked AMX path crashed on multi-token batches, else llama.cpp's default)"

die() { echo "compare_llamacpp: $*" >&2; exit 1; }

model=default threads=2 reps=3 quick=0
forge_extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) [ $# -ge 2 ] || die "--model needs a file"; model=$2; shift 2 ;;
    --threads) [ $# -ge 2 ] || die "--threads needs a number"; threads=$2; shift 2 ;;
    --reps) [ $# -ge 2 ] || die "--reps needs a number"; reps=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    --) shift; forge_extra=("$@"); break ;;
    *) echo "$usage" >&2; die "unknown argument: $1" ;;
  esac
done
[[ $threads =~ ^[1-9][0-9]*$ ]] || die "--threads must be a positive integer, got '$threads'"
[[ $reps =~ ^[1-9][0-9]*$ ]] || die "--reps must be a positive integer, got '$reps'"

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
py=$root/.venv/bin/python
forge=$root/.venv/bin/forge
[ -x "$forge" ] || die "no $forge: run 'make serve' or 'make test' first"

if [ "$model" = default ]; then
  gguf=$("$py" -c 'from engine.loader import resolve_model_path; print(resolve_model_path("default"))') \
    || die "the default model is not installed (make serve installs it)"
else
  [ -f "$model" ] || die "no such GGUF file: $model"
  gguf=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")
fi
case "$gguf" in *.gguf) ;; *) die "llama.cpp reads GGUF only: $gguf" ;; esac

ref=${LLAMACPP_REF:-/tmp/llamacpp-ref}
results=$ref/results
mkdir -p "$results"

# --- llama.cpp's binaries -------------------------------------------------------------------------
if [ -n "${LLAMA_CPP_BIN:-}" ]; then
  bin=$LLAMA_CPP_BIN
  [ -x "$bin/llama-bench" ] || die "LLAMA_CPP_BIN=$bin holds no llama-bench"
else
  src=$ref/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp
  bin=$src/build/bin
  if [ ! -x "$bin/llama-bench" ]; then
    command -v cmake >/dev/null || die "building llama.cpp needs cmake (or set LLAMA_CPP_BIN to a build's bin/)"
    command -v c++ >/dev/null || die "building llama.cpp needs a C++ compiler (or set LLAMA_CPP_BIN)"
    echo "building llama.cpp (llama-cpp-python $LLAMA_CPP_PYTHON_VERSION's vendored tree) into $ref"
    echo "  (~6 min on 2 cores; log: $ref/build.log)"
    if [ ! -d "$src" ]; then
      "$py" -m pip download -q --no-binary :all: --no-deps -d "$ref" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" \
        > "$ref/build.log" 2>&1 || die "could not download the llama-cpp-python sdist (see $ref/build.log)"
      tar xzf "$ref/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$ref"
    fi
    cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >> "$ref/build.log" 2>&1 \
      || die "cmake failed (see $ref/build.log)"
    cmake --build "$src/build" --target llama-bench llama-batched-bench -j "$(nproc)" >> "$ref/build.log" 2>&1 \
      || die "the llama.cpp build failed (see $ref/build.log)"
  fi
fi
export LD_LIBRARY_PATH=$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

if [ -n "${LLAMA_REPACK:-}" ]; then
  repack=$LLAMA_REPACK
elif grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
  repack=0
else
  repack=""
fi

n_prompt=500
n_gen=$([ "$quick" = 1 ] && echo 32 || echo 128)
echo "model   $gguf"
echo "threads $threads; llama-bench: $reps repetitions, pp$n_prompt, tg$n_gen${repack:+, --repack $repack}"

# --- llama.cpp -----------------------------------------------------------------------------------
# Peak RSS of a child, read by its parent: llama-bench reports none of its own.
rss_of() { "$py" - "$@" <<'PY'
import resource, subprocess, sys
out = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, check=True).stdout
sys.stdout.buffer.write(out)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, file=sys.stderr)
PY
}

echo "llama.cpp: llama-bench ..."
rss_of "$bin/llama-bench" -m "$gguf" -t "$threads" -p "$n_prompt" -n "$n_gen" -r "$reps" -o json \
  ${repack:+--repack "$repack"} > "$results/llama_bench.json" 2> "$results/llama_bench.err" \
  || { tail -5 "$results/llama_bench.err" >&2; die "llama-bench failed (see $results/llama_bench.err)"; }
tail -1 "$results/llama_bench.err" > "$results/llama_bench.rss_mb"

rm -f "$results/llama_batched.jsonl"
if [ -x "$bin/llama-batched-bench" ]; then
  echo "llama.cpp: llama-batched-bench, 8 and 32 sequences ..."
  # as forge bench: 32-token prompts, one a sequence, then n_gen tokens each
  "$bin/llama-batched-bench" -m "$gguf" -t "$threads" -tb "$threads" -c $((32 * (32 + n_gen))) -b 2048 -ub 512 \
    -npp 32 -ntg "$n_gen" -npl 8,32 --output-format jsonl \
    > "$results/llama_batched.out" 2> "$results/llama_batched.err" \
    || { tail -5 "$results/llama_batched.err" >&2; die "llama-batched-bench failed (see $results/llama_batched.err)"; }
  cat "$results/llama_batched.out" "$results/llama_batched.err" | grep '^{"n_kv_max"' > "$results/llama_batched.jsonl" \
    || die "llama-batched-bench printed no results (see $results/llama_batched.err)"
else
  echo "llama.cpp: no llama-batched-bench in $bin: the aggregate rows are left out"
fi

# --- Forge ---------------------------------------------------------------------------------------
echo "forge bench ..."
forge_flags=(--model "$gguf" --threads "$threads" --json)
[ "$quick" = 1 ] && forge_flags+=(--quick)
"$forge" bench "${forge_flags[@]}" ${forge_extra[@]+"${forge_extra[@]}"} \
  > "$results/forge_bench.json" 2> "$results/forge_bench.err" \
  || { tail -5 "$results/forge_bench.err" >&2; die "forge bench failed (see $results/forge_bench.err)"; }

# --- side by side --------------------------------------------------------------------------------
"$py" - "$results" "$n_prompt" "$n_gen" <<'PY'
import json, sys
from pathlib import Path

results, n_prompt, n_gen = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
text = (results / "forge_bench.json").read_text()
forge = json.loads(text[text.index("{"):])
llama = {(t["n_prompt"], t["n_gen"]): t for t in json.loads((results / "llama_bench.json").read_text())}
batched = {}
path = results / "llama_batched.jsonl"
if path.exists():
    batched = {r["pl"]: r for r in map(json.loads, path.read_text().splitlines())}
llama_rss = float((results / "llama_bench.rss_mb").read_text())


def ts(key):
    t = llama.get(key)
    return (t["avg_ts"], t["stddev_ts"]) if t else (None, None)


rows = [
    (f"prefill tok/s ({n_prompt}-token prompt)", forge["prefill_tok_s"], *ts((n_prompt, 0)), True),
    (f"single-stream decode tok/s ({n_gen} tokens)", forge["decode_tok_s"], *ts((0, n_gen)), True),
]
for n in (8, 32):
    b = batched.get(n)
    rows.append((f"aggregate decode tok/s, {n} seqs", forge["aggregate_tok_s"][str(n)],
                 b["speed_tg"] if b else None, None, True))
rows.append(("peak RSS MB", forge["peak_rss_mb"], llama_rss, None, False))

print(f"\n{'':42s}{'forge':>10s}{'llama.cpp':>12s}{'ratio':>8s}")
for name, f, l, sd, higher in rows:
    if l is None:
        print(f"{name:42s}{f:10.1f}{'-':>12s}")
        continue
    note = f"  (llama.cpp +-{sd:.1f})" if sd else ""
    if not higher:
        note += "  (lower is better)"
    print(f"{name:42s}{f:10.1f}{l:12.1f}{f / l:7.2f}x{note}")
print(f"\nforge: {forge['model']}, {forge['backend']} backend, {forge['threads']} threads, "
      f"{forge['activations']} activations, KV budget {forge['kv_context_tokens']} tokens; "
      f"llama.cpp {next(iter(llama.values()))['build_commit']}: llama-bench n_ctx {n_prompt + n_gen}, "
      f"repack {next(iter(llama.values()))['repack']}.")
print(f"raw results: {results}")
PY
