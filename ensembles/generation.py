"""Framework 2 of the paper: lockstep private generation with fallbacks (docs/generation.md).

Each step: check the budget (``accountant.can_afford(mechanism.event)``), ask the backend for the active
teachers' votes (``backend.votes``: temperature, then top-p, applied once where the logits are; one vote per
teacher, coordinated for Hot PATE or independent for Cold PATE) on the randomness of the step's
:class:`~ensembles.keyed_votes.StepKey` (the run key, the token position and the retry), run the mechanism on
the histogram of the votes through the accountant, and append the released token to every active teacher.  A ``fail`` (or a boundary-wrapper target, which releases nothing) is
handled by the fallback: ``"retry"`` (fresh shared randomness, each retry a charged run), ``"public"``
(a token from a public backend: no privacy cost) or ``"stop"``.

With a :class:`~mechanisms.BetweenThresholds` mechanism the step is the individual-charging scheme of
the paper's "DP methods for heterogeneous ensembles": a random rate ``nu ~ U[1/n, 1]`` where ``n`` is the
*fixed, public* ensemble size (the number of teachers at the start, never the number still active), and a
random candidate ``v`` (both data-independent: ``v`` is drawn from the public backend's next-token
distribution when there is one, ``candidate="public"``, the default then, else uniformly from the
vocabulary, ``candidate="uniform"``; the public backend only sees the public prompt and released tokens,
so either choice is independent of the private data).  Each of the ``n`` original teachers gets one
inclusion draw ``U_i < nu``; a removed teacher abstains (its draw is made and ignored, so the other
teachers' draws do not depend on whether it was removed), and ``BetweenThresholds`` runs on the count
``c'_v`` of included active teachers voting ``v``; ``above``/``between`` release ``v``, ``below`` fails.
Hence the law of ``(nu, v, the included set restricted to the teachers other than i)`` is the same
whether or not teacher ``i`` was removed: removal changes only the queries that would count ``i``.
On a ``between`` outcome (a hit) the recorded release names the counted teachers (original indices) in
``charged_teachers``; any other outcome names nobody, so non-hits charge nobody and leave no teacher set
anywhere.  An ``IndividualChargingAccountant`` charges the named teachers and removes teachers at their
limit, and the generator drops removed teachers from the backend before the next step.

Nothing about prompts is stored: the result and the ledger hold only released tokens, outcome classes and
counts.  What is a raw function of the private data, and must stay out of anything shared (JSON results,
logs, the shareable ledger): ``StepRecord.max_count``/``margin`` (the raw top count and margin of the step's
histogram), ``StepRecord.counted`` (the count ``c'_v`` BetweenThresholds protects) and, under individual
charging, ``StepRecord.num_teachers``, ``GenerationResult.num_active_teachers`` and ``GenerationResult.spent``
(functions of which teachers were charged).
"""

from __future__ import annotations

import abc
import inspect

import attr
import numpy as np

from ensembles.backends.base import NextTokenBackend
from ensembles.histograms import TAIL_VOTE, VoteHistogram
from ensembles.keyed_votes import HISTOGRAMS, StepKey
from ensembles.public_prior import PublicPrior, as_public_mix, as_public_support
from mechanisms.between_thresholds import BetweenThresholds
from mechanisms.base import reads_distributions
from mechanisms.public_agreement import Episode
from pate_accountant.accountants.base import Accountant
from pate_accountant.accountants.individual import IndividualChargingAccountant
from pate_accountant.errors import BudgetExhaustedError
from pate_accountant.release import Release
from pate_accountant.validation import check_int, check_real

__all__ = [
    "AggregationStep",
    "DistributionAggregation",
    "GenerationResult",
    "HistogramAggregation",
    "IndividualChargingAggregation",
    "PrivateGenerator",
    "StepOutcome",
    "StepRecord",
    "check_between_thresholds_reachable",
    "individual_charging_draws",
    "public_generate",
    "public_generate_many",
    "public_token",
    "stop_position",
]

FALLBACKS = ("retry", "public", "stop")
CANDIDATES = ("public", "uniform")
STOP_REASONS = ("eos", "stop_string", "max_tokens", "budget", "fail")


@attr.s(frozen=True, slots=True, auto_attribs=True)
class StepRecord:
    """One charged mechanism run (a retry is a separate record).

    ``token``: the token appended after this run (``None`` if none); ``outcome``: ``"token"`` (released
    privately), ``"fail"``, ``"target"`` (boundary-wrapper target: nothing released), ``"below"``
    (BetweenThresholds answered ``below``: nothing released) or ``"fallback"`` (nothing was released and a
    public token was used); ``retries``: earlier failed runs at this position;
    ``num_teachers``: active teachers in this run; ``max_count``/``margin``: raw histogram diagnostics
    (not private); ``target_hit``: the release's target flag; ``counted``: BetweenThresholds' count ``c'_v``
    (the included active teachers voting the candidate; they are charged only on a target hit).

    **Confidential**: ``max_count``, ``margin`` and ``counted`` are raw functions of the votes, and under
    individual charging ``num_teachers`` reveals removals (a function of who was charged).  Keep them out
    of anything shared (JSON results, logs, ledgers); they are for local diagnostics only.
    """

    token: int | None
    outcome: str
    max_count: int
    margin: int
    retries: int
    num_teachers: int
    target_hit: bool | None = None
    counted: int = 0


@attr.s(frozen=True, slots=True, auto_attribs=True)
class GenerationResult:
    """What :meth:`PrivateGenerator.generate` returns: the generated text and token ids (without eos),
    the per-run step records, ``spent = accountant.spent()`` at the end, the stop reason (one of
    ``"eos"``, ``"stop_string"``, ``"max_tokens"``, ``"budget"``, ``"fail"``) and the number of
    teachers still active.  Holds no prompt text.

    **Confidential under individual charging**: ``num_active_teachers`` and ``spent`` are then functions of
    which teachers were charged (raw data, not DP outputs), and ``steps`` hold raw diagnostics (see
    :class:`StepRecord`): never put them in a shareable output.  The text, token ids, outcome classes and
    stop reason are DP outputs (or public fallbacks)."""

    text: str
    token_ids: tuple
    steps: tuple
    spent: tuple
    stop_reason: str
    num_active_teachers: int

    @property
    def num_charged_runs(self) -> int:
        return len(self.steps)

    def outcome_counts(self) -> dict:
        counts: dict = {}
        for step in self.steps:
            counts[step.outcome] = counts.get(step.outcome, 0) + 1
        return counts


def individual_charging_draws(rng: np.random.Generator, num_teachers: int, active) -> tuple[float, np.ndarray]:
    """The data-independent draws of one individual-charging query: the rate ``nu ~ U[1/n, 1]`` with ``n =
    num_teachers`` the fixed ensemble size, and one inclusion draw ``U_i ~ U[0, 1)`` for each of the ``n``
    original teachers.  Returns ``(nu, included)`` with ``included[j] = U_{active[j]} < nu`` for the active
    teachers (sorted original indices); removed teachers' draws are made and ignored (they abstain).

    So for a fixed random stream, ``nu`` and every other teacher's inclusion are the same whether or not
    some teacher ``i`` was removed: the law of ``(nu, included set minus {i})`` does not depend on it."""
    num_teachers = check_int("num_teachers", num_teachers, minimum=1)
    active = np.asarray(active, dtype=np.int64)
    if active.size and (active.min() < 0 or active.max() >= num_teachers):
        raise ValueError(f"active teachers must be indices in [0, {num_teachers}), got {int(active.max())}")
    nu = float(rng.uniform(1.0 / num_teachers, 1.0))
    draws = rng.random(num_teachers)
    return nu, draws[active] < nu


def check_between_thresholds_reachable(mechanism, num_teachers: int) -> None:
    """Refuse a BetweenThresholds query whose lower threshold exceeds ``n``: the counted votes ``c'_v`` are
    at most ``n``, so such a query could release only by noise and every run would be spent for nothing."""
    low = int(mechanism.low)
    if low > num_teachers:
        raise ValueError(f"BetweenThresholds threshold low={low} is out of reach of n={num_teachers} teachers "
                         f"(the count of votes is at most n): no query could release a token")


def _choice(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def _check_untransformed(name, backend, temperature: float, top_p) -> None:
    """Temperature and top-p are the generator's, applied once (by ``backend.votes``): refuse a backend that
    applies its own as well, and let a backend that cannot apply these (``check_sampling``) refuse them now,
    before any run."""
    if backend is None:
        return
    check = getattr(backend, "check_sampling", None)
    if check is not None:
        check(temperature, top_p)
    temperature, top_p = getattr(backend, "temperature", 1.0), getattr(backend, "top_p", None)
    if temperature != 1.0 or top_p not in (None, 1.0):
        raise ValueError(f"{name} applies temperature={temperature} and top_p={top_p} itself; build it with "
                         "temperature=1.0 and top_p=None and give them to PrivateGenerator, which applies them once")


def _takes_public(backend) -> bool:
    """Whether ``backend.votes`` accepts the ``public`` keyword (by name, or through ``**kwargs``)."""
    try:
        parameters = inspect.signature(backend.votes).parameters.values()
    except (TypeError, ValueError):  # no signature to read: let the first call decide
        return True
    return any(p.name == "public" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _check_public_prior(mix, support, backend, public_backend) -> bool:
    """Whether a public-prior option is on; refuses one that cannot run (no public model, or a backend whose
    ``votes`` cannot apply it), naming the option, before any run."""
    options = ([f"public_mix={mix.weight:g}"] if mix.weight > 0 else []) + \
        ([f"public_support={support!r}"] if support is not None else [])
    if not options:
        return False
    if public_backend is None:
        raise ValueError(f"{options[0]} needs a public_backend (the public model whose next-token distribution "
                         "is the prior)")
    if not _takes_public(backend):
        raise ValueError(f"{options[0]} needs a backend whose votes() applies the public prior (a public= "
                         f"keyword); {type(backend).__name__}.votes takes none")
    return True


def _diagnostics(votes: np.ndarray) -> tuple[int, int]:
    real = votes[votes != TAIL_VOTE]
    if real.size == 0:
        return 0, 0
    counts = np.sort(np.unique(real, return_counts=True)[1])[::-1]
    top = int(counts[0])
    second = int(counts[1]) if counts.size > 1 else 0
    return top, top - second


class _MechanismRandomness:
    """The secret randomness of one :meth:`PrivateGenerator.generate` call: ``mechanism`` is what the
    mechanism calls get (``None``: the OS generator, see :mod:`mechanisms.randomness`) and ``numpy`` a
    generator for the individual-charging draws (seeded from the OS entropy pool when none is given)."""

    def __init__(self, mechanism_rng):
        if mechanism_rng is not None and not isinstance(mechanism_rng, np.random.Generator):
            raise TypeError(f"mechanism_rng must be None or a numpy.random.Generator, got {type(mechanism_rng).__name__}")
        self.mechanism = mechanism_rng
        self.numpy = mechanism_rng if mechanism_rng is not None else np.random.default_rng()


@attr.s(frozen=True, slots=True, auto_attribs=True)
class StepOutcome:
    """What one charged run of an aggregation scheme gives the loop: the ``release`` (already recorded by the
    accountant), the ``token`` to append (``None``: nothing released) and ``counted`` (the raw count
    BetweenThresholds protects; 0 for the other schemes; confidential)."""

    release: Release
    token: int | None
    counted: int = 0


class AggregationStep(abc.ABC):
    """One aggregation scheme of Framework 2: how a step's votes become a charged release.

    :meth:`start` is called once per :meth:`PrivateGenerator.generate` call, before the first step;
    :meth:`run` once per charged run, with the step's votes (one per active teacher, original indices in
    ``active``).  A scheme refuses an unaffordable run by letting ``BudgetExhaustedError`` through, with
    the accountant unchanged."""

    def check(self, num_teachers: int) -> None:
        """Refuse a generation over ``num_teachers`` teachers (the fixed, public ensemble size) that this
        scheme cannot run, before anything starts (``ValueError``)."""

    def start(self) -> None:
        """Prepare for the first step, after the backend has begun (``BudgetExhaustedError`` when not one
        run is affordable)."""

    @abc.abstractmethod
    def run(self, votes: np.ndarray, active: np.ndarray, rng: np.random.Generator,
            secret: _MechanismRandomness, prior: PublicPrior | None = None) -> StepOutcome:
        """Aggregate one histogram privately and record the release with the accountant.  ``prior``: the step's
        public prior when a public-prior option is on (``None`` otherwise)."""


class HistogramAggregation(AggregationStep):
    """The paper's ensemble sampler ``M = A o H`` (Section 4.3): the histogram of all active teachers' votes
    goes to the mechanism ``A`` through ``accountant.register`` (check, run, record); a token is released
    unless ``A`` fails or hits its target (a boundary wrapper's target releases nothing).

    Under a public support (``prior.support``, ``k`` tokens) the mechanism runs on the histogram over the
    support alone, votes outside it counted as the tail: a mechanism that adds noise to every count (GNMax)
    then adds it to ``k`` counts, not to the whole vocabulary, and can only release a token of the support.
    The support is public, so this is the same mechanism on a relabelled, smaller histogram: one teacher's
    change still moves one vote by one, and the events do not depend on the number of tokens."""

    def __init__(self, mechanism, accountant, vocab_size: int):
        self.mechanism, self.accountant, self.vocab_size = mechanism, accountant, vocab_size
        self._run = None

    def start(self):
        self._run = self.accountant.register(self.mechanism)  # BudgetExhaustedError: not one run affordable

    def run(self, votes, active, rng, secret, prior=None):
        support = None if prior is None else prior.support
        if support is None:
            release = self._run(VoteHistogram.from_votes(votes, self.vocab_size), rng=secret.mechanism)
            token = None if (release.failed or release.target_hit) else int(release.value)
            return StepOutcome(release, token)
        release = self._run(VoteHistogram.from_votes(support_votes(votes, support), len(support)),
                            rng=secret.mechanism)
        token = None if (release.failed or release.target_hit) else int(support[int(release.value)])
        return StepOutcome(release, token)


def support_votes(votes: np.ndarray, support: np.ndarray) -> np.ndarray:
    """``votes`` relabelled to positions in the sorted public ``support``; a vote outside it (or a tail vote)
    becomes ``TAIL_VOTE``."""
    votes = np.asarray(votes)
    positions = np.searchsorted(support, votes)
    clipped = np.minimum(positions, len(support) - 1)
    inside = (votes != TAIL_VOTE) & (support[clipped] == votes)
    return np.where(inside, clipped, TAIL_VOTE).astype(np.int64)


class IndividualChargingAggregation(AggregationStep):
    """The individual-charging scheme of the paper's "DP methods for heterogeneous ensembles" with a
    :class:`~mechanisms.BetweenThresholds` mechanism (module docstring): data-independent ``nu``, inclusion
    draws and candidate ``v``; BetweenThresholds on the count of included active teachers voting ``v``;
    ``above``/``between`` release ``v``, ``below`` releases nothing; only a hit names (and charges) the
    counted teachers.  Under an :class:`IndividualChargingAccountant` the teachers it removes are dropped
    from the backend after every run.  Under a public support (``prior.support``) the candidate is drawn from
    the support (the public model's distribution restricted to it, or uniformly), a public choice too."""

    def __init__(self, mechanism, accountant, backend, candidate: str, public_token):
        self.mechanism, self.accountant, self.backend = mechanism, accountant, backend
        self.candidate, self.public_token = candidate, public_token
        self.individual = isinstance(accountant, IndividualChargingAccountant)
        self.num_teachers = 0

    def check(self, num_teachers):
        check_between_thresholds_reachable(self.mechanism, num_teachers)
        if self.individual and self.accountant.num_teachers != num_teachers:
            raise ValueError(
                f"the accountant tracks {self.accountant.num_teachers} teachers but {num_teachers} prompts were given"
            )
        self.num_teachers = num_teachers

    def start(self):
        self._sync_active()

    def run(self, votes, active, rng, secret, prior=None):
        nu, included = individual_charging_draws(secret.numpy, self.num_teachers, active)
        support = None if prior is None else prior.support
        if self.candidate == "public":
            candidate = self.public_token(rng) if support is None else self.public_token(rng, support)
        elif support is None:
            candidate = int(rng.integers(self.backend.vocab_size))
        else:  # a public support: the candidate is one of its tokens (votes outside it are tail votes)
            candidate = int(support[rng.integers(support.size)])
        counted = np.flatnonzero(included & (votes == candidate))
        release = self.mechanism(int(counted.size), rng=secret.mechanism)
        # Only a hit charges, and only a hit names its counted teachers: a non-hit records no teacher set.
        charged = frozenset(int(t) for t in active[counted]) if release.target_hit else frozenset()
        release = attr.evolve(release, charged_teachers=charged)
        self.accountant.record(release)  # check-then-commit: refuses atomically
        self._sync_active()
        token = candidate if release.value in ("between", "above") else None
        return StepOutcome(release, token, int(counted.size))

    def _sync_active(self) -> None:
        if not self.individual:
            return
        removed = np.setdiff1d(self.backend.active_teachers(), self.accountant.active_teachers())
        if removed.size:
            self.backend.drop_teachers(removed)


class DistributionAggregation(AggregationStep):
    """A mechanism over the teachers' distributions (``mechanism.inputs == "distributions"``: InvisibleInk's
    clipped-logit sampling, :mod:`mechanisms.clipped_logits`; Tang et al.'s Gaussian on averaged distributions,
    :mod:`mechanisms.averaged_distributions`): each charged run reads the active teachers'
    next-token log-probabilities and the public model's (the public prompt and the released tokens) and hands
    them to the mechanism through the accountant; no votes are drawn.  The mechanism never fails.

    The teachers' distributions are read with ``backend.distributions()`` (untransformed: temperature 1, no
    top-p; the mechanism applies its own temperature), so a backend holding its logits on a device sends the
    ``(m, V)`` probabilities to the host once per step (docs/mechanisms/clipped_logits.md)."""

    reads_distributions = True

    def __init__(self, mechanism, accountant, backend, public_backend):
        self.mechanism, self.accountant = mechanism, accountant
        self.backend, self.public_backend = backend, public_backend
        self._run, self._episode = None, {}

    def check(self, num_teachers):
        if num_teachers > self.mechanism.num_teachers:
            raise ValueError(f"{num_teachers} teacher prompts, more than the {self.mechanism.num_teachers} teachers "
                             "the mechanism is calibrated for")

    def start(self):
        self._run = self.accountant.register(self.mechanism)
        # an episodic mechanism (a sparse vector test) keeps its secret state for one record: a new record opens
        # a new episode
        self._episode = {"episode": Episode()} if getattr(self.mechanism, "episodic", False) else {}

    def run(self, votes, active, rng, secret, prior=None):
        with np.errstate(divide="ignore"):
            teachers = np.log(self.backend.distributions().to_dense())
            public = np.log(self.public_backend.distributions().to_dense()[0])
        release = self._run(teachers, public, rng=secret.mechanism, **self._episode)
        if release.outcome != "token":  # a sparse vector test's below: nothing released (the public token follows)
            return StepOutcome(release, None)
        return StepOutcome(release, int(release.value))


class _IncrementalText:
    """``backend.decode(tokens)`` kept up to date as tokens are appended, at a cost that does not grow with the
    length: each new token's text is read from the decode of the last :attr:`WINDOW` tokens (how incremental
    detokenisers handle tokens whose text depends on their neighbours).  When the window's old text is not
    the end of the text so far (a decoder whose output is not local), the whole list is decoded instead.
    Decisions that must be exact (a stop string, the final text) decode in full once."""

    WINDOW = 8

    def __init__(self, backend):
        self.backend = backend
        self.text = ""

    def extend(self, tokens: list) -> int:
        """Account for the last token of ``tokens`` (the others were seen before); return where the new text
        starts in :attr:`text`."""
        start = max(0, len(tokens) - 1 - self.WINDOW)
        old = self.backend.decode(tokens[start:-1]) if len(tokens) > 1 else ""
        new = self.backend.decode(tokens[start:])
        if new.startswith(old) and self.text.endswith(old):
            begin = len(self.text)
            self.text += new[len(old):]
            return begin
        self.text = self.backend.decode(tokens)
        return 0


class PrivateGenerator:
    """``PrivateGenerator(backend, mechanism, accountant, *, histograms="coordinated", fallback="retry",
    max_retries=3, public_backend=None, public_prompt="", max_tokens=32, stop_strings=(), top_p=None,
    temperature=1.0, seed=None, candidate=None, public_mix=0.0, public_support=None)``; :meth:`generate` runs
    Framework 2 (module docstring).

    ``candidate`` (BetweenThresholds only): where the individual-charging step's candidate token comes from,
    ``"public"`` (a sample of the public backend's distribution; the default when ``public_backend`` is given)
    or ``"uniform"`` (uniform over the vocabulary; the default without one).  A uniform candidate is rarely
    one the teachers vote for when the vocabulary is large, so most steps fail.

    Public prior (:mod:`ensembles.public_prior`; both need ``public_backend``, whose next-token distribution
    at the generator's temperature is computed once per token position and sent to ``backend.votes`` with the
    key; both are data-independent transforms of each teacher's distribution, so no privacy claim changes):

    * ``public_mix`` (a weight ``lambda`` in ``[0, 1]``, or a :class:`~ensembles.public_prior.PublicMix`;
      default 0, off): every teacher races on ``lambda p_pub + (1 - lambda) p_i``; the generator's top-p cuts
      the mixture.
    * ``public_support`` (``None``, off; an integer ``k``: the public model's top-``k`` tokens; or a
      :class:`~ensembles.public_prior.PublicSupport` with ``top_k`` or ``top_p``): votes outside the set are
      tail votes (``TAIL_VOTE``), which count in ``n`` and are never released; under BetweenThresholds the
      candidate is drawn from the set.

    With both off (the defaults) the generator calls ``backend.votes`` exactly as before (no ``public``
    keyword), so a backend whose ``votes`` takes no ``public`` serves every other run, and outputs are
    bit-identical for a fixed seed.  A backend that cannot apply them is refused when the generator is
    built."""

    def __init__(self, backend, mechanism, accountant, *, histograms="coordinated", fallback="retry",
                 max_retries=3, public_backend=None, public_prompt="", max_tokens=32, stop_strings=(),
                 top_p=None, temperature=1.0, seed=None, candidate=None, public_mix=0.0, public_support=None):
        if not isinstance(backend, NextTokenBackend):
            raise TypeError(f"backend must implement NextTokenBackend, got {type(backend).__name__}")
        if not isinstance(accountant, Accountant):
            raise TypeError(f"accountant must be an Accountant, got {type(accountant).__name__}")
        if not callable(mechanism) or not hasattr(mechanism, "event"):
            raise TypeError("mechanism must be callable with an .event")
        self.backend, self.mechanism, self.accountant = backend, mechanism, accountant
        self.histograms = _choice("histograms", histograms, HISTOGRAMS)
        self.fallback = _choice("fallback", fallback, FALLBACKS)
        self.max_retries = check_int("max_retries", max_retries, minimum=0)
        if fallback == "public" and public_backend is None:
            raise ValueError('fallback="public" needs a public_backend')
        if public_backend is not None and not isinstance(public_backend, NextTokenBackend):
            raise TypeError("public_backend must implement NextTokenBackend")
        if public_backend is not None and public_backend.vocab_size != backend.vocab_size:
            raise ValueError("public_backend must share the backend's vocabulary")
        self.public_backend, self.public_prompt = public_backend, public_prompt
        self.max_tokens = check_int("max_tokens", max_tokens, minimum=1)
        if isinstance(stop_strings, str):
            stop_strings = (stop_strings,)
        self.stop_strings = tuple(str(s) for s in stop_strings)
        if any(not s for s in self.stop_strings):
            raise ValueError("stop strings must be non-empty")
        self.top_p = None if top_p is None else check_real("top_p", top_p, minimum=0.0, maximum=1.0, min_open=True)
        self.temperature = check_real("temperature", temperature, minimum=0.0, min_open=True)
        for name, model in (("backend", backend), ("public_backend", public_backend)):
            _check_untransformed(name, model, self.temperature, self.top_p)
        self.seed = seed
        if candidate is None:
            candidate = "uniform" if public_backend is None else "public"
        self.candidate = _choice("candidate", candidate, CANDIDATES)
        if self.candidate == "public" and public_backend is None:
            raise ValueError('candidate="public" needs a public_backend')
        self.public_mix = as_public_mix(public_mix)
        self.public_support = as_public_support(public_support)
        self._public_prior = _check_public_prior(self.public_mix, self.public_support, backend, public_backend)
        if reads_distributions(mechanism):
            self.scheme = self._distribution_scheme(mechanism, accountant)
        elif isinstance(mechanism, BetweenThresholds):
            self.scheme = IndividualChargingAggregation(mechanism, accountant, backend, self.candidate,
                                                        self._public_token)
        elif isinstance(accountant, IndividualChargingAccountant):
            raise ValueError("an IndividualChargingAccountant needs a BetweenThresholds mechanism (the paper's "
                             "individual-charging scheme)")
        else:
            self.scheme = HistogramAggregation(mechanism, accountant, backend.vocab_size)

    # -- pieces ----------------------------------------------------------------------------------------
    def _distribution_scheme(self, mechanism, accountant) -> DistributionAggregation:
        """The scheme of a mechanism over distributions, at the generator's temperature and with the public
        support's top-k (``public_support``; none: the whole vocabulary); refused, naming the option, where an
        option of the votes would be silently dropped."""
        name = type(mechanism).__name__
        if self.public_backend is None:
            raise ValueError(f"{name} reads the public model's distribution: it needs a public_backend")
        if isinstance(accountant, IndividualChargingAccountant):
            raise ValueError(f"{name} has no individual charging (an IndividualChargingAccountant needs "
                             "BetweenThresholds)")
        if self.top_p is not None:
            raise ValueError(f"top_p={self.top_p:g}: {name} draws from its own aggregate of the distributions (its "
                             "public support is --public-top-k)")
        if self.public_mix.weight:
            raise ValueError(f"public_mix={self.public_mix.weight:g}: {name} reads the public model's distribution "
                             "itself")
        support = self.public_support
        if support is not None and support.top_k is None:
            raise ValueError(f"public_support={support!r}: {name} takes a public top-k, not a top-p")
        if getattr(mechanism, "episodic", False) and self.fallback != "public":
            raise ValueError(f"fallback={self.fallback!r}: {name} answers 'below' where the teachers agree with the "
                             "public model, and the public model's token follows: it needs fallback='public'")
        self._public_prior = False  # the mechanism reads the public distribution itself
        self.mechanism = mechanism.with_settings(temperature=self.temperature,
                                                 top_k=0 if support is None else support.top_k)
        return DistributionAggregation(self.mechanism, accountant, self.backend, self.public_backend)

    def _public_token(self, rng, support=None) -> int:
        """A sample of the public backend's distribution (:func:`public_token`)."""
        return public_token(self.public_backend, rng, self.temperature, self.top_p, support)

    def _step_prior(self) -> PublicPrior | None:
        """The public prior of the current position (``None`` when both options are off): the public backend's
        distribution at the generator's temperature, with the mixing weight and the support.  Computed once per
        position, before its first charged run, and used by every retry there."""
        if not self._public_prior:
            return None
        return PublicPrior.from_distributions(self.public_backend.distributions(), temperature=self.temperature,
                                              mix=self.public_mix, support=self.public_support)

    # -- the loop --------------------------------------------------------------------------------------
    def generate(self, teacher_prompts, *, shared_prefix="", seed=None, rng=None,
                 mechanism_rng=None, on_token=None, on_step=None) -> GenerationResult:
        """Generate one response privately from ``teacher_prompts`` (one prompt per teacher, text or ids).

        Two sources of randomness, kept apart (docs/mechanisms/randomness.md):

        * the *sampling* randomness: ``rng``, else ``np.random.default_rng(seed)``, else the constructor's
          ``seed``.  Its first draw is the run key; the teachers' shared noise ``u_j`` of every charged run is
          a function of (run key, token position, retry, token id) (:mod:`ensembles.keyed_votes`), so every
          shard of teachers computes the same noise.  Later draws give the candidate token and public
          fallback tokens.  It is not secret: the privacy guarantee holds for every fixed value of it.
        * the *mechanism* randomness (the aggregator's noise and, under individual charging, the rate
          ``nu`` and the inclusion draws): ``mechanism_rng``.  ``None`` (the default) is the operating
          system's cryptographic generator, fresh for every call, which is what a private run must use.
          A ``numpy.random.Generator`` makes the run reproducible for tests and simulations, and gives no
          privacy against whoever knows its seed.

        ``on_token(token_id)`` (optional) is called after each token is appended (a progress bar, a
        stream); it sees only released or public tokens.  ``on_step(outcome)`` (optional) is called after each
        charged run with its public outcome class (``"token"``, ``"fallback"``, ``"fail"``, ...; nothing
        confidential), e.g. to count private and public tokens apart.  Equal seeds and equal seeded ``mechanism_rng``
        give equal results (for a deterministic backend).
        """
        if rng is None:
            rng = np.random.default_rng(self.seed if seed is None else seed)
        secret = _MechanismRandomness(mechanism_rng)
        for name, hook in (("on_token", on_token), ("on_step", on_step)):
            if hook is not None and not callable(hook):
                raise TypeError(f"{name} must be callable or None, got {type(hook).__name__}")
        backend, accountant, scheme = self.backend, self.accountant, self.scheme
        run_key = int(rng.integers(0, 2**63 - 1, dtype=np.int64))
        teacher_prompts = list(teacher_prompts)
        scheme.check(len(teacher_prompts))  # n: the fixed, public ensemble size
        backend.begin(teacher_prompts, shared_prefix=shared_prefix or None)
        if self.public_backend is not None:
            self.public_backend.begin([self.public_prompt or ""], shared_prefix=shared_prefix or None)
        try:
            scheme.start()
        except BudgetExhaustedError:  # not even one run is affordable
            return GenerationResult("", (), (), tuple(accountant.spent()), "budget",
                                    int(backend.active_teachers().size))
        event = self.mechanism.event

        tokens: list[int] = []
        steps: list[StepRecord] = []
        stop_reason = "max_tokens"
        text = ""
        decoded = _IncrementalText(backend)  # decode(tokens), kept up to date at a constant cost per token
        while len(tokens) < self.max_tokens:
            token, retries, prior = None, 0, None
            while True:
                if not accountant.can_afford(event):
                    stop_reason = "budget"
                    break
                active = backend.active_teachers()
                if self._public_prior and prior is None:
                    prior = self._step_prior()
                options = {} if prior is None else {"public": prior}
                if getattr(scheme, "reads_distributions", False):  # no votes: the scheme reads distributions
                    votes, (max_count, margin) = None, (0, 0)
                else:
                    votes = backend.votes(StepKey(run_key, len(tokens), retries), temperature=self.temperature,
                                          top_p=self.top_p, histograms=self.histograms, **options)
                    max_count, margin = _diagnostics(votes)
                try:
                    step = scheme.run(votes, active, rng, secret, **({} if prior is None else {"prior": prior}))
                except BudgetExhaustedError:
                    stop_reason = "budget"
                    break
                token = step.token
                outcome = "token" if token is not None else step.release.outcome
                if token is None and self.fallback == "public":
                    token, outcome = self._public_token(rng), "fallback"
                steps.append(StepRecord(token, outcome, max_count, margin, retries, int(active.size),
                                        step.release.target_hit, step.counted))
                if on_step is not None:
                    on_step(outcome)
                if token is not None or self.fallback == "stop" or retries >= self.max_retries:
                    break
                retries += 1
            if stop_reason == "budget":
                break
            if token is None:
                stop_reason = "fail"
                break
            if backend.eos_token_id is not None and token == backend.eos_token_id:
                stop_reason = "eos"
                break
            tokens.append(token)
            backend.append(token)
            if self.public_backend is not None:
                self.public_backend.append(token)
            if on_token is not None:
                on_token(token)
            new_from = decoded.extend(tokens)
            if self.stop_strings and self._stop_string(decoded.text, new_from) is not None:
                text = backend.decode(tokens)  # the exact text, decoded once in full, decides
                hit = self._stop_string(text)
                if hit is not None:
                    text = text[:hit]
                    stop_reason = "stop_string"
                    break
                decoded.text = text
        else:
            stop_reason = "max_tokens"
        if stop_reason != "stop_string":
            text = backend.decode(tokens)
        num_active = int(backend.active_teachers().size)
        return GenerationResult(text, tuple(tokens), tuple(steps), tuple(accountant.spent()), stop_reason, num_active)

    def _stop_string(self, text: str, new_from: int = 0) -> int | None:
        return stop_position(self.stop_strings, text, new_from)


def public_token(public_backend, rng, temperature: float, top_p, support=None) -> int:
    """A sample of ``public_backend``'s next-token distribution (at ``temperature`` and ``top_p``); with
    ``support`` (sorted token ids), of that distribution restricted to the support (uniform over the support when
    the top-p cut leaves none of it)."""
    return _draw(public_backend.distributions().for_sampling(temperature, top_p), 0, rng, support)


def _draw(dists, row: int, rng, support=None) -> int:
    """A sample of row ``row`` of ``dists`` (:func:`public_token`'s rule)."""
    ids, probs = dists.row(row)
    if support is not None:
        inside = np.isin(ids, support)
        if not (inside.any() and probs[inside].sum() > 0):
            return int(support[rng.integers(support.size)])
        ids, probs = ids[inside], probs[inside]
    probs = probs / probs.sum()
    return int(ids[rng.choice(ids.size, p=probs)])


def stop_position(stop_strings, text: str, new_from: int = 0) -> int | None:
    """The first position of one of ``stop_strings`` in ``text`` that ends at or after ``new_from`` (the text
    before it was searched already), or ``None``."""
    start = max(0, new_from - max((len(s) for s in stop_strings), default=1) + 1)
    positions = [i for i in (text.find(s, start) for s in stop_strings) if i >= 0]
    return min(positions) if positions else None


def public_generate(public_backend, prompt: str, *, shared_prefix: str = "", max_tokens: int = 32,
                    stop_strings=(), temperature: float = 1.0, top_p=None, rng=None,
                    on_token=None) -> GenerationResult:
    """One response of the public model alone, from ``shared_prefix + prompt`` (no teacher, no mechanism, no
    charge): every token is a sample of its distribution, as a private run's public fallback draws it
    (:func:`public_token`), so the response stops as a private one does (end of text, a stop string,
    ``max_tokens``).  The epsilon = 0 floor a private run is judged against (docs/generation.md, "The public model
    alone").  No step is a charged run, so the result lists none (its ``token_ids`` are the draws, the end of text
    aside)."""
    return public_generate_many(public_backend, prompt, 1, shared_prefix=shared_prefix, max_tokens=max_tokens,
                                stop_strings=stop_strings, temperature=temperature, top_p=top_p, rng=rng,
                                on_token=on_token)[0]


def public_generate_many(public_backend, prompt: str, count: int, *, shared_prefix: str = "", max_tokens: int = 32,
                         stop_strings=(), temperature: float = 1.0, top_p=None, rng=None,
                         on_token=None) -> list[GenerationResult]:
    """``count`` independent responses of the public model alone to one prompt, each as :func:`public_generate`
    writes it (the same law, token by token).  A backend with ``append_each`` (:class:`~ensembles.backends.
    transformers_backend.TransformersBackend`) writes them side by side: the prompt is run once and copied, and
    each step is one forward of the responses not yet ended; any other backend writes them one after another.
    ``on_token(token)`` is called for every drawn token."""
    if not isinstance(public_backend, NextTokenBackend):
        raise TypeError(f"public_backend must implement NextTokenBackend, got {type(public_backend).__name__}")
    count = check_int("count", count, minimum=1)
    max_tokens = check_int("max_tokens", max_tokens, minimum=1)
    temperature = check_real("temperature", temperature, minimum=0.0, min_open=True)
    top_p = None if top_p is None else check_real("top_p", top_p, minimum=0.0, maximum=1.0, min_open=True)
    stop_strings = (stop_strings,) if isinstance(stop_strings, str) else tuple(str(s) for s in stop_strings)
    if any(not s for s in stop_strings):
        raise ValueError("stop strings must be non-empty")
    _check_untransformed("public_backend", public_backend, temperature, top_p)
    rng = np.random.default_rng() if rng is None else rng
    side_by_side = count > 1 and hasattr(public_backend, "append_each")
    if count == 1 or side_by_side:
        return _public_rows(public_backend, prompt, count, shared_prefix, max_tokens, stop_strings, temperature,
                            top_p, rng, on_token)
    return [_public_rows(public_backend, prompt, 1, shared_prefix, max_tokens, stop_strings, temperature, top_p, rng,
                         on_token)[0] for _ in range(count)]


def _public_rows(backend, prompt, count, shared_prefix, max_tokens, stop_strings, temperature, top_p, rng,
                 on_token) -> list[GenerationResult]:
    """The loop of :func:`public_generate_many`: rows (teachers of the backend) that end are dropped."""
    if count == 1:
        backend.begin([prompt or ""], shared_prefix=shared_prefix or None)
    else:  # the prompt's tokens as one shared prefix: run once, copied to every row (the tokens one row would see)
        backend.begin([[]] * count, shared_prefix=backend.encode(shared_prefix or "") + backend.encode(prompt or ""))
    tokens = [[] for _ in range(count)]
    decoded = [_IncrementalText(backend) for _ in range(count)]
    results: list = [None] * count
    while True:
        active = [int(i) for i in backend.active_teachers()]
        dists = backend.distributions().for_sampling(temperature, top_p)
        drawn, ended = [], []
        for row, i in enumerate(active):
            token = _draw(dists, row, rng)
            drawn.append(token)
            if backend.eos_token_id is not None and token == backend.eos_token_id:
                results[i] = _public_result(backend, tokens[i], "eos")
                ended.append(i)
                continue
            tokens[i].append(token)
            if on_token is not None:
                on_token(token)
            new_from = decoded[i].extend(tokens[i])
            if stop_strings and stop_position(stop_strings, decoded[i].text, new_from) is not None:
                text = backend.decode(tokens[i])
                hit = stop_position(stop_strings, text)
                if hit is not None:
                    results[i] = GenerationResult(text[:hit], tuple(tokens[i]), (), (0.0, 0.0), "stop_string", 0)
                    ended.append(i)
                    continue
                decoded[i].text = text
            if len(tokens[i]) >= max_tokens:
                results[i] = _public_result(backend, tokens[i], "max_tokens")
                ended.append(i)
        if len(ended) == len(active):
            return results
        going = [(i, t) for i, t in zip(active, drawn) if i not in ended]
        if ended:
            backend.drop_teachers(ended)
        if count == 1:
            backend.append(going[0][1])
        else:
            backend.append_each([t for _, t in going])


def _public_result(backend, tokens: list, stop_reason: str) -> GenerationResult:
    return GenerationResult(backend.decode(tokens), tuple(tokens), (), (0.0, 0.0), stop_reason, 0)
