"""Hub model names: `hf:OWNER/REPO[/FILE.gguf][:QUANT]`, a GGUF file's quantization label, and the rule that
picks one GGUF among a repository's files (docs/models.md)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from engine.loader.errors import ModelLoadError

PREFIX = "hf:"
DEFAULT_QUANT = "Q4_K_M"  # what a repository of several quantizations gives without --quant (Ollama's choice too)

# The quantization label in a file name: the last of Q4_K_M, Q8_0, IQ4_XS, TQ1_0, F16, BF16, ... between separators.
_QUANT = re.compile(r"(?:^|[-_.])((?:I|T)?Q\d(?:_[A-Z0-9]+)*|BF16|F16|FP16|F32)(?=$|[-_.])", re.IGNORECASE)
# llama.cpp's split files: one model in parts, model-00001-of-00003.gguf; the loader reads single files only
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)
_REPO_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class HubError(ModelLoadError):
    """A hub model cannot be named, found, fetched or trusted; the message says which and what to do."""


@dataclass(slots=True, frozen=True)
class HubRef:
    """A model on the hub: a repository, and maybe one file in it or a quantization to pick."""

    repo: str  # "owner/name"
    file: str | None = None  # a path inside the repository
    quant: str | None = None  # e.g. "Q4_K_M", upper case

    def __str__(self) -> str:
        name = f"{PREFIX}{self.repo}" + (f"/{self.file}" if self.file else "")
        return name + (f":{self.quant}" if self.quant else "")


def is_hub_name(model: str) -> bool:
    """True for `hf:...` model names (the only ones that may reach the network)."""
    return model.startswith(PREFIX)


def parse_hub_ref(text: str, quant: str | None = None) -> HubRef:
    """`[hf:]OWNER/REPO[/FILE][:QUANT]` -> HubRef; `quant` (a --quant flag) joins or must agree with the name's."""
    body = text[len(PREFIX) :] if text.startswith(PREFIX) else text
    named_quant = None
    if ":" in body:
        body, named_quant = body.rsplit(":", 1)
        if not named_quant:
            raise HubError(f"{text!r}: nothing after ':' (expected a quantization such as {DEFAULT_QUANT})")
    parts = body.strip("/").split("/")
    if len(parts) < 2 or not all(_REPO_PART.fullmatch(p) for p in parts[:2]):
        raise HubError(f"{text!r} is not a hub model name: expected OWNER/REPO[/FILE.gguf][:QUANT]")
    if named_quant and quant and named_quant.upper() != quant.upper():
        raise HubError(f"{text!r} names quantization {named_quant} but --quant says {quant}")
    chosen = (named_quant or quant or "").upper() or None
    file = "/".join(parts[2:]) or None
    if file and chosen:
        raise HubError(f"{text!r} names a file and a quantization: give one of them")
    if file and any(p in ("", ".", "..") for p in parts[2:]):
        raise HubError(f"{text!r}: bad file path {file!r}")
    return HubRef("/".join(parts[:2]), file, chosen)


def quant_of(filename: str) -> str | None:
    """The quantization label a GGUF file's name carries ("Q4_K_M", "F16"), or None."""
    stem = filename.rsplit("/", 1)[-1]
    stem = stem[: -len(".gguf")] if stem.lower().endswith(".gguf") else stem
    found = _QUANT.findall(stem)
    return found[-1].upper() if found else None


def is_model_gguf(filename: str) -> bool:
    """A .gguf file that is a whole model: not a split part, not a vision projector (mmproj)."""
    base = filename.rsplit("/", 1)[-1].lower()
    return base.endswith(".gguf") and not _SPLIT.search(base) and not base.startswith("mmproj")


def choose_gguf(ref: HubRef, files: Mapping[str, int | None]) -> str:
    """The file `ref` names among a repository's `files` (path -> size in bytes, None when unknown).

    The rule: a named file must be there and be a .gguf; otherwise the model GGUFs (split parts and
    projectors left out) are the candidates: with `ref.quant`, the one whose name carries it; with
    none, the only one, else the one labelled DEFAULT_QUANT; anything else is an error listing them.
    """
    if ref.file is not None:
        if ref.file not in files:
            raise HubError(f"{ref.repo} has no file {ref.file!r}{_listing(files)}")
        if not ref.file.lower().endswith(".gguf"):
            raise HubError(
                f"{ref.file!r} is not a GGUF file (.gguf): forge pulls and loads GGUF files{_listing(files)}"
            )
        return ref.file
    models = {f: s for f, s in files.items() if is_model_gguf(f)}
    if not models:
        split = sorted(f for f in files if _SPLIT.search(f))
        if split:
            raise HubError(f"{ref.repo} holds only split GGUF files ({split[0]}, ...): forge loads single-file GGUFs")
        shown = ", ".join(sorted(files)[:8]) + (", ..." if len(files) > 8 else "")
        raise HubError(f"{ref.repo} holds no GGUF file (it has: {shown or 'nothing'})")
    if ref.quant:
        picked = [f for f in models if quant_of(f) == ref.quant]
        if len(picked) == 1:
            return picked[0]
        why = "several files carry" if picked else "no GGUF file carries"
        raise HubError(f"{ref.repo}: {why} quantization {ref.quant}{_listing(dict.fromkeys(picked) or models, files)}")
    if len(models) == 1:
        return next(iter(models))
    default = [f for f in models if quant_of(f) == DEFAULT_QUANT]
    if len(default) == 1:
        return default[0]
    raise HubError(
        f"{ref.repo} holds {len(models)} GGUF files and none is {DEFAULT_QUANT}: choose one with --quant "
        f"(or {PREFIX}{ref.repo}:QUANT) or name the file{_listing(models)}"
    )


def _listing(files: Mapping[str, int | None], sizes: Mapping[str, int | None] | None = None) -> str:
    ggufs = sorted(f for f in files if is_model_gguf(f))
    if not ggufs:
        return ""
    sizes = sizes or files
    rows = [f"  {f}  {quant_of(f) or '-'}  {format_size(sizes.get(f))}" for f in ggufs]
    return ":\n" + "\n".join(rows)


def format_size(n: int | None) -> str:
    """Bytes for people: 1.3 GB, 812 MB, 4.2 kB (decimal units, as the hub shows them)."""
    if n is None:
        return "?"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
