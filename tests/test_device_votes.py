"""Votes computed where the logits are (ensembles/backends/device_votes.py) and their host form
(ensembles.keyed_votes.keyed_votes, what a backend without logits uses).

* Hot PATE: on the noise of a key, the device kernel's votes equal Algorithm 1's on the host distributions
  at the same temperature and top-p (``coordinated_votes_from_noise``), exactly in float64 and on every vote
  of these draws in float32, with the tail outcome exercised and the narrow-margin cut too.
* Cold PATE: the device kernel's inverse-CDF votes equal the host kernel's on the same teacher uniforms.
* Shards: any split of the teachers, each computing its own noise from the key, gives the whole ensemble's
  votes, for both laws; a teacher's Cold vote is keyed by its original index.
* The laws: each teacher's vote follows its own distribution (chi-square), Hot votes agree for identical
  teachers, Cold votes of identical teachers do not always.
"""

import numpy as np
import pytest
import torch
from scipy import stats

from ensembles import TAIL_VOTE, TeacherDistributions, coordinated_votes_from_noise
from ensembles import keyed_votes as keyed
from ensembles.backends.device_votes import device_votes
from ensembles.histograms import independent_votes_from_uniforms
from ensembles.keyed_votes import StepKey, keyed_votes, shared_noise, teacher_uniforms


def _logits(n, vocab, seed, scale=2.0):
    return np.random.default_rng(seed).normal(scale=scale, size=(n, vocab)).astype(np.float32)


def _host(logits, temperature, top_p):
    wide = logits.astype(np.float64)
    z = wide - wide.max(axis=1, keepdims=True)
    probs = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    return TeacherDistributions.from_dense(probs).for_sampling(temperature, top_p)


@pytest.mark.parametrize("margins", [keyed.TOP_P_MARGINS, (0.25, 1.0, np.inf)])
@pytest.mark.parametrize("temperature,top_p", [(1.0, None), (0.7, None), (1.0, 0.9), (0.7, 0.5), (1.3, 0.95)])
def test_hot_votes_equal_algorithm_1_on_the_same_noise(temperature, top_p, margins, monkeypatch):
    monkeypatch.setattr(keyed, "TOP_P_MARGINS", margins)
    n, vocab, draws = 24, 300, 25
    logits = _logits(n, vocab, 1)
    # The host rows are the softmax of logits / T: temperature on p (p ** (1/T)) is the same law.
    host = TeacherDistributions.from_dense(_host(logits / temperature, 1.0, None).to_dense()).for_sampling(1.0, top_p)
    tails = 0
    for step in range(draws):
        key = StepKey(9, step)
        u, u_tail = shared_noise(key, vocab)
        expected = coordinated_votes_from_noise(host, u[None, :], np.array([u_tail]))[0]
        exact = device_votes(torch.from_numpy(logits), key, temperature=temperature, top_p=top_p,
                             dtype=torch.float64)
        np.testing.assert_array_equal(exact, expected)
        fast = device_votes(torch.from_numpy(logits), key, temperature=temperature, top_p=top_p)
        np.testing.assert_array_equal(fast, expected)
        assert fast.dtype == np.int32
        np.testing.assert_array_equal(keyed_votes(host, key), expected)  # the host form
        tails += int((exact == TAIL_VOTE).sum())
    if top_p is not None:
        assert tails > 0  # the tail outcome is exercised


@pytest.mark.parametrize("top_p", [None, 0.8])
def test_cold_votes_equal_the_host_kernel_on_the_same_uniforms(top_p):
    n, vocab = 40, 200
    logits = _logits(n, vocab, 2)
    host = _host(logits, 1.0, top_p)
    ids = np.arange(100, 100 + n)
    tails = 0
    for step in range(25):
        key = StepKey(3, step, 1)
        expected = independent_votes_from_uniforms(host, teacher_uniforms(key, ids)[None, :])[0]
        got = device_votes(torch.from_numpy(logits), key, top_p=top_p, histograms="independent", teacher_ids=ids,
                           dtype=torch.float64)
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(keyed_votes(host, key, histograms="independent", teacher_ids=ids), expected)
        tails += int((got == TAIL_VOTE).sum())
    assert (top_p is None) == (tails == 0)


@pytest.mark.parametrize("histograms", ["coordinated", "independent"])
def test_any_split_of_the_teachers_gives_the_same_votes(histograms):
    logits = torch.from_numpy(_logits(64, 500, 3))
    ids = np.arange(64)
    key = StepKey(77, 4, 0)
    whole = device_votes(logits, key, top_p=0.8, histograms=histograms, teacher_ids=ids)
    for shards in (1, 2, 4):
        parts = [device_votes(logits[rows], key, top_p=0.8, histograms=histograms, teacher_ids=ids[rows])
                 for rows in np.array_split(ids, shards)]
        np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_teacher_uniforms_are_keyed_by_the_original_index():
    key = StepKey(5, 1)
    every = teacher_uniforms(key, np.arange(5000))
    np.testing.assert_array_equal(teacher_uniforms(key, np.array([4999, 7, 0])), every[[4999, 7, 0]])
    assert ((every >= 0) & (every < 1)).all()
    assert stats.kstest(every, "uniform").pvalue > 1e-3
    assert not np.array_equal(teacher_uniforms(StepKey(5, 2), np.arange(5000)), every)
    with pytest.raises(ValueError, match="teacher_ids"):
        teacher_uniforms(key, np.array([-1]))


@pytest.mark.parametrize("histograms", ["coordinated", "independent"])
def test_each_vote_follows_its_teachers_distribution(histograms):
    """Claim 1 (Hot) and plain sampling (Cold): teacher i's vote has law p_i; only Hot votes agree."""
    probs = np.array([0.5, 0.2, 0.1, 0.1, 0.05, 0.05])
    logits = torch.from_numpy(np.log(np.tile(probs, (3, 1))))
    draws = 4000
    votes = np.array([device_votes(logits, StepKey(1, s), histograms=histograms) for s in range(draws)])
    agree = (votes == votes[:, :1]).all(axis=1).mean()
    assert agree == 1.0 if histograms == "coordinated" else agree < 0.5
    for teacher in range(3):
        observed = np.bincount(votes[:, teacher], minlength=probs.size)
        assert stats.chisquare(observed, draws * probs).pvalue > 1e-3


def test_bad_inputs_are_refused():
    logits = torch.zeros((2, 5))
    with pytest.raises(TypeError, match="StepKey"):
        device_votes(logits, 3)
    with pytest.raises(ValueError, match="histograms"):
        device_votes(logits, StepKey(1), histograms="warm")
    with pytest.raises(ValueError, match="temperature"):
        device_votes(logits, StepKey(1), temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        device_votes(logits, StepKey(1), top_p=1.5)
    with pytest.raises(ValueError, match="teacher_ids"):
        device_votes(logits, StepKey(1), histograms="independent", teacher_ids=[0, 1, 2])
    with pytest.raises(ValueError, match="2-d"):
        device_votes(torch.zeros(5), StepKey(1))


@pytest.mark.gpu
@pytest.mark.parametrize("top_p", [None, 0.9])
def test_the_kernel_on_cuda_votes_as_on_the_cpu(top_p):
    """The gpu lane: the same kernel on a CUDA device gives the CPU's votes (float64: exactly; float32 and bf16
    logits: all but near-ties)."""
    if not torch.cuda.is_available():
        pytest.fail("the gpu lane needs CUDA")
    logits = torch.from_numpy(_logits(256, 4096, 5).astype(np.float64))
    keys = [StepKey(11, s) for s in range(20)]
    for key in keys:
        cpu = device_votes(logits, key, temperature=0.7, top_p=top_p, dtype=torch.float64)
        cuda = device_votes(logits.cuda(), key, temperature=0.7, top_p=top_p, dtype=torch.float64)
        np.testing.assert_array_equal(cuda, cpu)
        cold = device_votes(logits.cuda(), key, top_p=top_p, histograms="independent", dtype=torch.float64)
        np.testing.assert_array_equal(cold, device_votes(logits, key, top_p=top_p, histograms="independent",
                                                         dtype=torch.float64))
    same = np.mean([(device_votes(logits.cuda().to(torch.bfloat16), key, temperature=0.7, top_p=top_p)
                     == device_votes(logits, key, temperature=0.7, top_p=top_p)).mean() for key in keys])
    assert same > 0.9  # bf16 logits move near-ties only


def test_the_cached_cut_serves_retries_and_gives_the_same_votes():
    """A retry at the same position races again on new noise with the cut kept in ``cache``: same votes as
    computing the cut afresh, one cut per (temperature, top-p)."""
    logits = torch.from_numpy(_logits(32, 400, 6))
    cache = {}
    for retry in range(15):
        key = StepKey(4, 2, retry)
        np.testing.assert_array_equal(device_votes(logits, key, temperature=0.8, top_p=0.9, cache=cache),
                                      device_votes(logits, key, temperature=0.8, top_p=0.9))
    assert len(cache) == 1
    device_votes(logits, StepKey(4, 2, 0), top_p=0.5, cache=cache)
    assert len(cache) == 2


# -- the public prior on the device (ensembles/public_prior.py) ------------------------------------------------
def _public_prior(vocab, temperature, **options):
    from ensembles.public_prior import PublicPrior

    logits = np.random.default_rng(44).normal(scale=2.0, size=vocab) / temperature
    probs = np.exp(logits - logits.max())
    return PublicPrior(probs / probs.sum(), **options)


def _prior_options():
    from ensembles.public_prior import PublicSupport

    return [{"mix": 0.3}, {"mix": 1.0}, {"support": PublicSupport(top_k=5)}, {"support": PublicSupport(top_p=0.8)},
            {"mix": 0.3, "support": PublicSupport(top_k=5)}]


@pytest.mark.parametrize("histograms", ["coordinated", "independent"])
@pytest.mark.parametrize("temperature,top_p", [(1.0, None), (0.7, 0.9)])
@pytest.mark.parametrize("index", range(5))
def test_the_public_prior_on_the_device_votes_as_on_the_host(index, temperature, top_p, histograms):
    """Mixing (a logaddexp of the row's log-softmax with log p_pub) and the support (the race over its tokens
    and one tail) give the host transforms' votes (ensembles.public_prior.for_sampling then keyed_votes): exactly
    in float64, and on every vote of these draws in float32."""
    from ensembles.public_prior import for_sampling

    options = _prior_options()[index]
    n, vocab = 24, 300
    logits = _logits(n, vocab, 7)
    prior = _public_prior(vocab, temperature, **options)
    host = for_sampling(_host(logits / temperature, 1.0, None), 1.0, top_p, prior)
    ids = np.arange(n)
    tails = 0
    for step in range(20):
        key = StepKey(21, step)
        want = keyed_votes(host, key, histograms=histograms, teacher_ids=ids)
        for dtype in (torch.float64, None):
            got = device_votes(torch.from_numpy(logits), key, temperature=temperature, top_p=top_p,
                               histograms=histograms, teacher_ids=ids, public=prior, dtype=dtype)
            np.testing.assert_array_equal(got, want)
        if options.get("mix") == 1.0 and histograms == "coordinated":
            assert (want == want[0]).all()  # every teacher votes the public model's sample
        tails += int((want == TAIL_VOTE).sum())
    assert (tails > 0) == ("support" in options or top_p is not None)


def test_the_cache_keeps_one_cut_per_prior_and_gives_the_same_votes():
    """A retry at the same position reuses the cut of each prior (or, for mixing alone without top-p, the mixed
    rows), and votes as a fresh computation does."""
    logits = torch.from_numpy(_logits(16, 200, 8))
    priors = [_public_prior(200, 1.0, **options) for options in _prior_options()[3:5]]
    mix_only = _public_prior(200, 1.0, mix=0.3)
    cache = {}
    for retry in range(6):
        key = StepKey(4, 0, retry)
        for prior in priors:
            np.testing.assert_array_equal(device_votes(logits, key, top_p=0.9, public=prior, cache=cache),
                                          device_votes(logits, key, top_p=0.9, public=prior))
        np.testing.assert_array_equal(device_votes(logits, key, public=mix_only, cache=cache),
                                      device_votes(logits, key, public=mix_only))
    assert sorted(k[0] == "mixture" for k in cache) == [False, False, True]
