"""The per-query delta of a run, chosen from the queries it should pay for (issue 23, item 4; docs/planning.md).

A boundary-wrapped approximate inner with ``delta0 = delta_A`` pays ``w = 1 - (1 - delta0)^2`` in delta on every
query (docs/tct_and_individual.md, section 1): :func:`expected_queries` says how many queries a target-charged run
should be able to pay for, :func:`step_delta_for_queries` the largest ``delta0`` on the 1-2-5 grid that pays for
them.
"""

from __future__ import annotations

import math

from pate_accountant.planning.bounds import target_hits
from pate_accountant.planning.ranges import DEFAULT_AGGREGATOR_DELTA, DEFAULT_QUERY_DELTA_SHARE, _check_share
from pate_accountant.tct import wrapped_query_delta
from pate_accountant.validation import check_int, check_real

#: How many times the expected private draws of a plan's hits the default per-query delta must pay for.
QUERY_MARGIN = 4.0
#: The smallest per-query delta :func:`step_delta_for_queries` offers (its noise bound L grows like ln(1/delta)).
MIN_STEP_DELTA = 1e-30


def expected_queries(
    epsilon: float,
    delta: float,
    eps0: float,
    q: float = 1.0 / 3.0,
    composition: str = "optimal",
    *,
    query_delta_share: float = DEFAULT_QUERY_DELTA_SHARE,
    margin: float = QUERY_MARGIN,
) -> int:
    """The queries a target-charged run at level ``eps0`` should be able to pay for: ``margin`` times the private
    draws that the hits of ``(epsilon, delta)`` take in expectation (:func:`target_hits`' ``private_draws``,
    about ``hits / q``), at least one.  The hits do not depend on the per-query delta (its reserve is its own
    share of ``delta``), so they are computed with the smallest one on offer."""
    margin = check_real("margin", margin, minimum=1.0)
    plan = target_hits(epsilon, delta, eps0, q=q, delta0=MIN_STEP_DELTA, composition=composition,
                       query_delta_share=query_delta_share)
    return max(1, math.ceil(margin * plan.private_draws))


def step_delta_for_queries(
    delta: float,
    queries: int,
    *,
    query_delta_share: float = DEFAULT_QUERY_DELTA_SHARE,
    ceiling: float = DEFAULT_AGGREGATOR_DELTA,
) -> float:
    """The per-query delta ``delta0 = delta_A`` of a boundary-wrapped approximate inner, chosen from the queries a
    run should pay for instead of fixed (issue 23, item 4): the largest value on the 1-2-5 grid, at most
    ``ceiling``, whose weight ``w = 1 - (1 - delta0)^2`` fits ``queries`` times into the ``query_delta_share`` of
    ``delta``.  A fixed ``delta0 = 1e-10`` caps a run at budget delta ``1e-6`` to 2,500 queries whatever its
    epsilon buys; a larger ``delta0`` keeps the noise bound ``L`` (about ``ln(1/delta0)/eps_A``), and with it the
    release threshold, low.  Plain composition pays ``queries x delta0`` from all of ``delta``, which the
    same value also fits."""
    delta = check_real("delta", delta, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    queries = check_int("queries", queries, minimum=1)
    share = _check_share(query_delta_share)
    ceiling = check_real("ceiling", ceiling, minimum=MIN_STEP_DELTA, maximum=1.0, max_open=True)
    exponent = math.floor(math.log10(ceiling))
    while 10.0 ** exponent >= MIN_STEP_DELTA:
        for mantissa in (5.0, 2.0, 1.0):
            candidate = float(f"{mantissa:g}e{exponent}")
            if candidate <= ceiling and math.floor(share * delta / wrapped_query_delta(candidate)) >= queries:
                return candidate
        exponent -= 1
    raise ValueError(f"queries: no per-query delta of at least {MIN_STEP_DELTA:g} pays for {queries} queries "
                     f"within the {share:g} share of delta = {delta:g}")
