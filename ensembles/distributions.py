"""Teacher next-token distributions ``p^(i)`` over a vocabulary ``V`` (paper Sections 1.1-1.2).

``TeacherDistributions`` stores ``n`` distributions sparsely (compressed rows: token ids and
probabilities per teacher) together with an explicit per-teacher **tail**: probability mass that the
teacher has but that is not attached to any listed token (what top-k / top-p truncation drops).

Why the tail is privacy-safe and what it costs (docs/ensembles.md, "Truncation"):

* A teacher's tail is computed from that teacher's own distribution only, so changing one teacher's
  data still changes at most one vote for any fixed shared randomness (Observation 1): every DP or
  threshold guarantee of the aggregator carries over unchanged (Corollary 3.1).
* In the vote histograms the tail is one extra pseudo-token (vote ``TAIL_VOTE = -1``) with its own
  shared noise ``u_tail``; aggregators count tail votes in ``n`` but never release them, so a tail win
  can only turn into ``fail``.  No token outside a teacher's kept set can ever be released on its
  behalf.
* Each teacher still votes for every kept token ``j`` with exactly its probability ``p_ij`` (the
  minimum of the tail tokens' ``u_k / p_ik`` is ``Exp(tail_i)``-distributed, like ``u_tail / tail_i``), so
  Claim 1 holds for every releasable token.  Coupled with the untruncated ensemble on the same noise, a
  teacher's vote can differ only when one of the two votes falls in its tail, so the expected number of
  changed votes is at most ``2 * sum_i tail_i`` and the expected L1 change of the releasable counts is at
  most ``4 * sum_i tail_i`` (for top-p 0.999 and n = 512: at most about 2 votes).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pate_accountant.validation import check_int, check_real

#: Rows (kept probabilities plus tail) must sum to 1 within this absolute tolerance; they are then
#: renormalised exactly.  float32 softmax outputs over a 128k vocabulary sum to 1 within about 1e-5.
SUM_TOLERANCE = 1e-4
#: Top-p keeps a token while the mass before it is below ``p - TOP_P_TOLERANCE`` (forgives the rounding of
#: the running sum).
TOP_P_TOLERANCE = 1e-9


def top_p_keep(sorted_probs, mass_before, p: float):
    """The top-p rule, written once for the host (:meth:`TeacherDistributions.top_p`, numpy) and the device
    (the transformers backend, torch): in a row sorted by decreasing probability, a token is kept while the
    mass before it is below ``p`` (less :data:`TOP_P_TOLERANCE`) and its probability is positive.  Works
    elementwise on numpy arrays and torch tensors alike."""
    return (mass_before < p - TOP_P_TOLERANCE) & (sorted_probs > 0)


class TeacherDistributions:
    """``n`` teacher distributions over ``vocab_size`` tokens, stored as compressed sparse rows.

    Build with :meth:`from_dense` or :meth:`from_sparse`.  The object is immutable.
    """

    __slots__ = ("_indptr", "_token_ids", "_probs", "_tail", "_vocab_size", "_cache")

    def __init__(self, indptr, token_ids, probs, tail, vocab_size: int, *, _validated: bool = False):
        if not _validated:
            raise TypeError("use TeacherDistributions.from_dense or TeacherDistributions.from_sparse")
        for array in (indptr, token_ids, probs, tail):
            array.setflags(write=False)
        self._indptr, self._token_ids, self._probs, self._tail = indptr, token_ids, probs, tail
        self._vocab_size = vocab_size
        self._cache: dict = {}

    # -- construction ---------------------------------------------------------------------------------
    @classmethod
    def from_dense(cls, probs, tail=None) -> "TeacherDistributions":
        """From an ``(n, V)`` matrix whose row ``i`` is ``p^(i)`` (zeros are not stored).

        ``tail`` (optional, shape ``(n,)``) is mass outside the matrix, for already-truncated rows.
        """
        matrix = np.asarray(probs)
        if matrix.dtype == object or matrix.dtype.kind not in "fiu":
            raise TypeError(f"probs must be a numeric (n, V) array, got dtype {matrix.dtype}")
        if matrix.ndim != 2:
            raise ValueError(f"probs must be a 2-d (num_teachers, vocab_size) array, got shape {matrix.shape}")
        n, vocab = matrix.shape
        if n == 0:
            raise ValueError("probs must hold at least one teacher, got shape (0, V)")
        if vocab == 0:
            raise ValueError("probs must have a non-empty vocabulary, got shape (n, 0)")
        matrix = matrix.astype(np.float64, copy=False)
        _check_finite_nonnegative(matrix, "probs")
        rows, cols = np.nonzero(matrix)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
        return cls._build(indptr, cols.astype(np.int64), matrix[rows, cols], tail, vocab)

    @classmethod
    def from_sparse(cls, token_ids: Sequence, probs: Sequence, vocab_size: int, tail=None) -> "TeacherDistributions":
        """From per-teacher token ids and probabilities (ragged sequences, or equal-length 2-d arrays).

        ``tail`` (optional, shape ``(n,)``): mass of each teacher outside its listed tokens.  Without it
        every teacher's probabilities must sum to 1.
        """
        vocab_size = check_int("vocab_size", vocab_size, minimum=1)
        if isinstance(token_ids, np.ndarray) and token_ids.ndim == 2:
            token_rows = list(token_ids)
        else:
            token_rows = list(token_ids)
        if isinstance(probs, np.ndarray) and probs.ndim == 2:
            prob_rows = list(probs)
        else:
            prob_rows = list(probs)
        if len(token_rows) == 0:
            raise ValueError("token_ids must hold at least one teacher, got an empty sequence")
        if len(token_rows) != len(prob_rows):
            raise ValueError(
                f"token_ids and probs must list the same number of teachers, got {len(token_rows)} and {len(prob_rows)}"
            )
        n = len(token_rows)
        lengths = np.zeros(n, dtype=np.int64)
        id_parts, prob_parts = [], []
        for i, (ids, ps) in enumerate(zip(token_rows, prob_rows)):
            ids, ps = np.asarray(ids), np.asarray(ps)
            if ids.ndim != 1 or ps.ndim != 1 or ids.shape != ps.shape:
                raise ValueError(
                    f"teacher {i}: token_ids and probs must be 1-d of equal length, got shapes {ids.shape} and {ps.shape}"
                )
            if ids.size and ids.dtype.kind not in "iu":
                raise TypeError(f"teacher {i}: token_ids must be integers, got dtype {ids.dtype}")
            if ps.dtype == object or (ps.size and ps.dtype.kind not in "fiu"):
                raise TypeError(f"teacher {i}: probs must be numeric, got dtype {ps.dtype}")
            ids = ids.astype(np.int64)
            ps = ps.astype(np.float64)
            if ids.size:
                bad = (ids < 0) | (ids >= vocab_size)
                if bad.any():
                    raise ValueError(
                        f"teacher {i}: token id {int(ids[bad][0])} is outside the vocabulary [0, {vocab_size})"
                    )
                sorted_ids = np.sort(ids)
                dup = sorted_ids[1:][np.diff(sorted_ids) == 0]
                if dup.size:
                    raise ValueError(f"teacher {i}: token id {int(dup[0])} is listed twice")
            _check_finite_nonnegative(ps, "probs", row=i)
            keep = ps > 0
            id_parts.append(ids[keep])
            prob_parts.append(ps[keep])
            lengths[i] = int(keep.sum())
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        token_ids_flat = np.concatenate(id_parts) if id_parts else np.zeros(0, np.int64)
        probs_flat = np.concatenate(prob_parts) if prob_parts else np.zeros(0)
        return cls._build(indptr, token_ids_flat, probs_flat, tail, vocab_size)

    @classmethod
    def _build(cls, indptr, token_ids, probs, tail, vocab_size) -> "TeacherDistributions":
        n = indptr.size - 1
        if tail is None:
            tail_arr = np.zeros(n)
        else:
            tail_arr = np.asarray(tail)
            if tail_arr.dtype == object or tail_arr.dtype.kind not in "fiu":
                raise TypeError(f"tail must be numeric, got dtype {tail_arr.dtype}")
            tail_arr = tail_arr.astype(np.float64)
            if tail_arr.shape != (n,):
                raise ValueError(f"tail must have shape ({n},), one entry per teacher, got {tail_arr.shape}")
            _check_finite_nonnegative(tail_arr, "tail")
        teacher = np.repeat(np.arange(n), np.diff(indptr))
        totals = np.bincount(teacher, weights=probs, minlength=n) + tail_arr
        off = np.abs(totals - 1.0) > SUM_TOLERANCE
        if off.any():
            i = int(np.flatnonzero(off)[0])
            hint = "" if tail is not None else " (pass tail= for mass outside the listed tokens)"
            raise ValueError(
                f"teacher {i}: probabilities sum to {totals[i]:.6g}, not 1 within {SUM_TOLERANCE}{hint}"
            )
        scale = np.repeat(1.0 / totals, np.diff(indptr))
        return cls(
            indptr.astype(np.int64),
            token_ids.astype(np.int64),
            probs * scale,
            tail_arr / totals,
            int(vocab_size),
            _validated=True,
        )

    # -- read access -----------------------------------------------------------------------------------
    @property
    def num_teachers(self) -> int:
        return self._indptr.size - 1

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def indptr(self) -> np.ndarray:
        """Row pointers: teacher ``i``'s entries are ``[indptr[i], indptr[i+1])``."""
        return self._indptr

    @property
    def token_ids(self) -> np.ndarray:
        return self._token_ids

    @property
    def probs(self) -> np.ndarray:
        return self._probs

    @property
    def tail(self) -> np.ndarray:
        """Per-teacher mass not attached to a listed token (never releasable)."""
        return self._tail

    @property
    def support_sizes(self) -> np.ndarray:
        return np.diff(self._indptr)

    @property
    def nnz(self) -> int:
        return int(self._probs.size)

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Teacher ``i``'s token ids and probabilities."""
        i = check_int("teacher", i, minimum=0, maximum=self.num_teachers - 1)
        lo, hi = self._indptr[i], self._indptr[i + 1]
        return self._token_ids[lo:hi], self._probs[lo:hi]

    def teacher_of_entry(self) -> np.ndarray:
        """For each stored entry, the index of its teacher."""
        return np.repeat(np.arange(self.num_teachers), self.support_sizes)

    def to_dense(self) -> np.ndarray:
        """The ``(n, V)`` matrix of listed probabilities (the tail is not a column)."""
        out = np.zeros((self.num_teachers, self._vocab_size))
        out[self.teacher_of_entry(), self._token_ids] = self._probs
        return out

    def average(self) -> np.ndarray:
        """The average distribution ``(1/n) sum_i p^(i)`` over ``V`` (the average tail is left out)."""
        return np.bincount(self._token_ids, weights=self._probs, minlength=self._vocab_size) / self.num_teachers

    @property
    def average_tail(self) -> float:
        return float(self._tail.mean())

    def subset(self, teachers) -> "TeacherDistributions":
        """The distributions of the listed teachers, in the given order."""
        idx = np.asarray(teachers)
        if idx.dtype.kind not in "iu" or idx.ndim != 1:
            raise TypeError(f"teachers must be a 1-d sequence of teacher indices, got dtype {idx.dtype}")
        if idx.size == 0:
            raise ValueError("teachers must select at least one teacher")
        if idx.min() < 0 or idx.max() >= self.num_teachers:
            bad = idx[(idx < 0) | (idx >= self.num_teachers)][0]
            raise ValueError(f"teacher index {int(bad)} is outside [0, {self.num_teachers})")
        lengths = self.support_sizes[idx]
        starts = self._indptr[idx]
        gather = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths) + np.arange(lengths.sum())
        indptr = np.zeros(idx.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        return TeacherDistributions(
            indptr, self._token_ids[gather].copy(), self._probs[gather].copy(), self._tail[idx].copy(),
            self._vocab_size, _validated=True,
        )

    # -- transforms --------------------------------------------------------------------------------------
    def with_temperature(self, temperature: float) -> "TeacherDistributions":
        """``p_ij ∝ p_ij ** (1 / temperature)``, per teacher.

        Needs untruncated rows: the shape of a tail is unknown, so apply temperature before top-k/top-p.
        """
        temperature = check_real("temperature", temperature, minimum=0.0, min_open=True)
        if (self._tail > 0).any():
            i = int(np.flatnonzero(self._tail > 0)[0])
            raise ValueError(
                f"temperature needs untruncated distributions, but teacher {i} has a tail; "
                "apply temperature before top_k/top_p"
            )
        logp = np.log(self._probs) / temperature
        row_max = np.maximum.reduceat(logp, self._indptr[:-1])
        weights = np.exp(logp - np.repeat(row_max, self.support_sizes))
        sums = np.bincount(self.teacher_of_entry(), weights=weights, minlength=self.num_teachers)
        probs = weights / np.repeat(sums, self.support_sizes)
        return TeacherDistributions(
            self._indptr.copy(), self._token_ids.copy(), probs, self._tail.copy(), self._vocab_size, _validated=True
        )

    def for_sampling(self, temperature: float = 1.0, top_p: float | None = None) -> "TeacherDistributions":
        """The distributions a teacher samples from: temperature first (it needs untruncated rows), then the
        top-p cut (``None`` or 1: no cut).  The one place where both are applied on the host."""
        temperature = check_real("temperature", temperature, minimum=0.0, min_open=True)
        dists = self if temperature == 1.0 else self.with_temperature(temperature)
        if top_p is not None:
            top_p = check_real("top_p", top_p, minimum=0.0, maximum=1.0, min_open=True)
            if top_p < 1.0:
                dists = dists.top_p(top_p)
        return dists

    def top_k(self, k: int, *, renormalize: bool = False) -> "TeacherDistributions":
        """Keep each teacher's ``k`` most likely tokens; the dropped mass joins its tail.

        With ``renormalize=True`` the kept tokens are rescaled to carry the dropped mass instead
        (Hugging Face semantics); the existing tail is kept either way.
        """
        k = check_int("k", k, minimum=1)
        ranks = self._descending_ranks()
        return self._truncate(ranks < k, renormalize)

    def top_p(self, p: float, *, renormalize: bool = False) -> "TeacherDistributions":
        """Keep each teacher's smallest set of most likely tokens whose mass reaches ``p``.

        The tail counts as already-dropped mass: a teacher keeps tokens until its kept mass reaches ``p``
        or it runs out of listed tokens.  Dropped mass joins the tail (or, with ``renormalize=True``,
        is spread over the kept tokens).
        """
        p = check_real("p", p, minimum=0.0, maximum=1.0, min_open=True)
        order = self._descending_order()
        sorted_probs = self._probs[order]
        sizes = self.support_sizes
        csum = np.cumsum(sorted_probs)
        before = csum - sorted_probs - np.repeat(np.concatenate(([0.0], csum))[self._indptr[:-1]], sizes)
        keep_sorted = top_p_keep(sorted_probs, before, p)
        keep = np.empty_like(keep_sorted)
        keep[order] = keep_sorted
        return self._truncate(keep, renormalize)

    def _descending_order(self) -> np.ndarray:
        teacher = self.teacher_of_entry()
        return np.lexsort((-self._probs, teacher))

    def _descending_ranks(self) -> np.ndarray:
        order = self._descending_order()
        ranks = np.empty(order.size, dtype=np.int64)
        sizes = self.support_sizes
        ranks[order] = np.arange(order.size) - np.repeat(self._indptr[:-1], sizes)
        return ranks

    def _truncate(self, keep: np.ndarray, renormalize: bool) -> "TeacherDistributions":
        teacher = self.teacher_of_entry()
        dropped = np.bincount(teacher[~keep], weights=self._probs[~keep], minlength=self.num_teachers)
        lengths = np.bincount(teacher[keep], minlength=self.num_teachers)
        indptr = np.zeros(self.num_teachers + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        probs = self._probs[keep].copy()
        tail = self._tail.copy()
        if renormalize:
            kept_mass = np.bincount(teacher[keep], weights=probs, minlength=self.num_teachers)
            probs *= np.repeat((kept_mass + dropped) / np.where(kept_mass > 0, kept_mass, 1.0), lengths)
        else:
            tail = tail + dropped
        return TeacherDistributions(
            indptr, self._token_ids[keep].copy(), probs, tail, self._vocab_size, _validated=True
        )

    def __repr__(self):
        return (
            f"TeacherDistributions(num_teachers={self.num_teachers}, vocab_size={self._vocab_size}, "
            f"nnz={self.nnz}, average_tail={self.average_tail:.3g})"
        )


def _check_finite_nonnegative(values: np.ndarray, name: str, row: int | None = None) -> None:
    bad = ~np.isfinite(values) | (values < 0)
    if bad.any():
        flat = int(np.flatnonzero(bad.ravel())[0])
        if row is None and values.ndim == 2:
            row, col = divmod(flat, values.shape[1])
            where = f"teacher {row}, token {col}"
        elif row is None:
            where = f"teacher {flat}"
        else:
            where = f"teacher {row}, entry {flat}"
        value = values.ravel()[flat].item()
        kind = "NaN" if np.isnan(value) else ("infinite" if np.isinf(value) else "negative")
        raise ValueError(f"{name} must be finite and non-negative: {where} holds a {kind} value {value!r}")
