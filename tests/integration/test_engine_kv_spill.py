"""The KV spill tier on the real default model (numba): a conversation's blocks evicted under a small KV budget are
read back on its next turn, the reply identical to a cold run; a corrupt or truncated file is recomputed; the disk
budget holds; a new engine on the same folder restores; bad flags are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_helpers import chat_prompt, greedy, make_core, run_all

from engine.kv_spill_file import SUFFIX, block_digest, file_size

BLOCK = 16
KV_BLOCKS = 24  # the small KV budget: a second conversation evicts the first


def kv_memory(core_blocks: int = KV_BLOCKS) -> int:
    return core_blocks * 2 * 30 * BLOCK * 3 * 64 * 4  # the default model's float32 K and V per block


def conversation(core) -> tuple[list[int], list[int]]:
    """A first turn's prompt and the next turn's (first prompt + a reply + a new question)."""
    history = [{"role": "user", "content": "Tell me about lighthouses. " + "The keeper climbs the stairs. " * 30}]
    first = chat_prompt(core, history)
    history += [
        {"role": "assistant", "content": "Lighthouses guide ships along dangerous coasts at night."},
        {"role": "user", "content": "Who keeps them today?"},
    ]
    return first, chat_prompt(core, history)


def other_prompt(core) -> list[int]:
    return chat_prompt(core, [{"role": "user", "content": "Describe a quiet harbor at dawn. " * 40}])


def one(core, prompt: list[int], tokens: int = 8) -> list[int]:
    return next(iter(run_all(core, [greedy(prompt, tokens, ignore_eos=True)]).values())).token_ids


def digests(prompt: list[int]) -> list[bytes]:
    out, parent = [], None
    for start in range(0, len(prompt) - 1 - (len(prompt) - 1) % BLOCK, BLOCK):
        parent = block_digest(parent, tuple(prompt[start : start + BLOCK]))
        out.append(parent)
    return out


@pytest.fixture(scope="module")
def cold(default_model):
    """The next turn's greedy reply from an engine with nothing cached, and the two prompts."""
    core = make_core(default_model, kv_memory=kv_memory(), block_size=BLOCK)
    first, second = conversation(core)
    return first, second, one(core, second)


def spilled_core(default_model, folder: Path, first: list[int], size: int = 1 << 30):
    """An engine with a spill tier that ran the first turn, then another conversation that evicted it."""
    core = make_core(
        default_model, kv_memory=kv_memory(), block_size=BLOCK, kv_spill_dir=str(folder), kv_spill_size=size
    )
    one(core, first)
    one(core, other_prompt(core))
    assert core.blocks.stats.evictions > 0
    core.blocks.spill.flush()
    return core


def test_evicted_conversation_restores_and_replies_as_a_cold_run(default_model, cold, tmp_path):
    first, second, want = cold
    core = spilled_core(default_model, tmp_path, first)
    try:
        spill = core.blocks.spill
        assert spill.stats.spilled_blocks >= len(digests(first)) // 2
        before = spill.stats.restored_blocks
        result = next(iter(run_all(core, [greedy(second, 8, ignore_eos=True)]).values()))
        restored = spill.stats.restored_blocks - before
        assert restored >= 4
        assert result.final.usage.cached_tokens >= restored * BLOCK  # restored tokens were not recomputed
        assert result.token_ids == want
        stats = core.stats()
        assert stats["kv_restored_blocks"] == spill.stats.restored_blocks and stats["kv_spill_hit_rate"] > 0
        assert stats["kv_spilled_bytes"] > 0 and stats["kv_spill_restore_seconds"] > 0
    finally:
        core.close()


def test_a_corrupt_or_truncated_file_is_recomputed_never_trusted(default_model, cold, tmp_path):
    first, second, want = cold
    core = spilled_core(default_model, tmp_path, first)
    try:
        spill = core.blocks.spill
        in_memory = len(core.blocks.match_prefix(second))
        chain = digests(second)[in_memory:]  # the blocks the next turn finds only in the tier
        paths = [spill.dir / (d.hex() + SUFFIX) for d in chain]
        assert len(paths) >= 6 and all(p.exists() for p in paths[:6])
        data = bytearray(paths[2].read_bytes())
        data[len(data) // 2] ^= 0x40  # one bit of one K/V value
        paths[2].write_bytes(bytes(data))
        paths[4].write_bytes(paths[4].read_bytes()[:-7])
        assert one(core, second) == want
        assert spill.stats.restored_blocks == 2 and spill.stats.discarded == 1 and not paths[2].exists()
        # The truncated file, reached by a walk: refused and deleted, the block recomputed.
        start = (in_memory + 4) * BLOCK
        tokens = tuple(second[start : start + BLOCK])
        free = next(iter(core.blocks.free))
        assert not spill.restore(chain[4], tokens, free)
        assert spill.stats.discarded == 2 and not paths[4].exists()
    finally:
        core.close()


def test_the_disk_budget_holds(default_model, cold, tmp_path):
    first, _, _ = cold
    budget = 5 * file_size(BLOCK, kv_memory(1))
    core = spilled_core(default_model, tmp_path, first, size=budget)
    try:
        spill = core.blocks.spill
        files = list(spill.dir.glob("*" + SUFFIX))
        assert spill.stats.spilled_blocks > 5 and len(files) == 5
        assert sum(f.stat().st_size for f in files) == spill.num_bytes <= budget
    finally:
        core.close()
    assert len(list(spill.dir.glob("*" + SUFFIX))) == 5  # closing spills what is cached, within the budget


def test_a_new_engine_on_the_same_folder_restores(default_model, cold, tmp_path):
    first, second, want = cold
    spilled_core(default_model, tmp_path, first).close()  # closing spills the blocks still cached too
    core = make_core(
        default_model, kv_memory=kv_memory(), block_size=BLOCK, kv_spill_dir=str(tmp_path), kv_spill_size=1 << 30
    )
    try:
        assert core.blocks.spill.num_files > 0  # the index came back from the folder
        result = next(iter(run_all(core, [greedy(second, 8, ignore_eos=True)]).values()))
        assert result.token_ids == want
        shared = len(digests(first))  # the first prompt's full blocks: all of them come from disk
        assert core.blocks.spill.stats.restored_blocks == shared
        assert result.final.usage.cached_tokens == shared * BLOCK
    finally:
        core.close()


def test_a_spill_size_that_holds_no_block_is_refused(default_model, tmp_path):
    with pytest.raises(ValueError, match="holds no block"):
        make_core(default_model, kv_memory=kv_memory(), kv_spill_dir=str(tmp_path), kv_spill_size=1000)


def test_bad_spill_flags_get_a_clear_cli_error(capsys):
    from app.cli import main

    for args in (
        ["serve", "--kv-spill-size", "lots"],
        ["generate", "--kv-spill-size=-3GiB", "hi"],
        ["bench", "--kv-spill-size", "12 parsecs"],
    ):
        with pytest.raises(SystemExit) as exit_:
            main(args)
        err = capsys.readouterr().err
        assert exit_.value.code == 2, err
        assert f"forge {args[0]}: error:" in err and "as a size" in err and "Traceback" not in err


def test_the_server_reports_its_spill_tier(server):
    """The served engine has a spill tier by default, beside its SQLite file; /metrics and the admin feed carry
    its counters."""
    import httpx

    from tests.integration.conftest import ADMIN_TOKEN

    assert (server.db_path.parent / "kv-spill").is_dir()
    engine = server.stats()["engine"]
    assert engine["kv_spill_enabled"] is True and engine["kv_spill_capacity_bytes"] == 2 << 30
    text = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10).text
    model = httpx.get(server.url + "/v1/models", headers=server.auth, timeout=10).json()["data"][0]["id"]
    for name in (
        "forge_kv_spill_files",
        "forge_kv_spill_hit_rate",
        "forge_kv_spilled_blocks_total",
        "forge_kv_restored_bytes_total",
        "forge_kv_spill_restore_seconds_total",
    ):
        assert f'\n{name}{{model="{model}"}} ' in text, name  # the served model's series
