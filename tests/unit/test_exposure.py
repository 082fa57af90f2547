"""Which binds count as open to the network, and how `--allow-anonymous` / FORGE_ALLOW_ANONYMOUS are read."""

from __future__ import annotations

import argparse

import pytest

from app.config import Settings, is_loopback, serve_flags, settings_from_flags
from app.server import check_exposure


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.20", False),
        ("example.org", False),
        ("", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def _flags(*argv: str) -> Settings:
    parser = argparse.ArgumentParser()
    serve_flags(parser)
    return settings_from_flags(parser.parse_args(list(argv)))


def test_open_bind_needs_keys_or_consent(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FORGE_HOST", "FORGE_API_KEY", "FORGE_ALLOW_ANONYMOUS"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="--allow-anonymous"):
        check_exposure(_flags("--host", "0.0.0.0"))
    check_exposure(_flags("--host", "0.0.0.0", "--allow-anonymous"))
    check_exposure(_flags("--host", "0.0.0.0", "--api-key", "k1"))
    check_exposure(_flags())  # loopback by default
    assert _flags("--host", "0.0.0.0", "--allow-anonymous").open_to_network()
    assert not _flags("--host", "0.0.0.0", "--api-key", "k1").open_to_network()


@pytest.mark.parametrize(("raw", "value"), [("1", True), ("true", True), ("Yes", True), ("0", False), ("off", False)])
def test_allow_anonymous_from_the_environment(raw: str, value: bool) -> None:
    assert Settings.from_env({"FORGE_ALLOW_ANONYMOUS": raw}).allow_anonymous is value


def test_allow_anonymous_refuses_a_word_it_cannot_read() -> None:
    with pytest.raises(ValueError, match="FORGE_ALLOW_ANONYMOUS"):
        Settings.from_env({"FORGE_ALLOW_ANONYMOUS": "maybe"})
