"""``pate-accountant experiment alpha-sweep``: synthetic alpha-mixture teachers (paper Section 6,
"Privacy analysis considerations": Figure "cumvote" right and Figure "alphasweep2").

The teachers are ``p^(i) = alpha s + (1 - alpha) r^(i)`` (:func:`ensembles.synthetic.alpha_mixture`, one
shared token, one private token per teacher).  Under a coordinated ensemble the count ``c`` of the shared
token is ``Bin(n, exp(-y (1 - alpha)))`` with ``y ~ Exp(alpha)``, i.e. the beta-binomial
``BetaBin(n, alpha / (1 - alpha), 1)``; the maximum count is ``max(c, 1)`` (the private tokens get one vote
each).  The experiment reports, for a grid of ``alpha``:

(a) the distribution of the maximum count ``/ n`` of coordinated histograms (quantiles, empirical CDF) next
    to that law (the paper's "cumulative maximum frequency" figure), with the Kolmogorov distance;
(b) the token / fail / target probabilities of ``BoundaryWrapper(DPArgMax(step_epsilon, step_delta))`` over the
    shared randomness (:func:`pate_app.experiments.section6.alpha_sweep`: exact per-histogram laws averaged over
    coordinated histograms), next to the same probabilities computed from the count law alone;
(c) queries per target hit ``1 / P[target]`` against the paper's "``>~ eps0 n``, lowest at
    ``alpha ~ T/n``", and yields per hit against "``~ eps0 n / 2`` for ``alpha <= T/n``".  The paper writes
    ``eps0`` there for the noise's per-count epsilon, because it charges a wrapped query at its noise level;
    we call that epsilon ``eps_c`` (``DPArgMax.per_count_epsilon``, equal to DPArgMax's epsilon) and keep
    ``eps0`` for the target level target charging charges, which for the wrapper is ``2 eps_c``
    (docs/cli.md, "One grammar").  So (c) compares with ``eps_c n`` and ``eps_c n / 2``;
(d) yields per budget for ``n = C_delta / eps0`` teachers (:func:`pate_accountant.planning.yields`: TCT hits
    times ``eps0 n / 2``, and the paper's ``0.005 n^2 / C_delta``), next to the count law's yields per hit
    of the mechanism target charging charges at level ``eps0``, ``BoundaryWrapper(DPArgMax(eps0 / 2, delta))``
    with its exact ``L``: at that ``n`` (where its threshold ``n/2 + L + 1`` is about ``n`` or above, so a
    hit buys about one yield) and with the fewest teachers that bring ``T/n`` down to
    ``TARGET_THRESHOLD_FRACTION``.

Section (c) uses a small derivation of ours: the wrapped NoisyArgMax has target mass only within about
``1/eps_c`` counts of ``c0 = n/2 + L``, and ``sum_c P[target | c] ~ 2 ln(3/2) / eps_c`` (Laplace-noise
approximation); the count density at ``c0`` is largest over ``alpha`` at ``1 / (e theta ln(1/theta) n)``
with ``theta = c0 / n``.  So the fewest queries per hit are ``kappa(theta) eps_c n`` with
``kappa = e theta ln(1/theta) / (2 ln 1.5)``, which is 0.87-1.16 for ``theta`` in ``[0.5, 0.7]``: the
paper's ``eps0 n`` read with ``eps_c``.  Likewise the yield ``P[c >= c0] = 1 - theta^(alpha/(1-alpha))`` is ``alpha ln(1/theta)``
to first order: the paper's "``~ alpha``" up to the threshold's constant ``ln(1/theta)``.

The deltas here are the paper's settings, not a run's sizing, so the per-query delta that ``plan`` picks for a
run (:func:`pate_accountant.planning.step_delta_for_queries` for :func:`~pate_accountant.planning.expected_queries`)
is deliberately not used.  ``--step-delta`` (default ``1e-6``) is the delta of the DPArgMax whose per-histogram
laws (b)-(c) report, and the ``delta0`` of the paper's ``C_delta = 2 ln(1/delta0)`` in (d), whose hits are those
of a pure inner (no per-query delta), as in the paper's figure.  A target-charged run at the same budget must
pay each query's delta from it: at ``(1, 1e-6)`` and ``eps0 = 0.01`` the per-query delta that pays for four times
the expected queries is ``1e-10``, which buys 119 hits instead of 130 and moves the wrapped DPArgMax's ``L`` from
1565 to 3407.  ``pate-accountant plan yields`` sizes that run; (d) shows the paper's relation, and how far the
count law of the charged mechanism already falls below it (``tests/test_repro_alpha_tct.py`` checks these
figures).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ensembles.histograms import coordinated_votes
from ensembles.metrics import max_counts
from ensembles.synthetic import alpha_mixture
from pate_accountant.validation import check_int, check_real
from pate_app.experiments import claim_lines, parse_float_list, size_option
from pate_app.grammar import add_option
from pate_app.plotting import (
    COLORS,
    legend_outside,
    new_figure,
    styled,
)

NAME = "alpha-sweep"
HELP = "Section 6 alpha sweep: max counts, token/fail/target probabilities, queries and yields per hit"
DESCRIPTION = (
    "Synthetic alpha-mixture teachers p_i = alpha s + (1 - alpha) r_i (Hot PATE Section 6). For each alpha: "
    "the distribution of the maximum count of coordinated histograms against its beta-binomial law (the "
    "paper's cumulative max-frequency figure), the token / fail / target probabilities of the boundary-"
    "wrapped NoisyArgMax (BoundaryWrapper(DPArgMax)) over the shared randomness, queries and yields per "
    "target hit against the paper's eps0 n and eps0 n / 2 (read with the per-count epsilon eps_c), and the "
    "yields a budget buys with "
    "n = C_delta / eps0 teachers. Model-free."
)
SIZES = {
    "full": {
        "teachers": 1000,
        "samples": 5000,
        "alphas": [0.003, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.45, 0.5, 0.55, 0.6,
                   0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0],
        "eps0": [0.002, 0.005, 0.01, 0.02],
    },
    "quick": {
        "teachers": 300,
        "samples": 1500,
        "alphas": [0.01, 0.03, 0.1, 0.3, 0.45, 0.6, 0.7, 0.8, 0.9, 1.0],
        "eps0": [0.005, 0.01, 0.02],
    },
}
FULL_RUNTIME = "35-50 s wall, 30-35 s CPU on a shared 2-core CPU"  # measured: docs/results.md, section alpha-sweep

#: Defaults of the mechanism (the step: (epsilon, delta) of one DPArgMax run under replace-one) and of the budget.
DEFAULT_STEP_EPSILON = 0.5
DEFAULT_STEP_DELTA = 1e-6
DEFAULT_BUDGET_EPSILON = 1.0
DEFAULT_BUDGET_DELTA = 1e-6
#: Quantile levels of max count / n reported per alpha; x grid of the reported CDFs.
QUANTILE_LEVELS = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95)
CDF_GRID = tuple(round(i / 100, 2) for i in range(101))
#: Family-wise level of the claim checks in :func:`run` (Bonferroni over all checks of one kind).
FAMILY_LEVEL = 1e-4
#: Section (d) also evaluates the count law with the fewest teachers that bring the release threshold T/n down to
#: this fraction: close to the sweep's own T/n (0.53 at the full size), where its queries and yields per hit
#: land near the paper's relations read with eps_c.
TARGET_THRESHOLD_FRACTION = 0.55
#: alpha values for the count law at n = C_delta / eps0 (section (d)): a fine grid for the extremes.
_LAW_ALPHAS = tuple(float(a) for a in np.round(np.concatenate([[1e-4, 1e-3], np.linspace(0.01, 0.99, 99)]), 4))


def add_arguments(parser) -> None:
    """``--teachers``, ``--samples``, ``--alphas``, ``--step-epsilon``, ``--step-delta``, ``--eps0``,
    ``--budget-epsilon``, ``--budget-delta`` (defaults: ``SIZES`` and the constants above)."""
    full, quick = SIZES["full"], SIZES["quick"]
    size_option(parser, SIZES, "--teachers", "N", "ensemble size n")
    size_option(parser, SIZES, "--samples", "S", "coordinated histograms per alpha")
    parser.add_argument("--alphas", metavar="A,B,...", default=None,
                        help="comma-separated weights of the common part, each in (0, 1] "
                             f"(default: {len(full['alphas'])} values, --quick {len(quick['alphas'])})")
    add_option(parser, "--step-epsilon", "--epsilon", dest="step_epsilon", type=float, metavar="EPS", default=None,
               help=f"epsilon of one run of the DPArgMax under replace-one (default {DEFAULT_STEP_EPSILON}); it noises "
                    "its one deciding count at this epsilon, so this is also the per-count epsilon eps_c of the noise, "
                    "and target charging charges the wrapped mechanism at level eps0 = 2 eps_c")
    add_option(parser, "--step-delta", "--delta", dest="step_delta", type=float, metavar="D", default=None,
               help=f"delta of one run of the DPArgMax, also the delta0 of C_delta = 2 ln(1/delta0) "
                    f"(default {DEFAULT_STEP_DELTA:g})")
    parser.add_argument("--eps0", metavar="E,F,...", default=None,
                        help="comma-separated target levels eps0 (what target charging charges per target hit; "
                             "a wrapped DPArgMax of step epsilon eps0/2) for the yields-per-budget table "
                             f"(default {','.join(map(str, full['eps0']))}; --quick "
                             f"{','.join(map(str, quick['eps0']))})")
    parser.add_argument("--budget-epsilon", type=float, metavar="EPS", default=None,
                        help=f"total epsilon of the budget for the yields table (default {DEFAULT_BUDGET_EPSILON:g})")
    parser.add_argument("--budget-delta", type=float, metavar="D", default=None,
                        help=f"total delta of the budget for the yields table (default {DEFAULT_BUDGET_DELTA:g})")


# -- option parsing --------------------------------------------------------------------------------------


def _options(quick, teachers, samples, alphas, step_epsilon, step_delta, eps0, budget_epsilon, budget_delta) -> dict:

    sizes = SIZES["quick" if quick else "full"]
    return {
        "teachers": check_int("--teachers", sizes["teachers"] if teachers is None else teachers, minimum=2),
        "samples": check_int("--samples", sizes["samples"] if samples is None else samples, minimum=2),
        "alphas": parse_float_list("--alphas", alphas, sizes["alphas"], maximum=1.0),
        "step_epsilon": check_real("--step-epsilon", DEFAULT_STEP_EPSILON if step_epsilon is None else step_epsilon,
                                   minimum=0.0, min_open=True),
        "step_delta": check_real("--step-delta", DEFAULT_STEP_DELTA if step_delta is None else step_delta,
                                 minimum=0.0, maximum=1.0, min_open=True, max_open=True),
        "eps0": parse_float_list("--eps0", eps0, sizes["eps0"], maximum=1.0),
        "budget_epsilon": check_real("--budget-epsilon", DEFAULT_BUDGET_EPSILON if budget_epsilon is None
                                     else budget_epsilon, minimum=0.0, min_open=True),
        "budget_delta": check_real("--budget-delta", DEFAULT_BUDGET_DELTA if budget_delta is None else budget_delta,
                                   minimum=0.0, maximum=1.0, min_open=True, max_open=True),
    }


# -- the count law ---------------------------------------------------------------------------------------


def max_count_pmf(num_teachers: int, alpha: float) -> np.ndarray:
    """Law of the maximum count ``m`` (index ``0..n``) of a coordinated histogram of alpha-mixture teachers
    (one shared token, one private token each): ``m = max(c, 1)`` with ``c ~ BetaBin(n, alpha/(1-alpha), 1)``
    (the paper's ``y ~ Exp(alpha)``, ``c ~ Bin(n, e^{-y (1 - alpha)})``); ``m = n`` when ``alpha = 1``.
    With ``b = 1`` the beta-binomial has the closed form ``P[c = k] = a n! Gamma(k + a) / (k! Gamma(n + a + 1))``,
    ``a = alpha / (1 - alpha)`` (several times faster than ``scipy.stats.betabinom``, equal to it within
    ``1e-9`` relative)."""
    from scipy.special import gammaln

    n = num_teachers
    pmf = np.zeros(n + 1)
    if alpha >= 1.0:
        pmf[n] = 1.0
        return pmf
    a = alpha / (1.0 - alpha)
    k = np.arange(n + 1, dtype=float)
    pmf[:] = np.exp(math.log(a) + gammaln(n + 1.0) - gammaln(n + a + 1.0) + gammaln(k + a) - gammaln(k + 1.0))
    pmf[1] += pmf[0]
    pmf[0] = 0.0
    return pmf


def outcome_law(wrapper, num_teachers: int) -> tuple[np.ndarray, np.ndarray]:
    """``(y, t)`` indexed by the top count ``m = 0..n``: the inner DPArgMax's yield probability
    ``P[c + X > n/2 + L]`` and the wrapper's ``P[target]`` on a histogram whose largest count is ``m``
    (the token is ``(1 - t) y``, fail ``(1 - t)(1 - y)``).  Public mechanism API only."""
    from mechanisms.boundary_wrapper import target_probability


    counts = np.arange(num_teachers + 1)
    y = np.asarray(wrapper.inner.yield_probability(counts, num_teachers), dtype=float)
    t = np.array([target_probability(max(v, 1.0 - v)) for v in y])
    return y, t


def _law_outcomes(pmf: np.ndarray, y: np.ndarray, t: np.ndarray) -> dict:
    token = float(pmf @ ((1.0 - t) * y))
    target = float(pmf @ t)
    return {"token": token, "target": target, "fail": max(0.0, 1.0 - token - target)}


def kappa(theta: float) -> float:
    """``e theta ln(1/theta) / (2 ln 1.5)``: fewest queries per target hit over alpha, in units of
    ``eps_c n`` (``eps_c``: the per-count epsilon of the noise), when the release threshold sits at ``theta n`` (module docstring)."""
    return math.e * theta * math.log(1.0 / theta) / (2.0 * math.log(1.5))


# -- (a) maximum counts ----------------------------------------------------------------------------------


def _max_count_distributions(alphas, n: int, s: int, seed: int, progress) -> dict:

    rng = np.random.default_rng([seed, 1])  # a stream of its own, apart from the sweep's
    grid = np.asarray(CDF_GRID)
    out = {"quantiles": [], "law_quantiles": [], "mean": [], "std": [], "cdf": [], "law_cdf": [], "ks": []}
    for alpha in alphas:
        teachers = alpha_mixture(n, 1 + n, alpha, rng)
        m = max_counts(coordinated_votes(teachers, s, rng))
        pmf = max_count_pmf(n, alpha)
        law_cdf = np.minimum(np.cumsum(pmf), 1.0)
        emp_cdf = np.cumsum(np.bincount(m, minlength=n + 1)) / s
        frac = m / n
        out["quantiles"].append([float(v) for v in np.quantile(frac, QUANTILE_LEVELS)])
        out["law_quantiles"].append([float(np.searchsorted(law_cdf, q - 1e-12) / n) for q in QUANTILE_LEVELS])
        out["mean"].append(float(frac.mean()))
        out["std"].append(float(frac.std(ddof=1)))
        idx = np.floor(grid * n + 1e-9).astype(int)
        out["cdf"].append([float(v) for v in emp_cdf[idx]])
        out["law_cdf"].append([float(v) for v in law_cdf[idx]])
        out["ks"].append(float(np.max(np.abs(emp_cdf - law_cdf))))
        if progress is not None:
            progress()
    return out


# -- (d) yields per budget -------------------------------------------------------------------------------


def teachers_for_threshold(error_bound: int, fraction: float = TARGET_THRESHOLD_FRACTION) -> int:
    """The fewest teachers ``n`` whose release threshold ``n//2 + L + 1`` is at most ``fraction n``
    (``fraction`` in ``(1/2, 1]``)."""
    L = check_int("error_bound", error_bound, minimum=0)
    fraction = check_real("fraction", fraction, minimum=0.5, maximum=1.0, min_open=True)
    n = max(1, math.floor((L + 0.5) / (fraction - 0.5)) - 2)
    while n // 2 + L + 1 > fraction * n:
        n += 1
    return n


def _law_at(wrapper, n: int) -> dict:
    """The count law's queries and yields per target hit of ``wrapper`` with ``n`` alpha-mixture teachers, worst
    case over ``alpha <= T/n`` on the fine grid ``_LAW_ALPHAS`` (``None`` where no alpha has target mass)."""
    T = n // 2 + wrapper.inner.error_bound + 1
    y, t = outcome_law(wrapper, n)
    laws = [(a, _law_outcomes(max_count_pmf(n, a), y, t)) for a in _LAW_ALPHAS]
    best = max(o["target"] for _, o in laws)
    per_hit = [o["token"] / o["target"] for a, o in laws if o["target"] > 0 and a <= T / n]
    small = laws[0][1]
    return {
        "threshold_fraction": T / n,
        "min_queries_per_hit": 1.0 / best if best > 0 else None,
        "yields_per_hit_small_alpha": small["token"] / small["target"] if small["target"] > 0 else None,
        "min_yields_per_hit_below_threshold": min(per_hit) if per_hit else None,
    }


def _yields_rows(eps0_values, budget_epsilon, budget_delta, delta, progress) -> list[dict]:

    from mechanisms.boundary_wrapper import BoundaryWrapper
    from mechanisms.noisy_argmax import DPArgMax
    from pate_accountant import planning

    rows = []
    for eps0 in eps0_values:
        plan = planning.yields(budget_epsilon, budget_delta, eps0, aggregator_delta=delta)
        n = int(plan.num_teachers_needed)
        # The mechanism target charging charges at level eps0: a wrapped DPArgMax of step epsilon eps0 / 2 (its
        # per-count epsilon eps_c = eps0 / 2), with its exact L.
        wrapper = BoundaryWrapper(DPArgMax(eps0 / 2.0, delta))
        L = wrapper.inner.error_bound
        row = {
            "eps0": eps0, "step_epsilon": eps0 / 2.0, "c_delta": plan.c_delta, "num_teachers": n, "hits": plan.hits,
            "epsilon_spent": plan.epsilon_spent, "yields_per_hit": plan.yields_per_hit, "yields": plan.yields,
            "paper_hits": plan.paper_hits, "paper_yields": plan.paper_formula_yields,
            "error_bound": L, "teachers_to_release": 2 * L + 1,
        }
        # The count law of that mechanism at the paper's n = C_delta / eps0 ...
        law = _law_at(wrapper, n)
        row.update({"threshold_fraction": law["threshold_fraction"],
                    **{f"law_{k}": v for k, v in law.items() if k != "threshold_fraction"}})
        per_hit = law["min_yields_per_hit_below_threshold"]
        row["law_yields"] = plan.hits * per_hit if per_hit is not None else None
        # ... and with the fewest teachers that bring its threshold down to TARGET_THRESHOLD_FRACTION n.
        n_more = teachers_for_threshold(L)
        more = _law_at(wrapper, n_more)
        per_hit = more["min_yields_per_hit_below_threshold"]
        row.update({
            "more_teachers": n_more, "more_threshold_fraction": more["threshold_fraction"],
            "more_eps_c_n_half": eps0 / 2.0 * n_more / 2.0,
            **{f"more_law_{k}": v for k, v in more.items() if k != "threshold_fraction"},
            "more_law_yields": plan.hits * per_hit if per_hit is not None else None,
        })
        rows.append(row)
        if progress is not None:
            progress()
    return rows


# -- run -------------------------------------------------------------------------------------------------


def _claims(result: dict) -> list[dict]:
    """The paper's statements checked on this run (margins from the sample size, family level
    ``FAMILY_LEVEL``); ``tests/test_repro_alpha_tct.py`` re-derives the same checks independently."""
    from scipy import stats

    sweep, law, mc = result["sweep"], result["law"], result["max_counts"]
    p = result["parameters"]
    s = p["samples"]
    alphas = sweep["alphas"]
    theta = sweep["threshold_fraction"]
    z = float(stats.norm.isf(FAMILY_LEVEL / (2 * 3 * len(alphas))))
    dkw = math.sqrt(math.log(2 * len(alphas) / FAMILY_LEVEL) / (2 * s))
    claims = []

    worst = max(abs(sweep[k][i] - law[k][i]) / math.sqrt(max(law[k][i] * (1 - law[k][i]), 1e-12) / s)
                for k in ("token", "fail", "target") for i in range(len(alphas)))
    claims.append({"claim": "token/fail/target match the beta-binomial count law (paper: max count ~ "
                            "Bin(n, e^{-y(1-alpha)}), y ~ Exp(alpha))",
                   "holds": worst <= z, "detail": f"largest |z| = {worst:.2f} <= {z:.2f}"})
    ks = max(mc["ks"])
    claims.append({"claim": "max-count distribution matches the law (Kolmogorov distance within DKW)",
                   "holds": ks <= dkw, "detail": f"max KS = {ks:.4f} <= DKW {dkw:.4f}"})
    shifts = [mc["cdf"][i + 1][j] - mc["cdf"][i][j] for i in range(len(alphas) - 1) for j in range(len(CDF_GRID))]
    claims.append({"claim": "max-count distribution shifts up with alpha (CDFs ordered within 2 DKW)",
                   "holds": max(shifts) <= 2 * dkw,
                   "detail": f"largest CDF increase {max(shifts):.4f} <= {2 * dkw:.4f}"})
    band = result["yield_vs_alpha"]
    ok = all(lo_ok and hi_ok for lo_ok, hi_ok, applies in zip(band["above_low"], band["below_high"], band["applies"])
             if applies)
    claims.append({"claim": "yield ~ alpha for alpha <= T/n: yield/alpha in [ln(n/T_sure), ln 2/(1-alpha)]",
                   "holds": ok, "detail": f"ln(n/T_sure) = {band['band_low']:.3f}, ln 2 = {math.log(2):.3f}"})
    ok = all(c for c, applies in zip(band["first_order_close"], band["applies"]) if applies)
    small = band["first_order"][0]
    claims.append({"claim": "yield ~ P[c >= T] = 1 - (T/n)^(alpha/(1-alpha)) ~ alpha ln(n/T) for alpha <= T/n "
                            "(within sampling error plus P[target])",
                   "holds": ok, "detail": f"yield/alpha -> ln(n/T) = {math.log(1 / theta):.3f} as alpha -> 0"
                                          + (f" ({small:.3f} at alpha = {alphas[0]:g})" if small else "")})
    qph = result["queries_per_hit"]
    ratio = qph["ratio_to_paper"]
    claims.append({"claim": "fewest queries per target hit ~ eps_c n (paper: >~ eps0 n, lowest at alpha ~ T/n)",
                   "holds": ratio is not None and 0.5 <= ratio <= 2.0,
                   "detail": f"min {qph['min']:.1f} at alpha={qph['argmin_alpha']} vs eps_c n = {qph['paper']:.1f} "
                             f"(ratio {ratio:.2f}; kappa(T/n={theta:.2f}) = {qph['kappa']:.2f})"
                   if ratio is not None else "no target mass"})
    total = max(abs(sweep["token"][i] + sweep["fail"][i] + sweep["target"][i] - 1) for i in range(len(alphas)))
    claims.append({"claim": "token + fail + target = 1", "holds": total <= 1e-9, "detail": f"max error {total:.1e}"})
    return claims


def run(*, quick: bool = False, seed: int = 0, progress: bool = True, teachers=None, samples=None, alphas=None,
        step_epsilon=None, step_delta=None, eps0=None, budget_epsilon=None, budget_delta=None) -> dict:
    """The whole experiment (module docstring); deterministic for ``seed``.  Bad options raise
    ``ValueError`` / ``TypeError`` naming the option."""
    from scipy import stats
    from tqdm import tqdm

    from mechanisms.boundary_wrapper import BoundaryWrapper
    from mechanisms.noisy_argmax import DPArgMax
    from pate_app.experiments.section6 import alpha_sweep


    seed = check_int("--seed", seed, minimum=0)
    opt = _options(quick, teachers, samples, alphas, step_epsilon, step_delta, eps0, budget_epsilon, budget_delta)
    n, s, grid = opt["teachers"], opt["samples"], opt["alphas"]
    wrapper = BoundaryWrapper(DPArgMax(opt["step_epsilon"], opt["step_delta"]))
    L = wrapper.inner.error_bound
    if n // 2 + L + 1 > n:
        raise ValueError(
            f"--teachers {n} is too small for --step-epsilon {opt['step_epsilon']:g} / --step-delta "
            f"{opt['step_delta']:g}: the release threshold n/2 + L + 1 = {n // 2 + L + 1} (L = {L}) exceeds n; use at least {2 * L + 2} teachers"
        )
    with tqdm(total=2 * len(grid) + len(opt["eps0"]), desc=NAME, unit="step", disable=not progress,
              dynamic_ncols=True) as bar:
        bar.set_postfix_str("outcome probabilities")
        sweep = alpha_sweep(grid, num_teachers=n, num_samples=s, epsilon=opt["step_epsilon"],
                            delta=opt["step_delta"], seed=seed, progress=bar.update)
        bar.set_postfix_str("max counts")
        max_counts = _max_count_distributions(grid, n, s, seed, bar.update)
        bar.set_postfix_str("yields per budget")
        yields_rows = _yields_rows(opt["eps0"], opt["budget_epsilon"], opt["budget_delta"], opt["step_delta"],
                                   bar.update)

    y, t = outcome_law(wrapper, n)
    pmfs = [max_count_pmf(n, a) for a in grid]
    outcomes = [_law_outcomes(pmf, y, t) for pmf in pmfs]
    law = {k: [o[k] for o in outcomes] for k in ("token", "fail", "target")}
    law["queries_per_hit"] = [1.0 / o["target"] if o["target"] > 0 else None for o in outcomes]
    law["yields_per_hit"] = [o["token"] / o["target"] if o["target"] > 0 else None for o in outcomes]

    theta = sweep["threshold_fraction"]
    sure = int(np.argmax(y >= 1.0)) if np.any(y >= 1.0) else n + 1  # least top count that always yields
    z = float(stats.norm.isf(FAMILY_LEVEL / (2 * len(grid))))
    band_low = math.log(n / sure) if sure <= n else 0.0
    above, below, close, ratio = [], [], [], []
    for a, token, target, target_se in zip(grid, sweep["token"], sweep["target"], sweep["target_se"]):
        lo, hi = a * band_low, min(1.0, a * math.log(2.0) / (1.0 - a)) if a < 1 else 1.0
        above.append(bool(token >= lo - z * math.sqrt(lo * (1 - lo) / s)))
        below.append(bool(token <= hi + z * math.sqrt(hi * (1 - hi) / s)))
        # P[c >= T] = 1 - theta^(a/(1-a)); the wrapper takes at most P[target] from the yield.
        first = 1.0 - theta ** (a / (1.0 - a)) if a < 1 else 1.0
        close.append(bool(abs(token - first) <= z * math.sqrt(first * (1 - first) / s) + target + z * target_se))
        ratio.append(token / a)
    yield_vs_alpha = {
        "ratio": ratio, "band_low": band_low, "band_high": [math.log(2.0) / (1.0 - a) if a < 1 else None for a in grid],
        "sure_count": sure, "applies": [a <= theta for a in grid], "above_low": above, "below_high": below,
        "first_order": [(1.0 - theta ** (a / (1.0 - a))) / a if a < 1 else None for a in grid],
        "first_order_close": close,
    }

    finite = [(q, a) for q, a in zip(sweep["queries_per_hit"], grid) if q is not None]
    qmin, qarg = min(finite) if finite else (None, None)
    paper_q = sweep["paper_queries_per_hit"]
    law_finite = [q for q in law["queries_per_hit"] if q is not None]
    below_yph = [v for v, a in zip(sweep["yields_per_hit"], grid) if v is not None and a <= theta]
    queries_per_hit = {
        "min": qmin, "argmin_alpha": qarg, "paper": paper_q,
        "ratio_to_paper": qmin / paper_q if qmin is not None else None,
        "law_min_on_grid": min(law_finite) if law_finite else None,
        "kappa": kappa(theta), "kappa_theta": theta,
        "median_yields_per_hit_below_threshold": float(np.median(below_yph)) if below_yph else None,
        "paper_yields_per_hit": sweep["paper_yields_per_hit"],
        "first_order_yields_per_hit": theta * math.log(1.0 / theta) / (2.0 * math.log(1.5)) * paper_q,
    }

    result = {
        "experiment": NAME,
        "quick": bool(quick),
        "parameters": {**opt, "seed": seed, "error_bound": L, "per_count_epsilon": wrapper.inner.per_count_epsilon,
                       "threshold": n // 2 + L + 1, "threshold_fraction": theta,
                       "mechanism": sweep["parameters"]["mechanism"], "quantile_levels": list(QUANTILE_LEVELS),
                       "cdf_grid": list(CDF_GRID), "family_level": FAMILY_LEVEL},
        "sweep": sweep,
        "law": law,
        "max_counts": max_counts,
        "yield_vs_alpha": yield_vs_alpha,
        "queries_per_hit": queries_per_hit,
        "yields_per_budget": yields_rows,
        "notes": [
            "sweep: pate_app.experiments.section6.alpha_sweep (exact per-histogram laws of the wrapped DPArgMax, "
            "averaged over coordinated histograms; *_se are standard errors).",
            "law: the same probabilities from the beta-binomial law of the maximum count alone.",
            "The paper's eps0 n and eps0 n / 2 are read with eps_c, the per-count epsilon of the DPArgMax noise "
            "(equal to its epsilon); eps0 elsewhere is the target level target charging charges, 2 eps_c for the "
            "wrapper.",
            "yield ~ alpha: to first order the yield is alpha ln(n/T); the band [ln(n/T_sure), ln 2/(1-alpha)] "
            "brackets it, T_sure being the least top count that always yields and n/2 the largest that never does.",
            "yields_per_budget: planning.yields (TCT hits at level eps0, q = 1/3, times eps0 n / 2) with "
            "n = ceil(C_delta / eps0). The mechanism target charging charges at level eps0 is a wrapped DPArgMax of "
            "step epsilon eps0 / 2 (per-count eps_c = eps0 / 2); error_bound is its exact L, threshold_fraction its "
            "T/n = (n//2 + L + 1)/n at that n (above 1: even a unanimous histogram yields with probability below "
            "1/2), teachers_to_release = 2L+1 (the fewest n with T <= n). law_*: that mechanism's count law at that n, worst case over "
            "alpha <= T/n (law_yields = hits x law_min_yields_per_hit_below_threshold). more_*: the same with "
            f"more_teachers, the fewest teachers that bring T/n down to {TARGET_THRESHOLD_FRACTION:g}; "
            "more_eps_c_n_half is the paper's eps0 n / 2 read with eps_c at that n.",
        ],
    }
    result["claims"] = _claims(result)
    return result


# -- plots -----------------------------------------------------------------------------------------------


@styled
def _plot_max_counts(result: dict, path: Path) -> None:
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import LogNorm
    from matplotlib.lines import Line2D

    mc, p = result["max_counts"], result["parameters"]
    alphas = result["sweep"]["alphas"]
    theta = p["threshold_fraction"]
    fig = new_figure((12.5, 4.8))
    left, right = fig.subplots(1, 2)
    # Left: one colour per alpha on a colour bar (not a ten-entry legend); solid simulated, dotted the law.
    cmap = colormaps["viridis"]
    positive = [a for a in alphas if a > 0]
    norm = LogNorm(min(positive), max(positive))
    x = np.asarray(p["cdf_grid"])
    for i, alpha in enumerate(alphas):
        color = cmap(norm(max(alpha, min(positive))))
        left.plot(x, mc["cdf"][i], color=color, linewidth=1.5)
        left.plot(x, mc["law_cdf"][i], color=color, linestyle=":", linewidth=1.3)
    left.axvline(theta, color=COLORS["threshold"], linestyle="--", linewidth=1)
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=left, label="alpha")
    left.legend(handles=[Line2D([], [], color="k", linewidth=1.5, label="coordinated histograms"),
                         Line2D([], [], color="k", linestyle=":", label="beta-binomial law"),
                         Line2D([], [], color=COLORS["threshold"], linestyle="--", label=f"T/n = {theta:.2f}")],
                loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
    left.set_xlabel("maximum count / n")
    left.set_ylabel("P[maximum count / n <= x]")
    left.set_title("Distribution of the largest vote count")
    # Right: quantiles in one sequential colour ramp (low to high), the mean in black.
    q = np.asarray(mc["quantiles"])
    levels = p["quantile_levels"]
    ramp = colormaps["plasma"]
    for j, level in enumerate(levels):
        right.plot(alphas, q[:, j], color=ramp(0.1 + 0.75 * j / max(1, len(levels) - 1)), marker="o",
                   label=f"{level:g} quantile")
    right.plot(alphas, mc["mean"], color="black", linestyle="--", label="mean")
    right.axhline(theta, color=COLORS["threshold"], linestyle="--", linewidth=1, label=f"T/n = {theta:.2f}")
    right.set_xscale("log")
    right.set_xlabel("alpha (weight of the common part)")
    right.set_ylabel("maximum count / n")
    right.set_title("Quantiles of the largest vote count")
    right.grid(True, which="major", alpha=0.3)
    legend_outside(right)
    fig.suptitle(f"alpha-mixture teachers, n = {p['teachers']}, {p['samples']} coordinated histograms per alpha")
    fig.savefig(path)


@styled
def _plot_yields(result: dict, path: Path) -> None:
    from matplotlib.ticker import LogLocator, NullLocator

    rows = result["yields_per_budget"]
    p = result["parameters"]
    fig = new_figure((8.2, 5.6))
    ax = fig.add_subplot()
    n = [r["num_teachers"] for r in rows]
    more = [r["more_teachers"] for r in rows]

    def nan(values):
        return [np.nan if v is None else v for v in values]

    ax.plot(n, [r["yields"] for r in rows], marker="o", color=COLORS["yields"],
            label="planned: TCT hits x eps0 n / 2 (planning.yields), n = C_delta / eps0")
    ax.plot(n, [r["paper_yields"] for r in rows], color=COLORS["paper"], linewidth=2.2,
            label="paper: 0.005 n^2 / C_delta")
    ax.plot(n, nan(r["law_yields"] for r in rows), marker="s", color=COLORS["queries"], linestyle="--",
            label="count law of the mechanism charged at eps0 (step eps0 / 2), n = C_delta / eps0"
                  + (f":\nT/n >= {min(r['threshold_fraction'] for r in rows):.2f}" if rows else ""))
    ax.plot(more, nan(r["more_law_yields"] for r in rows), marker="D", color=COLORS["queries"], linestyle=":",
            label=f"the same mechanism with the teachers that bring T/n down to {TARGET_THRESHOLD_FRACTION:g}")
    for r in rows:  # eps0 beside the planned point (above left) and beside the larger ensemble (below right)
        ax.annotate(f"eps0 = {r['eps0']:g}", (r["num_teachers"], r["yields"]), fontsize=9,
                    textcoords="offset points", xytext=(-6, 10), ha="right")
        if r["more_law_yields"] is not None:
            ax.annotate(f"eps0 = {r['eps0']:g}", (r["more_teachers"], r["more_law_yields"]), fontsize=9,
                        color=COLORS["queries"], textcoords="offset points", xytext=(8, -14), ha="left")
    ax.set_xscale("log")
    ax.set_yscale("log")
    if rows:  # room for the labels on both sides
        ax.set_xlim(min(n) / 2.2, max(more + n) * 3.0)
    ax.margins(y=0.15)
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(lambda value, _position: f"{value:,.0f}")
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("teachers n")
    ax.set_ylabel(f"yields within epsilon {p['budget_epsilon']:g}, delta {p['budget_delta']:g}")
    ax.set_title("Yields per budget, worst case over alpha")
    ax.grid(True, which="both", alpha=0.25)
    legend_outside(ax, where="below")
    fig.savefig(path)


def plot(result: dict, out_dir) -> list[Path]:
    """``alpha_sweep_outcomes.png`` (:func:`pate_app.experiments.section6.plot_alpha_sweep`),
    ``alpha_sweep_max_counts.png`` and ``alpha_sweep_yields.png`` in ``out_dir``."""
    from pate_app.experiments.section6 import plot_alpha_sweep


    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    outcomes = out / "alpha_sweep_outcomes.png"
    plot_alpha_sweep(result["sweep"], outcomes)
    max_counts = out / "alpha_sweep_max_counts.png"
    _plot_max_counts(result, max_counts)
    yields = out / "alpha_sweep_yields.png"
    _plot_yields(result, yields)
    return [outcomes, max_counts, yields]


# -- summary ---------------------------------------------------------------------------------------------


def _fmt(v, spec=".4g") -> str:
    """``v`` formatted by ``spec``; ``None`` is a ``-`` of the same width, so a table's columns stay aligned."""
    if v is not None:
        return format(v, spec)
    width = "".join(c for c in spec.split(".")[0] if c.isdigit())
    return format("-", f">{width}") if width else "-"


def summary(result: dict) -> str:
    p, sweep, law, mc = result["parameters"], result["sweep"], result["law"], result["max_counts"]
    qph = result["queries_per_hit"]
    lines = [
        f"alpha-sweep: n={p['teachers']}, {p['samples']} coordinated histograms per alpha, {p['mechanism']}, "
        f"L={p['error_bound']}, per-count eps_c={p['per_count_epsilon']:g} (target level eps0 = "
        f"{2 * p['per_count_epsilon']:g}), T/n={p['threshold_fraction']:.3f}, "
        f"seed={p['seed']}",
        "",
        "columns: med/q90 max/n = median and 0.9-quantile of the largest count over n; token, fail, target = "
        "outcome probabilities over the shared randomness, (law) = from the count law alone; q/hit, y/hit = "
        "queries and yields per target hit (- : no target mass); yield/alpha = P[token] / alpha",
        f"{'alpha':>6} | {'med max/n':>9} {'q90 max/n':>9} | {'token':>7} {'(law)':>7} {'fail':>7} {'target':>8} "
        f"{'(law)':>8} | {'q/hit':>10} {'y/hit':>10} | {'yield/alpha':>11}",
    ]
    levels = p["quantile_levels"]
    i50, i90 = levels.index(0.5), levels.index(0.9)
    for i, a in enumerate(sweep["alphas"]):
        lines.append(
            f"{a:>6g} | {mc['quantiles'][i][i50]:>9.3f} {mc['quantiles'][i][i90]:>9.3f} | {sweep['token'][i]:>7.4f} "
            f"{law['token'][i]:>7.4f} {sweep['fail'][i]:>7.4f} {sweep['target'][i]:>8.5f} {law['target'][i]:>8.5f} | "
            f"{_fmt(sweep['queries_per_hit'][i], '>10.4g')} {_fmt(sweep['yields_per_hit'][i], '>10.4g')} | "
            f"{result['yield_vs_alpha']['ratio'][i]:>11.3f}"
        )
    lines += [
        "",
        f"queries per target hit: min {_fmt(qph['min'], '.1f')} at alpha={qph['argmin_alpha']} vs paper eps_c n = "
        f"{qph['paper']:.1f} (our estimate kappa eps_c n = {qph['kappa'] * qph['paper']:.1f}); yields per hit for "
        f"alpha <= T/n: median {_fmt(qph['median_yields_per_hit_below_threshold'], '.1f')} vs paper eps_c n/2 = "
        f"{qph['paper_yields_per_hit']:.1f}",
        "",
        f"yields per budget (epsilon={p['budget_epsilon']:g}, delta={p['budget_delta']:g}, n = C_delta/eps0):",
        "  planned = planning.yields (hits x eps0 n / 2); paper = 0.005 n^2 / C_delta; then the count law (worst case "
        "over alpha <= T/n)",
        "  of the mechanism target charging charges at level eps0, a wrapped DPArgMax of step epsilon eps0/2 with its "
        "exact L:",
        "  at n (T/n, y/hit, yields = hits x y/hit; n>= = 2L+1, where T/n reaches 1) and at n55, the fewest "
        f"teachers with T/n <= {TARGET_THRESHOLD_FRACTION:g}",
        f"{'eps0':>7} {'n':>7} {'hits':>6} {'planned':>9} {'paper':>9} | {'T/n':>6} {'n>=':>7} {'y/hit':>7} "
        f"{'yields':>9} | {'n55':>7} {'y/hit':>7} {'yields':>9}",
    ]
    for r in result["yields_per_budget"]:
        lines.append(
            f"{r['eps0']:>7g} {r['num_teachers']:>7d} {r['hits']:>6d} {r['yields']:>9.1f} {r['paper_yields']:>9.1f} | "
            f"{r['threshold_fraction']:>6.3f} {r['teachers_to_release']:>7d} "
            f"{_fmt(r['law_min_yields_per_hit_below_threshold'], '>7.2f')} {_fmt(r['law_yields'], '>9.1f')} | "
            f"{r['more_teachers']:>7d} {_fmt(r['more_law_min_yields_per_hit_below_threshold'], '>7.2f')} "
            f"{_fmt(r['more_law_yields'], '>9.1f')}"
        )

    lines += claim_lines(result["claims"])
    return "\n".join(lines)
