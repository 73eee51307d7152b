"""The BassilyTT margin condition ``eta n >= 32 sqrt(2)/eps ln(4m/delta) sqrt(ln(2/delta))`` of the paper's
Appendix D (docs/planning.md): the teachers ``m`` tokens need, or the tokens ``n`` teachers afford.
"""

from __future__ import annotations

import dataclasses
import math

from pate_accountant.planning.ranges import _check_budget, _check_count, _Result
from pate_accountant.validation import MAX_COUNT, check_real

#: The BassilyTT constant ``32 sqrt(2)``.
BTT_CONSTANT = 32.0 * math.sqrt(2.0)


@dataclasses.dataclass(frozen=True)
class BassilyTTTeachers(_Result):
    """What :func:`bassily_tt_teachers` returns: ``n_required`` (real) and ``num_teachers = ceil``."""

    eta: float
    epsilon: float
    delta: float
    tokens: int
    n_required: float
    num_teachers: int
    assumptions: tuple


@dataclasses.dataclass(frozen=True)
class BassilyTTTokens(_Result):
    """What :func:`bassily_tt_tokens` returns: ``m_max`` (``None`` when above ``1e300``; then read
    ``log10_m_max``) and ``log10_m_max = log10((delta/4) exp(x))``."""

    eta: float
    epsilon: float
    delta: float
    num_teachers: float
    m_max: int | None
    log10_m_max: float
    assumptions: tuple


# -- BassilyTT margin condition (Appendix D) -------------------------------------------------------------


def _check_btt(eta, epsilon, delta) -> tuple[float, float, float]:
    eta = check_real("eta", eta, minimum=0.0, maximum=1.0, min_open=True)
    epsilon, delta = _check_budget(epsilon, delta)
    return eta, epsilon, delta


_BTT_ASSUMPTIONS = (
    ("BassilyTT (NeurIPS 2018) Algorithm 3 as quoted in the paper's Appendix D: every histogram's top-vs-second "
    "margin is at least eta n (the paper observed eta ~ 0.4 with coordinated ensembles)."),
    ("Condition: eta n >= 32 sqrt(2)/eps * ln(4m/delta) * sqrt(ln(2/delta)) for m tokens at (eps, delta)-DP "
    "(constants as the Hot PATE paper's Appendix D quotes them)."),
)


def bassily_tt_teachers(eta: float, epsilon: float, delta: float, tokens: int) -> BassilyTTTeachers:
    """Teachers needed for ``tokens`` tokens: ``n = 32 sqrt(2) / (eps eta) ln(4m/delta) sqrt(ln(2/delta))``.

    Known values: ``eta = 0.4, eps = 1, delta = 1e-6``: ``m = 1e3 -> 9527.93``, ``m = 1e6 -> 12504.77``.
    """
    eta, epsilon, delta = _check_btt(eta, epsilon, delta)
    m = _check_count("tokens", tokens, 1, MAX_COUNT, "2^53, the largest integer float64 holds exactly")
    n = BTT_CONSTANT / (epsilon * eta) * math.log(4.0 * m / delta) * math.sqrt(math.log(2.0 / delta))
    return BassilyTTTeachers(eta=eta, epsilon=epsilon, delta=delta, tokens=m, n_required=n,
                             num_teachers=math.ceil(n * (1 - 1e-12)), assumptions=_BTT_ASSUMPTIONS)


def bassily_tt_tokens(eta: float, epsilon: float, delta: float, num_teachers: float) -> BassilyTTTokens:
    """Tokens ``num_teachers`` teachers afford: ``m_max = floor((delta/4) exp(eta n eps / (32 sqrt(2)
    sqrt(ln(2/delta)))))``, exponential in ``n`` (computed in log space; ``m_max`` is ``None`` above
    ``1e300``).  Known values (``eta = 0.4, eps = 1, delta = 1e-6``): ``n = 10000 -> 2990``,
    ``12000 -> 309955``, ``15000 -> 327068772``."""
    eta, epsilon, delta = _check_btt(eta, epsilon, delta)
    n = check_real("num_teachers", num_teachers, minimum=0.0, min_open=True, maximum=MAX_COUNT)
    x = eta * n * epsilon / (BTT_CONSTANT * math.sqrt(math.log(2.0 / delta)))
    log_m = math.log(delta / 4.0) + x
    if log_m < 690.0:
        m_max = math.floor(delta / 4.0 * math.exp(x)) if x < 700 else math.floor(math.exp(log_m))
    else:
        m_max = None
    return BassilyTTTokens(eta=eta, epsilon=epsilon, delta=delta, num_teachers=n, m_max=m_max,
                           log10_m_max=log_m / math.log(10.0), assumptions=_BTT_ASSUMPTIONS)
