"""What Poisson subsampling of the teachers would buy Tang et al.'s Gaussian on averaged distributions, with the
bound we can prove for the vector discrete Gaussian, against the same mechanism without subsampling.

Run: ``.venv/bin/python benchmarks/tang_subsampling.py`` (a few seconds).  For ``n`` teachers and a rate ``q``
it prints, at the budget ``(10, 1e-6)`` over a public top-50 support, under replace-one:

* **unsampled**: the largest noise ``sigma / Q`` whose step passes the 5 % noise rule for ``n`` voters
  (``GaussianAveragedDistributions.noise_release_probability``, docs/generation.md "Noise that decides"), its
  zCDP ``rho = 1 / (sigma / Q)^2`` (``Delta^2 = 2 Q^2``), and how many such steps the budget pays under RDP;
* **subsampled**: the same for the ``round(q n)`` teachers a step keeps on average, each step charged by the
  joint-convexity bound below, and how many steps that pays.

The bound.  A replaced teacher's two vectors ``a``, ``b`` are kept with the same coin, so the step's two laws
are ``(1 - q) P + q P_a`` and ``(1 - q) P + q P_b`` with ``P`` the law without that teacher.  The map
``(X, Y) -> E_Y[(X / Y)^alpha]`` is jointly convex for ``alpha > 1``, hence

    E[(mix_a / mix_b)^alpha] <= (1 - q) + q exp((alpha - 1) D_alpha(P_a || P_b))
                             <= (1 - q) + q exp(alpha (alpha - 1) rho),

in both directions.  The remove direction alone has the tight binomial expansion (each term ``E_P[(P_v /
P)^l]`` is at most the continuous Gaussian's, the discrete Gaussian being sub-Gaussian with the same variance
proxy), but the add direction's integrand is not convex in the privacy loss, and we know of no proof that the
vector discrete Gaussian's subsampled divergence is at most the continuous one's (the quantity dp-accounting
computes for the Gaussian).  So the convexity bound, linear in ``q``, is what we could charge.  It does not pay
(docs/mechanisms/averaged_distributions.md, "No subsampling"): the figures say by how much.
"""

from __future__ import annotations

import math

import numpy as np

from mechanisms.averaged_distributions import GaussianAveragedDistributions

BUDGET = (10.0, 1e-6)
SUPPORT = 50
NOISE_RULE = 0.05
ORDERS = np.array([1.25, 1.5, 1.75, 2, 2.5, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 128, 256])
CASES = ((64, 0.5), (256, 0.25), (1024, 0.1), (4096, 0.1))


def epsilon_of(rdp: np.ndarray) -> float:
    """RDP to ``(epsilon, delta)`` at the budget's delta (Canonne, Kamath and Steinke 2020, as dp-accounting)."""
    delta = BUDGET[1]
    return float(np.min(rdp + np.log1p(-1 / ORDERS) - (math.log(delta) + np.log(ORDERS)) / (ORDERS - 1)))


def quietest_rho(voters: int) -> float:
    """The zCDP ``rho`` of the noisiest replace-one step whose noise rule holds for ``voters`` teachers."""
    low, high = 1e-4, 1e3  # step epsilons at step delta 1e-8, bisected on the log scale
    for _ in range(60):
        mid = math.sqrt(low * high)
        passes = GaussianAveragedDistributions(mid, 1e-8, voters).noise_release_probability(voters, SUPPORT)
        low, high = (low, mid) if passes <= NOISE_RULE else (mid, high)
    return GaussianAveragedDistributions(high, 1e-8, voters).event.rho


def steps_paid(rdp_step: np.ndarray) -> int:
    """The most steps of RDP curve ``rdp_step`` the budget pays."""
    low, high = 0, 1
    while epsilon_of(high * rdp_step) <= BUDGET[0]:
        high *= 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if epsilon_of(mid * rdp_step) <= BUDGET[0] else (low, mid)
    return low


def main() -> None:
    print(f"budget {BUDGET}, public top-{SUPPORT}, replace-one, noise rule {NOISE_RULE:.0%}")
    print(f"{'teachers':>8} {'q':>5} {'unsampled rho':>14} {'steps':>7} {'kept':>5} {'kept rho':>9} "
          f"{'steps (convexity bound)':>24}")
    for n, q in CASES:
        rho = quietest_rho(n)
        kept = max(1, round(q * n))
        rho_kept = quietest_rho(kept)
        with np.errstate(over="ignore"):
            convexity = np.log1p(q * np.expm1(ORDERS * (ORDERS - 1) * rho_kept)) / (ORDERS - 1)
        print(f"{n:>8} {q:>5} {rho:>14.3g} {steps_paid(ORDERS * rho):>7} {kept:>5} {rho_kept:>9.3g} "
              f"{steps_paid(convexity):>24}")


if __name__ == "__main__":
    main()
