"""The per-step laws of the run mechanisms on the paper's agreement model (Section 6's alpha mixture with
coordinated votes; docs/planning.md, "The best run: plan best"): with what probability one step releases a private
token, and hits the target, when the shared token has ``c`` votes (:func:`per_count_outcomes`), and the same for the
public-candidate query (:func:`public_candidate_outcomes`).  ``tests/test_plan_configurations.py`` checks them
against the mechanisms' own ``output_distribution``.
"""

from __future__ import annotations

import math

import numpy as np

from mechanisms.boundary_wrapper import target_from_outside_mass
from pate_app.options import DEFAULT_VOCAB_SIZE
from pate_app.planning.configurations import GAUSSIAN


def _gaussian_noise(sigma: float, bound: int):
    """GNMax's noise (mechanisms/gaussian.py): the discrete Gaussian ``P[X = x] ~ exp(-x^2 / (2 sigma^2))`` on
    ``{-bound, ..., bound}``: ``(pmf, survival)``, ``pmf[x + bound] = P[X = x]`` and ``survival(k) = P[X >= k]`` for
    an integer array ``k``."""
    x = np.arange(-bound, bound + 1, dtype=np.float64)
    log_w = -(x * x) / (2.0 * sigma * sigma)
    pmf = np.exp(log_w - np.logaddexp.reduce(log_w))
    tail = np.concatenate([np.cumsum(pmf[::-1])[::-1], [0.0]])  # tail[i] = P[X >= i - bound]

    def survival(k):
        k = np.asarray(k, dtype=np.int64)
        return np.where(k <= -bound, 1.0, tail[np.clip(k + bound, 0, 2 * bound + 1)])

    return pmf, survival


def _gaussian_outcomes(mechanism, num_teachers: int, threshold: int | None, vocab_size: int):
    """``(token, exact)`` of GNMax on the agreement model's histograms (:func:`per_count_outcomes`)."""
    from scipy.signal import fftconvolve

    n, bound = num_teachers, mechanism.truncation_bound
    pmf, survival = _gaussian_noise(mechanism.sigma, bound)
    # g(v): a lower bound on the top voted token's winning (and clearing the threshold) when its noisy count is v:
    # each of the other vocab_size - 1 tokens has at most one vote, so its noisy count reaches v with probability
    # at most P[1 + X >= v] (a union bound; a tie counts as a loss).
    values = np.arange(1 - bound, n + bound + 1)
    g = np.clip(1.0 - (vocab_size - 1) * survival(values - 1), 0.0, 1.0)
    if threshold is not None:
        g[values < threshold] = 0.0
    # token[m] = E[g(m + X)] for the top count m = 1..n: a correlation of g with the noise law.
    token = np.empty(n + 1)
    token[1:] = np.clip(fftconvolve(g, pmf[::-1], mode="valid"), 0.0, 1.0)
    token[0] = token[1]  # no shared token: the top count is one of the teachers' own tokens
    return token, threshold is not None and threshold >= bound + 2


def _subsampled_gaussian_outcomes(name: str, mechanism, num_teachers: int, vocab_size: int):
    """A lower bound on ``token[c]`` of GNMax on teachers subsampled at ``q = mechanism.rate``: the shared token
    keeps ``k ~ Binomial(c, q)`` of its ``c`` votes and every other kept teacher still votes a token of its own, so
    ``token[c] = sum_k P[k] token'[k]`` with ``token'`` the inner GNMax's bound (:func:`_gaussian_outcomes`, its
    threshold set from the votes a step keeps on average), and ``token'[0] = 0`` (no shared vote kept: counted as
    no release)."""
    from scipy import stats

    n, inner = int(num_teachers), mechanism.inner
    threshold = getattr(inner, "threshold", None) if name == "gaussian-threshold-argmax" else None
    kept, _ = _gaussian_outcomes(inner, n, threshold, vocab_size)
    kept[0] = 0.0
    counts = np.arange(n + 1)
    thinning = stats.binom.pmf(counts[None, :], counts[:, None], mechanism.rate)  # [c, k]: k of c votes kept
    return np.clip(thinning @ kept, 0.0, 1.0)


def per_count_outcomes(name: str, mechanism, num_teachers: int, vocab_size: int = DEFAULT_VOCAB_SIZE, *,
                       inclusion=None):
    """``(token, target, exact)`` of one step of the run mechanism ``name`` (built as ``mechanism``) with ``n =
    num_teachers`` teachers on the agreement model's histograms (:func:`pate_accountant.planning.agreement_count_pmf`):
    the shared token has ``c`` votes and each of the other ``n - c`` teachers one vote for a token of its own.
    ``token[c]`` and ``target[c]`` (index ``c = 0..n``) are the probabilities that the step releases a private
    token and, for a boundary wrapper, that it hits the target; ``exact`` says whether ``token`` is the
    mechanism's exact law (``output_distribution``, computed here in closed form for this family;
    ``tests/test_plan_configurations.py`` checks both against it) or a lower bound.  ``inclusion``: DPWS's
    ``inclusion_probabilities(n)``, when already computed.

    * DPArgMax: the top count is ``m = max(c, 1)``; it releases with ``yield_probability(m, n)``.
    * DPWS: ``fail = (1 - pi*(c)) (1 - pi*(1))^(n-c)`` (``inclusion_probabilities``); any included token is
      released.
    * boundary wrappers: ``P[target] = a/(1 + a)``, ``a = min(1 - pi, 1/2)`` with ``pi`` the inner law's largest
      outcome (``target_from_outside_mass``), and a token with ``(1 - P[target]) P[inner releases]``; for DPWS
      the shared token's share is ``pi*(c) E[1/(1 + K)]``, ``K ~ Bin(n - c, pi*(1))``, and the rest of the
      released mass is split evenly between the ``n - c`` own tokens.
    * GNMax on subsampled teachers (``--subsample-teachers``): :func:`_subsampled_gaussian_outcomes`, a lower
      bound.
    * GNMax (``gaussian-argmax``, ``gaussian-threshold-argmax``; noise ``X`` on ``[-T, T]`` on every one of the
      ``vocab_size`` tokens): counted only when the top voted token (``m = max(c, 1)`` votes) wins outright, and
      clears the threshold ``n//2 + 1``, with the other tokens' chance to reach its noisy count ``v`` bounded by
      ``(vocab_size - 1) P[1 + X >= v]`` (each has at most one vote): a lower bound (GNMax also releases a token
      nobody voted for when the noise decides), exact for the threshold form when ``n//2 + 1 >= T + 2`` (then no
      other token can clear it).
    """
    n = int(num_teachers)
    c = np.arange(n + 1)
    m = np.maximum(c, 1)
    inner = getattr(mechanism, "inner", mechanism)
    wrapped = inner is not mechanism
    zero = np.zeros(n + 1)
    if name in GAUSSIAN and getattr(mechanism, "rate", None) is not None:  # on subsampled teachers
        return _subsampled_gaussian_outcomes(name, mechanism, n, vocab_size), zero, False
    if name in GAUSSIAN:
        threshold = n // 2 + 1 if name == "gaussian-threshold-argmax" else None
        token, exact = _gaussian_outcomes(mechanism, n, threshold, vocab_size)
        return token, zero, exact
    if name in ("dp-argmax", "boundary-dp-argmax"):
        released = np.asarray(inner.yield_probability(m, n), dtype=np.float64)
        if not wrapped:
            return released, zero, True
        target = target_from_outside_mass(np.minimum(released, 1.0 - released))
        return (1.0 - target) * released, target, True
    if name in ("dp-weighted-sampling", "boundary-dp-weighted-sampling"):
        table = np.asarray(inner.inclusion_probabilities(n) if inclusion is None else inclusion, dtype=np.float64)
        own = float(table[1]) if n >= 1 else 0.0
        rest = (n - c).astype(np.float64)
        with np.errstate(divide="ignore"):
            log_fail = np.log1p(-table) + rest * math.log1p(-own)
        released = -np.expm1(log_fail)
        if not wrapped:
            return released, zero, True
        fail = np.exp(log_fail)
        if own > 0.0:  # E[1/(1 + K)], K ~ Bin(rest, own)
            alone = -np.expm1((rest + 1.0) * math.log1p(-own)) / ((rest + 1.0) * own)
        else:
            alone = np.ones(n + 1)
        shared = table * alone
        with np.errstate(divide="ignore", invalid="ignore"):
            single = np.where(rest > 0, np.maximum(released - shared, 0.0) / np.maximum(rest, 1.0), 0.0)
        outside = np.where(fail >= np.maximum(shared, single), released,
                           np.where(shared >= single, fail + np.maximum(released - shared, 0.0), 1.0 - single))
        target = target_from_outside_mass(outside)
        return (1.0 - target) * released, target, True
    raise ValueError(f"mechanism {name!r}: plan best has no law for it")


def public_candidate_outcomes(mechanism, num_teachers: int, shared, other, public_agreement: float) -> dict:
    """One step of the public-candidate query (``mechanism``, a :class:`mechanisms.BetweenThresholds` built for
    ``n = num_teachers`` teachers) on the agreement model, when the public model's candidate is the teachers'
    shared token with probability ``P = public_agreement``: ``shared`` and ``other`` are the laws of the counted
    teachers ``c'`` when it is (the shared token's count) and when it is not (a token of one teacher's own, one
    vote) (:meth:`BestPlanner.included`).  ``above`` and ``between`` release the candidate, ``between`` is the
    target hit (it charges the counted teachers).

    * ``target``: ``P E[between(c'_shared)] + (1 - P) E[between(c'_other)]``, every hit (the other token's one vote
      gives at least the hits of a token nobody votes for: more hits, more charges);
    * ``token``: ``P (E[release(c'_shared)] - release(0))``, the releases of the shared token beyond those of a
      candidate no teacher votes for (noise alone): a lower bound on the private tokens, which counts neither a
      released candidate the teachers do not share (the public model's token, as a fallback would be) nor the
      noise's share;
    * ``counted_per_hit``: ``E[c' | between]``, the teachers a hit charges on average.
    """
    table = mechanism.outcome_table(np.arange(int(num_teachers) + 1))
    between, released = table[:, 1], table[:, 1] + table[:, 2]
    p = float(public_agreement)
    shared, other = np.asarray(shared), np.asarray(other)
    k_shared, k_other = np.arange(shared.size), np.arange(other.size)
    target = p * float(shared @ between[:shared.size]) + (1.0 - p) * float(other @ between[:other.size])
    counted = (p * float((k_shared * shared) @ between[:shared.size])
               + (1.0 - p) * float((k_other * other) @ between[:other.size]))
    token = p * max(0.0, float(shared @ released[:shared.size]) - float(released[0]))
    return {"token": min(token, 1.0), "target": min(target, 1.0),
            "counted_per_hit": counted / target if target > 0.0 else 0.0, "noise_release": float(released[0])}
