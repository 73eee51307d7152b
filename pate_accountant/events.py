"""Privacy events: what an accountant needs to know about one step, and nothing about the data.

Every event is a frozen, validated attrs class that subclasses ``dp_accounting.DpEvent`` so that
dp-accounting's own accountants and ours can consume the same objects.  Events hold parameters only,
never teacher prompts, records or vote counts.
"""

from __future__ import annotations

import math
from fractions import Fraction

import attr
import dp_accounting

from pate_accountant.validation import attrs_validator, check_int, check_real

#: Names of the neighbouring relations an event can be stated under: replace-one (one teacher's vote moves,
#: n fixed; the default) and add-remove-one (a teacher and its vote join or leave, n changes by one).
REPLACE_ONE = "replace-one"
ADD_REMOVE_ONE = "add-remove-one"
NEIGHBOURING_RELATIONS = (REPLACE_ONE, ADD_REMOVE_ONE)


def _check_relation(instance, attribute, value):
    if value not in NEIGHBOURING_RELATIONS:
        raise ValueError(f"{attribute.name} must be one of {NEIGHBOURING_RELATIONS}, got {value!r}")


@attr.s(frozen=True, slots=True, auto_attribs=True)
class EpsilonDeltaEvent(dp_accounting.DpEvent):
    """A generic step that is ``(epsilon, delta)``-DP under ``relation`` (one teacher's vote changes)."""

    epsilon: float = attr.ib(converter=float, validator=attrs_validator(check_real, minimum=0.0))
    delta: float = attr.ib(
        default=0.0, converter=float, validator=attrs_validator(check_real, minimum=0.0, maximum=1.0, max_open=True)
    )
    relation: str = attr.ib(default=REPLACE_ONE, validator=_check_relation)


@attr.s(frozen=True, slots=True, auto_attribs=True)
class ThresholdPrivacyEvent(dp_accounting.DpEvent):
    """A step with ``T``-threshold privacy (paper Section 4.3): only tokens with ``c_j >= T`` can be released.

    Threshold privacy is a proxy for DP, not a DP guarantee: DP accountants report it as unsupported.
    """

    threshold: int = attr.ib(validator=attrs_validator(check_int, minimum=1))


def _positive_real(instance, attribute, value):
    check_real(attribute.name, value, minimum=0.0, min_open=True)


def _probability_open(instance, attribute, value):
    check_real(attribute.name, value, minimum=0.0, maximum=1.0, min_open=True, max_open=True)


@attr.s(frozen=True, slots=True, auto_attribs=True)
class NoisyArgMaxEvent(EpsilonDeltaEvent):
    """Truncated-geometric NoisyArgMax or LArgMax (``DPArgMax``): ``(epsilon, delta)``-DP in total under
    ``relation``, with per-count noise ``TG(epsilon_c, error_bound)``."""

    error_bound: int = attr.ib(default=0, validator=attrs_validator(check_int, minimum=0))


@attr.s(frozen=True, slots=True, auto_attribs=True)
class DiscreteGaussianArgMaxEvent(EpsilonDeltaEvent):
    """Gaussian NoisyArgMax (GNMax, Papernot et al. 2018) with truncated discrete Gaussian noise
    ``N_Z(0, sigma^2)`` on ``{-truncation_bound, ..., truncation_bound}`` added to every count of the
    vocabulary, one draw per count.  Under ``relation`` one teacher shifts ``shifts`` counts by one (2 under
    replace-one, 1 under add-remove-one): the PLD accountant charges the composition of ``shifts``
    one-dimensional discrete-Gaussian mechanisms of sensitivity one (dp-accounting's
    ``from_discrete_gaussian_mechanism``); every other accountant charges the stated ``(epsilon, delta)``,
    which that same curve certifies (docs/mechanisms/gaussian.md)."""

    sigma: float = attr.ib(default=1.0, converter=float, validator=_positive_real)
    truncation_bound: int = attr.ib(default=1, validator=attrs_validator(check_int, minimum=1))

    @property
    def shifts(self) -> int:
        """How many counts one neighbouring step moves by one (:func:`histogram_shifts`)."""
        return histogram_shifts(self.relation)


def histogram_shifts(relation: str) -> int:
    """How many counts of a vote histogram one neighbour moves by one: 2 under replace-one (one vote leaves a
    token, another gains it), 1 under add-remove-one."""
    return 2 if relation == REPLACE_ONE else 1


@attr.s(frozen=True, slots=True, auto_attribs=True)
class SubsampledTeachersEvent(EpsilonDeltaEvent):
    """A run on Poisson-subsampled teachers (``mechanisms.subsampled``): each teacher kept with probability
    ``rate``, an inner mechanism ``(inner_epsilon, inner_delta)``-DP under add-remove-one on the kept votes; the
    stated ``(epsilon, delta)`` under ``relation`` is the amplified bound every accountant charges
    (docs/mechanisms/subsampled.md)."""

    rate: float = attr.ib(default=1.0, converter=float,
                          validator=attrs_validator(check_real, minimum=0.0, maximum=1.0, min_open=True))
    inner_epsilon: float = attr.ib(default=0.0, converter=float, validator=attrs_validator(check_real, minimum=0.0))
    inner_delta: float = attr.ib(default=0.0, converter=float,
                                 validator=attrs_validator(check_real, minimum=0.0, maximum=1.0, max_open=True))
    #: The inner mechanism's own event (``None``: only its ``(inner_epsilon, inner_delta)`` is known).  The PLD
    #: accountant charges a truncated discrete Gaussian inner (GNMax) by the exact PLD of its Poisson-subsampled
    #: noisy histogram instead of the stated bound (docs/mechanisms/subsampled.md).
    inner: dp_accounting.DpEvent | None = attr.ib(default=None)

    @inner.validator
    def _check_inner(self, attribute, value):
        if value is not None and not isinstance(value, dp_accounting.DpEvent):
            raise TypeError(f"inner must be a dp_accounting.DpEvent or None, got {type(value).__name__}")
        if getattr(value, "relation", ADD_REMOVE_ONE) != ADD_REMOVE_ONE:
            raise ValueError(f"the inner event of subsampled teachers is stated under add-remove-one, got "
                             f"{value.relation!r}")


@attr.s(frozen=True, slots=True, auto_attribs=True)
class WeightedSamplingEvent(EpsilonDeltaEvent):
    """Sparsity-preserving DP weighted sampling (LWS / ``DPWeightedSampling``):
    ``(epsilon, delta)``-DP in total under ``relation``."""


@attr.s(frozen=True, slots=True, auto_attribs=True)
class BoundedRangeEvent(EpsilonDeltaEvent):
    """A step that is ``epsilon``-bounded-range under ``relation``: on every neighbouring pair the log-ratio of
    the two output laws, over the outcomes, lies in an interval of width ``epsilon`` (the exponential mechanism
    with a utility whose change on a neighbour spans at most ``epsilon``; Durfee and Rogers 2019).  That is
    ``(epsilon, 0)``-DP, which every accountant may charge; it is also ``epsilon**2 / 8``-zCDP (Cesar and Rogers
    2021), which the RDP accountant charges instead (docs/mechanisms/clipped_logits.md).  ``delta`` is 0."""

    @property
    def rho(self) -> float:
        """The zCDP parameter ``epsilon**2 / 8`` the bounded range gives."""
        return self.epsilon * self.epsilon / 8.0


@attr.s(frozen=True, slots=True, auto_attribs=True)
class SparseVectorEpisodeEvent(EpsilonDeltaEvent):
    """One episode of a sparse vector test with a private draw at its end (Amin et al.'s public agreement,
    docs/mechanisms/public_agreement.md): an AboveThreshold run that is ``svt_epsilon``-DP for every number of
    ``below`` answers it gives, then at most one ``draw_epsilon``-bounded-range draw.  Charged once, when the
    episode starts: ``epsilon >= svt_epsilon + draw_epsilon`` pure for every accountant, and
    ``rho = svt_epsilon**2 / 2 + draw_epsilon**2 / 8`` (pure DP is ``eps^2/2``-zCDP, Bun-Steinke 2016, Prop. 1.4;
    bounded range ``eps^2/8``, Cesar-Rogers 2021) for the RDP accountant.  ``delta`` is 0."""

    svt_epsilon: float = attr.ib(default=0.0, converter=float, validator=attrs_validator(check_real, minimum=0.0))
    draw_epsilon: float = attr.ib(default=0.0, converter=float, validator=attrs_validator(check_real, minimum=0.0))

    @property
    def rho(self) -> float:
        """``svt_epsilon**2 / 2 + draw_epsilon**2 / 8``."""
        return self.svt_epsilon * self.svt_epsilon / 2.0 + self.draw_epsilon * self.draw_epsilon / 8.0


def zcdp_epsilon(rho: float, delta: float) -> float:
    """The epsilon at ``delta`` that ``rho``-zCDP gives: ``rho + 2 sqrt(rho log(1 / delta))`` (Bun and Steinke
    2016, Proposition 1.3)."""
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def zcdp_rho(epsilon: float, delta: float) -> float:
    """The largest ``rho`` whose :func:`zcdp_epsilon` at ``delta`` is ``epsilon``:
    ``(sqrt(log(1 / delta) + epsilon) - sqrt(log(1 / delta)))**2``."""
    log = math.log(1.0 / delta)
    return (math.sqrt(log + epsilon) - math.sqrt(log)) ** 2


@attr.s(frozen=True, slots=True, auto_attribs=True)
class DiscreteGaussianSumEvent(EpsilonDeltaEvent):
    """A step that releases (a function of) an integer vector plus independent *untruncated* discrete Gaussian
    noise ``N_Z(0, sigma^2)`` on each coordinate, where one neighbour moves the vector by at most
    ``sqrt(sensitivity_squared)`` in L2 norm under ``relation``: ``rho = sensitivity_squared / (2 sigma^2)``-zCDP
    (Canonne, Kamath and Steinke 2020, Theorem 14: the Renyi divergence of integer shifts is that of the
    continuous Gaussian), which the RDP accountant charges.  Every other accountant charges the stated
    ``(epsilon, delta)``, which must follow from ``rho`` (:func:`zcdp_epsilon`; checked by every accountant).
    Tang et al.'s Gaussian on averaged distributions (docs/mechanisms/averaged_distributions.md)."""

    sigma_squared: float = attr.ib(default=1.0, converter=float, validator=_positive_real)
    sensitivity_squared: float = attr.ib(default=1.0, converter=float, validator=_positive_real)

    @property
    def rho(self) -> float:
        """``sensitivity_squared / (2 sigma_squared)``, computed exactly from the two floats and rounded up."""
        exact = Fraction(self.sensitivity_squared) / (2 * Fraction(self.sigma_squared))
        value = float(exact)
        return value if Fraction(value) >= exact else math.nextafter(value, math.inf)


@attr.s(frozen=True, slots=True, auto_attribs=True)
class BetweenThresholdsEvent(dp_accounting.DpEvent):
    """One BetweenThresholds query: ``epsilon``-DP (pure) for a count of sensitivity one, whose
    ``between`` outcome is a ``q``-target at level ``epsilon`` (charged by target-charging accountants)."""

    epsilon: float = attr.ib(converter=float, validator=_positive_real)
    q: float = attr.ib(converter=float, validator=_probability_open)
    relation: str = attr.ib(default=REPLACE_ONE, validator=_check_relation)


@attr.s(frozen=True, slots=True, auto_attribs=True)
class BoundaryWrapperEvent(dp_accounting.DpEvent):
    """A boundary-wrapped query (paper, "Privacy analysis considerations"): the wrapped mechanism's ``inner`` event, and the target ``T``
    is a ``q``-target at privacy level ``epsilon``.  The default charge is ``epsilon = 2 eps_A`` and
    ``q = min(1/3, (E + 1) / (2 E^2 + E + 2))`` with ``E = e^{eps_A}``: exactly 1/3 for ``eps_A <= 0.3119``
    (docs/mechanisms/boundary_wrapper.md)."""

    inner: dp_accounting.DpEvent = attr.ib()
    epsilon: float = attr.ib(converter=float, validator=_positive_real)
    q: float = attr.ib(converter=float, validator=_probability_open)

    @inner.validator
    def _check_inner(self, attribute, value):
        if not isinstance(value, dp_accounting.DpEvent):
            raise TypeError(f"inner must be a dp_accounting.DpEvent, got {type(value).__name__}")
