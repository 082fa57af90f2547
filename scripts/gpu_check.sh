#!/usr/bin/env bash
# The prepared GPU check, one command on a lent GPU machine (docs/gpu.md):
#
#   bash scripts/gpu_check.sh --fetch-wheels   here, once: llguidance and gguf wheels for Python 3.12 and a small
#                                              GGUF carrying the default tokenizer, into .gpu-wheels/ (git-ignored)
#   bash scripts/gpu_check.sh                  on the GPU machine (carry .gpu-wheels): results in $OUT, else ./gpu-results
#   bash scripts/gpu_check.sh --dry-run        on any machine without a GPU: the same steps on the NumPy backend
#
# Other arguments go to scripts/gpu_check.py (--help). The GPU machine has no network and no project venv: its own
# python3 (CuPy for CUDA 13, torch, transformers, numpy, tokenizers, jinja2 preinstalled) runs the check, with the
# carried wheels installed into a folder of their own (never the `gpu` extras: a second cupy would collide).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELS="$REPO/.gpu-wheels"
SITE="${TMPDIR:-/tmp}/forge-gpu-site"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO/.venv/bin/python" ]]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python3; fi
fi

pin() {  # the version pyproject.toml pins for a dependency
    sed -n "s/^ *\"$1==\([^\"]*\)\".*/\1/p" "$REPO/pyproject.toml" | head -n 1
}

if [[ "${1:-}" == "--fetch-wheels" ]]; then
    mkdir -p "$WHEELS"
    platforms=()
    for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" --platform manylinux2014_x86_64 -d "$WHEELS" \
        "llguidance==$(pin llguidance)" "gguf==$(pin gguf)" || exit 1
    # The synthetic models' tokenizer: the default model (98 MB) cannot travel, a tiny model carrying its tokenizer can.
    cat > "$WHEELS/tokenizer-config.json" <<'EOF'
{"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
 "num_key_value_heads": 1, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 4096,
 "tie_word_embeddings": true}
EOF
    (cd "$REPO" && "$PYTHON" -m app.cli synth --config "$WHEELS/tokenizer-config.json" --quant q4_0 \
        --out "$WHEELS/tokenizer.gguf") || exit 1
    rm -f "$WHEELS/tokenizer-config.json"
    ls -l "$WHEELS"
    du -sh "$WHEELS"
    exit 0
fi

dry=0
for arg in "$@"; do [[ "$arg" == "--dry-run" ]] && dry=1; done
OUT_DIR="${OUT:-$REPO/gpu-results}"
mkdir -p "$OUT_DIR"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
if [[ $dry == 0 ]] && ! "$PYTHON" -c "import llguidance, gguf" 2>/dev/null; then
    if ! compgen -G "$WHEELS/*.whl" >/dev/null; then
        echo "gpu_check: llguidance or gguf is missing and $WHEELS holds no wheels (run --fetch-wheels here first)" >&2
        exit 2
    fi
    "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$WHEELS"/*.whl 2>&1 | tee -a "$OUT_DIR/check.log" || exit 1
    export PYTHONPATH="$REPO:$SITE${PYTHONPATH#"$REPO"}"
fi
cd "$REPO" || exit 1
exec "$PYTHON" scripts/gpu_check.py --out "$OUT_DIR" "$@"
