"""What ``pate-accountant plan best`` compares (docs/planning.md, "The best run: plan best"): the (mechanism,
accountant) configurations that ``generate`` runs, the grid of step epsilons and deltas each is tried at, and the
group counts (``generate --groups``; parallel composition, docs/groups.md).
"""

from __future__ import annotations

import math

from pate_accountant.validation import MIN_DELTA

#: The (mechanism, accountant) pairs ``plan best`` compares: target charging of the boundary-wrapped DPArgMax and
#: DPWS, and plain composition of the same inners and of the Gaussian aggregators by the PLD accountant (the
#: tightest plain composition the runs offer).  Every other runnable pair is listed as not compared, with why.
BEST_CONFIGURATIONS = (
    ("boundary-dp-argmax", "target-charging"),
    ("boundary-dp-weighted-sampling", "target-charging"),
    ("dp-argmax", "pld"),
    ("dp-weighted-sampling", "pld"),
    ("gaussian-threshold-argmax", "pld"),
    ("gaussian-argmax", "pld"),
)
GAUSSIAN = ("gaussian-argmax", "gaussian-threshold-argmax")
#: The rates of ``--subsample-teachers`` ``plan best`` compares for the Gaussian aggregators under PLD, which charges
#: them by the exact PLD of their subsampled noisy counts (docs/mechanisms/subsampled.md).
SUBSAMPLE_RATES = (0.5, 0.25, 0.1)
#: ``(mechanism, accountant, rate)``: the Gaussian aggregators on Poisson-subsampled teachers.
SUBSAMPLED_CONFIGURATIONS = tuple((name, "pld", rate) for name in GAUSSIAN for rate in SUBSAMPLE_RATES)
#: The public-candidate query generate runs (docs/tct_and_individual.md, "In generate"): BetweenThresholds on the
#: count of the public model's candidate among the teachers included at a random rate, thresholds from n.
PUBLIC_CANDIDATE = "between-thresholds"
#: The pairs ``plan best --public-agreement P`` adds: the public-candidate query as a q-target (target charging),
#: under individual charging (planned for the worst teacher charged on every hit) and as a pure step (PLD).
PUBLIC_CANDIDATE_CONFIGURATIONS = (
    (PUBLIC_CANDIDATE, "target-charging"),
    (PUBLIC_CANDIDATE, "individual-charging"),
    (PUBLIC_CANDIDATE, "pld"),
)
#: GNMax's largest noise (mechanisms.gaussian.MAX_SIGMA): a step epsilon that would need more is not tried.
GAUSSIAN_MAX_SIGMA = 1e4
#: The step epsilons compared: the 1-2-5 grid from 1e-5 to 50 (the largest step epsilon a run takes); those whose
#: budget search would pass the planning limit (docs/ranges.md) are left out for each budget.
BEST_STEP_EPSILONS = tuple(float(f"{m}e{k}") for k in range(-5, 2) for m in (1, 2, 5))
#: How many step deltas are compared below the largest (a decade apart).
BEST_STEP_DELTA_DECADES = 10
#: A run plan prints records enough for the budget to end its run before them with this probability.
RECORDS_QUANTILE = 0.99


def _grid_value(mantissa: int, exponent: int) -> float:
    return float(f"{mantissa}e{exponent}")


def best_step_deltas(budget_delta: float) -> tuple[float, ...]:
    """The step deltas ``plan best`` compares for the DPArgMax and DPWS configurations: the largest value on the
    1-2-5 grid at most a quarter of ``--budget-delta`` (target charging reserves half of it for the per-query
    weights ``w ~ 2 delta``, so a larger one pays for no query), and the values one to five decades below."""
    exponent = math.floor(math.log10(budget_delta / 4.0)) + 1
    top = None
    while top is None:
        for mantissa in (5, 2, 1):
            if _grid_value(mantissa, exponent) <= budget_delta / 4.0:
                top = (mantissa, exponent)
                break
        exponent -= 1
    values = [_grid_value(top[0], top[1] - k) for k in range(BEST_STEP_DELTA_DECADES)]
    return tuple(v for v in values if v >= MIN_DELTA)


def gaussian_step_delta(budget_delta: float) -> float:
    """The one step delta the Gaussian configurations are compared at: PLD composes a GNMax step by its noise
    alone, and the step epsilons sweep the noise, so one delta suffices (the largest of
    :func:`best_step_deltas`, at least the GNMax floor 1e-14)."""
    return max(best_step_deltas(budget_delta)[0], 1e-14)


def group_counts(num_teachers: int) -> tuple[int, ...]:
    """The group counts ``plan best`` compares: ``generate --groups G`` needs ``G`` to divide ``--teachers``, so the
    divisors of ``N`` that leave each group at least two teachers, about one per doubling (the largest divisor up to
    each power of two), 1 first."""
    divisors = sorted({d for k in range(1, math.isqrt(num_teachers) + 1) if num_teachers % k == 0
                       for d in (k, num_teachers // k) if num_teachers // d >= 2} | {1})
    out, power = [], 1
    while power <= divisors[-1]:
        below = [d for d in divisors if d <= power]
        if below[-1] not in out:
            out.append(below[-1])
        power *= 2
    return tuple(out)
