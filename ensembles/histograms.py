"""Coordinated (Hot PATE) and independent (Cold PATE) teacher votes, and vote histograms.

* :func:`coordinated_votes` is Algorithm 1 (``CoordinatedHistogram``, paper Section 3): one shared
  ``u_j ~ Exp(1)`` per token per sample, and teacher ``i`` votes ``argmax_j p_ij / u_j``.  Each teacher's
  vote is distributed as ``p^(i)`` (Claim 1), and votes agree in bursts (Claim 2, Appendix C).
* :func:`independent_votes` is the Cold PATE ensemble ``H_ind`` (eq. 1): each teacher samples from its own
  distribution independently.

Both are vectorised over many samples and work on the sparse supports only: the work per sample is
one pass over the stored entries (``sum_i |supp p^(i)|``), never ``n x V``, and memory is bounded by
chunking over samples and teachers (``docs/performance.md``).

How the coordinated kernel avoids ``n x V``: only tokens in the union of the supports can win, so the
shared noise is drawn for those tokens (plus one column for the shared tail noise ``u_tail``).  Teachers
are grouped by support size into padded blocks (widths within a factor 1.25), and for each block
``argmin_j u_j * (1 / p_ij)`` is taken over a gathered ``(samples, teachers, width)`` array; padding has
``1 / p = inf`` and never wins.  ``argmin u/p`` is ``argmax p/u``.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ensembles.distributions import TeacherDistributions
from mechanisms.histogram import TAIL_VOTE, CountHistogram, HistogramBatch
from pate_accountant.validation import check_generator, check_int

__all__ = [
    "TAIL_VOTE",
    "VoteHistogram",
    "batch_from_votes",
    "coordinated_votes",
    "coordinated_votes_from_noise",
    "count_votes",
    "histograms_from_votes",
    "independent_votes",
    "independent_votes_from_uniforms",
    "literal_coordinated_votes",
]

#: Elements of one gathered block (samples x teachers x width); about 1 MB of float64, cache-sized.
_BLOCK_ELEMENTS = 1 << 17
#: Shared-noise elements drawn at once (samples x union tokens); 8 MB of float64.
_NOISE_ELEMENTS = 1 << 20
_TINY = np.finfo(np.float64).tiny
#: At most this many worker threads split the samples (numpy releases the GIL in the kernel's loops).
_MAX_THREADS = 8


def _threads(num_threads: int | None) -> int:
    if num_threads is None:
        available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return max(1, min(_MAX_THREADS, available))
    return check_int("num_threads", num_threads, minimum=1)


def _run_split(kernel, plan, inputs: np.ndarray, out: np.ndarray, threads: int) -> None:
    """Run ``kernel(plan, inputs[rows], out[rows])`` on disjoint row ranges in ``threads`` threads.

    Rows are independent samples and every random number is drawn before the split, so the result
    does not depend on the number of threads.
    """
    rows = inputs.shape[0]
    parts = min(threads, max(1, rows // 8))
    if parts <= 1:
        kernel(plan, inputs, out)
        return
    bounds = np.linspace(0, rows, parts + 1).astype(int)
    with ThreadPoolExecutor(max_workers=parts) as pool:
        futures = [pool.submit(kernel, plan, inputs[a:b], out[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        for future in futures:
            future.result()


class VoteHistogram(CountHistogram):
    """One vote histogram ``c`` (``c_j`` = number of teachers that voted ``j``); tail votes count in ``n``."""

    __slots__ = ()

    @classmethod
    def from_votes(cls, votes, vocab_size: int) -> "VoteHistogram":
        """From one vote per teacher (``TAIL_VOTE`` for a vote into a truncated tail)."""
        vocab_size = check_int("vocab_size", vocab_size, minimum=1)
        votes = _check_votes(votes, vocab_size, ndim=1)
        tokens, counts = np.unique(votes[votes != TAIL_VOTE], return_counts=True)
        return cls(tokens, counts, num_teachers=votes.size, vocab_size=vocab_size)


def _check_votes(votes, vocab_size: int, ndim: int) -> np.ndarray:
    array = np.asarray(votes)
    if array.dtype.kind not in "iu":
        raise TypeError(f"votes must be integer token ids, got dtype {array.dtype}")
    if array.ndim != ndim:
        shape = "(num_teachers,)" if ndim == 1 else "(num_samples, num_teachers)"
        raise ValueError(f"votes must have shape {shape}, got {array.shape}")
    array = array.astype(np.int64, copy=False)
    bad = (array < TAIL_VOTE) | (array >= vocab_size)
    if bad.any():
        raise ValueError(f"vote {int(array[bad][0])} is neither a token id in [0, {vocab_size}) nor TAIL_VOTE")
    return array


def count_votes(votes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sparse counts of a ``(num_samples, num_teachers)`` vote matrix.

    Returns ``(sample, token, count)`` arrays sorted by sample then token, one entry per token with a
    positive count in that sample; tail votes are left out.
    """
    votes = np.asarray(votes)
    if votes.ndim != 2:
        raise ValueError(f"votes must have shape (num_samples, num_teachers), got {votes.shape}")
    num_samples, n = votes.shape
    if num_samples == 0 or n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    ordered = np.sort(votes, axis=1)
    starts = np.ones(ordered.shape, dtype=bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    sample, position = np.nonzero(starts)
    flat_starts = sample * n + position
    ends = np.append(flat_starts[1:], num_samples * n)
    # A run never crosses a row boundary because every row starts a run.
    counts = ends - flat_starts
    tokens = ordered.ravel()[flat_starts]
    keep = tokens != TAIL_VOTE
    return sample[keep].astype(np.int64), tokens[keep].astype(np.int64), counts[keep].astype(np.int64)


def batch_from_votes(votes, vocab_size: int) -> HistogramBatch:
    """The rows of a ``(num_samples, num_teachers)`` vote matrix as one :class:`HistogramBatch`."""
    votes = _check_votes(votes, check_int("vocab_size", vocab_size, minimum=1), ndim=2)
    sample, tokens, counts = count_votes(votes)
    return HistogramBatch(sample, tokens, counts, votes.shape[0], votes.shape[1])


def histograms_from_votes(votes, vocab_size: int) -> list[VoteHistogram]:
    """One :class:`VoteHistogram` per row of a ``(num_samples, num_teachers)`` vote matrix."""
    votes = _check_votes(votes, check_int("vocab_size", vocab_size, minimum=1), ndim=2)
    sample, tokens, counts = count_votes(votes)
    bounds = np.searchsorted(sample, np.arange(votes.shape[0] + 1))
    n = votes.shape[1]
    return [
        VoteHistogram(tokens[lo:hi], counts[lo:hi], num_teachers=n, vocab_size=vocab_size)
        for lo, hi in zip(bounds[:-1], bounds[1:])
    ]


# --------------------------------------------------------------------------------------------------
# Padded blocks of teachers, built once per TeacherDistributions and cached on it.


class _Block:
    __slots__ = ("teachers", "columns", "flat_columns", "inverse_probs", "last", "_cumulative")

    def __init__(self, teachers, columns, inverse_probs, last):
        self.teachers = teachers  # (b,) teacher indices
        self.columns = columns  # (b, w) union-column index of each entry (padding: 0)
        self.flat_columns = columns.ravel()
        self.inverse_probs = inverse_probs  # (b, w) 1/p (padding: inf)
        self.last = last  # (b,) index of the last real entry of each row
        self._cumulative = None

    @property
    def cumulative(self) -> np.ndarray:
        """(b, w) running sums of p along each row (padding repeats the row total); built on first use."""
        if self._cumulative is None:
            self._cumulative = np.cumsum(1.0 / self.inverse_probs, axis=1)
        return self._cumulative


class _VotePlan:
    """Union of supports, token of every union column, and the padded blocks."""

    __slots__ = ("union", "column_tokens", "blocks", "num_columns")

    def __init__(self, teachers: TeacherDistributions):
        # Union of the supports and each entry's column in it, by a lookup table over V (no sort).
        column_of_token = np.zeros(teachers.vocab_size, dtype=np.int64)
        column_of_token[teachers.token_ids] = 1
        union = np.flatnonzero(column_of_token)
        column_of_token[union] = np.arange(union.size)
        columns = column_of_token[teachers.token_ids]
        del column_of_token
        self.union = union
        lengths = teachers.support_sizes.copy()
        entry_teacher = teachers.teacher_of_entry()
        probs = teachers.probs
        has_tail = teachers.tail > 0
        if has_tail.any():
            # The tail of every teacher is one extra column with its own shared noise u_tail.
            tail_teachers = np.flatnonzero(has_tail)
            entry_teacher = np.concatenate([entry_teacher, tail_teachers])
            columns = np.concatenate([columns, np.full(tail_teachers.size, union.size)])
            probs = np.concatenate([probs, teachers.tail[tail_teachers]])
            order = np.argsort(entry_teacher, kind="stable")
            entry_teacher, columns, probs = entry_teacher[order], columns[order], probs[order]
            lengths = lengths + has_tail
        self.column_tokens = np.append(union, TAIL_VOTE).astype(np.int64)
        self.num_columns = union.size + (1 if has_tail.any() else 0)
        row_start = np.zeros(lengths.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=row_start[1:])
        position = np.arange(entry_teacher.size) - row_start[entry_teacher]

        self.blocks = []
        by_length = np.argsort(lengths, kind="stable")
        sorted_lengths = lengths[by_length]
        start = 0
        while start < by_length.size:
            width = int(sorted_lengths[start])
            limit = max(width + 8, int(np.ceil(width * 1.25)))
            stop = int(np.searchsorted(sorted_lengths, limit, side="right"))
            block_teachers = by_length[start:stop]
            width = int(sorted_lengths[stop - 1])
            self.blocks.append(self._make_block(block_teachers, width, entry_teacher, position, columns, probs))
            start = stop

    @staticmethod
    def _make_block(block_teachers, width, entry_teacher, position, columns, probs):
        b = block_teachers.size
        local = np.full(entry_teacher.max() + 1 if entry_teacher.size else 0, -1, dtype=np.int64)
        local[block_teachers] = np.arange(b)
        mask = local[entry_teacher] >= 0
        rows, cols = local[entry_teacher[mask]], position[mask]
        block_columns = np.zeros((b, width), dtype=np.intp)
        inverse = np.full((b, width), np.inf)
        block_columns[rows, cols] = columns[mask]
        inverse[rows, cols] = 1.0 / probs[mask]
        last = np.bincount(rows, minlength=b) - 1
        return _Block(block_teachers, block_columns, inverse, last)


def _plan(teachers: TeacherDistributions) -> _VotePlan:
    if not isinstance(teachers, TeacherDistributions):
        raise TypeError(f"teachers must be a TeacherDistributions, got {type(teachers).__name__}")
    plan = teachers._cache.get("vote_plan")
    if plan is None:
        plan = teachers._cache["vote_plan"] = _VotePlan(teachers)
    return plan


def _steps(block: _Block, num_samples: int):
    """Split (samples x block rows) into pieces of about ``_BLOCK_ELEMENTS`` gathered elements."""
    b, width = block.columns.shape
    rows_per_step = max(1, _BLOCK_ELEMENTS // max(1, width))
    for t0 in range(0, b, rows_per_step):
        t1 = min(b, t0 + rows_per_step)
        samples_per_step = max(1, _BLOCK_ELEMENTS // ((t1 - t0) * width))
        for s0 in range(0, num_samples, samples_per_step):
            yield t0, t1, s0, min(num_samples, s0 + samples_per_step)


def _coordinated_kernel(plan: _VotePlan, noise: np.ndarray, out: np.ndarray) -> None:
    """Votes for ``noise.shape[0]`` samples, given shared noise over the union columns."""
    np.maximum(noise, _TINY, out=noise)  # u = 0 (probability ~2^-64) would make 0 * inf = nan
    for block in plan.blocks:
        width = block.columns.shape[1]
        for t0, t1, s0, s1 in _steps(block, noise.shape[0]):
            flat = block.flat_columns[t0 * width : t1 * width]
            scores = np.take(noise[s0:s1], flat, axis=1, mode="clip").reshape(s1 - s0, t1 - t0, width)
            np.multiply(scores, block.inverse_probs[t0:t1], out=scores)
            winner = scores.argmin(axis=2)
            chosen = np.take_along_axis(block.columns[None, t0:t1, :], winner[:, :, None], axis=2)[:, :, 0]
            out[s0:s1, block.teachers[t0:t1]] = plan.column_tokens[chosen]


def coordinated_votes(
    teachers: TeacherDistributions, num_samples: int, rng: np.random.Generator, *, num_threads: int | None = None
) -> np.ndarray:
    """Algorithm 1 for ``num_samples`` independent draws of the shared randomness.

    Returns an ``int64`` array of shape ``(num_samples, num_teachers)``: row ``s`` holds every teacher's
    vote ``argmax_j p_ij / u_sj`` under the shared noise ``u_s`` (``TAIL_VOTE`` for a vote into the tail).
    ``num_threads`` (default: the available cores, at most 8) splits the samples between threads; the
    votes are the same for any number of threads.
    """
    num_samples = check_int("num_samples", num_samples, minimum=0)
    check_generator("rng", rng)
    threads = _threads(num_threads)
    plan = _plan(teachers)
    out = np.empty((num_samples, teachers.num_teachers), dtype=np.int64)
    rows = max(1, _NOISE_ELEMENTS // max(1, plan.num_columns))
    for s0 in range(0, num_samples, rows):
        s1 = min(num_samples, s0 + rows)
        noise = rng.standard_exponential((s1 - s0, plan.num_columns))
        _run_split(_coordinated_kernel, plan, noise, out[s0:s1], threads)
    return out


def coordinated_votes_from_noise(teachers: TeacherDistributions, noise, tail_noise=None) -> np.ndarray:
    """Algorithm 1 with the shared noise given: ``noise`` is ``(num_samples, vocab_size)`` of ``u_j``.

    ``tail_noise`` (shape ``(num_samples,)``) is ``u_tail``; it is required when a teacher has a tail.
    Backends that draw the noise on a device, and tests against the literal algorithm, use this form.
    """
    noise = np.asarray(noise, dtype=np.float64)
    if noise.ndim != 2 or noise.shape[1] != teachers.vocab_size:
        raise ValueError(f"noise must have shape (num_samples, {teachers.vocab_size}), got {noise.shape}")
    if not np.isfinite(noise).all() or (noise < 0).any():
        raise ValueError("noise must hold finite non-negative Exp(1) draws")
    plan = _plan(teachers)
    gathered = np.empty((noise.shape[0], plan.num_columns))
    gathered[:, : plan.union.size] = noise[:, plan.union]
    if plan.num_columns > plan.union.size:
        if tail_noise is None:
            raise ValueError("tail_noise is required: some teachers have a truncated tail")
        tail_noise = np.asarray(tail_noise, dtype=np.float64)
        if tail_noise.shape != (noise.shape[0],):
            raise ValueError(f"tail_noise must have shape ({noise.shape[0]},), got {tail_noise.shape}")
        gathered[:, -1] = tail_noise
    out = np.empty((noise.shape[0], teachers.num_teachers), dtype=np.int64)
    _run_split(_coordinated_kernel, plan, gathered, out, _threads(None))
    return out


def _independent_kernel(plan: _VotePlan, uniforms: np.ndarray, out: np.ndarray) -> None:
    """Inverse-CDF votes for ``uniforms.shape[0]`` samples, one uniform per (sample, teacher)."""
    for block in plan.blocks:
        for t0, t1, a0, a1 in _steps(block, uniforms.shape[0]):
            cumulative = block.cumulative[t0:t1]
            draw = uniforms[a0:a1, block.teachers[t0:t1]] * cumulative[:, -1]
            index = (cumulative[None, :, :] <= draw[:, :, None]).sum(axis=2)
            np.minimum(index, block.last[None, t0:t1], out=index)
            chosen = np.take_along_axis(block.columns[None, t0:t1, :], index[:, :, None], axis=2)[:, :, 0]
            out[a0:a1, block.teachers[t0:t1]] = plan.column_tokens[chosen]


def independent_votes(
    teachers: TeacherDistributions, num_samples: int, rng: np.random.Generator, *, num_threads: int | None = None
) -> np.ndarray:
    """Cold PATE: every teacher samples its own vote independently (inverse-CDF sampling).

    Returns an ``int64`` array of shape ``(num_samples, num_teachers)``; ``num_threads`` as in
    :func:`coordinated_votes`.
    """
    num_samples = check_int("num_samples", num_samples, minimum=0)
    check_generator("rng", rng)
    threads = _threads(num_threads)
    plan = _plan(teachers)
    n = teachers.num_teachers
    out = np.empty((num_samples, n), dtype=np.int64)
    rows = max(1, _NOISE_ELEMENTS // max(1, n))
    for s0 in range(0, num_samples, rows):
        s1 = min(num_samples, s0 + rows)
        _run_split(_independent_kernel, plan, rng.random((s1 - s0, n)), out[s0:s1], threads)
    return out


def independent_votes_from_uniforms(teachers: TeacherDistributions, uniforms) -> np.ndarray:
    """Cold PATE with the randomness given: ``uniforms`` is ``(num_samples, num_teachers)`` of ``U ~ U[0, 1)``,
    and teacher ``i`` votes the first entry of its row (in stored order, the tail last) whose running mass
    exceeds ``U_i`` times the row's total (inverse-CDF sampling, the kernel of :func:`independent_votes`)."""
    uniforms = np.asarray(uniforms, dtype=np.float64)
    if uniforms.ndim != 2 or uniforms.shape[1] != teachers.num_teachers:
        raise ValueError(f"uniforms must have shape (num_samples, {teachers.num_teachers}), got {uniforms.shape}")
    if not ((uniforms >= 0) & (uniforms < 1)).all():
        raise ValueError("uniforms must lie in [0, 1)")
    out = np.empty(uniforms.shape, dtype=np.int64)
    _run_split(_independent_kernel, _plan(teachers), uniforms, out, _threads(None))
    return out


def literal_coordinated_votes(teachers: TeacherDistributions, noise, tail_noise=None) -> np.ndarray:
    """Reference implementation of Algorithm 1 exactly as printed, one sample at a time.

    Divides the full ``(n, V)`` probability matrix by the shared noise row and takes the row argmax
    (the tail is one extra column).  Slow (``n x V`` per sample); used by tests and the benchmark.
    """
    noise = np.asarray(noise, dtype=np.float64)
    if noise.ndim != 2 or noise.shape[1] != teachers.vocab_size:
        raise ValueError(f"noise must have shape (num_samples, {teachers.vocab_size}), got {noise.shape}")
    dense = np.concatenate([teachers.to_dense(), teachers.tail[:, None]], axis=1)
    has_tail = bool((teachers.tail > 0).any())
    if has_tail and tail_noise is None:
        raise ValueError("tail_noise is required: some teachers have a truncated tail")
    tail_noise = np.ones(noise.shape[0]) if tail_noise is None else np.asarray(tail_noise, dtype=np.float64)
    out = np.empty((noise.shape[0], teachers.num_teachers), dtype=np.int64)
    for s in range(noise.shape[0]):
        row = np.append(noise[s], tail_noise[s])
        with np.errstate(divide="ignore"):
            out[s] = np.argmax(dense / row, axis=1)
    out[out == teachers.vocab_size] = TAIL_VOTE
    return out
