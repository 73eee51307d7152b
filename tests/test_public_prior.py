"""Public-prior mixing and public supports (ensembles/public_prior.py): validated frozen options, the host and
device transforms, and the argument that they change no privacy claim.

* Validation: every bad option is a one-line error naming the parameter and the value.
* Sensitivity, by enumeration: on a grid of small teacher sets, replacing one teacher's distribution changes
  at most that teacher's vote on every draw of the shared randomness (Hot and Cold, each transform, with and
  without top-p), and the two histograms are then a replace-one pair of the contract suite's own enumeration
  (``mechanisms.audit.neighbouring_pairs``), on which every mechanism's claim is checked.
* The tail bucket: no registered run mechanism releases it (exact laws and samples), and a mechanism that
  releases only voted tokens releases only tokens of the support.
* Mixing: weight 0 is the identity, weight 1 makes every teacher vote the public model's coordinated sample,
  and on alpha-mixture teachers the shared token's expected count moves to ``n (lambda + (1 - lambda) alpha)``
  (Claim 1) while the top count rises (a test with a tolerance from the sample size).
* Generation with each option on the toy backend, the tiny random Llama (votes on the device equal the host
  form) and in-process shards.
"""

from __future__ import annotations

import itertools
import pickle

import attr
import numpy as np
import pytest
from conftest import z_bound

from ensembles import TAIL_VOTE, TeacherDistributions, VoteHistogram, coordinated_votes
from ensembles.backends import ToyBackend
from ensembles.generation import PrivateGenerator
from ensembles.histograms import (
    coordinated_votes_from_noise,
    independent_votes_from_uniforms,
)
from ensembles.keyed_votes import StepKey, keyed_votes
from ensembles.public_prior import (
    PublicMix,
    PublicPrior,
    PublicSupport,
    as_public_mix,
    as_public_support,
    for_sampling,
    mix_with_public,
    restrict_to_support,
)
from ensembles.synthetic import alpha_mixture
from mechanisms import DPArgMax, registry
from mechanisms.audit import hockey_stick, neighbouring_pairs
from mechanisms.base import reads_distributions
from mechanisms.between_thresholds import OUTCOME_LABELS, TokenQuery
from mechanisms.testing import MAX_TEACHERS, VOCAB_SIZE
from pate_accountant.accountants import BasicCompositionAccountant

VOCAB = ["<unk>", "<eos>", "the", "cat", "sat", "on", "mat", "dog", "ran", "."]
W = {w: i for i, w in enumerate(VOCAB)}
CHAIN = {W["the"]: W["cat"], W["cat"]: W["sat"], W["sat"]: W["on"], W["on"]: W["the"]}


def varied(teacher, context):
    """The chain's next word, plus a word of the teacher's own (teachers differ)."""
    p = np.full(len(VOCAB), 0.02)
    p[CHAIN.get(context[-1] if len(context) else 0, W["the"])] += 0.5
    p[2 + teacher % 8] += 0.3
    return p / p.sum()


def public_chain(teacher, context):
    """The public model: the chain's next word after the last released word (its context has no record)."""
    p = np.full(len(VOCAB), 0.04)
    p[CHAIN.get(context[-1] if len(context) else W["on"], W["the"])] += 0.6
    return p / p.sum()


def prompts(n):
    return [f"record{i} the" for i in range(n)]


# -- validation --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make,kind,pattern", [
    (lambda: PublicMix(-0.1), ValueError, r"public_mix must be >= 0.0, got -0.1"),
    (lambda: PublicMix(1.5), ValueError, r"public_mix must be <= 1.0, got 1.5"),
    (lambda: PublicMix(float("nan")), ValueError, r"public_mix must be finite, got nan"),
    (lambda: PublicMix("0.5"), TypeError, r"public_mix must be a real number, got '0.5'"),
    (lambda: PublicSupport(top_k=0), ValueError, r"public_support top_k must be >= 1, got 0"),
    (lambda: PublicSupport(top_k=2.5), TypeError, r"public_support top_k must be an integer, got 2.5"),
    (lambda: PublicSupport(top_p=0.0), ValueError, r"public_support top_p must be > 0.0, got 0.0"),
    (lambda: PublicSupport(top_p=1.2), ValueError, r"public_support top_p must be <= 1.0, got 1.2"),
    (lambda: PublicSupport(), ValueError, r"exactly one of top_k and top_p, got top_k=None and top_p=None"),
    (lambda: PublicSupport(top_k=3, top_p=0.9), ValueError, r"exactly one of top_k and top_p, got top_k=3"),
    (lambda: as_public_support(0), ValueError, r"public_support must be >= 1, got 0"),
    (lambda: as_public_support(True), TypeError, r"public_support must be None, a top-k integer or a .* got True"),
    (lambda: as_public_support(0.9), TypeError, r"public_support must be .* got 0.9"),
    (lambda: as_public_mix(None), TypeError, r"public_mix must be a real number, got None"),
])
def test_bad_options_are_one_line_errors_naming_parameter_and_value(make, kind, pattern):
    with pytest.raises(kind, match=pattern) as caught:
        make()
    assert "\n" not in str(caught.value)


def test_options_are_frozen_and_compare_by_value():
    mix, support = PublicMix(0.25), PublicSupport(top_k=4)
    with pytest.raises(attr.exceptions.FrozenInstanceError):
        mix.weight = 0.5
    with pytest.raises(attr.exceptions.FrozenInstanceError):
        support.top_k = 2
    assert PublicMix(0.25) == mix and as_public_mix(0.25) == mix and as_public_mix(mix) is mix
    assert as_public_support(4) == support and as_public_support(None) is None
    assert repr(mix) == "PublicMix(0.25)" and repr(support) == "PublicSupport(top_k=4)"
    prior = PublicPrior(np.array([0.5, 0.3, 0.2]), mix=0.25, support=support)
    with pytest.raises(AttributeError, match="immutable"):
        prior.mix = 0.5
    with pytest.raises(ValueError):
        prior.probs[0] = 1.0  # read-only
    copy = pickle.loads(pickle.dumps(prior))  # what a Ray shard receives
    assert copy.digest == prior.digest and copy.mix == 0.25 and copy.support.tolist() == [0, 1, 2]
    assert not copy.probs.flags.writeable and copy.support_spec == support


def test_generator_options_are_validated_before_any_run():
    backend, public = ToyBackend(varied, VOCAB), ToyBackend(public_chain, VOCAB)

    def make(**kwargs):
        return PrivateGenerator(backend, DPArgMax(1.0, 1e-5), BasicCompositionAccountant(), **kwargs)

    for kwargs, kind, pattern in [
        ({"public_mix": 2, "public_backend": public}, ValueError, r"public_mix must be <= 1.0, got 2"),
        ({"public_mix": 0.3}, ValueError, r"public_mix=0.3 needs a public_backend"),
        ({"public_support": 5}, ValueError, r"public_support=PublicSupport\(top_k=5\) needs a public_backend"),
        ({"public_support": -1, "public_backend": public}, ValueError, r"public_support must be >= 1, got -1"),
        ({"public_support": "top5", "public_backend": public}, TypeError, r"public_support must be None"),
    ]:
        with pytest.raises(kind, match=pattern) as caught:
            make(**kwargs)
        assert "\n" not in str(caught.value)

    class OldBackend(ToyBackend):  # a backend whose votes() cannot apply the prior
        def votes(self, key, *, temperature=1.0, top_p=None, histograms="coordinated", teacher_ids=None):
            return super().votes(key, temperature=temperature, top_p=top_p, histograms=histograms,
                                 teacher_ids=teacher_ids)

    with pytest.raises(ValueError, match=r"public_mix=0.5 needs a backend whose votes\(\) applies the public "
                                         r"prior .*OldBackend.votes takes none") as caught:
        PrivateGenerator(OldBackend(varied, VOCAB), DPArgMax(1.0, 1e-5), BasicCompositionAccountant(),
                         public_backend=public, public_mix=0.5)
    assert "\n" not in str(caught.value)
    # With both options off the old backend serves as before, and 0 / None are "off".
    PrivateGenerator(OldBackend(varied, VOCAB), DPArgMax(1.0, 1e-5), BasicCompositionAccountant(),
                     public_mix=0.0, public_support=None)


def test_public_support_selection():
    probs = np.array([0.1, 0.4, 0.0, 0.2, 0.2, 0.1])
    assert PublicSupport(top_k=1).select(probs).tolist() == [1]
    assert PublicSupport(top_k=3).select(probs).tolist() == [1, 3, 4]  # ties by token id
    assert PublicSupport(top_k=2).select(probs).tolist() == [1, 3]
    assert PublicSupport(top_k=10).select(probs).tolist() == [0, 1, 3, 4, 5]  # zero-probability tokens never
    assert PublicSupport(top_p=0.5).select(probs).tolist() == [1, 3]
    assert PublicSupport(top_p=0.6).select(probs).tolist() == [1, 3]  # mass 0.6 reached by two tokens
    assert PublicSupport(top_p=1.0).select(probs).tolist() == [0, 1, 3, 4, 5]


# -- the host transforms -------------------------------------------------------------------------------------
def test_host_transforms_keep_rows_distributions_and_move_the_rest_to_the_tail():
    rng = np.random.default_rng(1)
    teachers = TeacherDistributions.from_dense(rng.dirichlet(np.full(12, 0.5), size=5))
    public = rng.dirichlet(np.full(12, 0.5))
    mixed = mix_with_public(teachers, public, 0.3)
    np.testing.assert_allclose(mixed.to_dense(), 0.3 * public + 0.7 * teachers.to_dense(), atol=1e-15)
    assert mix_with_public(teachers, public, 0.0) is teachers
    np.testing.assert_allclose(mix_with_public(teachers, public, 1.0).to_dense(), np.tile(public, (5, 1)),
                               atol=1e-15)
    support = np.array([2, 5, 7])
    cut = restrict_to_support(teachers, support)
    dense = teachers.to_dense()
    np.testing.assert_allclose(cut.tail, 1 - dense[:, support].sum(axis=1), atol=1e-12)
    assert set(cut.token_ids.tolist()) <= set(support.tolist())
    # A teacher with a tail (top-p): mixing scales the tail, the support adds to it.
    cut_p = teachers.top_p(0.6)
    np.testing.assert_allclose(mix_with_public(cut_p, public, 0.25).tail, 0.75 * cut_p.tail)
    both = restrict_to_support(cut_p, support)
    assert (both.tail >= cut_p.tail - 1e-15).all()
    rows = both.teacher_of_entry()
    kept = np.bincount(rows, weights=both.probs, minlength=5)
    np.testing.assert_allclose(kept + both.tail, 1.0, atol=1e-12)


def test_mix_zero_is_the_identity_and_off_is_the_plain_path():
    rng = np.random.default_rng(2)
    teachers = TeacherDistributions.from_dense(rng.dirichlet(np.full(30, 0.3), size=8))
    public = rng.dirichlet(np.full(30, 0.3))
    off = PublicPrior(public, mix=0.0)
    assert not off.active
    for temperature, top_p in [(1.0, None), (0.7, 0.9)]:
        plain = teachers.for_sampling(temperature, top_p)
        same = for_sampling(teachers, temperature, top_p, off)
        np.testing.assert_array_equal(same.to_dense(), plain.to_dense())
        np.testing.assert_array_equal(same.tail, plain.tail)
        for step in range(20):
            key = StepKey(3, step)
            np.testing.assert_array_equal(keyed_votes(same, key), keyed_votes(plain, key))


@pytest.mark.parametrize("top_p", [None, 0.8])
def test_mix_one_makes_every_teacher_vote_the_public_models_coordinated_sample(top_p):
    """lambda = 1: every teacher's distribution is the public one, so on every key all votes agree (total
    agreement) and equal the public model's own coordinated vote on that key."""
    rng = np.random.default_rng(3)
    teachers = TeacherDistributions.from_dense(rng.dirichlet(np.full(40, 0.4), size=16))
    public = rng.dirichlet(np.full(40, 0.4))
    prior = PublicPrior(public, mix=1.0)
    lone = TeacherDistributions.from_dense(public[None, :]).for_sampling(1.0, top_p)
    seen = set()
    for step in range(60):
        key = StepKey(5, step)
        votes = keyed_votes(for_sampling(teachers, 1.0, top_p, prior), key)
        assert (votes == votes[0]).all()
        assert votes[0] == keyed_votes(lone, key)[0]
        seen.add(int(votes[0]))
    assert len(seen) > 3  # the public sample varies with the key: agreement is not a constant


# -- sensitivity: one teacher's data moves at most its own vote -------------------------------------------------
GRID = [np.array(p) / 4 for p in itertools.product(range(5), repeat=3) if sum(p) == 4]  # 15 distributions
PUBLIC = np.array([0.5, 0.3, 0.2])
TRANSFORMS = [
    PublicPrior(PUBLIC, mix=0.25),
    PublicPrior(PUBLIC, mix=1.0),
    PublicPrior(PUBLIC, support=PublicSupport(top_k=1)),
    PublicPrior(PUBLIC, support=PublicSupport(top_k=2)),
    PublicPrior(PUBLIC, support=PublicSupport(top_p=0.6)),
    PublicPrior(PUBLIC, mix=0.5, support=PublicSupport(top_k=2)),
]
NUM_DRAWS = 64


def _all_votes(dense, prior, top_p, histograms, noise, tail_noise, uniforms):
    dists = for_sampling(TeacherDistributions.from_dense(dense), 1.0, top_p, prior)
    if histograms == "coordinated":
        return coordinated_votes_from_noise(dists, noise, tail_noise)
    return independent_votes_from_uniforms(dists, uniforms)


def _histogram(votes):
    return VoteHistogram.from_votes(votes, VOCAB_SIZE)


@pytest.mark.parametrize("histograms", ["coordinated", "independent"])
@pytest.mark.parametrize("top_p", [None, 0.7])
@pytest.mark.parametrize("prior", TRANSFORMS, ids=["mix0.25", "mix1", "top1", "top2", "topp0.6", "mix0.5-top2"])
def test_replacing_one_teacher_moves_at_most_its_vote_and_gives_a_contract_pair(prior, top_p, histograms):
    """Every neighbouring teacher set of a grid (one teacher's distribution replaced by each other grid point),
    on the same draws of the shared randomness: the other teachers' votes are unchanged, and the histograms
    are equal or a replace-one pair that the contract suite enumerates (so each mechanism's checked claim
    applies).  DPArgMax's exact laws on the observed pairs stay within its (epsilon, delta)."""
    n = 4
    assert n <= MAX_TEACHERS
    pairs = {frozenset(pair) for pair in neighbouring_pairs(n, VOCAB_SIZE, "replace-one", tail=True)}
    rng = np.random.default_rng(2026)
    noise = rng.standard_exponential((NUM_DRAWS, VOCAB_SIZE))
    tail_noise = rng.standard_exponential(NUM_DRAWS)
    uniforms = rng.random((NUM_DRAWS, n))
    mechanism = DPArgMax(1.0, 0.1)
    laws: dict = {}

    def law(h):
        if h not in laws:
            laws[h] = mechanism.output_distribution(h).as_dict()
        return laws[h]

    moved = tails = 0
    for rows in rng.choice(len(GRID), size=(3, n)):
        dense = np.stack([GRID[i] for i in rows])
        votes = _all_votes(dense, prior, top_p, histograms, noise, tail_noise, uniforms)
        tails += int((votes == TAIL_VOTE).sum())
        for teacher in range(n):
            for replacement in GRID:
                other = dense.copy()
                other[teacher] = replacement
                votes2 = _all_votes(other, prior, top_p, histograms, noise, tail_noise, uniforms)
                others = np.delete(np.arange(n), teacher)
                np.testing.assert_array_equal(votes2[:, others], votes[:, others])
                for draw in np.flatnonzero(votes2[:, teacher] != votes[:, teacher]):
                    a, b = _histogram(votes[draw]), _histogram(votes2[draw])
                    assert frozenset((a, b)) in pairs, (a, b)
                    assert hockey_stick(law(a), law(b), mechanism.epsilon) <= mechanism.delta + 1e-12
                    moved += 1
    if prior.mix == 1.0:
        assert moved == 0  # lambda = 1: the teachers' own distributions no longer matter at all
    else:
        assert moved > 50  # the enumeration moves votes: the check is not vacuous
    if prior.support is not None:
        assert tails > 0  # and the tail bucket is exercised


# -- the tail bucket is never released ---------------------------------------------------------------------------
ALL_TAIL = VoteHistogram.from_votes(np.full(6, TAIL_VOTE), VOCAB_SIZE)


def _tail_heavy_histograms():
    """Histograms of six teachers' coordinated votes over three tokens under the public support {0}: every vote
    is token 0 or a tail vote, most of them tail votes; and the all-tail histogram."""
    rng = np.random.default_rng(11)
    dense = rng.dirichlet(np.full(VOCAB_SIZE, 0.7), size=6)
    prior = PublicPrior(PUBLIC, support=PublicSupport(top_k=1))
    dists = for_sampling(TeacherDistributions.from_dense(dense), 1.0, None, prior)
    votes = coordinated_votes(dists, 300, rng)
    assert set(np.unique(votes).tolist()) == {TAIL_VOTE, 0}
    return sorted({_histogram(v) for v in votes} | {ALL_TAIL}, key=lambda h: (h.tail, h.count(0)))


def _tokens(law: dict) -> dict:
    """The token outcomes of an exact law (fail is ``None``, a boundary wrapper's target a string)."""
    return {v: p for v, p in law.items() if v is not None and not isinstance(v, str)}


def _label_query(mechanism) -> bool:
    """A BetweenThresholds query on one fixed token's count (``between-thresholds``): its outcomes are the labels
    below / between / above about that token (codes 0, 1, 2 in its exact law), not tokens."""
    return isinstance(mechanism, TokenQuery)


#: The run mechanisms that read vote histograms (a mechanism over distributions has no tail vote: it releases a
#: token of the public support, tests/test_clipped_logits.py).
VOTE_MECHANISMS = tuple(name for name in registry.run_mechanism_names()
                        if not reads_distributions(registry.contract_examples(name, "replace-one")[0]))


@pytest.mark.parametrize("name", VOTE_MECHANISMS)
def test_no_run_mechanism_releases_the_tail_bucket(name):
    """Exact laws and sampled runs: never the tail vote, only token ids; a mechanism that releases nothing on
    the all-tail histogram releases only voted tokens, here only token 0, the public support.  A query on one
    token's count (BetweenThresholds) asks about a token id, never the tail, and tail votes do not count."""
    hists = _tail_heavy_histograms()
    assert any(h.tail >= 4 for h in hists) and any(h.count(0) >= 3 for h in hists)
    rng = np.random.default_rng(5)
    released = 0
    for mechanism in registry.contract_examples(name, "replace-one"):
        if _label_query(mechanism):
            assert 0 <= mechanism.token < VOCAB_SIZE
            for hist in hists:
                without_tail = VoteHistogram(hist.tokens, hist.counts, vocab_size=VOCAB_SIZE)
                assert (mechanism.output_distribution(hist).as_dict()
                        == mechanism.output_distribution(without_tail).as_dict())
                assert mechanism(hist, rng=rng).value in OUTCOME_LABELS
                released += 1
            continue
        voted_only = not _tokens(mechanism.output_distribution(ALL_TAIL).as_dict())
        size = getattr(mechanism, "vocab_size", None) or VOCAB_SIZE
        for hist in hists:
            law = mechanism.output_distribution(hist).as_dict()
            assert TAIL_VOTE not in law
            assert abs(sum(law.values()) - 1.0) < 1e-9
            for value in _tokens(law):
                assert isinstance(value, (int, np.integer)) and 0 <= value < size
                if voted_only:
                    assert value == 0
            for _ in range(20):
                value = mechanism(hist, rng=rng).value
                assert value != TAIL_VOTE
                if value is not None and not isinstance(value, str):
                    assert 0 <= value < size and (value == 0 or not voted_only)
                    released += 1
    assert released or name.startswith(("dp-argmax", "boundary-dp-argmax"))  # the small examples fail often


def test_only_mechanisms_that_noise_every_token_can_release_an_unvoted_one():
    """The run mechanisms that release a token on an all-tail histogram are the Gaussian ones (GNMax noises
    every vocabulary token, docs/generation.md "Public prior"); they favour no token, and never the tail."""
    noisy = set()
    for name in VOTE_MECHANISMS:
        for mechanism in registry.contract_examples(name, "replace-one"):
            if _label_query(mechanism):
                continue  # its outcomes are labels about a token the run chose (from the support, under one)
            tokens = _tokens(mechanism.output_distribution(ALL_TAIL).as_dict())
            if tokens:
                noisy.add(name)
                assert TAIL_VOTE not in tokens
                assert max(tokens.values()) - min(tokens.values()) < 1e-12
    assert noisy == {"gaussian-argmax", "gaussian-threshold-argmax"}


# -- mixing on alpha-mixture teachers --------------------------------------------------------------------------
def test_mixing_raises_agreement_on_alpha_mixtures():
    """Teachers ``alpha s + (1 - alpha) r_i`` with the shared token 0; the public model puts mass 0.9 on it.
    Mixing with weight lambda gives every teacher mass ``m = lambda 0.9 + (1 - lambda) alpha`` on token 0, so
    its expected count is ``n m`` (Claim 1): checked within z standard errors of the sample mean.  The mean top
    count fraction rises with lambda by more than its sampling error."""
    n, vocab, alpha, draws = 200, 2000, 0.3, 4000
    rng = np.random.default_rng(20261123)
    teachers = alpha_mixture(n, vocab, alpha, rng)
    public = np.zeros(vocab)
    public[0], public[1000:1010] = 0.9, 0.01
    z = z_bound(6)
    tops = {}
    for weight in (0.0, 0.25, 0.5):
        mixed = mix_with_public(teachers, public, weight)
        votes = coordinated_votes(mixed, draws, rng)
        shared = (votes == 0).sum(axis=1)
        expected = n * (weight * 0.9 + (1 - weight) * alpha)
        assert abs(shared.mean() - expected) <= z * shared.std(ddof=1) / np.sqrt(draws) + 1e-9
        top = np.array([np.unique(row, return_counts=True)[1].max() for row in votes[:1000]])
        tops[weight] = (top.mean(), top.std(ddof=1) / np.sqrt(top.size))
    for low, high in [(0.0, 0.25), (0.25, 0.5)]:
        gap = tops[high][0] - tops[low][0]
        assert gap > z * np.hypot(tops[high][1], tops[low][1]), (low, high, tops)


# -- generation with each option ------------------------------------------------------------------------------
OPTIONS = [
    {"public_mix": 0.5},
    {"public_support": 3},
    {"public_support": PublicSupport(top_p=0.7)},
    {"public_mix": 0.3, "public_support": 4},
]


class _CountingPublic(ToyBackend):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = 0

    def distributions(self):
        self.calls += 1
        return super().distributions()


@pytest.mark.parametrize("histograms", ["coordinated", "independent"])
@pytest.mark.parametrize("options", OPTIONS, ids=repr)
def test_toy_generation_runs_with_each_option(options, histograms):
    public = _CountingPublic(public_chain, VOCAB)
    seen = []

    class Recording(ToyBackend):
        def votes(self, key, **kwargs):
            seen.append((key, kwargs.get("public")))
            return super().votes(key, **kwargs)

    acc = BasicCompositionAccountant()
    gen = PrivateGenerator(Recording(varied, VOCAB), DPArgMax(2.0, 1e-4), acc, histograms=histograms,
                           max_tokens=8, fallback="retry", max_retries=2, top_p=0.95, public_backend=public,
                           **options)
    result = gen.generate(prompts(64), seed=3, mechanism_rng=np.random.default_rng(3))
    assert result.num_charged_runs == len(seen) > 0
    assert acc.spent()[0] == pytest.approx(2.0 * result.num_charged_runs)  # each run charged as before
    priors = [prior for _, prior in seen]
    assert all(isinstance(p, PublicPrior) and p.active for p in priors)
    positions = {key.step for key, _ in seen}
    assert public.calls == len(positions)  # the public distribution: once per position, shared by its retries
    for (key, prior), (key2, prior2) in itertools.pairwise(seen):
        if key.step == key2.step:
            assert prior is prior2
    if "public_support" in options:
        for token in result.token_ids:  # released tokens lie in the support of their position
            assert token in set().union(*(p.support.tolist() for p in priors))


def test_mixing_releases_more_tokens_privately():
    """Teachers that mostly disagree (each its own word, a weak common chain): DPArgMax releases few tokens and
    the public fallback fills in.  Mixing towards the public model (lambda = 0.8) makes the coordinated votes
    agree, so most tokens are released privately (fixed seeds: the counts are reproducible)."""
    def own_word(teacher, context):
        p = np.full(len(VOCAB), 0.01)
        p[CHAIN.get(context[-1] if len(context) else 0, W["the"])] += 0.2
        p[2 + teacher % 8] += 0.7
        return p / p.sum()

    def released(**options):
        total = 0
        for seed in range(6):
            gen = PrivateGenerator(ToyBackend(own_word, VOCAB), DPArgMax(2.0, 1e-4), BasicCompositionAccountant(),
                                   max_tokens=6, fallback="public", public_backend=ToyBackend(public_chain, VOCAB),
                                   public_prompt="the", **options)
            result = gen.generate(prompts(80), seed=seed, mechanism_rng=np.random.default_rng(seed))
            total += result.outcome_counts().get("token", 0)
        return total

    plain, mixed = released(), released(public_mix=0.8)
    assert plain <= 6 and mixed >= 15 and mixed > 2 * plain


def test_between_thresholds_candidates_come_from_the_support():
    from mechanisms import BetweenThresholds
    from pate_accountant.accountants import IndividualChargingAccountant

    for candidate in ("public", "uniform"):
        bt = BetweenThresholds(0.5, 3, 8)
        acc = IndividualChargingAccountant(40, per_teacher_limit=1000, epsilon0=0.5, q=bt.q)
        supports = []

        class Recording(ToyBackend):
            def votes(self, key, *, _seen=supports, **kwargs):
                _seen.append(set(kwargs["public"].support.tolist()))
                return super().votes(key, **kwargs)

        gen = PrivateGenerator(Recording(varied, VOCAB), bt, acc, max_tokens=10, fallback="public",
                               public_backend=ToyBackend(public_chain, VOCAB), public_prompt="on",
                               candidate=candidate, public_support=2, seed=1)
        result = gen.generate(prompts(40), mechanism_rng=np.random.default_rng(1))
        assert result.num_charged_runs == len(supports)
        private = [(step.token, support) for step, support in zip(result.steps, supports) if step.outcome == "token"]
        assert private  # some candidates are released
        assert all(token in support for token, support in private)


def test_the_tiny_llama_generates_with_each_option_and_votes_on_the_device_as_on_the_host():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from test_transformers_backend import PREFIX, PROMPTS, _tokenizer, tiny_llama

    from ensembles.backends.transformers_backend import TransformersBackend

    tokenizer = _tokenizer()
    model = tiny_llama(tokenizer)
    backend = TransformersBackend(model, tokenizer, threads=1, batch_size=4)
    public = TransformersBackend(model, tokenizer, threads=1, batch_size=1)
    public.begin([""], shared_prefix=PREFIX)
    teacher_prompts = PROMPTS * 4
    backend.begin(teacher_prompts, shared_prefix=PREFIX)
    host = TeacherDistributions.from_dense(backend.distributions().to_dense())
    for options in OPTIONS:
        prior = PublicPrior.from_distributions(public.distributions(), temperature=0.9,
                                               mix=options.get("public_mix", 0.0),
                                               support=as_public_support(options.get("public_support")))
        for histograms in ("coordinated", "independent"):
            for retry in range(4):
                key = StepKey(8, 0, retry)
                got = backend.votes(key, temperature=0.9, top_p=0.9, histograms=histograms, public=prior)
                want = keyed_votes(for_sampling(host, 0.9, 0.9, prior), key, histograms=histograms,
                                   teacher_ids=backend.active_teachers())
                assert (got == want).mean() >= 0.95  # float32 on the device: all but near-ties
    for options in OPTIONS:
        gen = PrivateGenerator(backend, DPArgMax(1.0, 1e-5), BasicCompositionAccountant(), max_tokens=5,
                               fallback="public", public_backend=public, top_p=0.9, temperature=0.9, **options)
        result = gen.generate(teacher_prompts, shared_prefix=PREFIX, seed=5, mechanism_rng=np.random.default_rng(5))
        assert len(result.token_ids) == 5 and result.num_charged_runs == 5


def test_shards_apply_the_prior_like_one_backend():
    from test_sharded_backend import VOCAB as SHARD_VOCAB
    from test_sharded_backend import _sharded, chain_model, toy_backend, toy_prompts

    plain = toy_backend(chain_model)
    sharded = _sharded(toy_backend, 3, chain_model)
    teacher_prompts = toy_prompts(9)
    plain.begin(teacher_prompts)
    sharded.begin(teacher_prompts)
    public = np.random.default_rng(4).dirichlet(np.full(len(SHARD_VOCAB), 0.5))
    for prior in (PublicPrior(public, mix=0.4), PublicPrior(public, support=PublicSupport(top_k=3)),
                  PublicPrior(public, mix=0.2, support=PublicSupport(top_p=0.5))):
        for histograms in ("coordinated", "independent"):
            for step in range(10):
                key = StepKey(12, step)
                np.testing.assert_array_equal(
                    sharded.votes(key, top_p=0.8, histograms=histograms, public=prior),
                    plain.votes(key, top_p=0.8, histograms=histograms, public=prior))
    sharded.close()


def test_device_kernel_checks_its_prior():
    torch = pytest.importorskip("torch")
    from ensembles.backends.device_votes import device_votes

    logits = torch.zeros((2, 5))
    with pytest.raises(TypeError, match="public must be a PublicPrior or None, got dict"):
        device_votes(logits, StepKey(1), public={"mix": 0.5})
    with pytest.raises(ValueError, match="the public prior is over 4 tokens, the teachers over 5"):
        device_votes(logits, StepKey(1), public=PublicPrior(np.full(4, 0.25), mix=0.5))


@pytest.mark.parametrize("name", ["gaussian-argmax", "gaussian-threshold-argmax"])
def test_gnmax_under_a_support_noises_and_releases_only_the_support(name):
    """Under a public support the step runs the mechanism on the histogram over the support alone (tail
    outside): GNMax adds noise to k counts, not to the vocabulary, so every private token lies in its step's
    support, at the same charge per step.  Without the support the same (very noisy) GNMax releases tokens
    outside it: the check has teeth."""
    from pate_app.run import build_mechanism

    def run(support):
        seen = []

        class Recording(ToyBackend):
            def votes(self, key, **kwargs):
                prior = kwargs.get("public")
                seen.append(None if prior is None else set(prior.support.tolist()))
                return super().votes(key, **kwargs)

        mechanism = build_mechanism(name, 0.05, 1e-6, num_teachers=40)  # sigma of dozens of votes: noise wins
        acc = BasicCompositionAccountant()
        gen = PrivateGenerator(Recording(varied, VOCAB), mechanism, acc, max_tokens=12, fallback="public",
                               public_backend=ToyBackend(public_chain, VOCAB), public_prompt="on",
                               public_support=support, seed=2)
        result = gen.generate(prompts(40), mechanism_rng=np.random.default_rng(2))
        assert acc.spent()[0] == pytest.approx(mechanism.event.epsilon * result.num_charged_runs)
        return [(step.token, allowed) for step, allowed in zip(result.steps, seen, strict=True)
                if step.outcome == "token"]

    supported = run(2)
    assert supported and all(token in allowed for token, allowed in supported)
    public_top2 = {W["the"], W["cat"], W["sat"], W["on"]}  # the chain's words: each step's top 2 lie among them
    assert any(token not in public_top2 for token, _ in run(None))
