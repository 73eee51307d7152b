"""The public support sized by measurement, on public records only.

A public top-``k`` support (:class:`~ensembles.public_prior.PublicSupport`) makes every token the public model ranks
below ``k`` unreleasable, and every token inside it a candidate the noise must be calibrated over: too small and
the teachers' tokens fall outside it (their votes land in the tail, the step fails), too large and the noise alone
clears a threshold more often (docs/generation.md, "Noise that decides").  A fixed ``k = 50`` is right for no
corpus in particular.

:func:`measure_top_k` sizes it on records the user declared public (``--public-examples``): each public example is
continued by the public model from the prompt it would write from (the template's header and the *other* public
examples of its label, then the open slot), token by token with the example's own tokens forced, and at each
position the rank of the example's token in the public model's next-token distribution is read (ties by token
id, as the support chooses).  ``k`` is the smallest size whose top-``k`` holds the true token at ``coverage`` of
the positions.  Nothing private enters: the prompts and the continuations are public records, so the size is public
and free (no budget), like the support itself (paper Section 3.2, Observation 1: data-independent transforms before
the vote change no privacy claim).
"""

from __future__ import annotations

import math
import sys

import attr
import numpy as np

from pate_accountant.validation import check_real

__all__ = ["NEVER", "SupportSize", "measure_top_k", "token_rank"]

#: The rank of a token no support holds (probability 0).
NEVER = sys.maxsize
#: The share of the public examples' tokens the measured support holds by default.
DEFAULT_COVERAGE = 0.9


@attr.s(frozen=True, slots=True)
class SupportSize:
    """What :func:`measure_top_k` found: ``top_k``, the smallest support holding the true token at ``coverage`` of
    the ``positions`` measured (``covered``: the share it holds), and the share a top-50 held, for comparison."""

    top_k: int = attr.ib()
    coverage: float = attr.ib()
    positions: int = attr.ib()
    covered: float = attr.ib()
    covered_by_50: float = attr.ib()

    def as_dict(self) -> dict:
        return attr.asdict(self)


def token_rank(ids: np.ndarray, probs: np.ndarray, token: int) -> int:
    """The 0-based rank of ``token`` in a next-token distribution given as ``(ids, probs)`` (decreasing
    probability, ties by token id, as :meth:`~ensembles.public_prior.PublicSupport.select` orders): the top-``k``
    support holds it iff the rank is below ``k``.  No support holds a token of probability 0 (or an unlisted one):
    its rank is :data:`NEVER`."""
    ids, probs = np.asarray(ids), np.asarray(probs, dtype=np.float64)
    at = np.flatnonzero(ids == token)
    if at.size == 0 or probs[at[0]] <= 0:
        return NEVER
    p = probs[at[0]]
    return int(np.count_nonzero(probs > p) + np.count_nonzero((probs == p) & (ids < token)))


def measure_top_k(backend, contexts, *, coverage: float = DEFAULT_COVERAGE) -> SupportSize:
    """The public top-``k`` that holds the true token at ``coverage`` of the positions of ``contexts``: a list of
    ``(shared_prefix, prompt, continuation)`` strings, all public (module docstring).  Each continuation is forced
    token by token; contexts with the same shared prefix are run side by side when the backend has
    ``append_each`` (:class:`~ensembles.backends.transformers_backend.TransformersBackend`), one by one otherwise.
    The backend must be untransformed (temperature 1, no top-p): the support is chosen on the public model's
    own distribution."""
    coverage = check_real("coverage", coverage, minimum=0.0, maximum=1.0, min_open=True)
    contexts = [tuple(c) for c in contexts]
    if not contexts or any(len(c) != 3 or not all(isinstance(x, str) for x in c) for c in contexts):
        raise ValueError("contexts must be a non-empty list of (shared_prefix, prompt, continuation) strings")
    ranks: list[int] = []
    by_prefix: dict = {}
    for prefix, prompt, continuation in contexts:
        forced = backend.encode(continuation)
        if forced:
            by_prefix.setdefault(prefix, []).append((prompt, forced))
    if not by_prefix:
        raise ValueError("the continuations hold no token to measure")
    side_by_side = hasattr(backend, "append_each")
    for prefix, rows in by_prefix.items():
        groups = [rows] if side_by_side else [[row] for row in rows]
        for group in groups:
            ranks.extend(_forced_ranks(backend, prefix, group))
    ranks_array = np.sort(np.asarray(ranks, dtype=np.int64))
    top_k = min(int(ranks_array[math.ceil(coverage * ranks_array.size) - 1]) + 1, int(backend.vocab_size))
    return SupportSize(top_k=top_k, coverage=coverage, positions=int(ranks_array.size),
                       covered=float(np.mean(ranks_array < top_k)), covered_by_50=float(np.mean(ranks_array < 50)))


def _forced_ranks(backend, prefix: str, rows) -> list[int]:
    """The rank of every forced token of ``rows`` (``(prompt, token ids)``) after ``prefix + prompt``."""
    backend.begin([prompt for prompt, _ in rows], shared_prefix=prefix or None)
    position, ranks = [0] * len(rows), []
    while True:
        active = [int(i) for i in backend.active_teachers()]
        dists = backend.distributions()
        going, tokens, ended = [], [], []
        for row, i in enumerate(active):
            ids, probs = dists.row(row)
            token = rows[i][1][position[i]]
            ranks.append(token_rank(ids, probs, token))
            position[i] += 1
            if position[i] == len(rows[i][1]):
                ended.append(i)
            else:
                going.append(i)
                tokens.append(token)
        if not going:
            return ranks
        if ended:
            backend.drop_teachers(ended)
        if len(rows) == 1:
            backend.append(tokens[0])
        else:
            backend.append_each(tokens)
