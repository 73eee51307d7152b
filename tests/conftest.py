import contextlib
import os
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
