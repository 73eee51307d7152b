"""Bad input is refused up front, in one line that names it (issue 13, item 7; docs/ranges.md).

Every case of the bad-input sweep goes through the real entry point (``pate_accountant.cli.main``): exit status 2,
nothing on stdout, one error line on stderr naming the option (after argparse's usage block), no traceback, and
quickly (a deadline turns a hang into a failure).  The mechanisms, the planners, the auditor and the histograms
experiment are checked through their APIs too: ``ValueError`` naming the parameter, before any work.
"""

from __future__ import annotations

import contextlib
import math
import signal
import time

import numpy as np
import pytest

from mechanisms import (
    BetweenThresholds,
    BoundaryWrapper,
    CountHistogram,
    DPArgMax,
    DPWeightedSampling,
    ThresholdArgMax,
    TruncatedGeometricNoisyArgMax,
    audit,
    registry,
)
from mechanisms.base import reads_distributions
from mechanisms.geometric import MAX_ERROR_BOUND, TruncatedGeometric, k_star, truncation
from pate_accountant import planning
from pate_accountant.cli import main
from pate_accountant.events import EpsilonDeltaEvent
from pate_accountant.validation import (
    MAX_COUNT,
    MAX_STEP_EPSILON,
    MIN_DELTA,
    check_delta,
    check_epsilon,
)
from pate_app.experiments import histograms

#: A refusal must come at once; a regression that starts the work fails here instead of hanging the suite.
DEADLINE = 30.0


@contextlib.contextmanager
def deadline(seconds: float = DEADLINE):
    def expire(signum, frame):
        raise TimeoutError(f"no answer within {seconds} s: the input was not refused up front")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def refused(capsys, argv: list[str], option: str) -> str:
    """Run ``argv``; check exit 2, empty stdout, exactly one line besides argparse's usage block, naming
    ``option``, and no traceback.  Returns that line."""
    capsys.readouterr()
    started = time.perf_counter()
    with deadline():
        code = main(argv)
    elapsed = time.perf_counter() - started
    out, err = capsys.readouterr()
    assert code == 2, (code, err)
    assert out == ""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("usage:", " "))]
    assert len(lines) == 1, err
    line = lines[0]
    assert "error: " in line and f"argument {option}:" in line, line
    assert elapsed < DEADLINE
    return line


# -- the sweep's cases through the command line ------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "option", "needle"),
    [
        (["audit-mechanism", "dp-argmax", "--step-epsilon", "1000", "--runs", "1000"], "--step-epsilon", "(0, 15]"),
        (["audit-mechanism", "noisy-argmax", "--step-epsilon", "1000"], "--step-epsilon", "(0, 15]"),
        (["audit-mechanism", "dp-argmax", "--runs", str(10**13)], "--runs", "[1, 100000000]"),
        (["audit-mechanism", "dp-argmax", "--step-delta", "1e-320"], "--step-delta", "[1e-300, 1)"),
        (["audit-mechanism", "between-thresholds", "--step-epsilon", "1e-17"], "--step-epsilon", "2^53"),
        (["audit-mechanism", "dp-argmax", "--step-epsilon", "1e-4", "--step-delta", "1e-300"], "--step-epsilon", "noise truncation L"),
        (["plan", "hits", "--eps0", "1000"], "--eps0", "(0, 50]"),
        (["plan", "hits", "--eps0", "1e-300"], "--eps0", "planning limit"),
        (["plan", "hits", "--eps0", "0.0001"], "--eps0", "planning limit"),
        (["plan", "hits", "--eps0", "0.1", "--budget-epsilon", "1e300"], "--budget-epsilon", "(0, 300]"),
        (["plan", "hits", "--eps0", "0.01", "--budget-delta", "1e-310"], "--budget-delta", "[1e-300, 1)"),
        (["plan", "compare", "--queries", "100", "--target-rate", "0.1", "--teachers", "100", "--eps0", "0.1",
          "--individual-q", "1e-6"], "--individual-q", "[0.001, 1]"),
        (["plan", "yields", "--eps0", "1e-320"], "--eps0", "[1e-300, 50]"),
        (["plan", "yields", "--eps0", "0.01", "--teachers", "1e300"], "--teachers", "9007199254740992"),
        (["plan", "yields", "--eps0", "0.01", "--step-delta", "1e-320"], "--step-delta", "1e-300"),
        (["plan", "for-tokens", "--tokens", "1e18"], "--tokens", "largest plannable horizon"),
        (["plan", "for-tokens", "--tokens", "1" + "0" * 400], "--tokens", "largest plannable horizon"),
        (["plan", "for-tokens", "--tokens", "10", "--budget-epsilon", "1000"], "--budget-epsilon", "(0, 300]"),
        (["plan", "compare", "--queries", "1000000000000000", "--target-rate", "0.1", "--teachers", "100",
          "--eps0", "0.1"], "--queries", "[0, 10000000]"),
        (["plan", "compare", "--queries", "10000000", "--target-rate", "1", "--teachers", "100", "--eps0", "0.1"],
         "--queries", "private draws"),
        (["plan", "compare", "--queries", "100", "--target-rate", "1e-20", "--teachers", "100", "--eps0", "0.1"],
         "--target-rate", "1e-12"),
        (["plan", "compare", "--queries", "100", "--target-rate", "0.1", "--teachers", "100", "--eps0", "0.0001",
          "--budget-epsilon", "1"], "--eps0", "budget_epsilon = 1"),
        (["plan", "compare", "--queries", "100", "--target-rate", "0.1", "--teachers", str(10**20), "--eps0", "0.1"],
         "--teachers", "2^53"),
        (["plan", "margin", "--tokens", "1e300"], "--tokens", "2^53"),
        (["experiment", "histograms", "--no-progress", "--teachers", "100000000"], "--teachers", "[1, 50000]"),
        (["experiment", "histograms", "--no-progress", "--teachers", "50000"], "--teachers", "votes per ensemble"),
        (["experiment", "histograms", "--no-progress", "--samples", str(10**9)], "--samples", "[1, 100000]"),
    ],
)
def test_bad_input_is_one_line_naming_the_option(capsys, tmp_path, argv, option, needle):
    if argv[0] == "experiment":
        argv = [*argv, "--out", str(tmp_path / "out")]
    line = refused(capsys, argv, option)
    assert needle in line, line
    if argv[0] == "experiment":
        assert not (tmp_path / "out").exists()  # nothing written


def test_audit_notes_say_when_the_audit_cannot_tell(capsys):
    # Within the range but beyond what the pair or the runs can show: the output says so instead of a bare 0.
    with deadline():
        code = main(["audit-mechanism", "noisy-argmax", "--step-epsilon", "10", "--runs", "1000", "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "cannot show an epsilon above" in out and "the pair is not tight at this epsilon" in out
    with deadline():
        code = main(["audit-mechanism", "dp-argmax", "--runs", "20000", "--seed", "1"])
    assert code == 0 and "note" not in capsys.readouterr().out


def test_dp_argmax_audit_pair_grows_with_the_noise():
    # A small epsilon gives a wide noise (L = 853 at epsilon 0.01): the pair's n grows so the runner-up keeps a vote.
    case = audit.audit_case("dp-argmax", 0.01, 1e-6)
    assert case.histogram.num_teachers >= 2 * case.mechanism.error_bound + 4
    exact = audit.exact_pair_epsilon(case.mechanism, case.histogram, case.neighbour, case.claimed_delta)
    assert exact == pytest.approx(0.01, rel=0.05)


# -- mechanisms ----------------------------------------------------------------------------------------------
BUILDABLE = [name for name in registry.mechanism_names() if registry.mechanism_entry(name).build is not None]


@pytest.mark.parametrize("name", BUILDABLE)
@pytest.mark.parametrize("epsilon", [1e6, 1e308, 50.000001, math.inf, math.nan])
def test_every_buildable_mechanism_refuses_a_huge_epsilon(name, epsilon):
    with deadline(), pytest.raises(ValueError, match=r"^epsilon must (lie in \(0, 50\]|be finite)"):
        registry.build_mechanism(name, epsilon, 1e-6, num_teachers=50)


@pytest.mark.parametrize("name", BUILDABLE)
@pytest.mark.parametrize("delta", [1e-320, 5e-324, 0.0, 1.0, 1.5])
def test_every_buildable_mechanism_refuses_a_delta_out_of_range(name, delta):
    with deadline(), pytest.raises(ValueError, match=r"^delta must"):
        registry.build_mechanism(name, 1.0, delta, num_teachers=50)


@pytest.mark.parametrize("name", BUILDABLE)
def test_the_extremes_of_the_range_still_build_and_run(name):
    rng = np.random.default_rng(0)
    floor = registry.mechanism_entry(name).min_delta or MIN_DELTA  # a mechanism's own floor, where it has one
    with deadline():
        for epsilon, delta in ((MAX_STEP_EPSILON, floor), (MAX_STEP_EPSILON, 0.3), (1e-3, 1e-6)):
            mechanism = registry.build_mechanism(name, epsilon, delta, num_teachers=50)
            reads_one_count = name == "between-thresholds"  # a query on the count of a candidate token
            if reads_distributions(mechanism):  # teachers' and public log-probabilities
                release = mechanism(np.log(rng.dirichlet(np.ones(8), size=50)), np.log(np.full(8, 1 / 8)), rng=rng)
                assert release.value == "below" if release.outcome == "below" else 0 <= release.value < 8
            else:
                release = mechanism(_hist(), rng=rng, **({"token": 0} if reads_one_count else {}))
            assert release.event is not None


def test_a_mechanism_that_needs_the_teachers_says_so():
    """``gaussian-threshold-argmax`` sets its threshold from the run's configured teachers (a strict majority):
    built without them it is refused in one line; with them the threshold is floor(n/2) + 1."""
    with pytest.raises(ValueError, match=r"^mechanism 'gaussian-threshold-argmax' needs the number of teachers"):
        registry.build_mechanism("gaussian-threshold-argmax", 1.0, 1e-6)
    assert registry.build_mechanism("gaussian-threshold-argmax", 1.0, 1e-6, num_teachers=64).threshold == 33
    assert registry.build_mechanism("gaussian-threshold-argmax", 1.0, 1e-6, num_teachers=65).threshold == 33
    with pytest.raises(ValueError, match=r"^num_teachers must be a positive integer, got 0$"):
        registry.build_mechanism("gaussian-threshold-argmax", 1.0, 1e-6, num_teachers=0)


def test_a_step_delta_below_a_mechanisms_own_floor_is_refused_in_one_line():
    from mechanisms.gaussian import MIN_GAUSSIAN_DELTA

    assert registry.mechanism_entry("gaussian-argmax").min_delta == MIN_GAUSSIAN_DELTA
    with deadline(), pytest.raises(ValueError, match=r"^delta must be at least 1e-14 for a GNMax step .*got 1e-30$"):
        registry.build_mechanism("gaussian-argmax", 1.0, 1e-30)


def _hist():
    return CountHistogram([0, 1], [40, 3], num_teachers=50, vocab_size=8)  # GNMax noises the whole vocabulary


@pytest.mark.parametrize("epsilon", [1e6, 1e308])
def test_direct_constructors_refuse_huge_epsilons(epsilon):
    for build in (
        lambda: DPArgMax(epsilon, 1e-6),
        lambda: DPArgMax(epsilon, 1e-6, relation="add-remove-one"),
        lambda: TruncatedGeometricNoisyArgMax(epsilon, 1e-6),
        lambda: DPWeightedSampling(epsilon, 1e-6),
        lambda: DPWeightedSampling(epsilon, 1e-6, release_counts=True),
        lambda: BetweenThresholds(epsilon, 0, 10),
        lambda: TruncatedGeometric(epsilon, 3),
        lambda: k_star(epsilon, 1e-6),
        lambda: truncation(epsilon, 1e-6),
    ):
        with deadline(), pytest.raises(ValueError, match=r"^epsilon must lie in \(0, 50\], got 1e\+(06|308)"):
            build()


def test_tiny_epsilon_with_tiny_delta_is_refused_before_any_table():
    # L = truncation(1e-4, 1e-300) is 6.8 million: a table of 13.6 million entries and a 25 s law, refused at once.
    with deadline(5.0):
        for build in (lambda: DPArgMax(1e-4, 1e-300), lambda: TruncatedGeometricNoisyArgMax(1e-4, 1e-300),
                      lambda: DPWeightedSampling(1e-4, 1e-300, release_counts=True)):
            with pytest.raises(ValueError, match=r"^epsilon = 0\.0001 with delta = 1e-300 gives the noise truncation L"):
                build()
        with pytest.raises(ValueError, match=r"^k must be <= 1000000"):
            TruncatedGeometric(1.0, MAX_ERROR_BOUND + 1)
    # ... while the same budget without sanitised counts needs no noise table and is fine.
    assert DPWeightedSampling(1e-4, 1e-300).epsilon == 1e-4
    assert DPArgMax(1e-6, 1e-6).error_bound <= MAX_ERROR_BOUND  # tiny epsilon: L is about 1/(2 delta)


def test_thresholds_tokens_and_counts_are_bounded():
    with pytest.raises(ValueError, match=r"^low must be >= -9007199254740992"):
        BetweenThresholds(1.0, -(2**60), 10)
    with pytest.raises(ValueError, match=r"^high must be <= 9007199254740992"):
        BetweenThresholds(1.0, 0, 2**60)
    with pytest.raises(ValueError, match="too small for epsilon"):  # 1e-17 needs a gap above 2^53
        BetweenThresholds(1e-17, 0, MAX_COUNT)
    query = BetweenThresholds(0.5, 0, MAX_COUNT)
    assert 0 < query.q < 1
    with pytest.raises(ValueError, match=r"^token must be <= "):
        query.on_token(2**63)
    with pytest.raises(ValueError, match=r"^count must be <= "):
        query.outcome_probabilities(2**64)
    with pytest.raises(ValueError, match=r"^threshold must be <= 9007199254740992"):
        ThresholdArgMax(2**60)


def test_boundary_wrapper_refuses_an_inner_epsilon_above_the_range():
    class Loud:
        event = EpsilonDeltaEvent(1000.0, 0.0)

        def output_distribution(self, histogram, **kwargs):
            raise AssertionError("never reached")

    with pytest.raises(ValueError, match=r"^inner\.event\.epsilon must lie in \(0, 50\]"):
        BoundaryWrapper(Loud())
    assert BoundaryWrapper(DPArgMax(MAX_STEP_EPSILON, 1e-6)).q > 0


def test_private_run_refuses_the_step_epsilon_before_any_model_is_loaded(tmp_path):
    from pate_app.run import RunInputError, build_mechanism, private_run
    from pate_app.spec import RunSpec

    with pytest.raises(RunInputError, match=r"^mechanism dp-argmax: epsilon must lie in \(0, 50\], got 1000") as caught:
        build_mechanism("dp-argmax", 1000, 1e-6)
    assert "\n" not in str(caught.value)
    # A model path that does not exist is only looked at after the mechanism: the epsilon is what is reported.
    records = [{"instruction": f"q{i}", "context": "", "response": f"a{i}", "category": "open_qa"} for i in range(4)]
    with deadline(), pytest.raises(RunInputError, match="epsilon must lie in"):
        private_run(RunSpec(data="records", model=str(tmp_path / "no-such-model"), teachers=2,
                            ledger=str(tmp_path / "ledger.sqlite"), step_epsilon=1000.0, budget_epsilon=100.0,
                            budget_delta=1e-5), records=records)
    assert not (tmp_path / "ledger.sqlite").exists()


def test_shared_checks_name_the_range():
    with pytest.raises(ValueError, match=r"^eps must lie in \(0, 50\], got 51 \("):
        check_epsilon("eps", 51)
    with pytest.raises(ValueError, match=r"^eps must be > 0\.0, got 0\.0"):
        check_epsilon("eps", 0)
    with pytest.raises(ValueError, match=r"^d must lie in \[1e-300, 1\), got 1e-301"):
        check_delta("d", 1e-301)
    assert check_delta("d", MIN_DELTA) == MIN_DELTA and check_epsilon("eps", MAX_STEP_EPSILON) == MAX_STEP_EPSILON


# -- the auditor ---------------------------------------------------------------------------------------------
def test_auditor_limits():
    with deadline(5.0):
        with pytest.raises(ValueError, match=r"^epsilon must lie in \(0, 15\]"):
            audit.audit_case("noisy-argmax", 1000.0, None)
        with pytest.raises(ValueError, match=r"^num_runs must be <= 100000000"):
            audit.audit_pair(DPArgMax(1.0, 1e-6), _hist(), _hist(), 10**13, np.random.default_rng(0))
        with pytest.raises(ValueError, match=r"^epsilon must be <= 700"):
            audit.hockey_stick({0: 1.0}, {0: 1.0}, 1000.0)
        with pytest.raises(ValueError, match=r"^max_teachers = 100 over vocab_size = 10 gives"):
            audit.small_histograms(100, 10)
    assert audit.largest_showable_epsilon(audit.MAX_AUDIT_RUNS) > audit.MAX_AUDIT_EPSILON
    # a broken variant of a case at the top of the range runs at most at the mechanisms' own limit
    case = audit.audit_case("between-thresholds", audit.MAX_AUDIT_EPSILON, None, noise_scale=1e-9)
    assert case.mechanism.query.epsilon == MAX_STEP_EPSILON


# -- planning through the API ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: planning.target_hits(1.0, 1e-6, 1000.0), r"^eps0 must lie in \(0, 50\]"),
        (lambda: planning.target_hits(1.0, 1e-6, 1e-300), r"^eps0 = 1e-300 with epsilon = 1 .* planning limit"),
        (lambda: planning.target_hits(1e300, 1e-6, 0.1), r"^epsilon must lie in \(0, 300\]"),
        (lambda: planning.target_hits(1.0, 1e-320, 0.1), r"^delta must lie in \[1e-300, 1\)"),
        (lambda: planning.target_hits(1.0, 1e-6, 0.01, q=1e-9), r"^q must lie in \[0\.001, 1\]"),
        (lambda: planning.yields(1.0, 1e-6, 0.01, num_teachers=1e300), r"^num_teachers must be <= "),
        (lambda: planning.plain_max_queries(1e-5, 1.0, 1e-6), r"^eps0 = 1e-05 with epsilon = 1 .* planning limit"),
        (lambda: planning.plain_epsilon(10**15, 0.1, 1e-6), r"^num_queries must lie in \[0, 10000000\]"),
        (lambda: planning.plan_for_tokens(10**18, 1.0, 1e-6), r"^tokens = 1e\+18 needs .* largest plannable horizon"),
        (lambda: planning.plan_for_tokens(10**500, 1.0, 1e-6), r"^tokens = about 1e500 needs"),
        (lambda: planning.compare_accounting(10**15, 0.1, 1e-6, 100, 0.1), r"^num_queries must lie in"),
        (lambda: planning.compare_accounting(10**7, 0.1, 1e-6, 100, 1.0), r"^num_queries = 10000000 .* private draws"),
        (lambda: planning.compare_accounting(100, 0.1, 1e-6, 100, 1e-300), r"^target_rate must be 0 or lie in"),
        (lambda: planning.compare_accounting(100, 1e-5, 1e-6, 100, 0.1, budget_epsilon=1.0),
         r"^eps0 = 1e-05 with budget_epsilon = 1 "),
        (lambda: planning.compare_accounting(100, 0.1, 1e-6, 100, 0.1, budget_epsilon=1e9),
         r"^budget_epsilon must lie in \(0, 300\]"),
        (lambda: planning.bassily_tt_teachers(0.4, 1.0, 1e-6, 10**400), r"^tokens must lie in \[1, 9007199254740992\]"),
        (lambda: planning.bassily_tt_tokens(0.4, 1.0, 1e-6, 1e300), r"^num_teachers must be <= "),
        (lambda: planning.teachers_for(5e-324), r"^eps0 must lie in \[1e-300, 50\]"),
        (lambda: planning.c_delta(1e-320), r"^delta0 must lie in \[1e-300, 1\)"),
    ],
)
def test_planning_refuses_out_of_range_values_at_once(call, needle):
    with deadline(5.0), pytest.raises(ValueError, match=needle):
        call()


def test_planning_still_answers_at_the_edges_of_its_ranges():
    with deadline():
        assert planning.target_hits(planning.MAX_BUDGET_EPSILON, MIN_DELTA, planning.MAX_EPS0).hits == 0
        # for-tokens tries eps0 up to twice the budget: e^600 must not overflow
        plan = planning.plan_for_tokens(1, planning.MAX_BUDGET_EPSILON, 1e-6)
        assert plan.hits >= plan.hits_needed and plan.epsilon_spent <= planning.MAX_BUDGET_EPSILON
        assert planning.compare_accounting(planning.MAX_PLAN_QUERIES, 0.1, 1e-6, 100, 0.0).plain["best"] > 0
        assert planning.max_plannable_tokens() == 1381551
        assert planning.plan_for_tokens(1000, 1.0, 1e-6).hits_needed == 73


@pytest.mark.parametrize(("epsilon", "delta", "eps0"), [(1.0, 1e-6, 0.01), (10.0, 1e-6, 0.01), (100.0, 1e-6, 0.1),
                                                         (1.0, 1e-300, 0.01), (1.0, 0.5, 0.01)])
def test_the_step_estimate_is_close_to_the_exact_count(epsilon, delta, eps0):
    # The search guard's estimate (a refusal only) is within 10% of the exact plain query limit for small eps0.
    exact = planning.plain_max_queries(eps0, epsilon, delta)
    assert planning.estimated_steps(epsilon, delta, eps0) == pytest.approx(exact, rel=0.1)


# -- the histograms experiment ----------------------------------------------------------------------------------
def test_histograms_experiment_refuses_sizes_before_any_work():
    with deadline(5.0):
        with pytest.raises(ValueError, match=r"^num_teachers must be <= 50000"):
            histograms.histograms_experiment(10**8, 10, 20, 0, progress=False)
        with pytest.raises(ValueError, match=r"^num_teachers x num_samples = 30000 x 1001 ="):
            histograms.histograms_experiment(30_000, 1001, 20, 0, progress=False)
        with pytest.raises(ValueError, match=r"^argument --samples: must be an integer in \[1, 100000\]"):
            histograms.run(samples=10**6, progress=False)


# -- composition and TCT at astronomically many private draws ---------------------------------------------------
def test_optimal_composition_beyond_the_exact_law_is_an_upper_bound():
    """Past MAX_EXACT_STEPS the optimal epsilon is not computed from the k + 1 weights (memory) but bounded by the
    smaller of DRV and basic composition: never below the exact value, which grows with k."""
    from pate_accountant.composition import (
        MAX_EXACT_STEPS,
        drv_epsilon,
        optimal_epsilon,
    )

    with deadline(30.0):
        exact = optimal_epsilon(MAX_EXACT_STEPS, 1e-4, 0.0, 1e-6, cache=False)
        beyond = optimal_epsilon(MAX_EXACT_STEPS + 1, 1e-4, 0.0, 1e-6)
    assert exact < beyond == min(drv_epsilon(MAX_EXACT_STEPS + 1, 1e-4, 1e-6), (MAX_EXACT_STEPS + 1) * 1e-4)


@pytest.mark.parametrize("step_epsilon", [10.0, 20.0, 50.0])
def test_target_charging_of_a_wrapper_at_a_large_epsilon_refuses_at_once(step_epsilon):
    """A boundary wrapper at a large epsilon has q near e^(-2 eps): one target hit needs billions of private draws
    (at 50, more than 2^53). The accountant answers at once that it cannot pay, instead of building a law of
    billions of weights (a MemoryError before)."""
    from mechanisms import BoundaryWrapper, DPArgMax
    from pate_accountant.accountants import TargetChargingAccountant
    from pate_accountant.tct import MAX_PRIVATE_DRAWS, private_draws_needed, tct_epsilon

    with deadline(20.0):
        accountant = TargetChargingAccountant(budget=(150.0, 1e-4))
        assert not accountant.can_afford(BoundaryWrapper(DPArgMax(step_epsilon, 1e-6)).event)
        assert accountant.spent() == (0.0, 0.0)
    assert private_draws_needed(1, 1e-22, 1e-6) == MAX_PRIVATE_DRAWS + 1
    assert tct_epsilon(1, 1e-22, 0.1, 1e-6) == math.inf
