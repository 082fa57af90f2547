"""Service settings: defaults, then FORGE_* environment variables, then explicit overrides (CLI flags)."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "FORGE_"


@dataclass(slots=True)
class Settings:
    """Everything `forge serve` needs. Field names map to FORGE_<NAME> variables."""

    model: str = "default"
    host: str = "127.0.0.1"
    port: int = 8000
    database_url: str = "sqlite+aiosqlite:///./data/forge.db"
    backend: str = "auto"
    kv_memory: str = "1GiB"
    speculative: str = "ngram"  # n-gram speculative decoding by default ("off" to disable); requests may override
    api_key: str | None = None
    admin_token: str | None = None
    max_waiting: int = 256
    threads: int | None = None
    log_level: str = "info"
    keepalive_s: float = 5.0  # SSE keep-alive comment interval while no event is ready
    shutdown_grace_s: float = 10.0  # how long SIGTERM waits for in-flight replies to be stored

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> "Settings":
        """Build settings from FORGE_* variables (or `env`), then apply the non-None `overrides`.

        Raises ValueError naming the variable or field when a value has the wrong type
        or an override names no field.
        """
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            name = ENV_PREFIX + f.name.upper()
            raw = env.get(name)
            if raw:
                values[f.name] = _convert(f.name, raw, name)
        known = {f.name for f in dataclasses.fields(cls)}
        for key, value in overrides.items():
            if key not in known:
                raise ValueError(f"unknown setting {key!r}")
            if value is not None:
                values[key] = _convert(key, value, f"--{key.replace('_', '-')}") if isinstance(value, str) else value
        settings = cls(**values)
        settings.check()
        return settings

    def check(self) -> None:
        """Raise ValueError naming the first invalid field."""
        if not (0 <= self.port <= 65535):
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {self.max_waiting}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if not self.database_url or "://" not in self.database_url:
            raise ValueError(f"database_url must be an SQLAlchemy URL, got {self.database_url!r}")
        if self.log_level.lower() not in _LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(_LOG_LEVELS)}, got {self.log_level!r}")
        if self.speculative not in ("off", "ngram"):
            raise ValueError(f"speculative must be 'off' or 'ngram', got {self.speculative!r}")
        if self.keepalive_s <= 0:
            raise ValueError(f"keepalive_s must be > 0, got {self.keepalive_s}")
        if self.shutdown_grace_s < 0:
            raise ValueError(f"shutdown_grace_s must be >= 0, got {self.shutdown_grace_s}")


_LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
_INT_FIELDS = {"port", "max_waiting", "threads"}
_FLOAT_FIELDS = {"keepalive_s", "shutdown_grace_s"}


def _convert(field_name: str, raw: str, source: str) -> Any:
    try:
        if field_name in _INT_FIELDS:
            return int(raw)
        if field_name in _FLOAT_FIELDS:
            return float(raw)
    except ValueError:
        kind = "an integer" if field_name in _INT_FIELDS else "a number"
        raise ValueError(f"{source} must be {kind}, got {raw!r}") from None
    return raw
