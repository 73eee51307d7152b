"""``ToyBackend``: a table- or function-driven backend with a whitespace word "tokenizer" (for tests)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ensembles.backends.base import ContextBackend
from ensembles.distributions import TeacherDistributions

__all__ = ["ToyBackend"]

UNK = "<unk>"


class TokenView(Sequence):
    """A read-only view of a teacher's context (token ids) for a model function: indexing, ``len``, iteration
    and slices (which copy) work as on a list, but the view costs nothing to make, so a step costs the same
    however long the context has grown (a copy per teacher per step made long runs quadratic)."""

    __slots__ = ("_ids",)

    def __init__(self, ids):
        self._ids = ids

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, index):
        return self._ids[index]

    def __repr__(self) -> str:
        return f"TokenView({list(self._ids)!r})"


class ToyBackend(ContextBackend):
    """Teachers given by a function or a table over a word vocabulary.

    ``ToyBackend(model, vocab, *, eos="<eos>")``:

    * ``model`` is either a callable ``f(teacher_index, context_token_ids) -> probability vector`` (length
      ``len(vocab)``) or ``(token_ids, probs)``, or a table: an ``(n, V)`` array of fixed per-teacher
      distributions (the same at every step).  ``teacher_index`` is the teacher's original index;
      ``context_token_ids`` is a read-only :class:`TokenView` of the teacher's context (index it, slice it,
      take its ``len``; it is not a copy, so a step's cost does not grow with the context).
    * ``vocab`` is the list of words; ``encode`` splits on whitespace and maps each word to its index
      (a word outside the vocabulary maps to ``"<unk>"`` when the vocabulary has it, else it is an error);
      ``decode`` joins words with single spaces.
    * ``eos`` names the end-of-sequence word (``None``: no eos); ``eos_token_id`` is its index.
    """

    def __init__(self, model, vocab: Sequence[str], *, eos: str | None = "<eos>"):
        vocab = [str(w) for w in vocab]
        if not vocab:
            raise ValueError("vocab must hold at least one word")
        if len(set(vocab)) != len(vocab):
            raise ValueError("vocab words must be distinct")
        if any(not w or any(c.isspace() for c in w) for w in vocab):
            raise ValueError("vocab words must be non-empty and contain no whitespace")
        self._vocab = vocab
        self._index = {w: i for i, w in enumerate(vocab)}
        if eos is not None and eos not in self._index:
            raise ValueError("eos must be a word of vocab (or None)")
        self._eos = None if eos is None else self._index[eos]
        if callable(model):
            self._fn: Callable = model
            self._table = None
        else:
            table = np.asarray(model, dtype=np.float64)
            if table.ndim != 2 or table.shape[1] != len(vocab):
                raise ValueError(f"a table model must have shape (num_teachers, {len(vocab)}), got {table.shape}")
            TeacherDistributions.from_dense(table)  # validates the rows
            self._table = table
            self._fn = None

    @property
    def vocab(self) -> list[str]:
        return list(self._vocab)

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    @property
    def eos_token_id(self) -> int | None:
        return self._eos

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        unk = self._index.get(UNK)
        ids = []
        for position, word in enumerate(text.split()):
            index = self._index.get(word, unk)
            if index is None:
                # Never quote the word: it may come from a private prompt.
                raise ValueError(f"word {position} of the text is not in the vocabulary (and it has no {UNK})")
            ids.append(index)
        return ids

    def decode(self, token_ids) -> str:
        words = []
        for t in token_ids:
            t = int(t)
            if not 0 <= t < len(self._vocab):
                raise ValueError(f"token id {t} is outside [0, {len(self._vocab)})")
            words.append(self._vocab[t])
        return " ".join(words)

    def _row(self, teacher: int, context):
        if self._table is not None:
            if teacher >= self._table.shape[0]:
                raise ValueError(f"the table has {self._table.shape[0]} teachers; teacher {teacher} does not exist")
            row = self._table[teacher]
            return np.flatnonzero(row), row[row > 0]
        out = self._fn(teacher, context if isinstance(context, TokenView) else TokenView(context))
        if isinstance(out, tuple) and len(out) == 2:
            return np.asarray(out[0], dtype=np.int64), np.asarray(out[1], dtype=np.float64)
        row = np.asarray(out, dtype=np.float64)
        if row.shape != (len(self._vocab),):
            raise ValueError(f"teacher {teacher}: the model returned shape {row.shape}, expected ({len(self._vocab)},)")
        return np.flatnonzero(row), row[row > 0]

    def next_token_distributions(self, contexts, teachers=None) -> TeacherDistributions:
        """Stateless: one context (token ids) per teacher; ``teachers`` (default ``0..n-1``) are the
        original indices passed to the model function."""
        teachers = range(len(contexts)) if teachers is None else [int(t) for t in teachers]
        rows = [self._row(t, c) for t, c in zip(teachers, contexts)]
        return TeacherDistributions.from_sparse([r[0] for r in rows], [r[1] for r in rows], len(self._vocab))

    def _distributions_for(self, teachers: np.ndarray) -> TeacherDistributions:
        return self.next_token_distributions([self._contexts[i] for i in teachers], teachers=teachers)
