"""The data and figures of the paper's Section 6 ("Privacy analysis considerations"), shared by the
``tct-budget`` and ``alpha-sweep`` experiments (and so by ``pate-accountant plan figures``, which runs them).

* :func:`target_hits_curve`: the number of target hits a total ``(epsilon = 1, delta = 1e-6)`` buys against
  the per-query level ``eps0`` (paper Figure "TCT", left: about ``(10 eps0)^-2`` for ``eps0 <= 0.01``), for
  our TCT bound with exact optimal and with DRV composition inside, at ``q = 1/3`` (the charge a
  ``BoundaryWrapper`` event carries) and at the wrapper's certified ``q`` (about 0.40), next to the number
  of plain ``eps0``-DP queries optimal / DRV composition allows.
* :func:`alpha_sweep`: the outcome probabilities (token / fail / target) of
  ``BoundaryWrapper(DPArgMax(epsilon, delta))`` on coordinated histograms of alpha-mixture teachers
  (paper Figure "alpha sweep"), from the exact per-histogram laws averaged over the shared randomness,
  with queries and yields per target hit.
* :func:`plot_target_hits`, :func:`plot_alpha_sweep`: PNG files (matplotlib, imported
  lazily, Agg canvas; no pyplot).

Every function returns JSON-able dicts (``None`` where a ratio is undefined, e.g. no target mass).

The deltas are the paper's settings and size no run: :func:`target_hits_curve` counts the hits of a pure inner
(no per-query delta) within ``(1, 1e-6)``, as the paper's figure does, and :func:`alpha_sweep`'s ``delta`` is the
delta of the one DPArgMax whose per-histogram laws it averages.  A run's per-query delta is ``plan``'s business
(:func:`pate_accountant.planning.step_delta_for_queries`; the alpha-sweep module says what it changes).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ensembles.histograms import batch_from_votes, coordinated_votes
from ensembles.synthetic import alpha_mixture
from pate_accountant.validation import check_int, check_real
from pate_app.plotting import COLORS, legend_outside, new_figure, styled

__all__ = [
    "ALPHA_FULL",
    "ALPHA_QUICK",
    "HITS_FULL",
    "HITS_QUICK",
    "alpha_sweep",
    "plot_alpha_sweep",
    "plot_target_hits",
    "target_hits_curve",
    "wrapper_certified_q",
]

#: ``target_hits_curve`` grids: eps0 values of the full run and of ``quick``.
HITS_FULL = {"eps0": [float(x) for x in np.geomspace(0.001, 0.1, 11)]}
HITS_QUICK = {"eps0": [0.005, 0.01, 0.02, 0.05, 0.1]}
#: ``alpha_sweep`` sizes: the full run and ``quick``.
#: (geometric for small alpha, linear around the threshold fraction T/n ~ 0.5-0.7 where the target peaks).
ALPHA_FULL = {
    "num_teachers": 1000,
    "num_samples": 5000,
    "alphas": [float(x) for x in np.geomspace(0.003, 0.3, 11)] + [round(0.35 + 0.05 * i, 2) for i in range(14)],
}
ALPHA_QUICK = {
    "num_teachers": 300,
    "num_samples": 1500,
    "alphas": [0.01, 0.03, 0.1, 0.3, 0.45, 0.6, 0.7, 0.8, 0.9, 1.0],
}
#: The DPArgMax of the sweep: total (epsilon, delta) under replace-one.
SWEEP_EPSILON = 0.5
SWEEP_DELTA = 1e-6


def _none_if_not_finite(x):
    x = float(x)
    return x if math.isfinite(x) else None


def wrapper_certified_q(eps0: float) -> float:
    """The certified ``q`` of the boundary wrapper's target at level ``eps0 = 2 eps_A``:
    ``(E + 1) / (2 E^2 + E + 2)`` with ``E = e^{eps_A}`` (docs/mechanisms/boundary_wrapper.md:
    ``0.3980`` at ``eps_A = 0.01``).  The wrapper's *event* charges ``min(1/3, this)``."""
    eps0 = check_real("eps0", eps0, minimum=0.0, min_open=True)
    e = math.exp(eps0 / 2.0)
    return (e + 1.0) / (2.0 * e * e + e + 2.0)


def target_hits_curve(eps0_values=None, *, epsilon: float = 1.0, delta: float = 1e-6, quick: bool = False,
                      progress=None) -> dict:
    """Target hits for total ``(epsilon, delta)`` against ``eps0`` (paper Figure "TCT", left).

    Series: ``tct[name]`` for ``name`` in ``optimal q=1/3``, ``optimal q=wrapper``, ``drv q=1/3``,
    ``drv q=wrapper`` (:func:`pate_accountant.tct.tct_max_hits`); ``plain[name]`` for ``optimal`` and
    ``drv``: the plain ``eps0``-DP queries (:func:`pate_accountant.planning.plain_max_queries`);
    ``paper``: ``(10 eps0)^-2``; ``ratio_to_paper``: ``optimal q=1/3`` over the paper's value.
    ``progress`` (optional) is called with no argument after each ``eps0``.
    """
    from pate_accountant import planning
    from pate_accountant.tct import tct_max_hits

    epsilon = check_real("epsilon", epsilon, minimum=0.0, min_open=True)
    delta = check_real("delta", delta, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    if eps0_values is None:
        eps0_values = (HITS_QUICK if quick else HITS_FULL)["eps0"]
    eps0_values = [check_real("eps0", e, minimum=0.0, min_open=True) for e in eps0_values]
    if not eps0_values:
        raise ValueError("eps0_values must not be empty")
    names = ("optimal q=1/3", "optimal q=wrapper", "drv q=1/3", "drv q=wrapper")
    tct = {name: [] for name in names}
    plain = {"optimal": [], "drv": []}
    q_wrapper = []
    for eps0 in eps0_values:
        qw = wrapper_certified_q(eps0)
        q_wrapper.append(qw)
        for name in names:
            composition, qname = name.split(" ")
            q = 1.0 / 3.0 if qname == "q=1/3" else qw
            tct[name].append(tct_max_hits(q, eps0, epsilon, delta, composition=composition))
        for method in plain:
            plain[method].append(planning.plain_max_queries(eps0, epsilon, delta, method=method))
        if progress is not None:
            progress()
    paper = [planning.paper_target_hits(e) for e in eps0_values]
    return {
        "figure": "target_hits",
        "epsilon": epsilon,
        "delta": delta,
        "eps0": eps0_values,
        "q_wrapper": q_wrapper,
        "tct": tct,
        "plain": plain,
        "paper": paper,
        "ratio_to_paper": [h / p for h, p in zip(tct["optimal q=1/3"], paper)],
        "notes": [
            "tct: our TCT bound (docs/tct_and_individual.md, section 1): negative-binomial tail plus exact optimal or DRV "
            "composition of the private draws; q=1/3 is the charge a BoundaryWrapper event carries, "
            "q=wrapper the certified (E+1)/(2E^2+E+2), E = e^(eps0/2), for a target at level eps0 = 2 eps_A.",
            "paper: (10 eps0)^-2, the paper's reading of its figure for eps0 <= 0.01 (our own sanity "
            "check: within a factor [0.7, 2.7] of 'optimal q=1/3', not an equality).",
            "plain: eps0-DP queries allowed when every query is charged (no target charging).",
        ],
    }


def alpha_sweep(
    alphas=None,
    *,
    num_teachers: int | None = None,
    num_samples: int | None = None,
    epsilon: float = SWEEP_EPSILON,
    delta: float = SWEEP_DELTA,
    seed: int = 0,
    quick: bool = False,
    common_size: int = 1,
    progress=None,
) -> dict:
    """Outcome probabilities of ``BoundaryWrapper(DPArgMax(epsilon, delta))`` against ``alpha``.

    For each ``alpha``: ``ensembles.synthetic.alpha_mixture(n, common_size + n, alpha)`` teachers (a shared
    part of weight ``alpha`` over ``common_size`` tokens, one private token per teacher), ``num_samples``
    coordinated histograms (``coordinated_votes`` + ``batch_from_votes``), and on each histogram the exact
    law of the wrapped aggregator (``BoundaryWrapper.batch_distributions``): ``P[target] = t``,
    ``P[token] = (1 - t) P[yield]``, ``P[fail] = (1 - t)(1 - P[yield])``.  The averages over the
    histograms (and their standard errors) are the probabilities over the shared randomness.
    ``queries_per_hit = 1 / P[target]`` and ``yields_per_hit = P[token] / P[target]`` (``None`` when no
    histogram has target mass).  References: the threshold fraction ``T/n = (n/2 + L + 1)/n`` and the
    paper's ``eps0 n`` (queries per hit, "at least about") and ``eps0 n / 2`` (yields per hit for
    ``alpha <= T/n``), read with ``eps_c``, the per-count epsilon of the DPArgMax noise (the paper's
    NoisyArgMax level; the target level charged for the wrapper is ``eps0 = 2 eps_c``).
    """
    from mechanisms.boundary_wrapper import BoundaryWrapper
    from mechanisms.noisy_argmax import DPArgMax


    sizes = ALPHA_QUICK if quick else ALPHA_FULL
    n = check_int("num_teachers", sizes["num_teachers"] if num_teachers is None else num_teachers, minimum=2)
    s = check_int("num_samples", sizes["num_samples"] if num_samples is None else num_samples, minimum=2)
    alphas = sizes["alphas"] if alphas is None else alphas
    alphas = [check_real("alpha", a, minimum=0.0, maximum=1.0, min_open=True) for a in alphas]
    if not alphas:
        raise ValueError("alphas must not be empty")
    seed = check_int("seed", seed, minimum=0)
    common_size = check_int("common_size", common_size, minimum=1)
    wrapper = BoundaryWrapper(DPArgMax(epsilon, delta))
    inner = wrapper.inner
    vocab = common_size + n
    rng = np.random.default_rng(seed)
    out = {k: [] for k in ("token", "fail", "target", "token_se", "target_se", "queries_per_hit", "yields_per_hit")}
    for alpha in alphas:
        teachers = alpha_mixture(n, vocab, alpha, rng, common_size=common_size)
        batch = batch_from_votes(coordinated_votes(teachers, s, rng, num_threads=1), vocab)
        sample, _, probs, target = wrapper.batch_distributions(batch)
        yield_prob = np.clip(np.bincount(sample, weights=probs, minlength=s), 0.0, 1.0)
        token = (1.0 - target) * yield_prob
        fail = (1.0 - target) * (1.0 - yield_prob)
        pt, py = float(target.mean()), float(token.mean())
        out["token"].append(py)
        out["fail"].append(float(fail.mean()))
        out["target"].append(pt)
        out["token_se"].append(float(token.std(ddof=1) / math.sqrt(s)))
        out["target_se"].append(float(target.std(ddof=1) / math.sqrt(s)))
        out["queries_per_hit"].append(1.0 / pt if pt > 0 else None)
        out["yields_per_hit"].append(py / pt if pt > 0 else None)
        if progress is not None:
            progress()
    eps_c = inner.per_count_epsilon
    threshold = n // 2 + inner.error_bound + 1  # least top count that can yield: c + L > n/2 + L
    finite_q = [x for x in out["queries_per_hit"] if x is not None]
    low = [y for a, y in zip(alphas, out["yields_per_hit"]) if y is not None and a <= threshold / n]
    return {
        "figure": "alpha_sweep",
        "parameters": {
            "num_teachers": n, "num_samples": s, "seed": seed, "common_size": common_size,
            "mechanism": f"BoundaryWrapper(DPArgMax(epsilon={epsilon:g}, delta={delta:g}))",
            "epsilon": epsilon, "delta": delta, "error_bound": inner.error_bound,
            "per_count_epsilon": eps_c, "target_level": wrapper.epsilon, "target_q": wrapper.q,
        },
        "alphas": alphas,
        **out,
        "threshold_fraction": threshold / n,
        "paper_queries_per_hit": eps_c * n,
        "paper_yields_per_hit": eps_c * n / 2.0,
        "summary": {
            "min_queries_per_hit": min(finite_q) if finite_q else None,
            "median_yields_per_hit_below_threshold": float(np.median(low)) if low else None,
        },
        "notes": [
            "Probabilities are exact per histogram (the aggregator's law given the shared randomness) and "
            "averaged over num_samples coordinated histograms; *_se are the standard errors of those means.",
            "paper_queries_per_hit = eps_c n and paper_yields_per_hit = eps_c n / 2, the paper's eps0 n and eps0 n / 2 "
            "read with eps_c, the per-count epsilon of the DPArgMax noise (equal to its epsilon); the wrapper's "
            "target level is eps0 = 2 eps_c.",
        ],
    }


def _positive(values) -> np.ndarray:
    """Counts as floats with zeros masked (NaN), so a log axis leaves them out."""
    v = np.asarray(values, dtype=float)
    return np.where(v > 0, v, np.nan)




@styled
def plot_target_hits(data: dict, path) -> Path:
    """Write the target-hits figure (log-log) of :func:`target_hits_curve` data to the PNG file ``path``."""
    path = Path(path)
    fig = new_figure((8.6, 4.6))
    ax = fig.add_subplot()
    x = np.asarray(data["eps0"])
    for name in ("optimal q=1/3", "optimal q=wrapper", "drv q=1/3", "drv q=wrapper"):
        composition, q = name.split()
        ax.plot(x, _positive(data["tct"][name]), color=COLORS[composition], marker="o" if q == "q=1/3" else "^",
                linestyle="-" if q == "q=1/3" else "--", label=f"TCT hits, {composition}, {q}")
    ax.plot(x, data["paper"], color=COLORS["paper"], linewidth=2.2, label="paper: (10 eps0)^-2")
    ax.plot(x, _positive(data["plain"]["optimal"]), color=COLORS["optimal"], alpha=0.45, linestyle=":", marker="s",
            label="plain eps0-DP queries, optimal")
    ax.plot(x, _positive(data["plain"]["drv"]), color=COLORS["drv"], alpha=0.45, linestyle=":", marker="s",
            label="plain eps0-DP queries, DRV")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("eps0 (privacy level of one query's target)")
    ax.set_ylabel(f"count within epsilon {data['epsilon']:g}, delta {data['delta']:g}")
    ax.set_title("Target hits against eps0 (paper Section 6)")
    ax.grid(True, which="both", alpha=0.25)
    legend_outside(ax)
    fig.savefig(path)
    return path


@styled
def plot_alpha_sweep(data: dict, path) -> Path:
    """Write the two-panel outcome figure of :func:`alpha_sweep` data to the PNG file ``path``: the law of one
    query's outcome (token, fail, target hit; log scale, the three of them) and what one target hit costs."""
    path = Path(path)
    fig = new_figure((12.0, 4.6))
    a = np.asarray(data["alphas"])
    p = data["parameters"]
    tn = data["threshold_fraction"]
    left, right = fig.subplots(1, 2)
    for key, label, marker in (("token", "token (a yield)", "o"), ("fail", "fail", "s"),
                               ("target", "target hit", "^")):
        left.plot(a, _positive(data[key]), color=COLORS[key], marker=marker, label=label)
    left.axhline(1 / 3, color=COLORS["paper"], linestyle=":", linewidth=1.2, label="1/3: the wrapper's cap on hits")
    left.set_yscale("log")
    left.set_ylabel("probability over the shared randomness")
    left.set_title("Outcome of one query")
    qph = np.array([np.nan if v is None else v for v in data["queries_per_hit"]], dtype=float)
    yph = np.array([np.nan if v is None else v for v in data["yields_per_hit"]], dtype=float)
    right.plot(a, qph, color=COLORS["queries"], marker="o", label="queries per target hit")
    right.plot(a, yph, color=COLORS["yields"], marker="s", label="yields per target hit")
    right.axhline(data["paper_queries_per_hit"], color=COLORS["queries"], linestyle=":", label="paper: eps_c n")
    right.axhline(data["paper_yields_per_hit"], color=COLORS["yields"], linestyle=":", label="paper: eps_c n / 2")
    right.set_yscale("log")
    right.set_ylabel("per target hit")
    right.set_title("What one target hit buys")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("alpha (weight of the common part)")
        ax.axvline(tn, color=COLORS["threshold"], linestyle="--", linewidth=1, label=f"release threshold T/n = {tn:.2f}")
        ax.grid(True, which="major", alpha=0.3)
        legend_outside(ax, where="below", ncol=2)
    fig.suptitle(f"{p['mechanism']}, L = {p['error_bound']}, n = {p['num_teachers']}, "
                 f"{p['num_samples']} coordinated histograms per alpha")
    fig.savefig(path)
    return path
