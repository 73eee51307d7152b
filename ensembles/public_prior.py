"""Public-prior transforms of the teachers' next-token distributions, applied before the vote.

Two options of :class:`~ensembles.generation.PrivateGenerator` use the next-token distribution ``p_pub`` of a
*public* model (its ``public_backend``: the public prompt, the shared prefix and the tokens released so far,
never a private record), computed once per token position:

* **Public-prior mixing** (:class:`PublicMix`, weight ``lambda``): every teacher races on
  ``q_i = lambda p_pub + (1 - lambda) p_i`` instead of ``p_i``.  Tokens the public model already likes gain
  votes from every teacher at once, so agreement (and the yield of a thresholded aggregator) rises; the
  price is a bias towards the public model (``lambda = 1``: every teacher votes the public model's
  coordinated sample, whatever its data).
* **Public support** (:class:`PublicSupport`, top-k or top-p of ``p_pub``): a set ``S`` of tokens fixed by
  the public model alone.  A teacher's mass outside ``S`` becomes one *tail* outcome: its vote is
  :data:`~ensembles.TAIL_VOTE` (``-1``) when the tail wins the race.  Tail votes count in the number of
  teachers ``n`` but are not a token, so no mechanism can release them (``mechanisms.histogram``: a histogram
  holds the counts of tokens ``0 .. V-1`` and ``tail = n - sum_j c_j``); a step whose votes land in the tail
  can only fail.  The race runs over ``|S| + 1`` outcomes instead of ``V``.

Where they act (one order for the host and the device): temperature ``T`` on the teacher's distribution, then
the mixing (with ``p_pub`` at the same temperature, untruncated), then the generator's top-p cut on the
mixture, then the public support (the mass outside ``S`` joins the top-p tail: one tail outcome, one shared
noise ``u_tail``).  ``S`` is the top-k or top-p set of ``p_pub`` at temperature ``T``.

**Why no privacy claim changes** (paper Section 3.2, Observation 1 and its corollary: data-independent transforms
applied before the vote; docs/generation.md, "Public prior"; the same for Cold PATE's independent votes).  For a fixed public context, both transforms are one fixed function
``F`` applied to each teacher's distribution *separately*: ``q_i = F(p_i)`` depends on ``p_i`` and on public
quantities (``p_pub``, ``lambda``, ``S``) only.  Algorithm 1 on ``(F(p_1), ..., F(p_n))`` is still a
coordinated histogram in which teacher ``i``'s vote is a function of ``F(p_i)`` and the shared randomness.
Changing one teacher's data changes ``p_i`` alone, hence ``F(p_i)`` alone, hence at most that teacher's vote
(which may move to or from the tail): the neighbouring histograms differ by one moved vote, with ``n``
unchanged, which is exactly the relation every mechanism's claim is stated under.  So each mechanism's
``(epsilon, delta)``, threshold or target claim holds unchanged, and the accountants charge the same events.
``tests/test_public_prior.py`` checks this by enumeration (every pair of neighbouring teacher sets of a small
grid, on many noise draws, gives histograms that are a replace-one pair of the contract suite's enumeration).

The paper's appendix "Privacy analysis considerations" observes that responses agreeing with a public prior need
not cost privacy under a data-dependent analysis; mixing is the data-independent way to lean on the public
model, paid for in bias rather than in budget (each step is charged as before).

What they cost is utility, not privacy: mixing biases the released text towards the public model (its tokens,
including ones no teacher proposes, are released more often, the teachers' own favourites less often), and a
support makes a token the public model ranks low unreleasable.  ``docs/generation.md`` ("Public prior") and ``benchmarks/bench_public_prior.py`` measure both.
"""

from __future__ import annotations

import hashlib

import attr
import numpy as np

from ensembles.distributions import TeacherDistributions, top_p_keep
from pate_accountant.validation import check_int, check_real

__all__ = [
    "PublicMix",
    "PublicPrior",
    "PublicSupport",
    "as_public_mix",
    "as_public_support",
    "for_sampling",
    "mix_with_public",
    "restrict_to_support",
]


def _weight(value) -> float:
    return check_real("public_mix", value, minimum=0.0, maximum=1.0)


def _top_k(value):
    return None if value is None else check_int("public_support top_k", value, minimum=1)


def _top_p(value):
    return None if value is None else check_real("public_support top_p", value, minimum=0.0, maximum=1.0,
                                                 min_open=True)


@attr.s(frozen=True, slots=True, repr=False)
class PublicMix:
    """Public-prior mixing with weight ``lambda`` in ``[0, 1]``: teacher ``i`` races on
    ``lambda p_pub + (1 - lambda) p_i`` (module docstring).  ``PublicMix(0.0)`` is the identity."""

    weight: float = attr.ib(converter=_weight)

    def __repr__(self) -> str:
        return f"PublicMix({self.weight:g})"


@attr.s(frozen=True, slots=True, repr=False)
class PublicSupport:
    """A support fixed by the public model: ``PublicSupport(top_k=k)`` (its ``k >= 1`` most likely tokens, ties
    by token id) or ``PublicSupport(top_p=p)`` with ``p`` in ``(0, 1]`` (its smallest set of most likely tokens
    reaching mass ``p``, the rule of :meth:`~ensembles.TeacherDistributions.top_p`).  Exactly one of the two.
    A teacher's mass outside the set is one tail outcome that no mechanism releases (module docstring)."""

    top_k: int | None = attr.ib(default=None, kw_only=True, converter=_top_k)
    top_p: float | None = attr.ib(default=None, kw_only=True, converter=_top_p)

    def __attrs_post_init__(self):
        if (self.top_k is None) == (self.top_p is None):
            raise ValueError(f"public_support needs exactly one of top_k and top_p, got top_k={self.top_k!r} "
                             f"and top_p={self.top_p!r}")

    def select(self, probs: np.ndarray) -> np.ndarray:
        """The support of the public distribution ``probs`` (a dense ``(V,)`` vector): sorted token ids.  Only
        tokens of positive public probability are chosen, so the set may be smaller than ``top_k``."""
        probs = np.asarray(probs, dtype=np.float64)
        ids = np.flatnonzero(probs > 0)
        order = ids[np.lexsort((ids, -probs[ids]))]  # decreasing probability, ties by token id
        if self.top_k is not None:
            chosen = order[: self.top_k]
        else:
            sorted_probs = probs[order]
            before = np.cumsum(sorted_probs) - sorted_probs
            chosen = order[top_p_keep(sorted_probs, before, self.top_p)]
        return np.sort(chosen).astype(np.int64)

    def __repr__(self) -> str:
        return f"PublicSupport(top_k={self.top_k})" if self.top_k is not None else f"PublicSupport(top_p={self.top_p:g})"


def as_public_mix(value) -> PublicMix:
    """``public_mix`` as given to :class:`~ensembles.generation.PrivateGenerator`: a weight in ``[0, 1]`` or a
    :class:`PublicMix`."""
    return value if isinstance(value, PublicMix) else PublicMix(value)


def as_public_support(value) -> PublicSupport | None:
    """``public_support`` as given to :class:`~ensembles.generation.PrivateGenerator`: ``None`` (no support),
    an integer ``k >= 1`` (the public top-k) or a :class:`PublicSupport`."""
    if value is None or isinstance(value, PublicSupport):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"public_support must be None, a top-k integer or a PublicSupport, got {value!r}")
    return PublicSupport(top_k=check_int("public_support", value, minimum=1))


class PublicPrior:
    """One position's public information, handed to ``backend.votes(..., public=prior)``: the public
    distribution ``probs`` (a read-only dense ``(V,)`` float64 vector at the generator's temperature, summing to
    1; a public row with a tail is renormalised over its listed tokens), the mixing weight ``mix`` and the
    support ``support`` (sorted token ids, or ``None``).  Everything in it is public: it is a function of the
    public model's context alone.  ``digest`` identifies the content (a backend may cache work per prior)."""

    __slots__ = ("digest", "mix", "probs", "support", "support_spec")

    def __init__(self, probs, *, mix=0.0, support: PublicSupport | None = None):
        probs = np.array(probs, dtype=np.float64)
        if probs.ndim != 1 or probs.size == 0:
            raise ValueError(f"the public distribution must be a non-empty 1-d vector, got shape {probs.shape}")
        if not np.isfinite(probs).all() or (probs < 0).any():
            raise ValueError("the public distribution must hold finite non-negative probabilities")
        total = probs.sum()
        if total <= 0:
            raise ValueError("the public distribution has no mass")
        probs /= total
        probs.setflags(write=False)
        spec = as_public_support(support)
        chosen = None if spec is None else spec.select(probs)
        if chosen is not None:
            chosen.setflags(write=False)
        mix = as_public_mix(mix).weight
        digest = hashlib.blake2b(digest_size=16)
        digest.update(np.float64(mix).tobytes())
        digest.update(probs.tobytes())
        digest.update(b"none" if chosen is None else chosen.tobytes())
        self.__setstate__({"probs": probs, "mix": mix, "support": chosen, "support_spec": spec,
                           "digest": digest.hexdigest()})

    def __setattr__(self, name, value):
        raise AttributeError(f"PublicPrior is immutable: cannot set {name}")

    @classmethod
    def from_distributions(cls, public: TeacherDistributions, *, temperature: float = 1.0, mix=0.0,
                           support: PublicSupport | None = None) -> PublicPrior:
        """From the public backend's distributions (one row: the public context), at ``temperature``."""
        if not isinstance(public, TeacherDistributions):
            raise TypeError(f"public must be a TeacherDistributions, got {type(public).__name__}")
        if public.num_teachers != 1:
            raise ValueError(f"the public distribution must be one row, got {public.num_teachers}")
        ids, probs = public.for_sampling(temperature, None).row(0)
        dense = np.zeros(public.vocab_size)
        dense[ids] = probs
        return cls(dense, mix=mix, support=support)

    @property
    def vocab_size(self) -> int:
        return int(self.probs.size)

    @property
    def active(self) -> bool:
        """Whether the prior changes anything (a positive weight or a support)."""
        return self.mix > 0 or self.support is not None

    def check_vocab(self, vocab_size: int) -> None:
        if vocab_size != self.probs.size:
            raise ValueError(f"the public prior is over {self.probs.size} tokens, the teachers over {vocab_size}")

    def __getstate__(self):  # sent to shard workers (Ray pickles it)
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state):
        for name, value in state.items():
            if isinstance(value, np.ndarray) and value.flags.writeable:
                value = value.copy()
                value.setflags(write=False)
            object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        support = "None" if self.support is None else f"{self.support.size} tokens"
        return f"PublicPrior(vocab_size={self.vocab_size}, mix={self.mix:g}, support={support})"


def mix_with_public(teachers: TeacherDistributions, public_probs, weight: float) -> TeacherDistributions:
    """``q_i = weight * p_pub + (1 - weight) * p_i`` for every teacher (a teacher's tail is scaled by
    ``1 - weight``; ``p_pub`` is a dense ``(V,)`` distribution).  Rows list their tokens by increasing id.

    Teacher ``i``'s row depends on its own row and on public inputs only (module docstring)."""
    if not isinstance(teachers, TeacherDistributions):
        raise TypeError(f"teachers must be a TeacherDistributions, got {type(teachers).__name__}")
    weight = check_real("public_mix", weight, minimum=0.0, maximum=1.0)
    public_probs = np.asarray(public_probs, dtype=np.float64)
    n, vocab = teachers.num_teachers, teachers.vocab_size
    if public_probs.shape != (vocab,):
        raise ValueError(f"the public distribution must have shape ({vocab},), got {public_probs.shape}")
    if weight == 0.0:
        return teachers
    pub_ids = np.flatnonzero(public_probs > 0)
    rows = np.concatenate([teachers.teacher_of_entry(), np.repeat(np.arange(n), pub_ids.size)])
    ids = np.concatenate([teachers.token_ids, np.tile(pub_ids, n)])
    values = np.concatenate([(1.0 - weight) * teachers.probs, np.tile(weight * public_probs[pub_ids], n)])
    keys, inverse = np.unique(rows * vocab + ids, return_inverse=True)
    summed = np.bincount(inverse, weights=values, minlength=keys.size)
    keep = summed > 0
    keys, summed = keys[keep], summed[keep]
    entry_rows = keys // vocab
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(entry_rows, minlength=n), out=indptr[1:])
    tail = (1.0 - weight) * teachers.tail
    # Rows sum to (1 - weight) + weight = 1 by construction (each input row sums to 1).
    return TeacherDistributions(indptr, (keys % vocab).astype(np.int64), summed, tail, vocab, _validated=True)


def restrict_to_support(teachers: TeacherDistributions, support) -> TeacherDistributions:
    """Every teacher keeps its tokens in ``support`` (sorted token ids); the rest of its mass joins its tail,
    one outcome whose vote is :data:`~ensembles.TAIL_VOTE` (module docstring)."""
    if not isinstance(teachers, TeacherDistributions):
        raise TypeError(f"teachers must be a TeacherDistributions, got {type(teachers).__name__}")
    support = np.asarray(support, dtype=np.int64)
    inside = np.zeros(teachers.vocab_size, dtype=bool)
    if support.size and (support.min() < 0 or support.max() >= teachers.vocab_size):
        raise ValueError(f"support token ids must lie in [0, {teachers.vocab_size})")
    inside[support] = True
    return teachers._truncate(inside[teachers.token_ids], renormalize=False)


def for_sampling(teachers: TeacherDistributions, temperature: float = 1.0, top_p: float | None = None,
                 public: PublicPrior | None = None) -> TeacherDistributions:
    """The distributions the teachers race on, on the host: without ``public`` exactly
    :meth:`TeacherDistributions.for_sampling`; with it, temperature, then the mixing, then top-p, then the
    support (module docstring).  :meth:`~ensembles.backends.base.ContextBackend.votes` uses it; the device
    kernel (:func:`~ensembles.backends.device_votes.device_votes`) does the same on logits."""
    if public is None:
        return teachers.for_sampling(temperature, top_p)
    if not isinstance(public, PublicPrior):
        raise TypeError(f"public must be a PublicPrior or None, got {type(public).__name__}")
    public.check_vocab(teachers.vocab_size)
    dists = teachers.for_sampling(temperature, None)
    if public.mix > 0:
        dists = mix_with_public(dists, public.probs, public.mix)
    if top_p is not None:
        top_p = check_real("top_p", top_p, minimum=0.0, maximum=1.0, min_open=True)
        if top_p < 1.0:
            dists = dists.top_p(top_p)
    if public.support is not None:
        dists = restrict_to_support(dists, public.support)
    return dists
