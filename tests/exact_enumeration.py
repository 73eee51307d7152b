"""Exact output laws of the randomness samplers, by enumerating every path of their random choices.

A *branching* source replaces one primitive of ``mechanisms.randomness.RandomBits`` (fair bits, a rational
Bernoulli, a Bernoulli of ``e^-gamma``, a geometric draw) by a choice among finitely many answers with
exact ``Fraction`` weights.  :func:`enumerate_law` re-runs the sampler once per path of answers (depth
first), so the law it returns is computed from the sampler's own code, with exact arithmetic:

* ``law[outcome]`` sums the weights of the paths that finished with ``outcome``;
* ``unfinished`` is the weight of the paths cut at the depth limit (so the true probability of each
  outcome lies in ``[law[o], law[o] + unfinished]``);
* ``restart`` is the weight of the paths that began a fresh, independent round of a rejection loop
  (the source raises :class:`Restart` there): as rounds are i.i.d., the law of the loop is
  ``law[o] / (1 - restart)`` exactly.
"""

from __future__ import annotations

from fractions import Fraction

from mechanisms.randomness import RandomBits


class OutOfBudget(Exception):
    """The path made more choices than the depth limit allows."""


class Restart(Exception):
    """The path starts a fresh round of a rejection loop (its weight is the restart probability)."""


class Branching(RandomBits):
    """Base of the branching sources: ``_choose(weights)`` returns the index of the answer on this path."""

    def __init__(self, prefix: tuple, depth: int):
        super().__init__()
        self.prefix, self.depth = prefix, depth
        self.taken: list[int] = []
        self.points: list[tuple[int, list]] = []  # (position, weights) of choices made beyond the prefix
        self.weight = Fraction(1)

    def _fresh(self, num_bytes):  # pragma: no cover - every primitive used is overridden
        raise AssertionError("a branching source has no raw bytes")

    def _choose(self, weights) -> int:
        position = len(self.taken)
        if position >= self.depth:
            raise OutOfBudget
        if position < len(self.prefix):
            index = self.prefix[position]
        else:
            index = next(i for i, w in enumerate(weights) if w > 0)
            self.points.append((position, weights))
        self.taken.append(index)
        self.weight *= weights[index]
        return index


class BitBranching(Branching):
    """Fair bits, one binary choice per bit (the exact law of anything built on ``bits``)."""

    def _fresh(self, num_bytes):  # every draw is a branch point taken through bits() and friends
        raise AssertionError("a branching source has no raw bytes")

    def bits(self, k):
        value = 0
        for i in range(k):
            value |= self._choose([Fraction(1, 2), Fraction(1, 2)]) << i
        return value


class RatioBranching(BitBranching):
    """``bernoulli_ratio(a, b)`` is one choice (``True`` with weight ``a / b``); ``below(n)`` is one choice
    among ``n`` equally likely answers; bits stay fair binary choices."""

    def bernoulli_ratio(self, numerator, denominator):
        if numerator <= 0:
            return False
        if numerator >= denominator:
            return True
        p = Fraction(numerator, denominator)
        return self._choose([p, 1 - p]) == 0

    def below(self, n):
        if n == 1:
            return 0
        return self._choose([Fraction(1, n)] * n)


class ExpBranching(RatioBranching):
    """``bernoulli_exp_ratio(a, b)`` is one choice with weight ``y^(a t / b)``: ``y`` is a rational stand-in
    for ``e^(-1/t)``, so the weights are consistent (``e^-1`` is ``y^t``) and every exponent is an integer
    for the calls a geometric draw with denominator ``t`` makes.  A second ``below`` is a :class:`Restart`."""

    def __init__(self, prefix, depth, y: Fraction, t: int):
        super().__init__(prefix, depth)
        self.y, self.t, self.uniforms = y, t, 0

    def below(self, n):
        # In a geometric draw, a second uniform on {0..t-1} means the first was rejected: a fresh round.
        self.uniforms += 1
        if self.uniforms > 1:
            raise Restart
        return super().below(n)

    def bernoulli_exp_ratio(self, numerator, denominator):
        exponent = Fraction(numerator * self.t, denominator)
        assert exponent.denominator == 1, "a stand-in exponent must be an integer"
        p = self.y ** int(exponent)
        return self._choose([p, 1 - p]) == 0


class GeometricBranching(BitBranching):
    """``geometric_ratio`` is one choice: ``g`` in ``0 .. g_max`` with weight ``(1 - q) q^g`` (``q`` a
    rational stand-in for ``e^-gamma``), and the tail ``g > g_max`` (weight ``q^(g_max + 1)``) either as
    the representative value ``g_max + 1`` (``tail="value"``, for samplers whose outcome is the same for
    every tail value) or as a :class:`Restart` (``tail="restart"``: by memorylessness, ``G mod (g_max + 1)``
    on the tail has the law of a fresh draw).  A second geometric draw on one path is a :class:`Restart`
    (a rejection loop begins its next i.i.d. round)."""

    def __init__(self, prefix, depth, q: Fraction, g_max: int, tail: str):
        super().__init__(prefix, depth)
        self.q, self.g_max, self.tail, self.draws = q, g_max, tail, 0

    def geometric_ratio(self, s, t):
        self.draws += 1
        if self.draws > 1:
            raise Restart
        q = self.q
        weights = [(1 - q) * q**g for g in range(self.g_max + 1)] + [q ** (self.g_max + 1)]
        g = self._choose(weights)
        if g == self.g_max + 1 and self.tail == "restart":
            raise Restart
        return g


def enumerate_law(make_source, run):
    """``(law, unfinished, restart)`` of ``run(source)`` over every path of ``make_source(prefix)``."""
    law: dict = {}
    unfinished = restart = Fraction(0)
    stack = [()]
    while stack:
        prefix = stack.pop()
        source = make_source(prefix)
        try:
            outcome = run(source)
        except OutOfBudget:
            unfinished += source.weight
        except Restart:
            restart += source.weight
        else:
            law[outcome] = law.get(outcome, Fraction(0)) + source.weight
        for position, weights in source.points:
            base = tuple(source.taken[:position])
            chosen = source.taken[position]
            stack.extend(base + (j,) for j in range(len(weights)) if j != chosen and weights[j] > 0)
    return law, unfinished, restart
