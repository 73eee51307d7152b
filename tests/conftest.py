import os

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
