"""The two published peers of ``pate-accountant experiment tokens-per-epsilon``, simulated on the experiment's
synthetic teachers (:mod:`pate_app.experiments.tokens_world`; docs/results.md, section tokens-per-epsilon,
states each accounting argument).  The peers read the teachers' distributions, not vote histograms:

* Tang et al. (arXiv 2309.11765), "DP few-shot generation" (rows ``tang-pld`` / ``tang-rdp``): each step a
  Poisson sample (rate ``q``) of the records, each sampled teacher's next-token distribution restricted to
  the public top-100 tokens and renormalised, summed, Gaussian noise ``N(0, z^2)`` on each coordinate, the
  argmax released (:class:`TangTape`).  A record adds or removes a vector of L2 norm at most 1, so one step is
  dp-accounting's ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` under add-or-remove-one.  Replace-one is
  remove then add: for any three distributions ``H_{e^(a+b)}(P||R) <= H_{e^a}(P||Q) + e^a H_{e^b}(Q||R)``, so
  an add-or-remove-one budget ``(epsilon/2, delta/(1 + e^(epsilon/2)))`` gives ``(epsilon, delta)`` under
  replace-one (:func:`add_remove_budget`, :func:`replace_one_spent`).  The accountant runs under
  add-or-remove-one with that budget (an over-charge we state).
* InvisibleInk, Vinod, Pillutla and Thakurta (arXiv 2507.02974) (rows ``invisibleink`` /
  ``invisibleink-one-batch``): each text from a disjoint batch of ``B - 1`` private references plus the public
  prompt; per token, the exponential mechanism (softmax at temperature ``tau``) over the public logits plus
  the batch average of the private minus public logits clipped to ``[-C, C]``, on the top-k+ set of the public
  logits (:func:`invisibleink_distribution`).  Replacing one reference moves each averaged coordinate by at
  most ``2C/(B-1)``, so the sampler has bounded range ``eta = 4C/((B-1) tau)`` and is
  ``eta^2/8 = 2 (C/((B-1) tau))^2``-zCDP (Cesar and Rogers 2021; :func:`invisibleink_rho`); we charge that,
  four times the paper's ``(C/((B-1) tau))^2 / 2`` (which holds when a reference's clipped difference moves by
  ``C``, not ``2C``), through :class:`~pate_accountant.accountants.RdpAccountant` as a ``ZCDpEvent``.
  Batches are disjoint, so the run's guarantee is each batch's (parallel composition): every batch has its own
  accountant and ledger (:func:`pate_app.experiments.tokens_runs.run_invisibleink`).  ``C`` is calibrated as
  the paper does, from the text length ``T`` the budget must pay for (:func:`invisibleink_clip`, within the
  largest ``rho`` the budget affords, :func:`max_rho`).
"""

from __future__ import annotations

import math

import numpy as np

from pate_app.experiments.tokens_world import CHUNK, REPLACE_ONE, World

#: Tang et al.: the public top-k the distributions are restricted to ("top 100 public tokens").
TANG_TOP_K = 100


def _dense(teachers, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """``p^(i)_j`` for the teachers ``rows`` and the tokens ``tokens`` (a dense ``(len(rows), len(tokens))``)."""
    column = np.full(teachers.vocab_size, -1, dtype=np.int64)
    column[tokens] = np.arange(tokens.size)
    out = np.zeros((rows.size, tokens.size))
    for r, i in enumerate(rows):
        ids, probs = teachers.row(int(i))
        keep = column[ids] >= 0
        out[r, column[ids[keep]]] = probs[keep]
    return out


def public_top_k(public: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` tokens the public model ranks first (ties by token id), among those it gives mass."""
    order = np.lexsort((np.arange(public.size), -public))
    return np.sort(order[:k][public[order[:k]] > 0])


# -- Tang et al. ----------------------------------------------------------------------------------------------


class TangTape:
    """Tang et al.'s release per step (module docstring): a Poisson sample of the teachers at rate ``q``,
    their distributions on the public top-100 renormalised and summed, ``N(0, z^2)`` on each coordinate,
    the argmax.  Forward passes: the sampled teachers plus the public model."""

    def __init__(self, world: World, q: float, z: float, rng: np.random.Generator):
        self.world, self.q, self.z, self.rng = world, q, z, rng
        self.tokens = public_top_k(world.public, TANG_TOP_K)
        dense = _dense(world.teachers, np.arange(world.num_teachers), self.tokens)
        mass = dense.sum(axis=1, keepdims=True)
        self.restricted = np.divide(dense, mass, out=np.zeros_like(dense), where=mass > 0)
        self.values = np.zeros(0, dtype=np.int64)
        self.sampled = np.zeros(0, dtype=np.int64)

    def ensure(self, steps: int) -> None:
        n = self.world.num_teachers
        while self.values.size < steps:
            mask = self.rng.random((CHUNK, n)) < self.q
            noisy = mask.astype(np.float64) @ self.restricted + self.rng.normal(0.0, self.z, (CHUNK, self.tokens.size))
            self.values = np.concatenate([self.values, self.tokens[np.argmax(noisy, axis=1)]])
            self.sampled = np.concatenate([self.sampled, mask.sum(axis=1)])

    def passes(self, steps: int) -> int:
        return int(self.sampled[:steps].sum()) + steps

    def event(self):
        from dp_accounting import dp_event

        return dp_event.PoissonSampledDpEvent(self.q, dp_event.GaussianDpEvent(self.z))


def add_remove_budget(epsilon: float, delta: float) -> tuple[float, float]:
    """The add-or-remove-one budget whose guarantee implies ``(epsilon, delta)`` under replace-one (a replaced
    record is one removal then one addition; module docstring): ``(epsilon/2, delta/(1 + e^(epsilon/2)))``."""
    return epsilon / 2.0, delta / (1.0 + math.exp(epsilon / 2.0))


def replace_one_spent(epsilon: float, delta: float) -> tuple[float, float]:
    """The replace-one guarantee that an add-or-remove-one spend ``(epsilon, delta)`` implies (remove, then add):
    ``(2 epsilon, delta (1 + e^epsilon))``; the inverse of :func:`add_remove_budget`."""
    return 2.0 * epsilon, delta * (1.0 + math.exp(epsilon))


# -- InvisibleInk -----------------------------------------------------------------------------------------------


def invisibleink_rho(clip: float, references: int, tau: float) -> float:
    """Per-token zCDP of the clipped-logit exponential mechanism under replace-one (module docstring):
    bounded range ``eta = 4 C / (B' tau)`` with ``B'`` private references, so ``rho = eta^2 / 8``."""
    return 2.0 * (clip / (references * tau)) ** 2


def invisibleink_distribution(world: World, members: np.ndarray, clip: float, tau: float,
                              top_k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, probabilities)`` of one InvisibleInk step for the batch ``members``: the top-k+ set of the
    public logits (``k = |V|`` by default: every token the public model gives mass), and there the softmax of
    ``(public logit + mean clipped difference) / tau``; a zero probability has logit ``-inf``, clipped to
    ``-C``."""
    public = world.public
    finite = np.flatnonzero(public > 0)
    log_public = np.log(public[finite])
    if top_k is not None and top_k < finite.size:
        kth = np.sort(log_public)[-top_k]
        keep = log_public >= kth - 2.0 * clip / members.size
        finite, log_public = finite[keep], log_public[keep]
    probs = _dense(world.teachers, members, finite)
    with np.errstate(divide="ignore"):
        difference = np.log(probs) - log_public[None, :]
    score = (log_public + np.clip(difference, -clip, clip).mean(axis=0)) / tau
    weights = np.exp(score - score.max())
    return finite, weights / weights.sum()


def max_rho(epsilon: float, delta: float) -> float:
    """The largest ``rho`` whose ``ZCDpEvent`` our RDP accountant reports within ``(epsilon, delta)``."""
    from dp_accounting import dp_event

    from pate_accountant.accountants import RdpAccountant

    def fits(rho: float) -> bool:
        acc = RdpAccountant(neighboring_relation=REPLACE_ONE)
        acc.compose(dp_event.ZCDpEvent(rho))
        return acc.get_epsilon(delta) <= epsilon

    lo, hi = 0.0, max(1.0, epsilon)
    while fits(hi):
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def invisibleink_clip(rho_total: float, text: int, references: int, tau: float) -> float:
    """``C`` such that ``text`` tokens spend ``rho_total`` (the paper's calibration, with our per-token charge)."""
    return references * tau * math.sqrt(rho_total * (1 - 1e-9) / text / 2.0)
