"""The model-backend protocol for lockstep private generation (docs/generation.md, "Backends").

A backend holds the ``n`` teachers' contexts (teacher prompt, plus the response released so far) and
returns their next-token distributions.  The stateful methods let a backend keep a KV cache across
steps, because every active teacher appends the *same* released token each step (Framework 2):

* ``begin(teacher_prompts, shared_prefix=None)``: start a run; teacher ``i``'s context is
  ``shared_prefix + teacher_prompts[i]`` (each prompt a string or a list of token ids);
* ``distributions() -> TeacherDistributions``: the current step's distributions of the *active*
  teachers, in the order of ``active_teachers()`` (sorted original indices);
* ``append(token_id)``: append the released token to every active teacher's context;
* ``votes(key, *, temperature=1.0, top_p=None, histograms="coordinated", teacher_ids=None, public=None)``: one
  ``int32`` vote per active teacher on the randomness of the :class:`~ensembles.keyed_votes.StepKey` ``key``,
  with temperature and top-p applied once, where the distributions are (a device backend votes on its logits
  and returns only the votes); ``teacher_ids`` are the rows' original indices (Cold PATE's keys; default
  ``active_teachers()``); ``public`` (optional, a :class:`~ensembles.public_prior.PublicPrior`): the public-prior
  mixing and support, applied there too, after the temperature (:mod:`ensembles.public_prior`).  A teacher's
  vote is a function of its own context, ``key`` and public inputs alone, whatever other teachers share its
  batch or shard.  ``PrivateGenerator`` passes ``public`` only when one of its public-prior options is on, so a
  backend without it still serves every other run;
* optional ``check_sampling(temperature, top_p)``: a backend that cannot apply some temperature or top-p
  raises ``ValueError`` here; ``PrivateGenerator`` asks when it is built, before any run;
* ``drop_teachers(indices)``: remove teachers (original indices) from later steps (individual charging);
* ``encode(text) -> list[int]``, ``decode(ids) -> str``, ``vocab_size``, ``eos_token_id`` (or ``None``);
* ``next_token_distributions(contexts)``: the stateless form, one token-id context per teacher.

:class:`ContextBackend` implements the stateful methods on top of ``next_token_distributions`` for
backends without a cache (the toy and sampled-API backends).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from ensembles.distributions import TeacherDistributions
from ensembles.keyed_votes import keyed_votes
from ensembles.public_prior import for_sampling

__all__ = ["ContextBackend", "NextTokenBackend"]


@runtime_checkable
class NextTokenBackend(Protocol):
    """What :class:`ensembles.generation.PrivateGenerator` needs from a model backend."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_id(self) -> int | None: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def next_token_distributions(self, contexts: Sequence[Sequence[int]]) -> TeacherDistributions: ...

    def begin(self, teacher_prompts, shared_prefix=None) -> None: ...

    def distributions(self) -> TeacherDistributions: ...

    def append(self, token_id: int) -> None: ...

    def votes(self, key, *, temperature: float = 1.0, top_p: float | None = None, histograms: str = "coordinated",
              teacher_ids=None, public=None) -> np.ndarray: ...

    def drop_teachers(self, indices) -> None: ...

    def active_teachers(self) -> np.ndarray: ...


def _as_ids(backend, prompt, what: str) -> list[int]:
    """A prompt (text or token ids) as a list of token ids; error messages never quote the text."""
    if prompt is None:
        return []
    if isinstance(prompt, str):
        return list(backend.encode(prompt))
    ids = list(prompt)
    for position, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
            raise TypeError(f"{what}: token at position {position} is not an integer id")
        if not 0 <= int(token) < backend.vocab_size:
            raise ValueError(f"{what}: token id at position {position} is outside [0, {backend.vocab_size})")
    return [int(t) for t in ids]


class ContextBackend:
    """Stateful protocol methods on top of ``next_token_distributions`` (no cache: full contexts).

    Subclasses provide ``vocab_size``, ``eos_token_id``, ``encode``, ``decode`` and
    ``next_token_distributions(contexts)``.
    """

    _contexts: list | None = None
    _active: np.ndarray | None = None

    def begin(self, teacher_prompts, shared_prefix=None) -> None:
        if isinstance(teacher_prompts, str) or not isinstance(teacher_prompts, Sequence):
            raise TypeError("teacher_prompts must be a list of prompts (strings or token-id lists)")
        if len(teacher_prompts) == 0:
            raise ValueError("teacher_prompts must hold at least one teacher prompt")
        prefix = _as_ids(self, shared_prefix, "shared_prefix")
        self._contexts = [prefix + _as_ids(self, p, f"teacher prompt {i}") for i, p in enumerate(teacher_prompts)]
        self._active = np.arange(len(teacher_prompts), dtype=np.int64)

    def _check_started(self) -> None:
        if self._contexts is None:
            raise RuntimeError("call begin(teacher_prompts) first")

    @property
    def num_teachers(self) -> int:
        self._check_started()
        return len(self._contexts)

    def active_teachers(self) -> np.ndarray:
        self._check_started()
        return self._active.copy()

    def distributions(self) -> TeacherDistributions:
        self._check_started()
        if self._active.size == 0:
            raise RuntimeError("no active teachers left")
        return self._distributions_for(self._active)

    def _distributions_for(self, teachers: np.ndarray) -> TeacherDistributions:
        return self.next_token_distributions([self._contexts[i] for i in teachers])

    def votes(self, key, *, temperature: float = 1.0, top_p: float | None = None, histograms: str = "coordinated",
              teacher_ids=None, public=None) -> np.ndarray:
        """The host form: :meth:`distributions` at ``temperature`` and ``top_p`` (and the public prior ``public``,
        :func:`ensembles.public_prior.for_sampling`), then :func:`~ensembles.keyed_votes.keyed_votes`."""
        dists = for_sampling(self.distributions(), temperature, top_p, public)
        ids = self.active_teachers() if teacher_ids is None else teacher_ids
        return keyed_votes(dists, key, histograms=histograms, teacher_ids=ids)

    def append(self, token_id: int) -> None:
        self._check_started()
        token_id = int(token_id)
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is outside [0, {self.vocab_size})")
        for i in self._active:
            self._contexts[i].append(token_id)

    def drop_teachers(self, indices) -> None:
        self._check_started()
        drop = np.asarray(sorted(int(i) for i in indices), dtype=np.int64)
        if drop.size and (drop.min() < 0 or drop.max() >= len(self._contexts)):
            raise ValueError(f"teacher indices must lie in [0, {len(self._contexts)})")
        self._active = np.setdiff1d(self._active, drop)
