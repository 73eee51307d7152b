"""Random bits for DP noise, and samplers that turn them into exactly distributed noise.

Where the bits come from
------------------------
Every mechanism draws its noise from a :class:`RandomBits` source:

* ``rng=None`` (the default) gives a :class:`SystemRandomBits`: bytes from the operating system's
  cryptographic random number generator (``os.urandom``).  A fresh source is made for every call, so no
  buffered bits are shared between calls, threads or forked processes.
* ``rng=numpy.random.Generator`` gives a :class:`GeneratorRandomBits` that takes its bytes from that
  generator (``Generator.bytes``).  The draws are then reproducible from the generator's seed, which is
  the point of it: a seed is for tests and simulations.  Whoever knows the seed knows the noise, so a
  seeded run has no privacy against them; never seed a private run.
* a :class:`RandomBits` instance is used as it is (tests script one).

Why the samplers are exact
--------------------------
A uniform ``U`` in ``[0, 1)`` is an infinite string of fair bits.  Every sampler below decides its
outcome by comparing finitely many of those bits with exact numbers (Python integers, or rational
numbers as ``fractions.Fraction``), so the probability of each outcome is the exact mathematical value;
nothing is rounded to a float64 grid.  A float such as ``epsilon = 0.1`` is read as the exact rational
``Fraction(0.1)`` it stores, and the laws below are exact for that rational.

* :meth:`RandomBits.below` ``(n)``: ``k = bitlength(n - 1)`` fair bits read as an integer, redrawn while
  ``>= n``.  Each accepted value has probability ``2^-k`` per round, so the accepted value is uniform on
  ``{0, ..., n-1}``.
* :meth:`RandomBits.bernoulli` ``(p)``: for a float ``p = m / 2^e`` (every float is such a dyadic
  rational) the bits of ``U`` are compared with the binary expansion of ``p``, 64 at a time, until the
  first difference: ``U < p`` exactly when ``U``'s bits are smaller at that point, which has probability
  exactly ``p``.  A non-dyadic rational ``a / b`` uses ``below(b) < a``: probability ``a / b``.
* :meth:`RandomBits.bernoulli_exp` ``(gamma)`` is ``Bernoulli(e^-gamma)`` for a rational ``gamma >= 0``
  (the alternating-series method of Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential
  Privacy", 2020).  For ``gamma <= 1``: draw ``Bernoulli(gamma / 1)``, ``Bernoulli(gamma / 2)``, ... until
  the first failure, at trial ``K``; then ``P[K > j] = gamma^j / j!`` and
  ``P[K odd] = sum_j (-1)^j gamma^j / j! = e^-gamma``.  For ``gamma > 1`` the draw is ``floor(gamma)``
  independent ``Bernoulli(e^-1)`` and one ``Bernoulli(e^-(gamma - floor(gamma)))``, all of which must
  succeed: ``e^-gamma`` again.  Only rational Bernoullis are used, so this is exact.
* :meth:`RandomBits.geometric_exp` ``(gamma)``, ``P[G = g] = (1 - e^-gamma) e^-gamma g`` with
  ``gamma = s / t``: draw ``u`` uniform on ``{0, ..., t-1}`` and keep it with probability ``e^{-u/t}``
  (else redraw), so ``P[u] ~ e^{-u/t}``; draw ``v`` = the number of successes of ``Bernoulli(e^-1)``
  before the first failure; then ``x = u + t v`` has ``P[x] ~ e^{-x/t}`` on all of ``N`` (``(u, v) <-> x``
  is a bijection), and ``G = floor(x / s)`` sums ``s`` consecutive terms: ``P[G = g] ~ e^{-g s/t}``.
* :meth:`RandomBits.discrete_laplace` ``(gamma)``, ``P[Z = z] = (1 - r) / (1 + r) r^|z|`` with
  ``r = e^-gamma``: a geometric magnitude ``G`` and a fair sign; the pair (negative sign, 0) is rejected
  and redrawn, which leaves every integer with weight ``r^|z| / 2``.
* :meth:`RandomBits.discrete_gaussian` ``(sigma_squared)``, ``P[Y = y] ~ e^{-y^2 / (2 sigma^2)}`` on all the
  integers: a discrete Laplace draw kept with a rational-exponent ``Bernoulli(e^-gamma)`` (the rejection
  sampler of Canonne, Kamath and Steinke, Algorithm 1); the method's docstring shows the kept law.
* :meth:`RandomBits.truncated_geometric` ``(gamma, k)``, the law ``TG`` on ``{-k, ..., k}`` with
  ``P[X = x] ~ r^|x|``: this is the discrete Laplace law conditioned on ``|Z| <= k``.  It is sampled
  without rejecting large values: the magnitude is ``G mod (k + 1)``, whose law is exactly
  ``P[j] = sum_m (1 - r) r^{j + m(k+1)} = (1 - r) r^j / (1 - r^{k+1})``, i.e. ``~ r^j`` on ``{0..k}``;
  then a fair sign with (negative, 0) rejected, as above.  The extreme values ``+-k`` come out with
  their exact probability ``A r^k`` however small it is.
* :meth:`RandomBits.categorical` ``(weights)``: exact rational weights ``w_i`` (floats are read
  exactly) over a common denominator become integers ``W_i``; ``j = below(sum W)`` picks outcome ``i``
  when ``W_0 + ... + W_{i-1} <= j < W_0 + ... + W_i``: probability ``w_i / sum w`` exactly.

Vectorised draws (:class:`FiniteLaw`) use the inverse distribution function: with cumulative boundaries
``F_0 <= F_1 <= ...`` of a finite law, the outcome is the least ``i`` with ``U < F_i``.  The first 64 bits
of ``U`` come as one ``uint64`` word and are compared with the integer thresholds
``floor(2^64 F_i)`` (computed exactly: by integer arithmetic for rational boundaries, and by interval
arithmetic in fixed point, refined until the floor is certain, for boundaries involving ``e^-gamma``).
A word strictly below or above a threshold decides that comparison exactly; a word *equal* to a
threshold (probability ``2^-64`` per boundary) is resolved by drawing the next 64 bits of ``U`` and
comparing with the next 64 bits of the boundaries, and so on.  So the vectorised draws are exact as
well, and fast: one ``uint64`` per draw and a binary search.
"""

from __future__ import annotations

import abc
import bisect
import math
import numbers
import os
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np

__all__ = [
    "FiniteLaw",
    "GeneratorRandomBits",
    "IntervalLaw",
    "RandomBits",
    "RationalLaw",
    "SystemRandomBits",
    "bernoulli_exp_law",
    "discrete_gaussian_law",
    "discrete_laplace_cut_law",
    "exp_bounds",
    "geometric_block_law",
    "random_bits",
    "sample_geometric",
    "sample_laws",
    "truncated_geometric_law",
    "uniform_below",
]

_WORD = 64
_WORD_MASK = (1 << _WORD) - 1


def _system_bytes(num_bytes: int) -> bytes:
    """``num_bytes`` bytes from the operating system's cryptographic random number generator."""
    return os.urandom(num_bytes)


# -- argument checks ---------------------------------------------------------------------------------
def _fraction(name: str, value, *, positive: bool = False) -> Fraction:
    """``value`` (an int, a finite float or a ``Fraction``) as an exact non-negative ``Fraction``."""
    if type(value) is Fraction and value > 0:
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Rational, float, np.floating)):
        raise TypeError(f"{name} must be a rational number (int, float or Fraction), got {type(value).__name__}")
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value}")
        value = Fraction(float(value))
    elif isinstance(value, (numbers.Integral, np.integer)):
        value = Fraction(int(value))
    else:
        value = Fraction(value)
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be {'>' if positive else '>='} 0, got {float(value)}")
    return value


def _count(name: str, value, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _probability(name: str, value) -> tuple[int, int]:
    """``value`` in ``[0, 1]`` as an exact ``(numerator, denominator)``."""
    exact = _fraction(name, value)
    if exact > 1:
        raise ValueError(f"{name} must be <= 1, got {float(exact)}")
    return exact.numerator, exact.denominator


# -- bit sources --------------------------------------------------------------------------------------
class RandomBits(abc.ABC):
    """A source of independent fair random bits, and exact samplers built on them (see the module
    docstring for why each sampler is exact).

    Subclasses provide :meth:`_fresh` (``num_bytes`` fresh random bytes); everything else is built on
    :meth:`bits` and :meth:`words`.  A source buffers a few bytes between draws, so one source must not be
    shared between threads or across ``fork``: make one per call (``random_bits`` does).
    """

    __slots__ = ("_pool", "_size")

    #: Bytes fetched per refill of the bit buffer.
    REFILL_BYTES = 64
    #: Bits compared per step by :meth:`bernoulli` (a class attribute so that tests can enumerate it).
    CHUNK_BITS = 64

    def __init__(self):
        self._pool = 0
        self._size = 0

    @abc.abstractmethod
    def _fresh(self, num_bytes: int) -> bytes:
        """``num_bytes`` fresh random bytes."""

    # -- raw bits ----------------------------------------------------------------------------------------
    def bits(self, k: int) -> int:
        """``k`` fair bits as an integer in ``[0, 2^k)``."""
        if k <= 0:
            return 0
        size = self._size
        if size < k:
            num_bytes = max(self.REFILL_BYTES, (k - size + 7) // 8)
            self._pool |= int.from_bytes(self._fresh(num_bytes), "little") << size
            size += 8 * num_bytes
        value = self._pool & ((1 << k) - 1)
        self._pool >>= k
        self._size = size - k
        return value

    def words(self, size: int) -> np.ndarray:
        """``size`` independent uniform 64-bit words (a ``uint64`` array), for vectorised draws."""
        if size <= 0:
            return np.zeros(0, dtype=np.uint64)
        return np.frombuffer(self._fresh(8 * size), dtype="<u8").astype(np.uint64)

    def below(self, n: int) -> int:
        """A uniform integer in ``{0, ..., n - 1}`` (rejection from ``bitlength(n - 1)`` bits)."""
        if n <= 1:
            if n == 1:
                return 0
            raise ValueError(f"n must be >= 1, got {n}")
        k = (n - 1).bit_length()
        while True:
            value = self.bits(k)
            if value < n:
                return value

    # -- Bernoulli draws ---------------------------------------------------------------------------------
    def bernoulli_ratio(self, numerator: int, denominator: int) -> bool:
        """``True`` with probability ``numerator / denominator`` exactly (integers, ``denominator >= 1``)."""
        if numerator <= 0:
            return False
        if numerator >= denominator:
            return True
        return self.below(denominator) < numerator

    def bernoulli(self, p) -> bool:
        """``True`` with probability exactly ``p`` (a float, int or ``Fraction`` in ``[0, 1]``)."""
        numerator, denominator = _probability("p", p)
        if numerator == 0:
            return False
        if numerator >= denominator:
            return True
        if denominator & (denominator - 1):  # not dyadic
            return self.below(denominator) < numerator
        remaining = denominator.bit_length() - 1  # p = numerator / 2^remaining
        while remaining > 0:
            step = min(self.CHUNK_BITS, remaining)
            remaining -= step
            head = numerator >> remaining  # the next `step` bits of p
            drawn = self.bits(step)  # the next `step` bits of U
            if drawn != head:
                return drawn < head
            numerator -= head << remaining
        return False  # U's bits so far equal all of p's: U >= p

    def bernoulli_exp_ratio(self, numerator: int, denominator: int) -> bool:
        """``True`` with probability ``exp(-numerator / denominator)`` (``numerator >= 0``)."""
        while numerator > denominator:  # gamma > 1: peel off Bernoulli(e^-1) factors
            if not self._bernoulli_exp_unit(1, 1):
                return False
            numerator -= denominator
        return self._bernoulli_exp_unit(numerator, denominator)

    def _bernoulli_exp_unit(self, numerator: int, denominator: int) -> bool:
        """``Bernoulli(e^-gamma)`` for ``gamma = numerator / denominator`` in ``[0, 1]``."""
        trial = 1
        while self.bernoulli_ratio(numerator, denominator * trial):
            trial += 1
        return trial % 2 == 1

    def bernoulli_exp(self, gamma) -> bool:
        """``True`` with probability ``exp(-gamma)`` for a rational ``gamma >= 0``."""
        gamma = _fraction("gamma", gamma)
        return self.bernoulli_exp_ratio(gamma.numerator, gamma.denominator)

    # -- integer laws ------------------------------------------------------------------------------------
    def geometric_exp(self, gamma) -> int:
        """``G >= 0`` with ``P[G = g] = (1 - e^-gamma) e^{-gamma g}`` for a rational ``gamma > 0``."""
        gamma = _fraction("gamma", gamma, positive=True)
        return self.geometric_ratio(gamma.numerator, gamma.denominator)

    def geometric_ratio(self, s: int, t: int) -> int:
        """:meth:`geometric_exp` for ``gamma = s / t`` (positive integers, not checked)."""
        u = 0
        if t > 1:
            while True:
                u = self.below(t)
                if self.bernoulli_exp_ratio(u, t):
                    break
        v = 0
        while self.bernoulli_exp_ratio(1, 1):
            v += 1
        return (u + t * v) // s

    def discrete_laplace(self, gamma) -> int:
        """``Z`` with ``P[Z = z] = (1 - r) / (1 + r) r^|z|``, ``r = e^-gamma`` (``gamma > 0`` rational)."""
        gamma = _fraction("gamma", gamma, positive=True)
        s, t = gamma.numerator, gamma.denominator
        while True:
            magnitude = self.geometric_ratio(s, t)
            if self.bits(1):
                if magnitude:
                    return -magnitude
            else:
                return magnitude

    def discrete_gaussian(self, sigma_squared) -> int:
        """``Y`` with ``P[Y = y] ~ e^{-y^2 / (2 sigma^2)}`` on all the integers (untruncated) for a rational
        ``sigma_squared > 0``: Canonne, Kamath and Steinke's rejection sampler (2020, Algorithm 1).  With
        ``t = floor(sigma) + 1``, a discrete Laplace ``Y`` (``P ~ e^{-|y| / t}``) is kept with probability
        ``exp(-(|y| - sigma^2 / t)^2 / (2 sigma^2))``; the kept law is ``~ e^{-|y|/t - (|y| - sigma^2/t)^2 /
        (2 sigma^2)} = e^{-y^2 / (2 sigma^2) - sigma^2 / (2 t^2)}``, the discrete Gaussian.  Every draw is a
        rational Bernoulli, so the law is exact."""
        s2 = _fraction("sigma_squared", sigma_squared, positive=True)
        t = math.isqrt(s2.numerator // s2.denominator) + 1  # floor(sigma) + 1: floor(sqrt(x)) = isqrt(floor(x))
        rate, shift, scale = Fraction(1, t), s2 / t, 2 * s2
        while True:
            y = self.discrete_laplace(rate)
            if self.bernoulli_exp((abs(y) - shift) ** 2 / scale):
                return y

    def truncated_geometric(self, gamma, k: int) -> int:
        """``X`` on ``{-k, ..., k}`` with ``P[X = x] ~ e^{-gamma |x|}`` (the law ``TG(gamma, k)``)."""
        gamma = _fraction("gamma", gamma, positive=True)
        k = _count("k", k, 0)
        s, t = gamma.numerator, gamma.denominator
        while True:
            magnitude = self.geometric_ratio(s, t) % (k + 1)
            if self.bits(1):
                if magnitude:
                    return -magnitude
            else:
                return magnitude

    def categorical(self, weights) -> int:
        """Index ``i`` with probability ``weights[i] / sum(weights)`` exactly.

        ``weights`` are non-negative ints, floats (read exactly) or ``Fraction`` values, not all zero.
        """
        ratios = []
        for i, w in enumerate(weights):
            if isinstance(w, (float, np.floating)) and math.isfinite(w) and w >= 0:
                ratios.append(float(w).as_integer_ratio())
            else:
                exact = _fraction(f"weights[{i}]", w)
                ratios.append((exact.numerator, exact.denominator))
        if not ratios:
            raise ValueError("weights must not be empty")
        common = 1
        for _, den in ratios:
            if common % den:
                common = common * den // math.gcd(common, den)
        cumulative, total = [], 0
        for num, den in ratios:
            total += num * (common // den)
            cumulative.append(total)
        if total == 0:
            raise ValueError("weights must not all be zero")
        return bisect.bisect_right(cumulative, self.below(total))


class SystemRandomBits(RandomBits):
    """Bits from the operating system's cryptographic random number generator (``os.urandom``)."""

    __slots__ = ()

    def _fresh(self, num_bytes: int) -> bytes:
        return _system_bytes(num_bytes)


class GeneratorRandomBits(RandomBits):
    """Bits from a ``numpy.random.Generator`` (reproducible from its seed: for tests, never for privacy)."""

    __slots__ = ("generator",)

    REFILL_BYTES = 512  # Generator.bytes has a fixed cost per call of several microseconds

    def __init__(self, generator: np.random.Generator):
        super().__init__()
        if not isinstance(generator, np.random.Generator):
            raise TypeError(f"generator must be a numpy.random.Generator, got {type(generator).__name__}")
        self.generator = generator

    def _fresh(self, num_bytes: int) -> bytes:
        return self.generator.bytes(num_bytes)


def random_bits(rng=None, name: str = "rng") -> RandomBits:
    """The bit source for DP noise: ``None`` -> a fresh :class:`SystemRandomBits` (OS randomness),
    a ``numpy.random.Generator`` -> :class:`GeneratorRandomBits` (reproducible), a :class:`RandomBits` ->
    itself.  Anything else is a ``TypeError`` naming ``name`` (the value itself is not shown: it may be a
    seed)."""
    if rng is None:
        return SystemRandomBits()
    if isinstance(rng, RandomBits):
        return rng
    if isinstance(rng, np.random.Generator):
        return GeneratorRandomBits(rng)
    raise TypeError(
        f"{name} must be a numpy.random.Generator (for example numpy.random.default_rng(seed)), "
        f"a mechanisms.randomness.RandomBits, or None for the operating system's randomness; "
        f"got {type(rng).__name__}"
    )


# -- exact bounds on e^x -------------------------------------------------------------------------------
def exp_bounds(x, bits: int) -> tuple[int, int]:
    """Integers ``(lo, hi)`` with ``lo <= e^x 2^bits <= hi`` and ``hi - lo`` of a few units.

    ``x`` is a float or a rational.  ``decimal`` evaluates ``e^x`` at ``D`` significant digits, about
    ``bits`` binary digits plus 30 guard digits: the argument ``x`` is rounded once (relative error at
    most ``10^(1-D)``, which moves ``e^x`` by a relative ``|x| 10^(1-D)`` at most) and ``exp`` is correctly
    rounded (relative error at most ``10^(1-D)``).  The bounds widen the result by the relative slack
    ``(|x| + 2) 10^(5-D)``, far more than both errors together, and round outwards.
    """
    x = Fraction(float(x)) if isinstance(x, (float, np.floating)) else Fraction(x)
    magnitude = abs(float(x))
    digits = int(bits * 0.30103 + magnitude * 0.4343) + 30
    with localcontext() as context:
        context.prec = digits
        value = Fraction((Decimal(x.numerator) / Decimal(x.denominator)).exp())
    slack = Fraction(2 + math.ceil(magnitude), 10 ** (digits - 5))
    lo = value * (1 - slack) * (1 << bits)
    hi = value * (1 + slack) * (1 << bits)
    return max(0, lo.numerator // lo.denominator), -((-hi.numerator) // hi.denominator)


# -- finite laws sampled by exact inverse distribution function ---------------------------------------------
class FiniteLaw(abc.ABC):
    """A law on ``{0, ..., size - 1}`` given by its cumulative boundaries ``F_i = P[outcome <= i]``
    (``i < size - 1``), each computable to any number of bits; sampled exactly (module docstring).

    Subclasses implement :meth:`_prefix` (``floor(2^bits F_i)`` for every ``i``, exactly).
    """

    def __init__(self, size: int):
        self.size = _count("size", size, 1)
        self._cache: dict[int, list[int]] = {}
        self._thresholds: np.ndarray | None = None

    @abc.abstractmethod
    def _prefix(self, bits: int) -> list[int]:
        """``floor(2^bits F_i)`` for every boundary ``i``, exactly."""

    def prefix(self, level: int) -> list[int]:
        """``floor(2^{64 level} F_i)`` for every boundary, exactly (cached)."""
        if level not in self._cache:
            values = self._prefix(_WORD * level)
            if any(b < a for a, b in zip(values, values[1:])):
                raise RuntimeError("the boundaries of a finite law must be non-decreasing")
            self._cache[level] = values
        return self._cache[level]

    def thresholds(self) -> np.ndarray:
        """``floor(2^64 F_i)`` as a ``uint64`` array (the first-word thresholds).

        A boundary equal to 1 (``floor = 2^64``) is stored as ``2^64 - 1``: a word below it decides
        ``U < F`` as it should, and the one word equal to it is a tie, which :meth:`resolve` settles
        with the exact deeper bits (``U < 1`` always)."""
        if self._thresholds is None:
            self._thresholds = np.array([min(v, _WORD_MASK) for v in self.prefix(1)], dtype=np.uint64)
        return self._thresholds

    def resolve(self, word: int, index: int, source: RandomBits) -> int:
        """The outcome of a draw whose first word equals the threshold of boundary ``index``: extend ``U``
        by 64 fresh bits at a time and compare with deeper bits of the boundaries until they differ."""
        prefix, level = word, 1
        while True:
            level += 1
            prefix = (prefix << _WORD) | source.bits(_WORD)
            values = self.prefix(level)
            index = bisect.bisect_left(values, prefix, index)
            if index == len(values) or values[index] != prefix:
                return index

    def sample(self, source: RandomBits, size: int) -> np.ndarray:
        """``size`` independent exact draws (an ``int64`` array of outcome indices)."""
        words = source.words(size)
        if self.size == 1:
            return np.zeros(size, dtype=np.int64)
        thresholds = self.thresholds()
        index = np.searchsorted(thresholds, words, side="left").astype(np.int64)
        inside = index < thresholds.size
        tie = np.zeros(size, dtype=bool)
        tie[inside] = thresholds[index[inside]] == words[inside]
        for i in np.flatnonzero(tie):
            index[i] = self.resolve(int(words[i]), int(index[i]), source)
        return index

    def draw(self, source: RandomBits) -> int:
        """One exact draw."""
        return int(self.sample(source, 1)[0])


class RationalLaw(FiniteLaw):
    """A finite law with exact rational weights (ints, floats read exactly, or ``Fraction``)."""

    def __init__(self, weights):
        weights = [_fraction(f"weights[{i}]", w) for i, w in enumerate(weights)]
        super().__init__(len(weights))
        total = sum(weights, Fraction(0))
        if total == 0:
            raise ValueError("weights must not all be zero")
        running, self._boundaries = Fraction(0), []
        for w in weights[:-1]:
            running += w
            self._boundaries.append(running / total)

    def _prefix(self, bits: int) -> list[int]:
        return [(b.numerator << bits) // b.denominator for b in self._boundaries]


class IntervalLaw(FiniteLaw):
    """A finite law whose boundaries come with rigorous fixed-point bounds.

    ``bounds(precision)`` returns ``(upper, lo, hi)``: three equal-length lists with, for boundary ``i``,
    ``lo[i] <= t_i 2^precision <= hi[i]`` for a number ``t_i > 0`` that is never a dyadic rational, and
    ``F_i = 1 - t_i`` if ``upper[i]`` else ``F_i = t_i`` (writing a boundary near 1 through its small
    complement keeps it resolvable at any precision).  The precision is raised until every
    ``floor(2^bits F_i)`` is certain.
    """

    #: Precision beyond which a boundary is deemed not resolvable (a bug: it never happens for the laws here).
    MAX_PRECISION = 1 << 22

    def __init__(self, size: int, bounds):
        super().__init__(size)
        self._bounds = bounds

    def _prefix(self, bits: int) -> list[int]:
        precision = bits + _WORD + 2 * self.size.bit_length()
        while precision <= self.MAX_PRECISION:
            upper, lo, hi = self._bounds(precision)
            shift = precision - bits
            out = []
            for up, a, b in zip(upper, lo, hi):
                if up:  # floor(2^bits (1 - t)) = 2^bits - ceil(2^bits t), with ceil >= 1 as t > 0
                    ca = max(1, -((-a) >> shift))
                    cb = max(1, -((-b) >> shift))
                    if ca != cb:
                        break
                    out.append((1 << bits) - ca)
                else:
                    fa, fb = a >> shift, b >> shift
                    if fa != fb:
                        break
                    out.append(fa)
            else:
                return out
            precision += max(_WORD, precision // 2)
        raise RuntimeError("could not resolve a boundary of a finite law")


def sample_laws(laws, which: np.ndarray, source: RandomBits) -> np.ndarray:
    """One exact draw per entry: entry ``e`` is drawn from ``laws[which[e]]``.  All laws have the same
    (small) size; one 64-bit word per entry, compared with that law's thresholds."""
    which = np.asarray(which, dtype=np.int64)
    size = laws[0].size if laws else 1
    if any(law.size != size for law in laws):
        raise ValueError("sample_laws needs laws of equal size")
    words = source.words(which.size)
    if size == 1 or which.size == 0:
        return np.zeros(which.size, dtype=np.int64)
    table = np.stack([law.thresholds() for law in laws])  # (laws, size - 1)
    rows = table[which]
    index = (rows < words[:, None]).sum(axis=1).astype(np.int64)
    inside = np.flatnonzero(index < size - 1)
    tie = np.zeros(which.size, dtype=bool)
    tie[inside] = rows[inside, index[inside]] == words[inside]
    for e in np.flatnonzero(tie):
        index[e] = laws[which[e]].resolve(int(words[e]), int(index[e]), source)
    return index


def uniform_below(bounds: np.ndarray, source: RandomBits) -> np.ndarray:
    """One exact uniform integer in ``{0, ..., bounds[e] - 1}`` per entry (``1 <= bounds[e] < 2^63``).

    A word ``w`` is accepted when ``w < m floor((2^64 - 1) / m)`` (a whole number of cycles of residues),
    then ``w mod m`` is uniform; rejected entries (probability below ``m / 2^64``) are redrawn."""
    bounds = np.asarray(bounds, dtype=np.uint64)
    if bounds.size and int(bounds.min()) < 1:
        raise ValueError(f"bounds must be >= 1, got {int(bounds.min())}")
    out = np.zeros(bounds.size, dtype=np.int64)
    todo = np.arange(bounds.size)
    while todo.size:
        m = bounds[todo]
        words = source.words(todo.size)
        limit = (np.uint64(_WORD_MASK) // m) * m
        ok = words < limit
        out[todo[ok]] = (words[ok] % m[ok]).astype(np.int64)
        todo = todo[~ok]
    return out


# -- fixed-point interval arithmetic for laws built on r = e^-gamma -------------------------------------------
def _power_bounds(r_lo: int, r_hi: int, exponent: int, precision: int) -> tuple[int, int]:
    """Bounds on ``r^exponent 2^precision`` from bounds on ``r 2^precision`` (rounded outwards)."""
    one = 1 << precision
    lo = hi = one
    base_lo, base_hi = r_lo, r_hi
    while exponent:
        if exponent & 1:
            lo = (lo * base_lo) >> precision
            hi = -((-(hi * base_hi)) >> precision)
        exponent >>= 1
        if exponent:
            base_lo = (base_lo * base_lo) >> precision
            base_hi = -((-(base_hi * base_hi)) >> precision)
    return lo, min(hi, one)


def _divide(a_lo: int, a_hi: int, b_lo: int, b_hi: int, precision: int) -> tuple[int, int]:
    """Bounds on ``(a / b) 2^precision`` for non-negative ``a`` in ``[a_lo, a_hi]`` and ``b`` in ``[b_lo, b_hi]``
    (all scaled by ``2^precision``); an interval for ``b`` that reaches 0 gives an unbounded result (the
    caller then raises the precision)."""
    if b_lo <= 0:
        return 0, 1 << (3 * precision + 2)
    return (max(a_lo, 0) << precision) // b_hi, -((-(a_hi << precision)) // b_lo)


def _rate(gamma: Fraction, precision: int) -> tuple[int, int]:
    lo, hi = exp_bounds(-gamma, precision)
    one = 1 << precision
    return min(lo, one - 1), min(hi, one)


def _symmetric_boundaries(w_lo: list, w_hi: list, k: int, precision: int):
    """The boundaries of a law on ``{-k, ..., k}`` with ``P[x] ~ w_|x|`` (``w_0 = 1``), from lower and upper
    fixed-point bounds of the weights: with ``S_m = sum_{j=m}^{k} w_j`` and ``D = 1 + 2 S_1``,
    ``F_x = S_{-x} / D`` for ``x < 0`` and ``1 - S_{x+1} / D`` for ``x >= 0`` (each an interval, outward)."""
    s_lo, s_hi = [0] * (k + 2), [0] * (k + 2)  # S_m for m = 0 .. k + 1 (S_{k+1} = 0)
    for m in range(k, 0, -1):
        s_lo[m] = s_lo[m + 1] + w_lo[m]
        s_hi[m] = s_hi[m + 1] + w_hi[m]
    d_lo, d_hi = (1 << precision) + 2 * s_lo[1], (1 << precision) + 2 * s_hi[1]
    upper, lo, hi = [], [], []
    for x in range(-k, k):
        m = -x if x < 0 else x + 1
        a, b = _divide(s_lo[m], s_hi[m], d_lo, d_hi, precision)
        upper.append(x >= 0)
        lo.append(a)
        hi.append(b)
    return upper, lo, hi


def truncated_geometric_law(gamma, k: int) -> IntervalLaw:
    """``TG(gamma, k)`` as a :class:`FiniteLaw` on the indices ``x + k`` (``x`` in ``{-k, ..., k}``).

    Boundaries: with ``S_m = sum_{j=m}^{k} r^j`` and ``D = 1 + 2 S_1``, ``P[X >= m] = S_m / D`` for
    ``m >= 1``; so ``F_x = P[X <= x] = S_{-x} / D`` for ``x < 0`` and ``1 - S_{x+1} / D`` for ``x >= 0``.
    """
    gamma = _fraction("gamma", gamma, positive=True)
    k = _count("k", k, 0)

    def bounds(precision):
        r_lo, r_hi = _rate(gamma, precision)
        pw_lo, pw_hi = [1 << precision], [1 << precision]
        for _ in range(k):
            pw_lo.append((pw_lo[-1] * r_lo) >> precision)
            pw_hi.append(-((-(pw_hi[-1] * r_hi)) >> precision))
        return _symmetric_boundaries(pw_lo, pw_hi, k, precision)

    return IntervalLaw(2 * k + 1, bounds)


def geometric_block_law(gamma, block: int) -> IntervalLaw:
    """``G mod block`` for ``G`` geometric with ratio ``r = e^-gamma``: ``P[j] ~ r^j`` on ``{0..block-1}``;
    ``F_j = 1 - (r^{j+1} - r^block) / (1 - r^block)``."""
    gamma = _fraction("gamma", gamma, positive=True)
    block = _count("block", block, 1)

    def bounds(precision):
        r_lo, r_hi = _rate(gamma, precision)
        one = 1 << precision
        pw_lo, pw_hi = [one], [one]
        for _ in range(block):
            pw_lo.append((pw_lo[-1] * r_lo) >> precision)
            pw_hi.append(-((-(pw_hi[-1] * r_hi)) >> precision))
        d_lo, d_hi = one - pw_hi[block], one - pw_lo[block]
        upper, lo, hi = [], [], []
        for j in range(block - 1):
            a, b = _divide(pw_lo[j + 1] - pw_hi[block], pw_hi[j + 1] - pw_lo[block], d_lo, d_hi, precision)
            upper.append(True)
            lo.append(a)
            hi.append(b)
        return upper, lo, hi

    return IntervalLaw(block, bounds)


def bernoulli_exp_law(gamma) -> IntervalLaw:
    """Outcome ``0`` with probability ``e^-gamma`` and ``1`` otherwise (``gamma > 0`` rational)."""
    gamma = _fraction("gamma", gamma, positive=True)

    def bounds(precision):
        lo, hi = _rate(gamma, precision)
        return [False], [lo], [hi]

    return IntervalLaw(2, bounds)


def discrete_laplace_cut_law(gamma, cuts) -> IntervalLaw:
    """Which of the intervals ``(-inf, x_0], (x_0, x_1], ..., (x_last, inf)`` a discrete Laplace ``Z``
    (``P[Z = z] ~ r^|z|``, ``r = e^-gamma``) falls in, for increasing integer cuts ``x_i``.

    Boundaries: ``P[Z <= x] = r^{-x} / (1 + r)`` for ``x <= -1`` and ``1 - r^{x+1} / (1 + r)`` for
    ``x >= 0``."""
    gamma = _fraction("gamma", gamma, positive=True)
    cuts = [int(x) for x in cuts]
    if any(b <= a for a, b in zip(cuts, cuts[1:])):
        raise ValueError(f"cuts must be strictly increasing, got {cuts}")

    def bounds(precision):
        r_lo, r_hi = _rate(gamma, precision)
        one = 1 << precision
        upper, lo, hi = [], [], []
        for x in cuts:
            p_lo, p_hi = _power_bounds(r_lo, r_hi, -x if x < 0 else x + 1, precision)
            a, b = _divide(p_lo, p_hi, one + r_lo, one + r_hi, precision)
            upper.append(x >= 0)
            lo.append(a)
            hi.append(b)
        return upper, lo, hi

    return IntervalLaw(len(cuts) + 1, bounds)


def discrete_gaussian_law(sigma, bound: int) -> IntervalLaw:
    """The discrete Gaussian ``N_Z(0, sigma^2)`` truncated to ``{-bound, ..., bound}``, as a :class:`FiniteLaw`
    on the indices ``x + bound``: ``P[X = x] ~ w_x = e^{-x^2 / (2 sigma^2)}`` (Canonne, Kamath and Steinke,
    "The Discrete Gaussian for Differential Privacy", 2020, Definition 1, conditioned on ``|X| <= bound``:
    the law dp-accounting's ``DiscreteGaussianPrivacyLoss(sigma, truncation_bound=bound)`` analyses).

    ``sigma`` is read as the exact rational its float stores.  Boundaries, as for the truncated geometric law:
    with ``G_m = sum_{y=m}^{bound} w_y`` and ``Z = 1 + 2 G_1``, ``F_x = G_{-x} / Z`` for ``x < 0`` and
    ``1 - G_{x+1} / Z`` for ``x >= 0``.  The weights are bounded in fixed point from ``r = e^{-1/(2 sigma^2)}``
    by the exact recurrence ``w_{y+1} = w_y r^{2y+1}`` with outward rounding at every product.  No boundary
    is a dyadic rational (Lindemann-Weierstrass: a rational ``F_x`` would be a non-trivial rational relation
    between ``e^{-y^2/(2 sigma^2)}`` for distinct ``y^2``), so every floor the sampler needs is resolvable."""
    sigma = _fraction("sigma", sigma, positive=True)
    bound = _count("bound", bound, 1)
    gamma = 1 / (2 * sigma * sigma)

    def bounds(precision):
        one = 1 << precision
        r_lo, r_hi = _rate(gamma, precision)
        r2_lo, r2_hi = (r_lo * r_lo) >> precision, -((-(r_hi * r_hi)) >> precision)
        w_lo, w_hi = [one], [one]
        step_lo, step_hi = r_lo, r_hi  # r^{2y+1} for y = 0
        for _ in range(bound):
            w_lo.append((w_lo[-1] * step_lo) >> precision)
            w_hi.append(-((-(w_hi[-1] * step_hi)) >> precision))
            step_lo = (step_lo * r2_lo) >> precision
            step_hi = min(one, -((-(step_hi * r2_hi)) >> precision))
        return _symmetric_boundaries(w_lo, w_hi, bound, precision)

    return IntervalLaw(2 * bound + 1, bounds)


_GEOMETRIC_CACHE: dict = {}


def sample_geometric(gamma, size: int, source: RandomBits) -> np.ndarray:
    """``size`` exact draws of ``G`` with ``P[G = g] = (1 - r) r^g``, ``r = e^-gamma``, vectorised.

    ``G = X + b M`` with ``X = G mod b`` and ``M = G div b`` independent (memorylessness): ``X`` from
    :func:`geometric_block_law` and ``M`` geometric with ratio ``r^b``, drawn as repeated exact
    ``Bernoulli(r^b)`` on the entries still running.  The block ``b`` makes ``r^b <= 2^-8``, so few rounds
    are needed."""
    gamma = _fraction("gamma", gamma, positive=True)
    size = _count("size", size, 0)
    if gamma not in _GEOMETRIC_CACHE:
        if len(_GEOMETRIC_CACHE) > 64:
            _GEOMETRIC_CACHE.clear()
        block = max(1, math.ceil(8 * math.log(2) / float(gamma)))
        _GEOMETRIC_CACHE[gamma] = (block, geometric_block_law(gamma, block), bernoulli_exp_law(gamma * block))
    block, block_law, tail_law = _GEOMETRIC_CACHE[gamma]
    out = block_law.sample(source, size)
    running = np.arange(size)
    while running.size:
        going_on = tail_law.sample(source, running.size) == 0
        running = running[going_on]
        out[running] += block
    return out
