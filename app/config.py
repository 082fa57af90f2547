"""Service settings: defaults, then FORGE_* environment variables, then explicit overrides (CLI flags); the flags
of `forge serve` (and `python -m app.server`) and of the engine."""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kernels import check_activations

ENV_PREFIX = "FORGE_"
MODEL_MEMORY_SHARE = 0.75  # --model-memory's default: what the machine can hold, leaving the rest to the OS and us


@dataclass(slots=True)
class Settings:
    """Everything `forge serve` needs. Field names map to FORGE_<NAME> variables."""

    model: str = "default"  # FORGE_MODEL: the one model served when `models` is empty
    models: tuple[str, ...] = ()  # FORGE_MODELS / repeatable --model: "NAME=MODEL" or "MODEL", the default first
    model_memory: str | None = None  # what the loaded models may take together; None: MODEL_MEMORY_SHARE of the RAM
    host: str = "127.0.0.1"
    port: int = 8000
    database_url: str = "sqlite+aiosqlite:///./data/forge.db"
    backend: str = "auto"
    kv_memory: str = "1GiB"
    kv_spill_dir: str | None = None  # evicted KV blocks' files; None: kv-spill next to the SQLite file, else ./data
    kv_spill_size: str = "2GiB"  # the spill tier's disk budget; 0 turns it off
    speculative: str = "ngram"  # n-gram speculative decoding by default ("off" to disable); requests may override
    spec_row_cost: float | None = None  # a draft row's cost relative to a one-row step; None: measured (tests pin it)
    api_keys: tuple[str, ...] = ()  # FORGE_API_KEY: comma-separated; any one of them opens /v1, /api, /ws
    admin_token: str | None = None
    allow_anonymous: bool = False  # serve without API keys on a non-loopback address (refused otherwise)
    allowed_origins: tuple[str, ...] = ()  # browser origins accepted besides the served host's own
    max_waiting: int = 256
    threads: int | None = None
    quantize: str | None = None  # "q8_0": quantize float matrices at load
    activations: str = "f32"  # "q8": int8 activations in the numba backend's products
    log_level: str = "info"
    keepalive_s: float = 5.0  # SSE keep-alive comment interval while no event is ready
    shutdown_grace_s: float = 10.0  # how long SIGTERM waits for in-flight replies to be stored
    detached_turn_s: float = 120.0  # a chat reply nobody watches (its client dropped) goes on this long, then stops
    # Per-client bounds (docs/protocol.md#limits)
    outbox_events: int = 1024  # events queued for one WebSocket / SSE stream before its reader counts as stalled
    outbox_bytes: int = 1 << 20  # ... or this many bytes of them
    ws_sessions: int = 64  # sessions one WebSocket may watch
    ws_commands_per_s: float = 20.0  # sustained command rate per WebSocket (bursts of twice that)
    # Admission (app/domain/admission.py): past the engine's capacity, generations wait in a queue fair across keys
    queue_size: int = 1024  # generations that may wait; one more is refused with 429
    queue_timeout_s: float = 60.0  # how long one may wait; then 503
    max_concurrent_per_key: int | None = None  # generations one API key may run at once (None: no cap)
    import_messages: int = 10_000  # messages in one imported session
    default_max_tokens: int = 512  # /v1 chat completions without max_tokens stop here (app.domain.defaults)
    embedding_pooling: str = "mean"  # /v1/embeddings: "mean" | "last" (a model's own GGUF pooling_type wins)
    # Replicas sharing one database (docs/scale-out.md)
    replica_name: str | None = None  # None: host:port
    lease_ttl_s: float = 10.0  # a replica (and its session leases) counts as dead this long after its last heartbeat
    # MCP servers whose tools chat sessions may call (docs/mcp.md): "NAME=COMMAND ARGS…" or "NAME=URL" each
    mcp_servers: tuple[str, ...] = ()  # FORGE_MCP: separated by ";" (a command may hold commas), repeatable --mcp
    mcp_timeout_s: float = 30.0  # one tool call; then the model gets an error result and the server is restarted
    mcp_result_bytes: int = 16_384  # a tool's result is cut to this many bytes before the model reads it
    mcp_rounds: int = 4  # tool rounds one message may run by itself before the reply waits for the user

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings from FORGE_* variables (or `env`), then apply the non-None `overrides`.

        Raises ValueError naming the variable or field when a value has the wrong type
        or an override names no field.
        """
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            name = _ENV_NAMES.get(f.name, ENV_PREFIX + f.name.upper())
            raw = env.get(name)
            if raw or (raw is not None and f.name in _SECRETS):  # a secret set to "" is refused, not ignored
                values[f.name] = _convert(f.name, raw, name)
        known = {f.name for f in dataclasses.fields(cls)}
        for key, value in overrides.items():
            if key not in known:
                raise ValueError(f"unknown setting {key!r}")
            if value is not None:
                source = f"--{_FLAGS.get(key, key).replace('_', '-')}"
                if key in _SEPARATORS and isinstance(value, (list, tuple)):  # one flag, one item
                    values[key] = tuple(v.strip() for v in value)
                elif key in _LIST_FIELDS and isinstance(value, (list, tuple)):
                    values[key] = tuple(_convert(key, v, source)[0] for v in value)
                else:
                    values[key] = _convert(key, value, source) if isinstance(value, str) else value
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
        if self.spec_row_cost is not None and not 0 <= self.spec_row_cost < 1e6:
            raise ValueError(
                f"spec_row_cost must be >= 0 and finite (leave it unset to measure), got {self.spec_row_cost}"
            )
        if self.keepalive_s <= 0:
            raise ValueError(f"keepalive_s must be > 0, got {self.keepalive_s}")
        if not 0 <= self.detached_turn_s < 1e6:
            raise ValueError(f"detached_turn_s must be >= 0 and finite, got {self.detached_turn_s}")
        if self.shutdown_grace_s < 0:
            raise ValueError(f"shutdown_grace_s must be >= 0, got {self.shutdown_grace_s}")
        if not all(_TOKEN.fullmatch(k) for k in self.api_keys):
            raise ValueError(
                "an API key must not be empty and holds printable ASCII without spaces (it travels in "
                "an HTTP header); auth is off only when no key is given"
            )
        if self.admin_token is not None and not _TOKEN.fullmatch(self.admin_token):
            raise ValueError("the admin token must not be empty and holds printable ASCII without spaces")
        for name in ("outbox_events", "outbox_bytes", "ws_sessions", "import_messages", "default_max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_concurrent_per_key is not None and self.max_concurrent_per_key < 1:
            raise ValueError(
                f"max_concurrent_per_key must be >= 1 (leave it unset for no cap), got {self.max_concurrent_per_key}"
            )
        if self.queue_size < 0:
            raise ValueError(f"queue_size must be >= 0, got {self.queue_size}")
        if not 0 < self.queue_timeout_s < 1e6:
            raise ValueError(f"queue_timeout_s must be > 0 and finite, got {self.queue_timeout_s}")
        if not self.ws_commands_per_s > 0:
            raise ValueError(f"ws_commands_per_s must be > 0, got {self.ws_commands_per_s}")
        if self.embedding_pooling not in ("mean", "last"):
            raise ValueError(f"embedding_pooling must be 'mean' or 'last', got {self.embedding_pooling!r}")
        replica = self.replica_name
        if replica is not None and not (0 < len(replica) <= 200 and replica.isprintable()):  # as the store keeps them
            raise ValueError(f"replica_name must be 1 to 200 printable characters, got {self.replica_name!r}")
        self._check_mcp()
        self._check_models()
        if not 0.5 <= self.lease_ttl_s <= 3600:
            raise ValueError(f"lease_ttl_s must be in [0.5, 3600] seconds, got {self.lease_ttl_s}")
        check_activations(self.activations, self.backend)
        from engine.engine import parse_size  # the engine's own reading of a size

        try:
            parse_size(self.kv_spill_size)
        except ValueError as exc:
            raise ValueError(f"kv_spill_size: {exc}") from None

    def _check_models(self) -> None:
        from engine.engine import parse_size

        self.model_specs()  # ValueError naming a bad --model
        if self.model_memory is not None:
            try:
                parse_size(self.model_memory)
            except ValueError as exc:
                raise ValueError(f"model_memory: {exc}") from None

    def model_specs(self) -> list[Any]:
        """The served models (app.domain.models.ModelSpec), the default first: `models`, else `model` alone."""
        from app.domain.models import parse_specs

        return parse_specs(self.models, fallback=self.model)

    def model_budget(self) -> int:
        """Bytes the loaded models may take together: `model_memory`, else a share of this machine's memory."""
        from engine.engine import parse_size

        if self.model_memory is not None:
            return parse_size(self.model_memory)
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * MODEL_MEMORY_SHARE)

    def _check_mcp(self) -> None:
        from app.domain.mcp.spec import ServerSpec

        names = [ServerSpec.parse(text).name for text in self.mcp_servers]  # ValueError naming the bad one
        if len(set(names)) != len(names):
            raise ValueError(f"two --mcp servers share a name: {', '.join(sorted(names))}")
        if not 0 < self.mcp_timeout_s < 1e6 or self.mcp_result_bytes < 256 or not 0 <= self.mcp_rounds <= 64:
            raise ValueError("mcp_timeout_s must be > 0, mcp_result_bytes >= 256 and mcp_rounds in [0, 64]")

    def spill_dir(self) -> str:
        """Where the KV spill tier lives: `kv_spill_dir`, else beside the SQLite file, else ./data/kv-spill."""
        if self.kv_spill_dir:
            return self.kv_spill_dir
        m = re.match(r"^sqlite(?:\+\w+)?:///(.+)$", self.database_url)
        if m and not m.group(1).startswith(":memory:"):
            return os.path.join(os.path.dirname(m.group(1)) or ".", "kv-spill")
        return os.path.join("data", "kv-spill")

    def open_to_network(self) -> bool:
        """True when the service would listen beyond this machine with no API key asked of anyone."""
        return not self.api_keys and not is_loopback(self.host)

    @property
    def replica(self) -> str:
        """This process's name among the replicas sharing its database."""
        return self.replica_name or f"{self.host}:{self.port}"


def is_loopback(host: str) -> bool:
    """Whether `host` only reaches this machine: `localhost` or a loopback address (a name that needs resolving
    counts as reachable from elsewhere)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


_TOKEN = re.compile(r"[\x21-\x7e]+")  # what an HTTP bearer token can carry
_LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
_INT_FIELDS = {
    "port",
    "max_waiting",
    "threads",
    "outbox_events",
    "outbox_bytes",
    "ws_sessions",
    "queue_size",
    "max_concurrent_per_key",
    "import_messages",
    "default_max_tokens",
    "mcp_result_bytes",
    "mcp_rounds",
}
_FLOAT_FIELDS = {
    "spec_row_cost",
    "keepalive_s",
    "shutdown_grace_s",
    "ws_commands_per_s",
    "queue_timeout_s",
    "detached_turn_s",
    "lease_ttl_s",
    "mcp_timeout_s",
}
_BOOL_FIELDS = {"allow_anonymous"}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
# comma-separated in the environment, repeatable flags
_LIST_FIELDS = {"api_keys", "allowed_origins", "mcp_servers", "models"}
_SECRETS = {"api_keys", "admin_token"}
_ENV_NAMES = {"api_keys": "FORGE_API_KEY", "allowed_origins": "FORGE_ALLOWED_ORIGIN", "mcp_servers": "FORGE_MCP"}
_FLAGS = {"api_keys": "api_key", "allowed_origins": "allow_origin", "mcp_servers": "mcp"}
_SEPARATORS = {"mcp_servers": ";"}  # a list field's separator in the environment, when not ","


def _convert(field_name: str, raw: str, source: str) -> Any:
    if field_name in _LIST_FIELDS:
        items = tuple(item.strip() for item in raw.split(_SEPARATORS.get(field_name, ",")))
        if field_name in _SEPARATORS:
            items = tuple(item for item in items if item)
        if field_name in _SECRETS and not all(items):
            raise ValueError(f"{source} holds an empty key; auth is off only when no key is given")
        return items
    if field_name in _BOOL_FIELDS:
        if raw.strip().lower() not in _TRUE + _FALSE:
            raise ValueError(f"{source} must be one of {', '.join(_TRUE + _FALSE)}, got {raw!r}")
        return raw.strip().lower() in _TRUE
    try:
        if field_name in _INT_FIELDS:
            return int(raw)
        if field_name in _FLOAT_FIELDS:
            return float(raw)
    except ValueError:
        kind = "an integer" if field_name in _INT_FIELDS else "a number"
        raise ValueError(f"{source} must be {kind}, got {raw!r}") from None
    return raw


def engine_flags(p: argparse.ArgumentParser, many: bool = False) -> None:
    """The engine's flags (`forge serve`, `generate`, `chat`, `bench`); `many`: --model repeatable (serve)."""
    what = (
        '"default" (SmolLM2-135M-Instruct), a .gguf file, a HF directory or hf:OWNER/REPO[/FILE.gguf][:QUANT] '
        "(pulled from the hub when not on disk; docs/models.md)"
    )
    if many:
        p.add_argument(
            "--model",
            dest="models",
            action="append",
            default=None,
            metavar="[NAME=]MODEL",
            help=f"a model to serve: {what}; repeatable, the first is the default. NAME is what requests and "
            "sessions choose it by (default: the file's stem)",
        )
        p.add_argument(
            "--model-memory",
            default=None,
            help="what the loaded models may take together (their files and KV budgets), e.g. 8GiB; past it idle "
            "models unload, least recently used first (default: 3/4 of this machine's memory)",
        )
    else:
        p.add_argument("--model", default=None, help=what)
    p.add_argument(
        "--backend",
        default=None,
        choices=["auto", "numba", "numpy", "cupy"],
        help="auto: cupy with a usable GPU, else numba (compiled CPU kernels); numpy: float32 reference",
    )
    p.add_argument("--kv-memory", default=None, help="KV cache budget, e.g. 512MiB, 1GiB")
    p.add_argument("--threads", type=int, default=None, help="CPU kernel and BLAS threads (default: all cores)")
    p.add_argument("--quantize", default=None, choices=["q8_0"], help="quantize F16/BF16/F32 matrices at load")
    p.add_argument(
        "--activations",
        default=None,
        metavar="f32|q8",
        help="f32 (default): float32 activations; q8: int8 activations in the products over weights with groups "
        "of 32, on every CPU (numba backend; faster, close to but not equal to the float32 results). Not int8: "
        "Q6_K/Q3_K/Q2_K weights (groups of 16)",
    )
    p.add_argument(
        "--speculative",
        default=None,
        choices=["off", "ngram"],
        help="n-gram speculative decoding for requests that do not choose (default: ngram)",
    )
    p.add_argument(
        "--kv-spill-dir",
        default=None,
        help="folder for evicted KV blocks, read back instead of recomputed (serve: beside the SQLite "
        "database, else ./data/kv-spill)",
    )
    p.add_argument(
        "--kv-spill-size",
        default=None,
        help="disk budget of the KV spill folder, e.g. 2GiB; 0: off (default: 2GiB for serve or with "
        "--kv-spill-dir, else off)",
    )


def serve_flags(p: argparse.ArgumentParser) -> None:
    """`forge serve`'s flags: the engine's, then the service's."""
    engine_flags(p, many=True)
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--db", dest="database_url", default=None, help="SQLAlchemy async URL (default: SQLite in ./data)")
    p.add_argument(
        "--api-key",
        dest="api_keys",
        action="append",
        default=None,
        help="require this bearer key on /v1, /api, /ws and the UI (repeatable: one key per client)",
    )
    p.add_argument("--admin-token", default=None, help="require this token on /admin and /metrics")
    p.add_argument(
        "--allow-anonymous",
        action="store_true",
        default=None,
        help="serve on a non-loopback --host without --api-key (refused otherwise): anyone who reaches the "
        "address may use every surface",
    )
    p.add_argument(
        "--allow-origin",
        dest="allowed_origins",
        action="append",
        default=None,
        help="a browser origin allowed besides the served host, e.g. https://chat.example.org (repeatable)",
    )
    p.add_argument("--max-waiting", type=int, default=None, help="engine waiting-queue limit (default 256)")
    p.add_argument("--log-level", default=None, help="debug | info | warning | error")
    p.add_argument("--keepalive-s", type=float, default=None, help="SSE keep-alive interval in seconds")
    p.add_argument(
        "--detached-turn-s",
        type=float,
        default=None,
        help="a chat reply whose clients all dropped goes on this long for one to reattach, then stops "
        "(default 120; 0: stops at once)",
    )
    p.add_argument(
        "--queue-size",
        type=int,
        default=None,
        help="generations that may wait for the engine, served round-robin by API key (default 1024); "
        "one more is refused with 429",
    )
    p.add_argument(
        "--queue-timeout-s",
        type=float,
        default=None,
        help="how long a generation may wait for the engine before a 503 (default 60)",
    )
    p.add_argument(
        "--max-concurrent-per-key",
        type=int,
        default=None,
        help="generations one API key may run at once; more wait in the queue (default: no cap)",
    )
    p.add_argument(
        "--embedding-pooling",
        default=None,
        choices=["mean", "last"],
        help="/v1/embeddings: pool the last hidden state by mean or last token (default: mean; a model's "
        "own GGUF pooling_type wins)",
    )
    p.add_argument(
        "--replica-name",
        default=None,
        help="this process's name among replicas sharing the database (default: host:port); unique",
    )
    p.add_argument(
        "--lease-ttl-s",
        type=float,
        default=None,
        help="seconds after its last heartbeat a replica counts as dead and its replies interrupted (default 10)",
    )
    p.add_argument(
        "--mcp",
        dest="mcp_servers",
        action="append",
        default=None,
        metavar="NAME=COMMAND_OR_URL",
        help="an MCP server whose tools chat sessions may call (docs/mcp.md): NAME=COMMAND ARGS… (stdio, quote it "
        "as one argument) or NAME=http(s)://… (streamable HTTP); repeatable",
    )
    p.add_argument("--mcp-timeout-s", type=float, default=None, help="one MCP tool call's limit (default 30)")
    p.add_argument(
        "--mcp-result-bytes", type=int, default=None, help="an MCP tool result is cut to this size (default 16384)"
    )
    p.add_argument("--mcp-rounds", type=int, default=None, help="MCP tool rounds a reply runs by itself (default 4)")


_SERVE_SETTINGS = (
    "mcp_servers",
    "mcp_timeout_s",
    "mcp_result_bytes",
    "mcp_rounds",
    "models",
    "model_memory",
    "backend",
    "kv_memory",
    "threads",
    "quantize",
    "activations",
    "speculative",
    "host",
    "port",
    "database_url",
    "api_keys",
    "admin_token",
    "allow_anonymous",
    "allowed_origins",
    "max_waiting",
    "log_level",
    "keepalive_s",
    "queue_size",
    "queue_timeout_s",
    "max_concurrent_per_key",
    "embedding_pooling",
    "kv_spill_dir",
    "kv_spill_size",
    "detached_turn_s",
    "replica_name",
    "lease_ttl_s",
)


def settings_from_flags(args: argparse.Namespace) -> Settings:
    """Settings from the environment with `serve_flags`' values over them (ValueError naming a bad one)."""
    return Settings.from_env(**{k: getattr(args, k) for k in _SERVE_SETTINGS})
