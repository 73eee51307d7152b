"""Vote histograms as the mechanisms see them.

A histogram ``c`` over the vocabulary ``V`` holds ``c_j``, the number of teachers that voted for token
``j``; ``sum_j c_j <= n`` where ``n`` is the number of teachers.  Votes that are not for any releasable
token (a teacher that voted into its truncated tail, see ``ensembles.distributions``) count towards ``n``
but are never candidates for release: ``tail = n - sum_j c_j``.

Mechanisms accept a ``CountHistogram`` (``ensembles.VoteHistogram`` is one), a dense count vector, or a
``{token: count}`` mapping; :func:`as_histogram` turns any of them into a ``CountHistogram``.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping

import numpy as np

from pate_accountant.validation import check_int

#: The vote of a teacher whose coordinated (or independent) sample fell in its truncated tail.
TAIL_VOTE = -1


def _integral_array(name: str, values) -> np.ndarray:
    array = np.asarray(values)
    if array.dtype == object or array.dtype.kind not in "biuf":
        raise TypeError(f"{name} must hold integer counts, got dtype {array.dtype}")
    if array.dtype.kind == "b":
        raise TypeError(f"{name} must hold integer counts, got booleans")
    if array.dtype.kind == "f":
        bad = ~np.isfinite(array) | (array != np.round(array))
        if bad.any():
            where = int(np.flatnonzero(bad.ravel())[0])
            raise ValueError(f"{name} must hold integer counts, got {array.ravel()[where].item()!r} at position {where}")
    array = array.astype(np.int64)
    if (array < 0).any():
        where = int(np.flatnonzero(array.ravel() < 0)[0])
        raise ValueError(f"{name} must hold non-negative counts, got {array.ravel()[where]} at position {where}")
    return array


class CountHistogram:
    """A sparse vote histogram: ``tokens`` (sorted, distinct) with positive ``counts``, and ``num_teachers``.

    The object is immutable: its arrays are read-only views.
    """

    __slots__ = ("_tokens", "_counts", "_num_teachers", "_vocab_size")

    def __init__(self, tokens, counts, num_teachers: int | None = None, vocab_size: int | None = None):
        tokens = np.asarray(tokens)
        if tokens.ndim != 1 or (tokens.size and tokens.dtype.kind not in "iu"):
            raise TypeError(f"tokens must be a 1-d integer array, got shape {tokens.shape} dtype {tokens.dtype}")
        tokens = tokens.astype(np.int64)
        counts = _integral_array("counts", counts)
        if counts.shape != tokens.shape:
            raise ValueError(f"counts must have the shape of tokens {tokens.shape}, got {counts.shape}")
        if vocab_size is not None:
            vocab_size = check_int("vocab_size", vocab_size, minimum=1)
        if tokens.size:
            if tokens.min() < 0:
                raise ValueError(f"tokens must be non-negative token ids, got {int(tokens.min())}")
            if vocab_size is not None and tokens.max() >= vocab_size:
                raise ValueError(f"token id {int(tokens.max())} is outside the vocabulary of size {vocab_size}")
        order = np.argsort(tokens, kind="stable")
        tokens, counts = tokens[order], counts[order]
        if tokens.size > 1 and (np.diff(tokens) == 0).any():
            dup = int(tokens[1:][np.diff(tokens) == 0][0])
            raise ValueError(f"tokens must be distinct, token {dup} appears twice")
        keep = counts > 0
        tokens, counts = tokens[keep], counts[keep]
        total = int(counts.sum())
        if num_teachers is None:
            num_teachers = total
        num_teachers = check_int("num_teachers", num_teachers, minimum=0)
        if total > num_teachers:
            raise ValueError(f"counts sum to {total}, more than num_teachers={num_teachers}")
        tokens.setflags(write=False)
        counts.setflags(write=False)
        self._tokens, self._counts = tokens, counts
        self._num_teachers, self._vocab_size = num_teachers, vocab_size

    # -- constructors -----------------------------------------------------------------------------
    @classmethod
    def from_counts(cls, counts, num_teachers: int | None = None):
        """From a dense count vector indexed by token id."""
        dense = _integral_array("counts", counts)
        if dense.ndim != 1:
            raise ValueError(f"counts must be a 1-d vector indexed by token, got shape {dense.shape}")
        tokens = np.flatnonzero(dense)
        return cls(tokens, dense[tokens], num_teachers=num_teachers, vocab_size=max(dense.size, 1))

    @classmethod
    def from_mapping(cls, mapping: Mapping, num_teachers: int | None = None, vocab_size: int | None = None):
        """From a ``{token: count}`` mapping."""
        tokens = list(mapping.keys())
        for token in tokens:
            if isinstance(token, bool) or not isinstance(token, (numbers.Integral, np.integer)):
                raise TypeError(f"histogram keys must be integer token ids, got {token!r}")
        return cls(
            np.asarray(tokens, dtype=np.int64),
            list(mapping.values()) if tokens else np.zeros(0, np.int64),
            num_teachers=num_teachers,
            vocab_size=vocab_size,
        )

    # -- read access --------------------------------------------------------------------------------
    @property
    def tokens(self) -> np.ndarray:
        return self._tokens

    @property
    def counts(self) -> np.ndarray:
        return self._counts

    @property
    def num_teachers(self) -> int:
        return self._num_teachers

    @property
    def vocab_size(self) -> int | None:
        return self._vocab_size

    @property
    def tail(self) -> int:
        """Votes that went to no releasable token."""
        return self._num_teachers - int(self._counts.sum())

    def count(self, token: int) -> int:
        token = check_int("token", token)
        i = np.searchsorted(self._tokens, token)
        return int(self._counts[i]) if i < self._tokens.size and self._tokens[i] == token else 0

    def top(self, k: int = 1) -> list[tuple[int, int]]:
        """The ``k`` largest ``(token, count)`` pairs, by count descending, ties by token id ascending."""
        k = check_int("k", k, minimum=0)
        order = np.lexsort((self._tokens, -self._counts))[:k]
        return [(int(self._tokens[i]), int(self._counts[i])) for i in order]

    @property
    def max_count(self) -> int:
        return int(self._counts.max()) if self._counts.size else 0

    @property
    def margin(self) -> int:
        """Top count minus second count (the second is 0 when only one token has votes)."""
        if self._counts.size == 0:
            return 0
        if self._counts.size == 1:
            return int(self._counts[0])
        top2 = np.partition(self._counts, -2)[-2:]
        return int(top2[1] - top2[0])

    def above(self, threshold: int) -> tuple[np.ndarray, np.ndarray]:
        """``S_T(c)``: tokens with ``c_j >= threshold`` and their counts."""
        keep = self._counts >= threshold
        return self._tokens[keep], self._counts[keep]

    def as_dict(self) -> dict[int, int]:
        return {int(t): int(c) for t, c in zip(self._tokens, self._counts)}

    def to_dense(self, vocab_size: int | None = None) -> np.ndarray:
        size = vocab_size or self._vocab_size or (int(self._tokens.max()) + 1 if self._tokens.size else 0)
        out = np.zeros(size, dtype=np.int64)
        out[self._tokens] = self._counts
        return out

    def __eq__(self, other):
        if not isinstance(other, CountHistogram):
            return NotImplemented
        return (
            self._num_teachers == other._num_teachers
            and np.array_equal(self._tokens, other._tokens)
            and np.array_equal(self._counts, other._counts)
        )

    def __hash__(self):
        return hash((self._num_teachers, self._tokens.tobytes(), self._counts.tobytes()))

    def __repr__(self):
        shown = ", ".join(f"{t}: {c}" for t, c in self.top(5))
        more = ", ..." if self._tokens.size > 5 else ""
        return f"{type(self).__name__}({{{shown}{more}}}, num_teachers={self._num_teachers})"


def as_histogram(histogram, num_teachers: int | None = None) -> CountHistogram:
    """Accept a ``CountHistogram``, a dense count vector or a ``{token: count}`` mapping.

    ``num_teachers`` overrides (or, for vectors and mappings, supplies) ``n``; by default a vector or
    mapping has ``n = sum of counts``.
    """
    if isinstance(histogram, CountHistogram):
        if num_teachers is None or num_teachers == histogram.num_teachers:
            return histogram
        return CountHistogram(histogram.tokens, histogram.counts, num_teachers, histogram.vocab_size)
    if isinstance(histogram, Mapping):
        return CountHistogram.from_mapping(histogram, num_teachers=num_teachers)
    if isinstance(histogram, (np.ndarray, list, tuple)):
        return CountHistogram.from_counts(histogram, num_teachers=num_teachers)
    raise TypeError(
        "histogram must be a CountHistogram/VoteHistogram, a dense count vector or a {token: count} mapping, "
        f"got {type(histogram).__name__}"
    )


class HistogramBatch:
    """Many sparse histograms at once, for vectorised mechanisms.

    Entry ``e`` says histogram ``sample[e]`` has ``counts[e]`` votes for token ``tokens[e]``; entries are
    sorted by histogram then token, counts are positive.  ``num_teachers`` is one ``n`` shared by all
    histograms (votes not on any token are tail votes).
    """

    __slots__ = ("sample", "tokens", "counts", "num_histograms", "num_teachers", "starts")

    def __init__(self, sample, tokens, counts, num_histograms: int, num_teachers: int):
        sample = np.asarray(sample, dtype=np.int64)
        tokens = np.asarray(tokens, dtype=np.int64)
        counts = _integral_array("counts", counts)
        if not (sample.shape == tokens.shape == counts.shape) or sample.ndim != 1:
            raise ValueError("sample, tokens and counts must be 1-d arrays of equal length")
        num_histograms = check_int("num_histograms", num_histograms, minimum=0)
        num_teachers = check_int("num_teachers", num_teachers, minimum=0)
        if sample.size:
            if sample.min() < 0 or sample.max() >= num_histograms:
                raise ValueError(f"sample indices must lie in [0, {num_histograms})")
            if tokens.min() < 0:
                raise ValueError(f"tokens must be non-negative token ids, got {int(tokens.min())}")
            order = np.lexsort((tokens, sample))
            sample, tokens, counts = sample[order], tokens[order], counts[order]
            same = (np.diff(sample) == 0) & (np.diff(tokens) == 0)
            if same.any():
                raise ValueError(f"histogram {int(sample[1:][same][0])} lists token {int(tokens[1:][same][0])} twice")
            keep = counts > 0
            sample, tokens, counts = sample[keep], tokens[keep], counts[keep]
        totals = np.bincount(sample, weights=counts, minlength=num_histograms)
        if totals.size and totals.max() > num_teachers:
            bad = int(np.argmax(totals))
            raise ValueError(
                f"histogram {bad}: counts sum to {int(totals[bad])}, more than num_teachers={num_teachers}"
            )
        self.sample, self.tokens, self.counts = sample, tokens, counts
        self.num_histograms, self.num_teachers = num_histograms, num_teachers
        self.starts = np.searchsorted(sample, np.arange(num_histograms + 1))

    @classmethod
    def from_histograms(cls, histograms, num_teachers: int | None = None) -> "HistogramBatch":
        """From a sequence of histograms of any accepted form (they must share ``n``)."""
        hists = [as_histogram(h, num_teachers) for h in histograms]
        sizes = {h.num_teachers for h in hists}
        if len(sizes) > 1:
            raise ValueError(f"histograms in a batch must share num_teachers, got {sorted(sizes)}")
        n = sizes.pop() if sizes else (num_teachers or 0)
        sample = np.repeat(np.arange(len(hists)), [h.tokens.size for h in hists])
        tokens = np.concatenate([h.tokens for h in hists]) if hists else np.zeros(0, np.int64)
        counts = np.concatenate([h.counts for h in hists]) if hists else np.zeros(0, np.int64)
        return cls(sample, tokens, counts, len(hists), n)

    def histogram(self, i: int) -> CountHistogram:
        lo, hi = self.starts[i], self.starts[i + 1]
        return CountHistogram(self.tokens[lo:hi], self.counts[lo:hi], num_teachers=self.num_teachers)

    def __len__(self) -> int:
        return self.num_histograms

    def __iter__(self):
        return (self.histogram(i) for i in range(self.num_histograms))

    def top(self) -> tuple[np.ndarray, np.ndarray]:
        """Per histogram the largest count and its token (ties: smallest token id); ``(0, -1)`` if empty."""
        order = np.lexsort((self.tokens, -self.counts, self.sample))
        first = self.starts[:-1]
        present = self.starts[1:] > first
        top_count = np.zeros(self.num_histograms, dtype=np.int64)
        top_token = np.full(self.num_histograms, -1, dtype=np.int64)
        top_count[present] = self.counts[order[first[present]]]
        top_token[present] = self.tokens[order[first[present]]]
        return top_count, top_token


def as_batch(histograms, num_teachers: int | None = None) -> HistogramBatch:
    """A ``HistogramBatch`` as is, or a sequence of histograms, or a 2-d ``(histograms, V)`` count matrix."""
    if isinstance(histograms, HistogramBatch):
        return histograms
    if isinstance(histograms, np.ndarray) and histograms.ndim == 2:
        dense = _integral_array("counts", histograms)
        sample, tokens = np.nonzero(dense)
        n = int(dense.sum(axis=1).max()) if num_teachers is None and dense.size else (num_teachers or 0)
        return HistogramBatch(sample, tokens, dense[sample, tokens], dense.shape[0], n)
    return HistogramBatch.from_histograms(list(histograms), num_teachers)
