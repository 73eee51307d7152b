"""Coordinated votes from logits, with shared noise keyed by token id (paper Section 3, Algorithm 1).

Algorithm 1 gives every token ``j`` of the vocabulary one shared ``u_j ~ Exp(1)`` per draw, and teacher ``i``
votes ``argmax_j p_ij / u_j``.  Two things make that usable at scale:

* **Noise keyed by token id.**  :func:`shared_noise` makes ``u_j`` a counter-based function of
  ``(run key, step, retry, token id)``: the ``j``-th 64-bit word of a Philox stream keyed by the other three
  (numpy's ``Philox``, a counter-based generator), turned into a uniform in ``(0, 1)`` and then into
  ``-log U``.  A teacher's vote therefore never depends on which other teachers share its batch, process or
  worker: every shard computes the same ``u`` and the votes agree exactly with those of one process.  The tail
  vote (the mass that top-p dropped) has its own ``u_tail`` from a separate stream of the same key.
* **The exponential-race form.**  ``argmax_j p_ij / u_j = argmax_j (log p_ij - log u_j)``, and
  ``log p_ij = logit_ij / T - logsumexp_j(logit_ij / T)``, whose second term does not depend on ``j``:
  :func:`race_votes` takes the argmax of ``logit_ij / T - log u_j`` directly on the logits, in float32,
  with no softmax, no ``1/p`` and no ``u/p`` tensors.  With top-p the dropped tokens are one tail outcome of
  mass ``tail_i``, raced as ``log tail_i - log u_tail`` against the kept tokens' normalised log-probabilities;
  only then is the row's log-normaliser needed.

The law of the votes is Algorithm 1's for every fixed key (the key plays the role of the shared
randomness ``rng``; it is public, like the sampling seed of :class:`~ensembles.PrivateGenerator`).
``tests/test_keyed_votes.py`` proves equality of votes with :func:`~ensembles.coordinated_votes_from_noise`
and the literal algorithm on the same noise, with and without top-p tails.
"""

from __future__ import annotations

import attr
import numpy as np

from ensembles.distributions import TOP_P_TOLERANCE, top_p_keep
from ensembles.histograms import (
    TAIL_VOTE,
    coordinated_votes_from_noise,
    independent_votes_from_uniforms,
)
from pate_accountant.validation import check_int, check_real

__all__ = ["HISTOGRAMS", "StepKey", "keyed_votes", "race_votes", "shared_noise", "teacher_uniforms"]

#: The two vote laws: Hot PATE's coordinated votes (Algorithm 1) and Cold PATE's independent ones.
HISTOGRAMS = ("coordinated", "independent")

_MAX_KEY = 2**63 - 1
#: Stream labels under one step key: the tokens' noise, the tail's, and the teachers' own uniforms (Cold PATE).
_TOKENS, _TAIL, _TEACHERS = 0, 1, 2


def _check_field(instance, attribute, value):
    check_int(attribute.name, value, minimum=0, maximum=_MAX_KEY)


@attr.s(frozen=True, slots=True)
class StepKey:
    """What the shared noise of one charged run is a function of: the run's ``run_key`` (public: drawn once
    per run, like a sampling seed), the ``step`` (token position) and the ``retry`` at that position."""

    run_key: int = attr.ib(validator=_check_field)
    step: int = attr.ib(default=0, validator=_check_field)
    retry: int = attr.ib(default=0, validator=_check_field)

    def _stream(self, label: int) -> np.random.Philox:
        state = np.random.SeedSequence([self.run_key, self.step, self.retry, label]).generate_state(2, np.uint64)
        return np.random.Philox(key=state)


def shared_noise(key: StepKey, vocab_size: int) -> tuple[np.ndarray, float]:
    """``(u, u_tail)``: ``u[j] ~ Exp(1)`` for every token id ``j < vocab_size`` and the tail's ``u_tail``, all
    independent, each a function of ``key`` and its token id alone (``u[j]`` is the ``j``-th word of the
    key's token stream, so it is the same for any ``vocab_size > j``)."""
    if not isinstance(key, StepKey):
        raise TypeError(f"key must be a StepKey, got {type(key).__name__}")
    vocab_size = check_int("vocab_size", vocab_size, minimum=1)
    words = key._stream(_TOKENS).random_raw(vocab_size)
    tail_word = key._stream(_TAIL).random_raw(1)
    return _exponential(words), float(_exponential(tail_word)[0])


def teacher_uniforms(key: StepKey, teacher_ids) -> np.ndarray:
    """Cold PATE's randomness: one ``U_i ~ U[0, 1)`` per teacher, the word ``i`` (the teacher's original index)
    of the key's teacher stream, so that a teacher's independent vote does not depend on its shard either."""
    if not isinstance(key, StepKey):
        raise TypeError(f"key must be a StepKey, got {type(key).__name__}")
    ids = np.asarray(teacher_ids)
    if ids.ndim != 1 or (ids.size and (ids.dtype.kind not in "iu" or ids.min() < 0)):
        raise ValueError("teacher_ids must be a 1-d array of non-negative teacher indices")
    if ids.size == 0:
        return np.zeros(0)
    words = key._stream(_TEACHERS).random_raw(int(ids.max()) + 1)[ids]
    return (words >> np.uint64(11)).astype(np.float64) * 2.0**-53


def check_histograms(histograms: str) -> str:
    if histograms not in HISTOGRAMS:
        raise ValueError(f"histograms must be one of {HISTOGRAMS}, got {histograms!r}")
    return histograms


def keyed_votes(teachers, key: StepKey, *, histograms: str = "coordinated", teacher_ids=None) -> np.ndarray:
    """One vote per teacher of ``teachers`` (a :class:`~ensembles.TeacherDistributions`, already at the sampling
    temperature and top-p) on the randomness of ``key``: Algorithm 1 on :func:`shared_noise` (Hot), or
    inverse-CDF sampling on :func:`teacher_uniforms` (Cold; ``teacher_ids``: the rows' original teacher
    indices, default ``0..n-1``).  The host form of a backend's ``votes``; returns ``int32`` votes."""
    check_histograms(histograms)
    if histograms == "coordinated":
        noise, tail_noise = shared_noise(key, teachers.vocab_size)
        votes = coordinated_votes_from_noise(teachers, noise[None, :], np.array([tail_noise]))
    else:
        ids = np.arange(teachers.num_teachers) if teacher_ids is None else np.asarray(teacher_ids)
        if ids.shape != (teachers.num_teachers,):
            raise ValueError(f"teacher_ids must hold one index per teacher ({teachers.num_teachers}), got {ids.shape}")
        votes = independent_votes_from_uniforms(teachers, teacher_uniforms(key, ids)[None, :])
    return votes[0].astype(np.int32)


def _exponential(words: np.ndarray) -> np.ndarray:
    """``-log U`` for ``U = (top 53 bits + 1/2) / 2^53``, strictly inside ``(0, 1)``: finite and positive."""
    uniform = ((words >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
    return -np.log(uniform)


def race_votes(logits, noise, tail_noise=None, *, temperature: float = 1.0, top_p: float | None = None,
               dtype=np.float32) -> np.ndarray:
    """Algorithm 1's votes of the ``n`` teachers whose next-token logits are the rows of ``logits`` (``(n, V)``),
    on the shared noise ``noise`` (``(V,)``, from :func:`shared_noise`): ``argmax_j (logit_ij / T - log u_j)``.

    ``top_p`` (optional): each teacher keeps its smallest set of most likely tokens reaching mass ``top_p``
    (the rule of :meth:`TeacherDistributions.top_p`); the dropped mass is one tail outcome with noise
    ``tail_noise``, and a teacher whose tail wins votes :data:`~ensembles.TAIL_VOTE`.  The race runs in
    ``dtype`` (float32 by default; float64 reproduces the exact float64 path).  Returns ``int32`` votes.
    """
    logits = np.asarray(logits)
    if logits.ndim != 2 or logits.dtype.kind != "f":
        raise TypeError(f"logits must be a 2-d float array, got dtype {logits.dtype} and shape {logits.shape}")
    noise = np.asarray(noise, dtype=np.float64)
    if noise.shape != (logits.shape[1],):
        raise ValueError(f"noise must have shape ({logits.shape[1]},), got {noise.shape}")
    if not (np.isfinite(noise).all() and (noise > 0).all()):
        raise ValueError("noise must hold finite positive Exp(1) draws")
    temperature = check_real("temperature", temperature, minimum=0.0, min_open=True)
    scaled = logits.astype(dtype, copy=False) / dtype(temperature)
    minus_log_u = (-np.log(noise)).astype(dtype)
    if top_p is None or top_p >= 1.0:
        return np.argmax(scaled + minus_log_u, axis=1).astype(np.int32)
    top_p = check_real("top_p", top_p, minimum=0.0, maximum=1.0, min_open=True)
    if tail_noise is None:
        raise ValueError("tail_noise is required with top_p < 1")
    tail_noise = check_real("tail_noise", tail_noise, minimum=0.0, min_open=True)
    keep, logp, tail = _top_p_cut(scaled, top_p)
    race = np.where(keep, logp + minus_log_u, dtype(-np.inf))
    votes = np.argmax(race, axis=1)
    best = race[np.arange(race.shape[0]), votes]
    with np.errstate(divide="ignore"):
        tail_score = (np.log(tail) - np.log(tail_noise)).astype(dtype)
    votes = np.where(tail_score > best, TAIL_VOTE, votes)
    return votes.astype(np.int32)


#: The cut looks first at the tokens within ``margin`` nats of each row's most likely one, for these margins in
#: turn: a row's cut is settled once the tokens looked at hold mass ``top_p`` (a row with a flat distribution
#: needs a wider window; the last margin takes the whole row).
TOP_P_MARGINS = (8.0, 16.0, 32.0, np.inf)


def _top_p_cut(scaled: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The top-p rule of :meth:`TeacherDistributions.top_p` on rows of scaled logits: ``(keep, logp, tail)``
    with ``keep`` the kept tokens, ``logp`` the normalised log-probabilities (in ``scaled``'s dtype) and
    ``tail`` the dropped mass per row.  Probabilities are float64, so the cut is the host rule's.

    Only the tokens within a margin of each row's maximum are sorted (:data:`TOP_P_MARGINS`).  Those tokens
    are a prefix of the row in decreasing order, so the rule keeps the same tokens among them as on the whole
    row, and once their mass reaches ``top_p`` no token outside is kept."""
    n, vocab = scaled.shape
    wide = scaled.astype(np.float64)
    wide -= wide.max(axis=1, keepdims=True)
    wide -= np.log(np.exp(wide).sum(axis=1, keepdims=True))  # normalised log-probabilities, float64
    keep = np.zeros((n, vocab), dtype=bool)
    tail = np.empty(n)
    rows = np.arange(n)
    for margin in TOP_P_MARGINS:
        sub = wide[rows]
        r, c = np.nonzero(sub >= sub.max(axis=1, keepdims=True) - margin)
        values = sub[r, c]
        order = np.lexsort((c, -values, r))  # by row, then decreasing probability, ties by token id
        r, c, probs = r[order], c[order], np.exp(values[order])
        running = np.cumsum(probs)
        starts = np.searchsorted(r, np.arange(rows.size))
        ends = np.append(starts[1:], r.size)
        offset = np.concatenate(([0.0], running))[starts]
        kept = top_p_keep(probs, running - probs - offset[r], top_p)
        mass = running[ends - 1] - offset
        done = (mass >= top_p - TOP_P_TOLERANCE) | np.isinf(margin)
        settled = done[r] & kept
        keep[rows[r[settled]], c[settled]] = True
        kept_mass = np.bincount(r[settled], weights=probs[settled], minlength=rows.size)
        tail[rows[done]] = np.clip(1.0 - kept_mass[done], 0.0, 1.0)
        rows = rows[~done]
        if rows.size == 0:
            break
    logp = wide.astype(scaled.dtype)
    return keep, logp, tail
