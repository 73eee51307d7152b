import contextlib
import os
import shutil
import types

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def rng():
    return np.random.default_rng(20261121)


def z_bound(num_tests: int, alpha: float = 1e-4) -> float:
    """Two-sided normal critical value for ``num_tests`` simultaneous checks at family level ``alpha``."""
    from scipy.stats import norm

    return float(norm.isf(alpha / (2 * max(1, num_tests))))


class FakeLedger:
    """A minimal stand-in for pate_accountant.ledger, using only the accountant's public methods: rows appended
    per transaction, replayed on attach (``replay``)."""

    def __init__(self):
        self.rows = []

    def sync(self, accountant):  # a single writer: nothing to catch up on
        pass

    def attach(self, accountant):
        accountant.replay(self.rows)

    @contextlib.contextmanager
    def transaction(self, accountant):
        pending = []
        transaction = types.SimpleNamespace(append=pending.append, committed=False)
        yield transaction
        self.rows.extend(pending)
        transaction.committed = True


class Counting:
    """Forwards to a mechanism and counts the runs (to prove a refused call never ran)."""

    def __init__(self, mechanism):
        self.mechanism, self.calls = mechanism, 0

    @property
    def event(self):
        return self.mechanism.event

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.mechanism(*args, **kwargs)


@pytest.fixture(autouse=True)
def _own_ledger_home(tmp_path_factory, monkeypatch):
    """Every test gets its own ledger home and fingerprint key (docs/ledger.md, "One budget per data set"), so
    that tests charging the same records to ledgers of their own are not refused as one data set split, and
    nothing is written into the user's folders."""
    root = tmp_path_factory.mktemp("pate-home")
    monkeypatch.setenv("PATE_ACCOUNTANT_HOME", str(root / "data"))
    monkeypatch.setenv("PATE_ACCOUNTANT_CONFIG", str(root / "config"))


@pytest.fixture
def mechanism_rngs(monkeypatch):
    """The ``mechanism_rng`` every ``PrivateGenerator.generate`` call of the test is given, in order (``None``:
    the mechanism draws its noise from the operating system)."""
    from ensembles import generation

    seen = []
    generate = generation.PrivateGenerator.generate

    def recording(self, *args, **kwargs):
        seen.append(kwargs.get("mechanism_rng"))
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(generation.PrivateGenerator, "generate", recording)
    return seen


@pytest.fixture(scope="session")
def postgres_server():
    """A real PostgreSQL server for this test session (tests/pg_server.py), stopped and removed at its end.  Its
    folder is outside pytest's temporary folders: another pytest session on the machine prunes old ones, and a
    server whose data folder is removed shuts down in the middle of this session."""
    import tempfile
    from pathlib import Path

    from pg_server import PostgresServer

    folder = Path(tempfile.mkdtemp(prefix="pate-accountant-pg-"))
    try:
        server = PostgresServer(folder / "server").start()
        try:
            yield server
        finally:
            server.remove()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def postgres_database(postgres_server, request):
    """A new empty database on the session's server, for one test; its superuser URL."""
    import re

    name = "t_" + re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:40] + f"_{os.getpid()}"
    postgres_server.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return postgres_server.create_database(name)
