"""Framework 2 (ensembles.generation.PrivateGenerator) on the toy backend: accounting, fallbacks,
individual charging, determinism and that no prompt text leaks into results or ledgers."""

import numpy as np
import pytest

from ensembles.backends import ToyBackend
from ensembles.generation import GenerationResult, PrivateGenerator
from ensembles.keyed_votes import StepKey
from mechanisms import BetweenThresholds, BoundaryWrapper, DPArgMax
from pate_accountant.accountants import (
    BasicCompositionAccountant,
    IndividualChargingAccountant,
    TargetChargingAccountant,
)
from pate_accountant.ledger import Ledger

VOCAB = ["<unk>", "<eos>", "the", "cat", "sat", "on", "mat", "dog", "ran", "."]
W = {w: i for i, w in enumerate(VOCAB)}
# A word chain: the -> cat -> sat -> on -> the ...
CHAIN = {W["the"]: W["cat"], W["cat"]: W["sat"], W["sat"]: W["on"], W["on"]: W["the"], W["<unk>"]: W["the"]}
SECRET = "ZEBRAPASSWORD"
PROMPTS = [f"{SECRET} {i} the" for i in range(8)]


#: Tests seed the mechanism noise (mechanism_rng) so that their outcomes are reproducible; a private run
#: leaves it None (the OS generator), which test_mechanism_noise_never_comes_from_the_sampling_seed checks.
MECHANISM_SEED = 20261123

def agreeing(top=0.97):
    def f(teacher, context):
        p = np.full(len(VOCAB), (1 - top) / (len(VOCAB) - 1))
        p[CHAIN.get(context[-1] if context else 0, W["the"])] = top
        return p
    return f


def disagreeing(teacher, context):
    """Each teacher is sure of its own word: no majority, so DPArgMax fails."""
    p = np.zeros(len(VOCAB))
    p[2 + teacher % 8] = 1.0
    return p


def prompts(n):
    return [f"{SECRET} {i} the" for i in range(n)]


def test_basic_composition_runs_until_budget():
    mech = DPArgMax(1.0, 1e-5)
    acc = BasicCompositionAccountant(budget=(5.0, 1e-3), ledger=Ledger.in_memory())
    gen = PrivateGenerator(ToyBackend(agreeing(), VOCAB), mech, acc, max_tokens=100, seed=1)
    result = gen.generate(prompts(60), mechanism_rng=np.random.default_rng(MECHANISM_SEED))
    assert isinstance(result, GenerationResult)
    assert result.stop_reason == "budget"
    assert len(result.steps) == 5  # five runs of epsilon 1 fit into epsilon 5
    assert result.spent[0] <= 5.0 + 1e-9 and result.spent[1] <= 1e-3
    assert result.text == "cat sat on the cat"
    assert acc.ledger.verify().ok
    assert acc.ledger.row_count == len(result.steps)


def test_target_charging_with_boundary_wrapper_and_ledger(tmp_path):
    mech = BoundaryWrapper(DPArgMax(0.05, 1e-9))  # error bound L = 682
    path = tmp_path / "run.ledger"
    ledger = Ledger.open(path)
    acc = TargetChargingAccountant(budget=(4.0, 1e-4), ledger=ledger)
    gen = PrivateGenerator(ToyBackend(agreeing(0.99), VOCAB), mech, acc, max_tokens=12, seed=3)
    result = gen.generate(prompts(4000), shared_prefix=f"{SECRET} header", mechanism_rng=np.random.default_rng(MECHANISM_SEED))
    assert result.stop_reason in ("max_tokens", "budget")
    assert result.spent[0] <= 4.0 + 1e-9 and result.spent[1] <= 1e-4
    assert ledger.verify().ok
    assert ledger.row_count == len(result.steps)
    # outcome classes in the result match the ledger's
    assert sum(s.outcome == "target" for s in result.steps) == acc.hits
    ledger.close()
    data = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert SECRET.encode() not in data
    assert SECRET not in repr(result)


def test_target_counts_as_fail_and_is_retried():
    mech = BoundaryWrapper(DPArgMax(0.05, 1e-9))
    acc = TargetChargingAccountant(budget=(4.0, 1e-4))

    # top count two below the release threshold n/2 + L (L read from the mechanism): fails and targets are likely
    top = 2000 + mech.inner.error_bound - 2
    table = np.zeros((4000, len(VOCAB)))
    table[:top, W["cat"]] = 1.0
    table[top:, W["dog"]] = 1.0
    gen = PrivateGenerator(ToyBackend(table, VOCAB), mech, acc, max_tokens=3, max_retries=5, seed=0)
    result = gen.generate(prompts(4000), mechanism_rng=np.random.default_rng(MECHANISM_SEED))
    outcomes = {s.outcome for s in result.steps}
    assert "target" in outcomes or "fail" in outcomes
    for s in result.steps:
        if s.outcome in ("target", "fail"):
            assert s.token is None
    assert result.spent[0] <= 4.0 + 1e-9


def test_equal_seeds_equal_text_and_different_seeds_run():
    def run(seed):
        acc = BasicCompositionAccountant()
        gen = PrivateGenerator(ToyBackend(agreeing(0.6), VOCAB), DPArgMax(2.0, 1e-4), acc, max_tokens=10,
                               fallback="public", public_backend=ToyBackend(agreeing(0.5), VOCAB))
        return gen.generate(prompts(80), seed=seed, mechanism_rng=np.random.default_rng(seed))

    a, b = run(11), run(11)
    assert a.text == b.text and a.token_ids == b.token_ids and a.steps == b.steps
    run(12)  # a different seed runs too


class _RngSpy:
    """Wraps a mechanism and records the ``rng`` each call received."""

    def __init__(self, inner):
        self.inner, self.event, self.seen = inner, inner.event, []

    def __call__(self, histogram, rng=None, **kwargs):
        self.seen.append(rng)
        return self.inner(histogram, rng=rng, **kwargs)


def test_mechanism_noise_never_comes_from_the_sampling_seed():
    """A seed fixes the teachers' sampling; the mechanism's noise comes from the OS generator (rng=None)
    unless a mechanism_rng is given explicitly (tests and simulations)."""
    spy = _RngSpy(DPArgMax(2.0, 1e-4))
    gen = PrivateGenerator(ToyBackend(agreeing(0.9), VOCAB), spy, BasicCompositionAccountant(), max_tokens=4,
                           fallback="public", public_backend=ToyBackend(agreeing(0.5), VOCAB), seed=3)
    gen.generate(prompts(40), seed=5)
    assert spy.seen and all(rng is None for rng in spy.seen)
    mine = np.random.default_rng(0)
    spy.seen.clear()
    gen.generate(prompts(40), seed=5, mechanism_rng=mine)
    assert spy.seen and all(rng is mine for rng in spy.seen)
    with pytest.raises(TypeError, match="mechanism_rng"):
        gen.generate(prompts(40), mechanism_rng=7)


def test_fallback_public_when_teachers_disagree():
    acc = BasicCompositionAccountant()
    public = ToyBackend(agreeing(1.0), VOCAB)
    gen = PrivateGenerator(ToyBackend(disagreeing, VOCAB), DPArgMax(1.0, 1e-5), acc, fallback="public",
                           public_backend=public, public_prompt="the", max_tokens=4, seed=0)
    result = gen.generate(prompts(64), mechanism_rng=np.random.default_rng(MECHANISM_SEED))
    assert [s.outcome for s in result.steps] == ["fallback"] * 4
    assert result.text == "cat sat on the"  # the public model's chain after "the"
    assert acc.spent()[0] == pytest.approx(4.0)  # each private attempt is charged; the fallback is free
    assert result.stop_reason == "max_tokens"


def test_fallback_retry_and_stop_when_teachers_disagree():
    acc = BasicCompositionAccountant()
    gen = PrivateGenerator(ToyBackend(disagreeing, VOCAB), DPArgMax(1.0, 1e-5), acc, fallback="retry",
                           max_retries=3, seed=0)
    result = gen.generate(prompts(64), mechanism_rng=np.random.default_rng(MECHANISM_SEED))
    assert result.stop_reason == "fail"
    assert [s.retries for s in result.steps] == [0, 1, 2, 3]
    assert all(s.outcome == "fail" for s in result.steps)
    assert acc.spent()[0] == pytest.approx(4.0)  # every retry is a charged run

    acc = BasicCompositionAccountant()
    gen = PrivateGenerator(ToyBackend(disagreeing, VOCAB), DPArgMax(1.0, 1e-5), acc, fallback="stop", seed=0)
    result = gen.generate(prompts(64), mechanism_rng=np.random.default_rng(MECHANISM_SEED))
    assert result.stop_reason == "fail" and len(result.steps) == 1 and result.text == ""


def test_eos_and_stop_strings():
    def to_eos(teacher, context):
        p = np.zeros(len(VOCAB))
        p[W["dog"] if len(context) < 5 else W["<eos>"]] = 1.0  # the prompt has 3 tokens
        return p

    gen = PrivateGenerator(ToyBackend(to_eos, VOCAB), DPArgMax(1.0, 1e-5), BasicCompositionAccountant(), seed=0)
    result = gen.generate(prompts(64), mechanism_rng=np.random.default_rng(MECHANISM_SEED))
    assert result.stop_reason == "eos" and result.text == "dog dog" and W["<eos>"] not in result.token_ids

    gen = PrivateGenerator(ToyBackend(agreeing(1.0), VOCAB), DPArgMax(1.0, 1e-5), BasicCompositionAccountant(),
                           stop_strings=("on",), seed=0)
    result = gen.generate(prompts(64), mechanism_rng=np.random.default_rng(MECHANISM_SEED))
    assert result.stop_reason == "stop_string" and result.text == "cat sat "


def test_temperature_and_top_p_and_independent_histograms():
    acc = BasicCompositionAccountant()
    gen = PrivateGenerator(ToyBackend(agreeing(0.7), VOCAB), DPArgMax(1.0, 1e-5), acc, histograms="independent",
                           temperature=0.5, top_p=0.9, max_tokens=4, seed=0)
    result = gen.generate(prompts(100), mechanism_rng=np.random.default_rng(MECHANISM_SEED))
    assert result.text == "cat sat on the"


def test_individual_charging_removes_teachers():
    bt = BetweenThresholds(0.2, 5, 15)
    acc = IndividualChargingAccountant(40, per_teacher_limit=2, epsilon0=0.2, q=bt.q)

    def small_vocab(teacher, context):  # two-word vocabulary use, so the random candidate often hits
        p = np.zeros(len(VOCAB))
        p[W["cat"]] = 1.0
        return p

    # The public model proposes "cat", the teachers' word, so hits (and removals) come on most positions.
    gen = PrivateGenerator(ToyBackend(small_vocab, VOCAB), bt, acc, max_tokens=40, fallback="retry",
                           max_retries=30, public_backend=ToyBackend(small_vocab, VOCAB), seed=5)
    result = gen.generate(prompts(40), mechanism_rng=np.random.default_rng(MECHANISM_SEED))
    sizes = [s.num_teachers for s in result.steps]
    assert sizes[0] == 40
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[-1] < 40 and result.num_active_teachers < 40
    assert set(acc.removed_teachers)  # someone was removed
    assert result.num_active_teachers == acc.num_active
    hits = [s for s in result.steps if s.target_hit]
    assert hits and all(s.token == W["cat"] for s in hits if s.counted)  # only "cat" voters are counted


def test_individual_charging_needs_between_thresholds():
    acc = IndividualChargingAccountant(4)
    with pytest.raises(ValueError, match="BetweenThresholds"):
        PrivateGenerator(ToyBackend(agreeing(), VOCAB), DPArgMax(1.0, 1e-5), acc)


def test_budget_exhausted_before_first_step():
    acc = BasicCompositionAccountant(budget=(0.5, 1e-3))
    gen = PrivateGenerator(ToyBackend(agreeing(), VOCAB), DPArgMax(1.0, 1e-5), acc, seed=0)
    result = gen.generate(prompts(60), mechanism_rng=np.random.default_rng(MECHANISM_SEED))
    assert result.stop_reason == "budget" and result.steps == () and result.spent == (0.0, 0.0)


def test_constructor_validation():
    backend = ToyBackend(agreeing(), VOCAB)
    with pytest.raises(ValueError, match="public_backend"):
        PrivateGenerator(backend, DPArgMax(1.0, 1e-5), BasicCompositionAccountant(), fallback="public")
    with pytest.raises(ValueError, match="histograms"):
        PrivateGenerator(backend, DPArgMax(1.0, 1e-5), BasicCompositionAccountant(), histograms="hot")
    with pytest.raises(TypeError):
        PrivateGenerator(object(), DPArgMax(1.0, 1e-5), BasicCompositionAccountant())


def test_individual_charging_candidate_from_public_backend():
    """With a public backend, the BetweenThresholds candidate is a public-model sample: when the public model
    agrees with the teachers, the candidate is the teachers' token and steps release it; uniform candidates
    over the 10-word vocabulary hit only about 1 time in 10."""
    def make(candidate):
        bt = BetweenThresholds(0.5, 3, 8)
        acc = IndividualChargingAccountant(60, per_teacher_limit=1000, epsilon0=0.5, q=bt.q)
        public = ToyBackend(agreeing(1.0), VOCAB)
        return PrivateGenerator(ToyBackend(agreeing(1.0), VOCAB), bt, acc, max_tokens=20, fallback="public",
                                public_backend=public, candidate=candidate, seed=3)

    public_run = make(None).generate(prompts(60), mechanism_rng=np.random.default_rng(MECHANISM_SEED))  # default with a public backend: "public"
    uniform_run = make("uniform").generate(prompts(60), mechanism_rng=np.random.default_rng(MECHANISM_SEED))
    released_public = public_run.outcome_counts().get("token", 0)
    released_uniform = uniform_run.outcome_counts().get("token", 0)
    # Public candidate = the chain word every teacher votes for; the count of included voters is
    # nu * 60 with nu ~ U[1/60, 1], below the lower threshold 3 only when nu < about 0.05 (and noise):
    # expect about 19 of 20 releases.  Uniform: each release needs the candidate to be the chain word
    # (probability 1/10), so releases ~ Binomial(20, <= 0.1), mean <= 2, P[>= 8] < 1e-3.
    assert released_public >= 15
    assert released_uniform < 8
    assert public_run.text.startswith("the cat sat on the")  # released and fallback tokens follow the chain


def test_public_candidate_needs_a_public_backend():
    bt = BetweenThresholds(0.5, 3, 8)
    acc = IndividualChargingAccountant(10, per_teacher_limit=10, epsilon0=0.5, q=bt.q)
    with pytest.raises(ValueError, match="candidate"):
        PrivateGenerator(ToyBackend(agreeing(), VOCAB), bt, acc, candidate="public")
    with pytest.raises(ValueError, match="candidate"):
        PrivateGenerator(ToyBackend(agreeing(), VOCAB), bt, acc, candidate="model")


def test_individual_charging_rate_uses_the_fixed_ensemble_size(monkeypatch):
    """nu ~ U[1/n, 1] with n the ensemble size at the start, also after teachers were removed."""
    import ensembles.generation as generation

    calls = []
    draws = generation.individual_charging_draws

    def recording(rng, num_teachers, active):
        nu, included = draws(rng, num_teachers, active)
        calls.append((num_teachers, len(active), nu, included.size))
        return nu, included

    monkeypatch.setattr(generation, "individual_charging_draws", recording)
    bt = BetweenThresholds(0.2, 5, 15)
    acc = IndividualChargingAccountant(40, per_teacher_limit=2, epsilon0=0.2, q=bt.q)

    def cat(teacher, context):
        p = np.zeros(len(VOCAB))
        p[W["cat"]] = 1.0
        return p

    gen = PrivateGenerator(ToyBackend(cat, VOCAB), bt, acc, max_tokens=40, fallback="retry", max_retries=30,
                           public_backend=ToyBackend(cat, VOCAB), seed=10)
    gen.generate(prompts(40), mechanism_rng=np.random.default_rng(MECHANISM_SEED))
    assert calls and all(n == 40 for n, _, _, _ in calls)
    assert any(active < 40 for _, active, _, _ in calls)  # some queries ran after removals
    assert all(1 / 40 <= nu <= 1 for _, _, nu, _ in calls)
    assert all(size == active for _, active, _, size in calls)  # removed teachers are never counted


def test_individual_charging_draws_do_not_depend_on_removal():
    """For every random stream, removing teacher i changes neither nu nor any other teacher's inclusion, so
    the law of (nu, included set minus {i}) is the same with and without i (and i is never included)."""
    from ensembles.generation import individual_charging_draws

    n = 7
    everyone = np.arange(n)
    for seed in range(200):
        nu, included = individual_charging_draws(np.random.default_rng(seed), n, everyone)
        for i in range(n):
            others = np.delete(everyone, i)
            nu_without, included_without = individual_charging_draws(np.random.default_rng(seed), n, others)
            assert nu_without == nu
            assert np.array_equal(included_without, np.delete(included, i))
        assert 1 / n <= nu < 1
    with pytest.raises(ValueError, match="active teachers"):
        individual_charging_draws(np.random.default_rng(0), 3, np.array([0, 3]))


def test_individual_charging_non_hits_name_nobody():
    bt = BetweenThresholds(0.5, 3, 8)
    acc = IndividualChargingAccountant(60, per_teacher_limit=1000, epsilon0=0.5, q=bt.q)
    recorded = []
    original = acc.record
    acc.record = lambda release: (original(release), recorded.append(release))
    gen = PrivateGenerator(ToyBackend(agreeing(0.7), VOCAB), bt, acc, max_tokens=30, fallback="public",
                           public_backend=ToyBackend(agreeing(1.0), VOCAB), seed=2)
    result = gen.generate(prompts(60), mechanism_rng=np.random.default_rng(MECHANISM_SEED))
    assert {r.target_hit for r in recorded} == {True, False}
    for release, step in zip(recorded, result.steps):
        if release.target_hit:
            assert len(release.charged_teachers) == step.counted
        else:
            assert release.charged_teachers == frozenset()
    assert acc.charges == sum(len(r.charged_teachers) for r in recorded)


def test_between_thresholds_out_of_reach_refused_before_any_charge():
    bt = BetweenThresholds(0.5, 12, 20)
    ledger = Ledger.in_memory()
    acc = IndividualChargingAccountant(10, per_teacher_limit=5, epsilon0=0.5, q=bt.q, ledger=ledger)
    gen = PrivateGenerator(ToyBackend(agreeing(), VOCAB), bt, acc, max_tokens=5, seed=0)
    with pytest.raises(ValueError, match=r"low=12 is out of reach of n=10 teachers") as caught:
        gen.generate(prompts(10))
    assert "\n" not in str(caught.value)
    assert acc.queries == 0 and ledger.row_count == 0


# -- one generation step: schemes, on_token, honest outcomes ------------------------------------------------


def test_each_scheme_is_its_own_step_strategy():
    from ensembles.generation import HistogramAggregation, IndividualChargingAggregation

    plain = PrivateGenerator(ToyBackend(agreeing(), VOCAB), DPArgMax(1.0, 1e-5), BasicCompositionAccountant(),
                             histograms="independent")
    assert isinstance(plain.scheme, HistogramAggregation)
    bt = BetweenThresholds(0.5, 3, 8)
    individual = PrivateGenerator(ToyBackend(agreeing(), VOCAB), bt,
                                  IndividualChargingAccountant(10, per_teacher_limit=10, epsilon0=0.5, q=bt.q))
    assert isinstance(individual.scheme, IndividualChargingAggregation)
    # BetweenThresholds under a plain accountant is the same scheme, without removals.
    assert isinstance(PrivateGenerator(ToyBackend(agreeing(), VOCAB), bt, BasicCompositionAccountant()).scheme,
                      IndividualChargingAggregation)


class _KeyLog(ToyBackend):
    """A ToyBackend that records what every ``votes`` call asked for."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def votes(self, key, **options):
        self.calls.append((key, options))
        return super().votes(key, **options)


@pytest.mark.parametrize("histograms,num_teachers", [("coordinated", 20), ("independent", 60)])
def test_votes_come_from_the_backend_on_one_key_per_charged_run(histograms, num_teachers):
    """Every charged run asks the backend for votes once, on the key (run key, token position, retry), with the
    generator's temperature, top-p and histogram law; the run key is the sampling rng's first draw."""
    backend = _KeyLog(agreeing(0.5), VOCAB)
    gen = PrivateGenerator(backend, DPArgMax(1.0, 1e-5), BasicCompositionAccountant(), max_tokens=4,
                           max_retries=3, temperature=0.8, top_p=0.9, histograms=histograms)
    result = gen.generate(prompts(num_teachers), seed=11, mechanism_rng=np.random.default_rng(MECHANISM_SEED))
    keys = [key for key, _ in backend.calls]
    assert len(keys) == result.num_charged_runs
    assert any(r.retries for r in result.steps) and result.token_ids  # retries and released tokens both occur
    run_key = int(np.random.default_rng(11).integers(0, 2**63 - 1, dtype=np.int64))
    expected = []
    position = 0
    for record in result.steps:
        expected.append(StepKey(run_key, position, record.retries))
        if record.token is not None:
            position += 1
    assert keys == expected
    assert all(opts == {"temperature": 0.8, "top_p": 0.9, "histograms": histograms} for _, opts in backend.calls)


def test_a_backend_that_transforms_its_own_distributions_is_refused():
    """Temperature and top-p are applied once: a backend that applies its own as well is refused."""

    class Hot(ToyBackend):
        temperature, top_p = 0.7, None

    with pytest.raises(ValueError, match="backend applies temperature=0.7"):
        PrivateGenerator(Hot(agreeing(), VOCAB), DPArgMax(1.0, 1e-5), BasicCompositionAccountant())
    with pytest.raises(ValueError, match="public_backend applies"):
        PrivateGenerator(ToyBackend(agreeing(), VOCAB), DPArgMax(1.0, 1e-5), BasicCompositionAccountant(),
                         public_backend=Hot(agreeing(), VOCAB))


def test_on_token_sees_every_appended_token_and_nothing_else():
    seen = []
    gen = PrivateGenerator(ToyBackend(agreeing(), VOCAB), DPArgMax(1.0, 1e-5), BasicCompositionAccountant(),
                           max_tokens=6, fallback="public", public_backend=ToyBackend(agreeing(), VOCAB), seed=2)
    result = gen.generate(prompts(60), mechanism_rng=np.random.default_rng(MECHANISM_SEED), on_token=seen.append)
    assert seen == list(result.token_ids) and len(seen) == 6
    with pytest.raises(TypeError, match="on_token"):
        gen.generate(prompts(60), on_token="progress")


def test_a_between_thresholds_below_is_recorded_as_below_not_as_a_token():
    """BetweenThresholds answers ``below`` when the candidate's count is under its lower threshold: nothing is
    released, and neither the step record nor the ledger may call that a token."""
    bt = BetweenThresholds(0.5, 30, 40)  # the candidate's count is at most 8 here: almost always below
    ledger = Ledger.in_memory()
    acc = BasicCompositionAccountant(ledger=ledger)
    gen = PrivateGenerator(ToyBackend(agreeing(1.0), VOCAB), bt, acc, max_tokens=3, fallback="stop",
                           public_backend=ToyBackend(agreeing(1.0), VOCAB), seed=4)
    result = gen.generate(prompts(40), mechanism_rng=np.random.default_rng(MECHANISM_SEED))
    assert result.stop_reason == "fail" and result.token_ids == ()
    assert [s.outcome for s in result.steps] == ["below"]
    assert [row.outcome for row in ledger.rows()] == ["below"]
    assert ledger.verify().ok


# -- public-prior options off: bit-identical to the generator before them -------------------------------------


def _varied(teacher, context):
    """The chain's next word plus a word of the teacher's own, so that histograms vary from step to step."""
    p = np.full(len(VOCAB), 0.02)
    p[CHAIN.get(context[-1] if len(context) else 0, W["the"])] += 0.5
    p[2 + teacher % 8] += 0.3
    return p / p.sum()


def _summary(result):
    return result.token_ids, tuple((s.token, s.outcome, s.max_count, s.margin, s.retries) for s in result.steps)


#: Outputs of these runs recorded with the generator as it was before public_mix / public_support existed.
RECORDED = {
    "coordinated": ((3, 4, 5, 3, 4, 5, 2, 3), (
        (3, "token", 56, 48, 0), (4, "token", 64, 64, 0), (5, "token", 64, 64, 0), (3, "token", 40, 32, 0),
        (4, "token", 40, 32, 0), (5, "token", 56, 48, 0), (2, "token", 40, 32, 0), (3, "token", 56, 48, 0))),
    "independent": ((), ((None, "fail", 32, 27, 0), (None, "fail", 30, 24, 1), (None, "fail", 37, 33, 2))),
    "between-thresholds": ((2, 3, 4, 5, 2, 3, 4, 5), (
        (2, "fallback", 53, 46, 0), (3, "token", 23, 15, 0), (4, "token", 37, 29, 0), (5, "token", 60, 60, 0),
        (2, "token", 15, 7, 0), (3, "fallback", 60, 60, 0), (4, "fallback", 37, 29, 0), (5, "token", 45, 37, 0))),
}


@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("case", sorted(RECORDED))
def test_with_the_public_prior_off_outputs_are_bit_identical_to_before(case, explicit):
    """Defaults, or public_mix=0.0 and public_support=None given explicitly: the same tokens, outcomes and raw
    diagnostics as the recorded runs, for a fixed seed."""
    off = {"public_mix": 0.0, "public_support": None} if explicit else {}
    if case == "between-thresholds":
        bt = BetweenThresholds(0.5, 3, 8)
        acc = IndividualChargingAccountant(60, per_teacher_limit=1000, epsilon0=0.5, q=bt.q)
        gen = PrivateGenerator(ToyBackend(_varied, VOCAB), bt, acc, max_tokens=8, fallback="public",
                               public_backend=ToyBackend(agreeing(0.8), VOCAB), **off)
        result = gen.generate(prompts(60), seed=2, mechanism_rng=np.random.default_rng(2))
    else:
        gen = PrivateGenerator(ToyBackend(_varied, VOCAB), DPArgMax(2.0, 1e-4), BasicCompositionAccountant(),
                               histograms=case, max_tokens=8, fallback="retry", max_retries=2, top_p=0.9,
                               temperature=1.1, **off)
        result = gen.generate(prompts(64), seed=7, mechanism_rng=np.random.default_rng(7))
    assert _summary(result) == RECORDED[case]


@pytest.mark.slow
def test_with_the_public_prior_off_the_device_path_is_bit_identical_to_before():
    """The tiny random Llama voting on the device, with a public fallback from the same model: the recorded run."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from test_transformers_backend import PREFIX, PROMPTS, _tokenizer, tiny_llama

    from ensembles.backends.transformers_backend import TransformersBackend

    tokenizer = _tokenizer()
    model = tiny_llama(tokenizer)
    backend = TransformersBackend(model, tokenizer, threads=1, batch_size=2)
    public = TransformersBackend(model, tokenizer, threads=1, batch_size=2)
    gen = PrivateGenerator(backend, DPArgMax(1.0, 1e-5), BasicCompositionAccountant(), max_tokens=8,
                           fallback="public", public_backend=public, top_p=0.9, temperature=0.9,
                           public_mix=0.0, public_support=None)
    result = gen.generate(PROMPTS * 8, shared_prefix=PREFIX, seed=5, mechanism_rng=np.random.default_rng(5))
    assert _summary(result) == ((188, 112, 199, 53, 135, 17, 151, 235), (
        (188, "fallback", 16, 8, 0), (112, "fallback", 32, 24, 0), (199, "token", 32, 24, 0),
        (53, "fallback", 16, 0, 0), (135, "token", 32, 24, 0), (17, "fallback", 16, 0, 0), (151, "token", 40, 40, 0),
        (235, "token", 40, 40, 0)))


def test_public_generate_is_the_public_fallbacks_draw_with_no_charge():
    """The public model alone (issue 32, item 6; the epsilon = 0 floor): ``public_generate`` draws each token as a
    private run's public fallback draws it (the same rng stream gives the same tokens as ``public_token`` called
    in turn), stops at the end of text, a stop string or ``max_tokens`` as a private run does, and charges
    nothing (no step records, nothing spent)."""
    from ensembles.generation import public_generate, public_token

    result = public_generate(ToyBackend(agreeing(1.0), VOCAB), "the", max_tokens=5, rng=np.random.default_rng(1))
    assert result.text == "cat sat on the cat" and result.stop_reason == "max_tokens"
    assert result.steps == () and result.num_charged_runs == 0 and result.spent == (0.0, 0.0)
    result = public_generate(ToyBackend(agreeing(1.0), VOCAB), "the", max_tokens=20, stop_strings="on",
                             rng=np.random.default_rng(1))
    assert result.stop_reason == "stop_string" and result.text == "cat sat "

    def to_eos(teacher, context):
        p = np.zeros(len(VOCAB))
        p[W["dog"] if len(context) < 3 else W["<eos>"]] = 1.0
        return p

    result = public_generate(ToyBackend(to_eos, VOCAB), "the", max_tokens=20, rng=np.random.default_rng(1))
    assert result.stop_reason == "eos" and result.text == "dog dog" and W["<eos>"] not in result.token_ids
    # a mixed distribution: the same draws as public_token from the same stream, token by token
    backend, twin = ToyBackend(agreeing(0.5), VOCAB), ToyBackend(agreeing(0.5), VOCAB)
    result = public_generate(backend, "the", max_tokens=12, temperature=0.8, top_p=0.9, rng=np.random.default_rng(7))
    twin.begin(["the"])
    rng, drawn = np.random.default_rng(7), []
    while len(drawn) < 12:
        token = public_token(twin, rng, 0.8, 0.9)
        if token == W["<eos>"]:
            break
        drawn.append(token)
        twin.append(token)
    assert list(result.token_ids) == drawn
    with pytest.raises(ValueError, match="max_tokens"):
        public_generate(backend, "the", max_tokens=0)
    with pytest.raises(TypeError, match="public_backend"):
        public_generate(object(), "the")
