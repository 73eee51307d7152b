"""The one registry of mechanisms: names for the command line, the runs, the auditor and the contract suite.

``generate``/``demo`` build their per-step mechanism from ``--mechanism NAME`` and ``audit-mechanism NAME``
builds an audit case from the same name; both read this table, so a name means one mechanism everywhere.
An entry has a ``build(epsilon, delta, relation)`` when runs may use it (``runs=True``), an
``audit(epsilon, delta, noise_scale)`` that returns a :class:`mechanisms.audit.AuditCase` when the
auditor knows a telling neighbouring pair for it, and ``examples(relation)``: a few small instances for the
contract checks (:func:`contract_examples`; by default built from ``build`` at a few large budgets).

Registering your own mechanism::

    from mechanisms.registry import register_mechanism

    register_mechanism("my-argmax", build=lambda epsilon, delta, relation: MyArgMax(epsilon, delta, relation),
                       runs=True)

Afterwards ``generate --mechanism my-argmax`` builds it, and ``mechanism_names()`` lists it.  A mechanism is
a :class:`mechanisms.base.Mechanism` (or any object with an ``event``, a ``__call__(histogram, rng=None)``
returning a ``Release`` and an exact ``output_distribution(histogram)``); check it with
:func:`mechanisms.testing.check_registered_mechanism` before trusting it (the repository's contract suite
runs that check on every registered name).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

# The package exports its mechanisms lazily (mechanisms/__init__.py): a built-in's module is imported when it
# is first built, so listing the names imports no mechanism (nor numpy, scipy or dp-accounting behind them).
import mechanisms as _m

__all__ = [
    "ALIASES",
    "MechanismEntry",
    "audit_names",
    "EXAMPLE_BUDGETS",
    "build_mechanism",
    "contract_examples",
    "mechanism_entry",
    "mechanism_names",
    "register_mechanism",
    "run_mechanism_names",
]


@dataclasses.dataclass(frozen=True)
class MechanismEntry:
    """One registered mechanism: ``build(epsilon, delta, relation)`` (``None``: not buildable from a per-step
    budget alone), ``audit(epsilon, delta, noise_scale)`` (``None``: no audit case), whether runs offer it,
    and ``examples(relation)`` (``None``: built from ``build``; see :func:`contract_examples`)."""

    name: str
    build: Callable | None
    audit: Callable | None
    runs: bool
    summary: str
    examples: Callable | None = None
    min_delta: float | None = None
    needs_teachers: bool = False


_ENTRIES: dict[str, MechanismEntry] = {}

#: Earlier names of ``audit-mechanism`` cases, still accepted.
ALIASES = {"weighted-sampling": "dp-weighted-sampling", "boundary-wrapper": "boundary-dp-argmax"}


def register_mechanism(name: str, *, build: Callable | None = None, audit: Callable | None = None,
                       runs: bool = False, summary: str = "", examples: Callable | None = None,
                       min_delta: float | None = None, needs_teachers: bool = False) -> MechanismEntry:
    """Register a mechanism under ``name`` (lower-case words joined by ``-``).  ``runs=True`` needs a
    ``build``.  ``examples(relation)`` returns a few small instances for the contract checks (noise large
    enough that histograms of a handful of teachers reach every branch) and raises ``ValueError`` naming a
    relation the mechanism refuses; without it they are built from ``build`` (:data:`EXAMPLE_BUDGETS`).
    ``min_delta``: the smallest per-step delta ``build`` takes, when it is above the general floor
    ``MIN_DELTA`` (docs/ranges.md).  ``needs_teachers``: ``build`` takes a fourth argument, the configured number
    of teachers ``n`` (a public setting of the run, fixed when the mechanism is built, never read from a
    histogram).  A name that is taken by another entry is a ``ValueError``."""
    if not isinstance(name, str) or not name or name != name.strip().lower() or " " in name:
        raise ValueError(f"a mechanism name must be lower-case words joined by '-', got {name!r}")
    if name in ALIASES:
        raise ValueError(f"mechanism name {name!r} is an alias of {ALIASES[name]!r}")
    if any(f is not None and not callable(f) for f in (build, audit, examples)):
        raise TypeError("build, audit and examples must be callables or None")
    if runs and build is None:
        raise ValueError(f"mechanism {name!r}: runs=True needs a build(epsilon, delta, relation)")
    entry = MechanismEntry(name, build, audit, bool(runs), summary, examples, min_delta, bool(needs_teachers))
    old = _ENTRIES.get(name)
    if old is not None and old != entry:
        raise ValueError(f"mechanism name {name!r} is already registered")
    _ENTRIES[name] = entry
    return entry


def mechanism_entry(name: str) -> MechanismEntry:
    """The entry registered under ``name`` (or an alias of it); ``KeyError`` naming the known names."""
    entry = _ENTRIES.get(ALIASES.get(name, name)) if isinstance(name, str) else None
    if entry is None:
        raise KeyError(f"unknown mechanism {name!r}; registered: {', '.join(sorted(_ENTRIES))}")
    return entry


def mechanism_names() -> tuple[str, ...]:
    return tuple(sorted(_ENTRIES))


def run_mechanism_names() -> tuple[str, ...]:
    """The names ``generate``/``demo`` offer, in registration order (the default first)."""
    return tuple(name for name, entry in _ENTRIES.items() if entry.runs)


def audit_names() -> tuple[str, ...]:
    return tuple(sorted(name for name, entry in _ENTRIES.items() if entry.audit is not None))


def build_mechanism(name: str, epsilon: float, delta: float, relation: str = "replace-one",
                    num_teachers: int | None = None):
    """Build the per-step mechanism ``name`` with per-step ``(epsilon, delta)`` under ``relation``; an entry that
    ``needs_teachers`` also gets ``num_teachers``, the run's configured number of teachers."""
    entry = mechanism_entry(name)
    if entry.build is None:
        raise ValueError(f"mechanism {name!r} cannot be built from a per-step (epsilon, delta) alone")
    if entry.needs_teachers:
        if num_teachers is None:
            raise ValueError(f"mechanism {name!r} needs the number of teachers to be built (num_teachers)")
        return entry.build(epsilon, delta, relation, num_teachers)
    return entry.build(epsilon, delta, relation)


#: The per-step budgets :func:`contract_examples` builds a mechanism at when its entry gives no ``examples``:
#: large deltas and moderate epsilons, so the truncations are short and histograms of a handful of teachers
#: reach every branch of the mechanism.
EXAMPLE_BUDGETS = ((1.0, 0.1), (2.0, 0.2), (0.5, 0.3))


def contract_examples(name: str, relation: str) -> list:
    """Small instances of the mechanism ``name`` under ``relation``, for the contract checks
    (:func:`mechanisms.testing.check_registered_mechanism`): the entry's ``examples(relation)``, or else its
    ``build`` at each of :data:`EXAMPLE_BUDGETS`.  Raises ``ValueError`` (naming the relation) when the
    mechanism refuses the relation, and ``LookupError`` when the entry has neither."""
    entry = mechanism_entry(name)
    if entry.examples is not None:
        built = list(entry.examples(relation))
    elif entry.build is not None:
        built = [entry.build(epsilon, delta, relation) for epsilon, delta in EXAMPLE_BUDGETS]
    else:
        raise LookupError(
            f"mechanism {name!r} has no examples for the contract checks: register it with examples=relation -> "
            "[small instances] (or a build)"
        )
    if not built:
        raise LookupError(f"mechanism {name!r}: examples({relation!r}) returned no instance")
    return built


# -- the built-in mechanisms --------------------------------------------------------------------------------


def _case(name: str) -> Callable:
    """The audit-case builder ``mechanisms.audit.NAME``, imported when first called."""

    def build(*args, **kwargs):
        from mechanisms import audit

        return getattr(audit, name)(*args, **kwargs)

    build.__name__ = name
    return build


def _clipped_logits():
    from mechanisms import clipped_logits

    return clipped_logits


def _averaged_distributions():
    from mechanisms import averaged_distributions

    return averaged_distributions


def _public_agreement():
    from mechanisms import public_agreement

    return public_agreement


def _subsampled():
    from mechanisms import subsampled

    return subsampled


def _register_builtins() -> None:

    # Contract examples: budgets whose truncation L is 2 to 5, so histograms of at most six teachers reach the
    # release thresholds, the truncation's delta and (for LArgMax) both parities of n.
    def dp_argmax_examples(relation):
        return [_m.DPArgMax(e, d, relation=relation) for e, d in ((2.0, 0.2), (1.0, 0.1), (4.0, 0.05), (0.5, 0.3))]

    def weighted_sampling_examples(relation):
        return [_m.DPWeightedSampling(1.0, 0.05, relation), _m.DPWeightedSampling(2.0, 0.1, relation),
                _m.DPWeightedSampling(0.5, 1e-3, relation), _m.DPWeightedSampling(1.0, 0.05, relation, release_counts=True)]

    register_mechanism(
        "dp-argmax", build=lambda e, d, r: _m.DPArgMax(e, d, relation=r), audit=_case("dp_argmax_case"), runs=True,
        examples=dp_argmax_examples,
        summary="LArgMax: the majority token when its noisy count clears n/2 + L, else fail")
    register_mechanism(
        "boundary-dp-argmax", build=lambda e, d, r: _m.BoundaryWrapper(_m.DPArgMax(e, d, relation=r)),
        audit=_case("boundary_wrapper_case"), runs=True,
        examples=lambda r: [_m.BoundaryWrapper(_m.DPArgMax(e, d, relation=r)) for e, d in ((2.0, 0.2), (0.6, 0.3))],
        summary="DPArgMax inside the boundary wrapper (a q-target for target charging)")
    register_mechanism(
        "dp-weighted-sampling", build=lambda e, d, r: _m.DPWeightedSampling(e, d, relation=r),
        audit=_case("weighted_sampling_case"), runs=True, examples=weighted_sampling_examples,
        summary="sparsity-preserving DP weighted sampling of a voted token")
    register_mechanism(
        "boundary-dp-weighted-sampling", build=lambda e, d, r: _m.BoundaryWrapper(_m.DPWeightedSampling(e, d, relation=r)),
        runs=True, examples=lambda r: [_m.BoundaryWrapper(_m.DPWeightedSampling(1.0, 0.05, r))],
        summary="DPWeightedSampling inside the boundary wrapper")
    register_mechanism(
        "noisy-argmax", audit=_case("noisy_argmax_case"),
        examples=lambda r: [_m.TruncatedGeometricNoisyArgMax(e, d, relation=r)
                            for e, d in ((2.0, 0.2), (1.0, 0.1), (4.0, 0.05))],
        summary="truncated-geometric NoisyArgMax: the noisy top token and its noisy count")
    register_mechanism(
        "between-thresholds", audit=_case("between_thresholds_case"), runs=True, needs_teachers=True,
        build=lambda e, d, r, n: _m.BetweenThresholds.for_teachers(e, n, relation=r, step_delta=d),
        examples=lambda r: [_m.BetweenThresholds(e, lo, hi, relation=r).on_token(0)
                            for e, lo, hi in ((1.0, 1, 3), (0.5, 0, 4), (2.0, 2, 3))],
        summary="BetweenThresholds on the count of a candidate token (in runs: the public model's; thresholds from n)")
    # GNMax: sigma 1 to 2 over three or four tokens, so that six teachers move the law (noise of a few votes).
    register_mechanism(
        "gaussian-argmax", build=lambda e, d, r: _m.GaussianNoisyArgMax.calibrated(e, d, relation=r), runs=True,
        audit=_case("gaussian_argmax_case"),
        min_delta=1e-14,  # mechanisms.gaussian.MIN_GAUSSIAN_DELTA: the floor of dp-accounting's curve
        examples=lambda r: [_m.GaussianNoisyArgMax(1.0, vocab_size=3, relation=r),
                            _m.GaussianNoisyArgMax(2.0, vocab_size=4, relation=r, epsilon=0.5)],
        summary="GNMax: exact discrete Gaussian noise on every count of the vocabulary, the argmax (PLD-charged)")
    register_mechanism(
        "gaussian-threshold-argmax",
        build=lambda e, d, r, n: _m.GaussianThresholdArgMax.for_teachers(e, d, n, relation=r), runs=True,
        audit=_case("gaussian_threshold_argmax_case"),
        needs_teachers=True, min_delta=1e-14,  # mechanisms.gaussian.MIN_GAUSSIAN_DELTA
        examples=lambda r: [_m.GaussianThresholdArgMax(1.0, vocab_size=3, relation=r, threshold=3),
                            _m.GaussianThresholdArgMax(1.5, vocab_size=3, relation=r, threshold=5, epsilon=2.0)],
        summary="GNMax released only when the noisy top count clears a threshold, else fail (one noise draw; in "
                "runs the threshold is a strict majority of the configured teachers)")
    # Clipped-logit sampling over three teachers: epsilon 0.5 clips below the log-differences of the enumeration's
    # distributions (the bound is reached); epsilon 2 at temperature 0.7 on a public top-1 widened by the band.
    register_mechanism(
        "clipped-logit-sampling", runs=True, needs_teachers=True,
        build=lambda e, d, r, n: _clipped_logits().ClippedLogitSampling.for_run(e, d, r, n),
        examples=lambda r: [_clipped_logits().ClippedLogitSampling(0.5, 3, r),
                            _clipped_logits().ClippedLogitSampling(2.0, 3, r, temperature=0.7, top_k=1)],
        summary="InvisibleInk: the public log-probabilities plus the teachers' clipped differences, sampled by the "
                "exponential mechanism on the public top-k+ (reads distributions, not votes; pure, zCDP under RDP)")
    # Tang et al.'s Gaussian over three teachers rounded to 2 or 3 units: sigma 5.6 and 6.1 units, so that three
    # teachers move the law; the second on a public top-2 at temperature 0.7.
    register_mechanism(
        "gaussian-averaged-distributions", runs=True, needs_teachers=True,
        build=lambda e, d, r, n: _averaged_distributions().GaussianAveragedDistributions.for_run(e, d, r, n),
        examples=lambda r: [
            _averaged_distributions().GaussianAveragedDistributions(2.0, 1e-3, 3, r, resolution=2),
            _averaged_distributions().GaussianAveragedDistributions(3.0, 0.01, 3, r, temperature=0.7, top_k=2,
                                                                    resolution=3)],
        summary="Tang et al.: the teachers' distributions on the public top-k, rounded and summed, exact discrete "
                "Gaussian noise, the argmax (reads distributions, not votes; zCDP under RDP)")
    # Amin et al.'s public agreement over three teachers rounded to one unit (Delta 2): the test's noise a few units
    # against queries of up to 6, so that the enumeration's query sequences move the transcripts.
    register_mechanism(
        "svt-public-agreement", runs=True, needs_teachers=True,
        build=lambda e, d, r, n: _public_agreement().SparseVectorPublicAgreement.for_run(e, d, r, n),
        examples=lambda r: [
            _public_agreement().SparseVectorPublicAgreement(2.0, 3, r, resolution=1),
            _public_agreement().SparseVectorPublicAgreement(4.0, 3, r, temperature=0.7, top_k=1, threshold=0.3,
                                                            svt_share=0.75, resolution=2)],
        summary="Amin et al.: a sparse vector test of the teachers' distance from the public model; the public "
                "token where they agree, else a clipped-logit draw (reads distributions; charged an episode)")
    # Poisson-subsampled teachers around inner mechanisms calibrated under add-remove-one: LArgMax and GNMax at
    # large budgets, kept at rate 1/2 and 3/10, so that six teachers move the mixture's law.
    register_mechanism(
        "subsampled-teachers",
        examples=lambda r: [
            _subsampled().SubsampledTeachers(_m.DPArgMax(2.0, 0.2, relation="add-remove-one"), 0.5, r),
            _subsampled().SubsampledTeachers(_m.GaussianNoisyArgMax(1.0, vocab_size=3, relation="add-remove-one"),
                                             0.3, r)],
        summary="Poisson-subsampled teachers: each vote kept with probability q, an inner mechanism (add-remove-one) "
                "on the kept votes; amplified (epsilon, delta)")
    register_mechanism(
        "threshold-argmax", examples=lambda r: [_m.ThresholdArgMax(2), _m.ThresholdArgMax(4)],
        summary="TArgMax_T: the most-voted token with at least T votes (threshold privacy, not DP)")
    register_mechanism(
        "threshold-weighted-sampling",
        examples=lambda r: [_m.ThresholdWeightedSampling(2, 1.0), _m.ThresholdWeightedSampling(3, 2.0)],
        summary="TWS_{T,gamma}: a token with at least T votes, drawn by count (threshold privacy, not DP)")


_register_builtins()
