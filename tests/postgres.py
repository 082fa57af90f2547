"""A real PostgreSQL for the tests: initdb into a temporary folder, a random port, connections over a unix socket
only, stopped (and the folder removed) at the end. Each test takes a fresh database of its own (`database()`).
Fixtures: `postgres` (the server, once per test session) and `database_url` (an empty database of each kind the
store runs on, one test per kind).

initdb refuses to run as root: as root the server runs as the `postgres` system user (Debian's package makes it).
`unavailable()` says why PostgreSQL cannot run here, for a skip that names the reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

BIN = Path(os.environ.get("FORGE_PG_BIN", "/usr/lib/postgresql/15/bin"))
DATABASES = ("sqlite", "postgresql")
START_TIMEOUT_S = 60
# Durability off: a test database is thrown away, and fsyncs on a shared 2-core machine cost seconds.
TEST_SETTINGS = (
    "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 -c listen_addresses=''"
)


def _as_postgres() -> list[str]:
    """The prefix that runs a command as the server's user (initdb and postgres refuse root)."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def unavailable() -> str | None:
    """Why PostgreSQL can't run here (a skip's reason), or None when it can."""
    if not (BIN / "initdb").exists():
        return f"PostgreSQL's binaries are not in {BIN} (Debian's postgresql package; `make test` installs it)"
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a `postgres` user to run initdb as"
        if shutil.which("runuser") is None:
            return "running as root without `runuser` to start PostgreSQL as `postgres`"
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        return "asyncpg is not installed (pyproject.toml pins it)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Postgres:
    """One PostgreSQL server in a temporary folder, reached through the unix socket in that folder."""

    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="forge-pg-")))
    port: int = field(default_factory=_free_port)

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        """The SQLAlchemy URL of `database` (asyncpg, over the unix socket)."""
        return f"postgresql+asyncpg://postgres@/{database}?host={self.root}&port={self.port}"

    def _run(self, *args: str) -> None:
        done = subprocess.run([*_as_postgres(), *args], capture_output=True, text=True, timeout=START_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")

    def start(self) -> Postgres:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        # C.UTF-8: the text search parser classifies non-ASCII letters by the locale's ctype.
        self._run(
            str(BIN / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
            "--no-sync",
            "--no-instructions",
        )
        self._run(
            str(BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-w",
            "-t",
            str(START_TIMEOUT_S),
            "-o",
            f"-p {self.port} -k {self.root} {TEST_SETTINGS}",
            "start",
        )
        return self

    def stop(self) -> None:
        """Stop the server (immediate: nothing in it is kept) and remove its folder."""
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join((self.root / "server.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def database(self) -> str:
        """A new, empty database; returns its URL."""
        name = "t_" + uuid.uuid4().hex[:16]
        self._run(str(BIN / "createdb"), "-h", str(self.root), "-p", str(self.port), "-U", "postgres", name)
        return self.url(name)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """The test session's PostgreSQL (skipped, saying why, where it cannot run)."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"PostgreSQL cannot run here: {reason}")
    pg = Postgres()
    try:
        pg.start()
    except Exception as e:
        pg.stop()
        pytest.fail(f"PostgreSQL did not start: {e}\n{pg.log_tail()}")
    try:
        yield pg
    finally:
        pg.stop()


@pytest.fixture(params=DATABASES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new, empty database of each kind the store runs on (not migrated): an SQLite file, a PostgreSQL
    database."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'forge.db'}"
    return request.getfixturevalue("postgres").database()
