"""``SampledApiBackend``: next-token distributions estimated by repeated sampling (sampling-only APIs).

Estimator (docs/generation.md, "Sampling-only APIs").  For each teacher the backend draws ``m``
next tokens ``y_1..y_m`` from the teacher (``sample_fn``) and uses the empirical distribution
``p_hat_j = #{s: y_s = j} / m``.  Each ``p_hat_j`` is unbiased with standard error
``sqrt(p_j (1 - p_j) / m)``; for a distribution with support size ``k``,
``E[TV(p_hat, p)] <= (1/2) sum_j sqrt(p_j (1 - p_j) / m) <= sqrt(k / (4 m))`` (Cauchy-Schwarz).

Privacy is unaffected (paper Observation 1, Section "Implementation"): teacher ``i``'s estimate is a
function of teacher ``i``'s own outputs and of randomness independent of the data, so changing one
teacher's data still changes only that teacher's vote; the DP/threshold guarantee of the aggregator
holds for the estimated distributions exactly as for the true ones.  Only utility depends on ``m``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ensembles.backends.base import ContextBackend
from ensembles.backends.callable_tokenizer import CallableTokenizer
from ensembles.distributions import TeacherDistributions
from pate_accountant.validation import check_int

__all__ = ["SampledApiBackend", "empirical_distribution", "expected_tv_bound"]


def expected_tv_bound(support_size: int, num_samples: int) -> float:
    """``sqrt(k / (4 m))``: an upper bound on ``E[TV(p_hat, p)]`` for the empirical distribution of ``m``
    samples from a distribution with support size ``k``."""
    support_size = check_int("support_size", support_size, minimum=1)
    num_samples = check_int("num_samples", num_samples, minimum=1)
    return math.sqrt(support_size / (4.0 * num_samples))


def empirical_distribution(samples, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(token_ids, frequencies)`` of a list of sampled token ids."""
    samples = np.asarray(samples)
    if samples.ndim != 1 or samples.size == 0:
        raise ValueError("sample_fn must return a non-empty 1-d list of token ids")
    if samples.dtype.kind not in "iu":
        raise TypeError(f"sample_fn must return integer token ids, got dtype {samples.dtype}")
    if samples.min() < 0 or samples.max() >= vocab_size:
        raise ValueError(f"sample_fn returned a token id outside [0, {vocab_size})")
    tokens, counts = np.unique(samples.astype(np.int64), return_counts=True)
    return tokens, counts / samples.size


class SampledApiBackend(CallableTokenizer, ContextBackend):
    """``SampledApiBackend(sample_fn, num_samples, *, vocab_size, encode=None, decode=None,
    eos_token_id=None, text_contexts=False, seed=None)``.

    ``sample_fn(context, num_samples, rng) -> list of token ids`` returns ``num_samples`` independent
    next-token samples for one teacher's context.  The context is the teacher's token ids (shared prefix +
    prompt + response so far), or, with ``text_contexts=True``, ``decode`` of them.  ``encode`` is needed
    for text prompts.  ``seed`` seeds the sampling randomness; it is re-seeded at every ``begin`` so that
    runs are reproducible.  The estimates are the empirical distributions (module docstring).
    """

    _NO_ENCODE = "this SampledApiBackend has no encode: give prompts as token-id lists"

    def __init__(self, sample_fn: Callable, num_samples: int, *, vocab_size: int, encode=None, decode=None,
                 eos_token_id=None, text_contexts: bool = False, seed=None):
        if not callable(sample_fn):
            raise TypeError("sample_fn must be callable")
        self._sample_fn = sample_fn
        self._m = check_int("num_samples", num_samples, minimum=1)
        self._vocab_size = check_int("vocab_size", vocab_size, minimum=1)
        if eos_token_id is not None:
            eos_token_id = check_int("eos_token_id", eos_token_id, minimum=0)
            if eos_token_id >= self._vocab_size:
                raise ValueError("eos_token_id must lie in the vocabulary")
        self._eos = eos_token_id
        self._encode, self._decode = encode, decode
        if text_contexts and decode is None:
            raise ValueError("text_contexts=True needs decode")
        self._text_contexts = bool(text_contexts)
        self._seed = seed
        self._rng = np.random.default_rng(seed)

    @property
    def num_samples(self) -> int:
        return self._m

    def decode(self, token_ids) -> str:
        if self._decode is None:
            return " ".join(str(int(t)) for t in token_ids)
        return self._decode(list(token_ids))

    def begin(self, teacher_prompts, shared_prefix=None) -> None:
        super().begin(teacher_prompts, shared_prefix)
        self._rng = np.random.default_rng(self._seed)

    def next_token_distributions(self, contexts) -> TeacherDistributions:
        ids, probs = [], []
        for context in contexts:
            context = list(context)
            query = self._decode(context) if self._text_contexts else context
            samples = list(self._sample_fn(query, self._m, self._rng))
            if len(samples) != self._m:
                raise ValueError(f"sample_fn returned {len(samples)} samples, expected {self._m}")
            tokens, freqs = empirical_distribution(samples, self._vocab_size)
            ids.append(tokens)
            probs.append(freqs)
        return TeacherDistributions.from_sparse(ids, probs, self._vocab_size)
