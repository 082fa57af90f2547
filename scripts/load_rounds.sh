#!/bin/bash
# Forge and llama.cpp's llama-server under the same 64-client x 10-turn chat load, alternately.
#
#   scripts/load_rounds.sh LLAMA_BIN_DIR MODEL.gguf [ROUNDS]
#
# Each round starts `forge serve` (default model, no keys, a fresh SQLite file), runs
# scripts/load_chats.py over /v1, stops it, then does the same against `llama-server -t 2 -tb 2
# -np 64 -c 65536 -m MODEL.gguf` (pass the GGUF Forge serves by default, so both run the same bytes).
# A last run takes Forge over /ws. Alternating rounds, because this kind of machine's memory
# bandwidth moves between minutes. Results: one JSON per run in $OUT (default /tmp/forge-load).
set -euo pipefail
cd "$(dirname "$0")/.."
LB=${1:?llama.cpp bin dir (llama-server)}
GGUF=${2:?GGUF file for llama-server}
ROUNDS=${3:-2}
OUT=${OUT:-/tmp/forge-load}
mkdir -p "$OUT"
LOAD=(--clients 64 --turns 10 --max-tokens 16 --json)

forge() {  # name, extra load_chats args
  rm -rf "$OUT/db" && mkdir -p "$OUT/db"
  .venv/bin/forge serve --port 8941 --db "sqlite+aiosqlite:///$OUT/db/forge.db" > "$OUT/forge.log" 2>&1 &
  local pid=$!
  for _ in $(seq 180); do curl -s localhost:8941/ready | grep -q ready && break; sleep 1; done
  .venv/bin/python scripts/load_chats.py --base-url http://127.0.0.1:8941/v1 "${@:2}" "${LOAD[@]}" > "$OUT/$1.json"
  kill $pid; wait $pid 2>/dev/null || true
}

llama() {  # name
  LD_LIBRARY_PATH=$LB "$LB/llama-server" -m "$GGUF" -t 2 -tb 2 -np 64 -c 65536 --port 8942 > "$OUT/llama.log" 2>&1 &
  local pid=$!
  for _ in $(seq 180); do curl -s localhost:8942/health | grep -q ok && break; sleep 1; done
  .venv/bin/python scripts/load_chats.py --base-url http://127.0.0.1:8942/v1 "${LOAD[@]}" > "$OUT/$1.json"
  kill $pid; wait $pid 2>/dev/null || true
}

runs=()
for r in $(seq "$ROUNDS"); do
  forge "forge_v1_$r"; llama "llama_$r"; runs+=("forge_v1_$r" "llama_$r")
done
forge forge_ws --mode ws; runs+=(forge_ws)
for name in "${runs[@]}"; do
  .venv/bin/python -c "import json, sys; d = json.load(open(sys.argv[1])); print(f\"{sys.argv[2]:12s} {d['completed']}/{d['expected']} turns  {d['tokens_per_s']:6.1f} tok/s  TTFT p50/p95 {d['ttft_ms']['p50']:.0f}/{d['ttft_ms']['p95']:.0f} ms  errors {d['errors']}\")" "$OUT/$name.json" "$name"
done
