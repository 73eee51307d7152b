"""Shared noise keyed by token id and the exponential-race vote kernel (ensembles/keyed_votes.py).

* The noise of a token is a function of the step key and its id alone: the same for any vocabulary size and
  in every process, independent across keys, and Exp(1) (Kolmogorov-Smirnov at a fixed key).
* On the same noise, the race on logits gives exactly the votes of Algorithm 1 (``coordinated_votes_from_noise``
  and the literal algorithm) in float64, with and without top-p tails; in float32 it agrees on every vote of a
  fixed draw (near-ties are the only possible difference).
* Shards: any split of the teachers gives the votes of the whole ensemble.
"""

import ast
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from ensembles import TAIL_VOTE, TeacherDistributions, coordinated_votes_from_noise
from ensembles.histograms import literal_coordinated_votes
from ensembles import keyed_votes
from ensembles.keyed_votes import StepKey, race_votes, shared_noise


def _softmax(x):
    z = x - x.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _logits(n, vocab, seed, scale=3.0):
    return np.random.default_rng(seed).normal(scale=scale, size=(n, vocab))


def test_noise_is_a_function_of_the_key_and_the_token_id():
    key = StepKey(run_key=12345, step=7, retry=1)
    u, tail = shared_noise(key, 5000)
    small, small_tail = shared_noise(key, 40)
    np.testing.assert_array_equal(small, u[:40])  # the same for any vocabulary size
    assert small_tail == tail
    again, _ = shared_noise(StepKey(12345, 7, 1), 5000)
    np.testing.assert_array_equal(again, u)
    for other in (StepKey(12346, 7, 1), StepKey(12345, 8, 1), StepKey(12345, 7, 2)):
        assert not np.array_equal(shared_noise(other, 5000)[0], u)
    assert np.isfinite(u).all() and (u > 0).all() and tail > 0
    # Exp(1): a KS test at a fixed key (deterministic; the p-value of the true law is uniform).
    assert stats.kstest(u, "expon").pvalue > 1e-3


def test_noise_is_the_same_in_another_process():
    code = ("from ensembles.keyed_votes import StepKey, shared_noise; "
            "u, t = shared_noise(StepKey(99, 3, 0), 6); print(repr((u.tolist(), t)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    u, tail = shared_noise(StepKey(99, 3, 0), 6)
    assert ast.literal_eval(out) == (u.tolist(), tail)


def test_bad_keys_and_inputs_are_refused():
    with pytest.raises(ValueError, match="run_key"):
        StepKey(-1)
    with pytest.raises(TypeError, match="StepKey"):
        shared_noise(5, 10)
    with pytest.raises(ValueError, match="noise must have shape"):
        race_votes(np.zeros((2, 3)), np.ones(4))
    with pytest.raises(ValueError, match="tail_noise"):
        race_votes(np.zeros((2, 3)), np.ones(3), top_p=0.5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_race_equals_algorithm_1_on_the_same_noise(temperature):
    n, vocab, draws = 40, 300, 20
    logits = _logits(n, vocab, 1)
    teachers = TeacherDistributions.from_dense(_softmax(logits / temperature))
    for step in range(draws):
        u, _ = shared_noise(StepKey(5, step), vocab)
        expected = coordinated_votes_from_noise(teachers, u[None, :])[0]
        np.testing.assert_array_equal(race_votes(logits, u, temperature=temperature, dtype=np.float64), expected)
        np.testing.assert_array_equal(literal_coordinated_votes(teachers, u[None, :])[0], expected)
        np.testing.assert_array_equal(race_votes(logits, u, temperature=temperature), expected)  # float32


#: The default margins, and narrow ones under which most rows need the second or the last (whole-row) look.
MARGINS = [keyed_votes.TOP_P_MARGINS, (0.25, 1.0, np.inf)]


@pytest.mark.parametrize("margins", MARGINS)
@pytest.mark.parametrize("top_p", [0.9, 0.5])
def test_race_with_top_p_tails_equals_algorithm_1(top_p, margins, monkeypatch):
    monkeypatch.setattr(keyed_votes, "TOP_P_MARGINS", margins)
    n, vocab, draws = 30, 200, 30
    logits = _logits(n, vocab, 2, scale=2.0)
    teachers = TeacherDistributions.from_dense(_softmax(logits)).top_p(top_p)
    assert (teachers.tail > 0).any()
    tail_votes = 0
    for step in range(draws):
        u, u_tail = shared_noise(StepKey(6, step), vocab)
        expected = coordinated_votes_from_noise(teachers, u[None, :], np.array([u_tail]))[0]
        literal = literal_coordinated_votes(teachers, u[None, :], np.array([u_tail]))[0]
        np.testing.assert_array_equal(literal, expected)
        got = race_votes(logits, u, u_tail, top_p=top_p, dtype=np.float64)
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(race_votes(logits, u, u_tail, top_p=top_p), expected)  # float32
        tail_votes += int((got == TAIL_VOTE).sum())
    assert tail_votes > 0  # the tail outcome is exercised


def test_any_split_of_the_teachers_gives_the_same_votes():
    logits = _logits(64, 500, 3)
    key = StepKey(77, 4, 0)
    u, u_tail = shared_noise(key, 500)
    whole = race_votes(logits, u, u_tail, top_p=0.8)
    for shards in (1, 2, 4):
        parts = []
        for rows in np.array_split(np.arange(64), shards):
            shard_u, shard_tail = shared_noise(key, 500)  # each shard computes the noise itself
            parts.append(race_votes(logits[rows], shard_u, shard_tail, top_p=0.8))
        np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_votes_are_coordinated_and_follow_each_teachers_distribution():
    """Claim 1: each teacher's vote is distributed as its own p; identical teachers always agree."""
    vocab, draws = 6, 4000
    logits = np.log(np.array([[0.5, 0.2, 0.1, 0.1, 0.05, 0.05]] * 3))
    votes = np.array([race_votes(logits, shared_noise(StepKey(1, s), vocab)[0]) for s in range(draws)])
    assert (votes == votes[:, :1]).all()  # identical teachers vote together
    observed = np.bincount(votes[:, 0], minlength=vocab)
    assert stats.chisquare(observed, draws * np.exp(logits[0])).pvalue > 1e-3
