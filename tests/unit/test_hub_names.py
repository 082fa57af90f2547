"""Hub model names and the rule that picks one GGUF of a repository (engine/loader/hub_names.py)."""

from __future__ import annotations

import errno

import pytest

from engine.loader.hub_errors import explain
from engine.loader.hub_names import HubError, HubRef, choose_gguf, parse_hub_ref, quant_of


@pytest.mark.parametrize(
    ("text", "quant", "ref"),
    [
        ("hf:org/repo", None, HubRef("org/repo")),
        ("org/repo", None, HubRef("org/repo")),
        ("hf:org/repo/model-Q8_0.gguf", None, HubRef("org/repo", "model-Q8_0.gguf")),
        ("hf:org/repo/sub/dir/m.gguf", None, HubRef("org/repo", "sub/dir/m.gguf")),
        ("hf:org/repo:q4_k_m", None, HubRef("org/repo", None, "Q4_K_M")),
        ("org/repo", "q8_0", HubRef("org/repo", None, "Q8_0")),
        ("org/repo:Q8_0", "q8_0", HubRef("org/repo", None, "Q8_0")),
    ],
)
def test_names_parse(text, quant, ref):
    assert parse_hub_ref(text, quant) == ref


@pytest.mark.parametrize(
    ("text", "quant", "says"),
    [
        ("hf:repo", None, "OWNER/REPO"),
        ("hf:org/repo:", None, "nothing after ':'"),
        ("hf:org/repo:Q4_0", "Q8_0", "--quant says Q8_0"),
        ("hf:org/repo/m.gguf:Q4_0", None, "give one of them"),
        ("hf:org/repo/../m.gguf", None, "bad file path"),
        ("hf:../etc/x", None, "not a hub model name"),
    ],
)
def test_bad_names_are_refused_with_a_reason(text, quant, says):
    with pytest.raises(HubError, match=says.replace("(", r"\(")):
        parse_hub_ref(text, quant)


@pytest.mark.parametrize(
    ("name", "quant"),
    [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
        ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
        ("qwen2.5-0.5b-instruct-q8_0.gguf", "Q8_0"),
        ("gemma-IQ4_XS.gguf", "IQ4_XS"),
        ("model-f16.gguf", "F16"),
        ("model-BF16.gguf", "BF16"),
        ("sub/Model-UD-Q4_K_XL.gguf", "Q4_K_XL"),
        ("model.gguf", None),
        ("Q4dragon.gguf", None),
    ],
)
def test_quant_label_from_the_file_name(name, quant):
    assert quant_of(name) == quant


FILES = {"m-Q4_0.gguf": 100, "m-Q8_0.gguf": 200, "README.md": 5, "mmproj-m-f16.gguf": 50}


def test_choice_rule():
    assert choose_gguf(HubRef("o/r"), {"only.gguf": 1, "config.json": 2}) == "only.gguf"
    assert choose_gguf(HubRef("o/r", quant="Q8_0"), FILES) == "m-Q8_0.gguf"
    assert choose_gguf(HubRef("o/r"), FILES | {"m-Q4_K_M.gguf": 150}) == "m-Q4_K_M.gguf"  # the default rule
    assert choose_gguf(HubRef("o/r", "m-Q4_0.gguf"), FILES) == "m-Q4_0.gguf"


def test_several_without_a_choice_lists_them_with_sizes():
    with pytest.raises(HubError) as e:
        choose_gguf(HubRef("o/r"), FILES)
    msg = str(e.value)
    assert "--quant" in msg and "m-Q4_0.gguf  Q4_0  100 B" in msg and "m-Q8_0.gguf  Q8_0  200 B" in msg
    assert "mmproj" not in msg and "README" not in msg  # not models


def test_choice_errors():
    with pytest.raises(HubError, match="no GGUF file carries quantization Q6_K"):
        choose_gguf(HubRef("o/r", quant="Q6_K"), FILES)
    with pytest.raises(HubError, match="has no file 'x.gguf'"):
        choose_gguf(HubRef("o/r", "x.gguf"), FILES)
    with pytest.raises(HubError, match="not a GGUF file"):
        choose_gguf(HubRef("o/r", "README.md"), FILES)
    with pytest.raises(HubError, match="holds no GGUF file"):
        choose_gguf(HubRef("o/r"), {"model.safetensors": 1, "config.json": 1})
    with pytest.raises(HubError, match="split GGUF"):
        choose_gguf(HubRef("o/r"), {"m-Q4_0-00001-of-00002.gguf": 1, "m-Q4_0-00002-of-00002.gguf": 1})


def test_a_full_disk_mid_download_is_said_plainly():
    err = explain(OSError(errno.ENOSPC, "No space left on device"), HubRef("o/r", "m.gguf"), "downloading m.gguf", "x")
    assert "disk full" in str(err) and "forge rm" in str(err)
