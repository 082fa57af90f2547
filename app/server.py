"""`serve(settings)`: migrate the database, then run the app under uvicorn (one worker).

SIGTERM / Ctrl-C: new turns are refused at once and running replies are aborted, stored as
"interrupted", and their streams end; then the lifespan stops the engine.
Also runnable as `python -m app.server [--port N] [--db URL] ...` (same flags as `forge serve`).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import math
import re
import socket
import sys
import time
from types import FrameType

import uvicorn
from litestar import Litestar
from sqlalchemy.engine import make_url

from app.api.ws import MAX_FRAME_BYTES
from app.config import Settings, serve_flags, settings_from_flags
from app.main import create_app, drain, interrupt
from app.store.migrate import upgrade

log = logging.getLogger("forge.server")


class _Server(uvicorn.Server):
    """uvicorn, plus: running turns are aborted as soon as a shutdown signal arrives, and stored and
    answered (`done`) before uvicorn closes the connections (WebSockets with 1012)."""

    def __init__(self, config: uvicorn.Config, app: Litestar, grace_s: float) -> None:
        super().__init__(config)
        self._app = app
        self._grace_s = grace_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        first = not self.should_exit
        super().handle_exit(sig, frame)
        if first:
            try:
                asyncio.get_running_loop().call_soon_threadsafe(interrupt, self._app)
            except RuntimeError:  # no loop yet / any more
                pass

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # no new connections while the turns finish
        started = time.monotonic()
        try:
            await drain(self._app, self._grace_s)
        except Exception:
            log.exception("could not drain the running replies")
        # One grace period in all: uvicorn waits for the connections only for what is left of it (the
        # lifespan's own drain then finds nothing running).
        left = self._grace_s - (time.monotonic() - started)
        self.config.timeout_graceful_shutdown = max(1, math.ceil(left))
        await super().shutdown(sockets)


def _safe_url(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable URL>"


class RedactTokens(logging.Filter):
    """Access log lines show `?token=***`: the admin page may carry its token in the URL."""

    _TOKEN = re.compile(r"([?&]token=)[^&\s]*")

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(self._TOKEN.sub(r"\1***", a) if isinstance(a, str) else a for a in record.args)
        return True


def configure_logging(level: str) -> None:
    """Forge's loggers at `level` (a no-op basicConfig when the CLI already configured the root logger)."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    logging.getLogger("forge").setLevel(level.upper())
    logging.getLogger("uvicorn.access").addFilter(RedactTokens())


def preflight(settings: Settings) -> None:
    """Fail fast, in one line, on the usual mistakes (a wrong model path, a bad KV size, --backend cupy
    without a usable GPU, a port in use) before uvicorn starts and the lifespan loads the model."""
    from engine import BackendUnavailable, parse_size, resolve_backend
    from engine.loader import ModelLoadError, resolve_model_path

    try:
        for i, spec in enumerate(settings.model_specs()):
            if i == 0 or not spec.source.startswith("hf:"):  # the others' hub names are pulled when first used
                resolve_model_path(spec.source)
        if settings.model_memory is not None:
            parse_size(settings.model_memory)
        parse_size(settings.kv_memory)
        resolve_backend(settings.backend)
        check_exposure(settings)
        check_port(settings.host, settings.port)
    except (ModelLoadError, BackendUnavailable, ValueError) as e:
        raise SystemExit(f"forge: {e}") from None


def check_exposure(settings: Settings) -> None:
    """Raise ValueError when the service would be open to the network without keys and nobody said so."""
    if settings.open_to_network() and not settings.allow_anonymous:
        raise ValueError(
            f"refusing to serve {settings.host} without API keys: anyone who reaches it could use every "
            "surface. Give keys (--api-key / FORGE_API_KEY), bind to 127.0.0.1, or say so with "
            "--allow-anonymous (FORGE_ALLOW_ANONYMOUS=1)"
        )


def check_port(host: str, port: int) -> None:
    """Raise ValueError when `host`:`port` can't be listened on (bound the way uvicorn binds it)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            why = (
                "is already in use (another `forge serve`?); pick another with --port"
                if e.errno == errno.EADDRINUSE
                else f"can't be listened on: {e.strerror}"
            )
            raise ValueError(f"port {port} on {host} {why}") from None


def serve(settings: Settings) -> None:
    """Run Forge until SIGTERM/SIGINT. Blocking. Exits non-zero when start-up fails."""
    configure_logging(settings.log_level)
    preflight(settings)
    if settings.open_to_network():
        log.warning(
            "serving %s:%d with no API keys (--allow-anonymous): the server is open to anyone who reaches it",
            settings.host,
            settings.port,
        )
    try:
        upgrade(settings.database_url)
    except Exception as e:
        log.debug("migration failed", exc_info=True)
        raise SystemExit(f"forge: cannot migrate the database {_safe_url(settings.database_url)!r}: {e}") from None
    app = create_app(settings, migrate=False)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        lifespan="on",
        loop="uvloop",
        http="httptools",
        ws_max_size=MAX_FRAME_BYTES,
        timeout_graceful_shutdown=max(1, math.ceil(settings.shutdown_grace_s)),
    )
    server = _Server(config, app, settings.shutdown_grace_s)
    server.run()
    if not server.started:
        raise SystemExit(1)  # start-up failed (model or database); uvicorn logged why


def main(argv: list[str] | None = None) -> None:
    """`python -m app.server ARGS` is `forge serve ARGS`."""
    from engine import BackendUnavailable
    from engine.loader import ModelLoadError

    parser = argparse.ArgumentParser(prog="python -m app.server", description="forge serve")
    serve_flags(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        serve(settings_from_flags(args))
    except (ModelLoadError, BackendUnavailable, ValueError) as exc:
        print(f"forge serve: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
