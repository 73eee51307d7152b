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

from ensembles.distributions import top_p_keep
from ensembles.histograms import TAIL_VOTE
from pate_accountant.validation import check_int, check_real

__all__ = ["StepKey", "race_votes", "shared_noise"]

_MAX_KEY = 2**63 - 1
#: Stream labels under one step key: the tokens' noise and the tail's.
_TOKENS, _TAIL = 0, 1


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


#: How many of each row's largest logits :func:`_top_p_cut` sorts first; rows whose top-p set is larger are
#: sorted in full.
TOP_P_CANDIDATES = 1024


def _top_p_cut(scaled: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The top-p rule of :meth:`TeacherDistributions.top_p` on rows of scaled logits: ``(keep, logp, tail)``
    with ``keep`` the kept tokens, ``logp`` the normalised log-probabilities (in ``scaled``'s dtype) and
    ``tail`` the dropped mass per row.  Probabilities are float64, so the cut is the host rule's; only each
    row's :data:`TOP_P_CANDIDATES` largest logits are sorted unless its kept set reaches beyond them."""
    n, vocab = scaled.shape
    wide = scaled.astype(np.float64)
    row_max = wide.max(axis=1)
    log_norm = row_max + np.log(np.exp(wide - row_max[:, None]).sum(axis=1))
    k = min(TOP_P_CANDIDATES, vocab)
    candidates = np.argpartition(-wide, k - 1, axis=1)[:, :k] if k < vocab else np.tile(np.arange(vocab), (n, 1))
    keep = np.zeros((n, vocab), dtype=bool)
    tail = np.empty(n)

    def cut(rows, candidates):
        """Apply the rule to ``rows`` over their ``candidates``; return the rows whose cut needs more tokens."""
        cand_logp = np.take_along_axis(wide[rows], candidates, axis=1) - log_norm[rows, None]
        # Sort by decreasing probability, ties by token id (the order of TeacherDistributions.top_p).
        order = np.lexsort((candidates, -cand_logp), axis=1)
        ids = np.take_along_axis(candidates, order, axis=1)
        probs = np.exp(np.take_along_axis(cand_logp, order, axis=1))
        kept = top_p_keep(probs, np.cumsum(probs, axis=1) - probs, top_p)
        short = kept[:, -1] if ids.shape[1] < vocab else np.zeros(rows.size, dtype=bool)
        keep[rows[~short, None], ids[~short]] = kept[~short]
        tail[rows[~short]] = np.clip(1.0 - np.where(kept[~short], probs[~short], 0.0).sum(axis=1), 0.0, 1.0)
        return rows[short]

    short = cut(np.arange(n), candidates)
    if short.size:
        cut(short, np.tile(np.arange(vocab), (short.size, 1)))
    logp = scaled - log_norm[:, None].astype(scaled.dtype)
    return keep, logp, tail
