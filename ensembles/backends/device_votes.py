"""Votes computed where the logits are: the keyed vote kernels of :mod:`ensembles.keyed_votes` in torch.

A backend that holds its teachers' next-token logits on a device (``TransformersBackend``, a shard worker)
calls :func:`device_votes` and sends back one ``int32`` vote per teacher; no distribution leaves the device.

* Temperature and top-p are applied here, once, to the raw logits.
* **Hot PATE** (paper Section 3, Algorithm 1, in its exponential-race form): the shared noise
  ``u = shared_noise(key, V)`` is drawn on the host (a counter-based Philox stream, about a millisecond for
  ``V = 128k``) and copied to the device; teacher ``i`` votes ``argmax_j (logit_ij / T - log u_j)``.  With
  top-p, only the kept tokens race, against the tail outcome ``log tail_i - log u_tail``.
* **Cold PATE**: inverse-CDF sampling in token-id order (the tail last) on ``teacher_uniforms(key, ids)``.
* **Public prior** (:mod:`ensembles.public_prior`, optional): the mixing ``lambda p_pub + (1 - lambda) p_i`` is
  a ``logaddexp`` of each row's log-softmax with ``log p_pub`` (the public distribution is computed once per
  position by the generator and sent with the key); a public support keeps only its tokens in the race, the
  rest of each row's mass being the tail outcome, so the race runs over ``|S| + 1`` outcomes.

The top-p cut is the host rule (:func:`~ensembles.distributions.top_p_keep`) on float64 probabilities of the
tokens within a margin of each row's most likely one (:data:`ensembles.keyed_votes.TOP_P_MARGINS`), so no
row is ever fully sorted unless its distribution is flat.  The normaliser ``logsumexp_j logit_ij / T`` is
computed in ``dtype``: ``dtype=torch.float64`` reproduces the host path exactly (the tests' proof), float32
(the default) moves each probability by about 1e-7 relative, which can only move a top-p cut
whose running mass lies within that of ``top_p``.  Either way the cut is a function of the teacher's own
logits, so the votes keep Algorithm 1's law and the privacy analysis is unchanged.

torch is imported inside the functions only.
"""

from __future__ import annotations

import numpy as np

from ensembles import keyed_votes
from ensembles.distributions import TOP_P_TOLERANCE, top_p_keep
from ensembles.histograms import TAIL_VOTE
from ensembles.keyed_votes import (
    StepKey,
    check_histograms,
    shared_noise,
    teacher_uniforms,
)
from ensembles.public_prior import PublicPrior
from pate_accountant.validation import check_real

__all__ = ["device_votes"]

#: Rows of float64 probabilities materialised at once by the Cold PATE kernel (bounds its device memory).
_COLD_ROWS = 64


def device_votes(logits, key: StepKey, *, temperature: float = 1.0, top_p: float | None = None,
                 histograms: str = "coordinated", teacher_ids=None, dtype=None, cache=None, public=None) -> np.ndarray:
    """One ``int32`` vote per row of ``logits`` (a ``(n, V)`` torch tensor of raw next-token logits, on any
    device) on the randomness of ``key``, at ``temperature`` with the optional ``top_p`` cut; a vote into the
    top-p tail is :data:`~ensembles.TAIL_VOTE`.  ``histograms``: ``"coordinated"`` (Hot PATE) or
    ``"independent"`` (Cold PATE, with ``teacher_ids`` the rows' original teacher indices, default
    ``0..n-1``).  ``dtype`` (default float32): the precision of the race and of the exponentials.

    ``public`` (optional, a :class:`~ensembles.public_prior.PublicPrior`): the public-prior transforms, in the
    order of :func:`ensembles.public_prior.for_sampling`.  The mixing replaces each row's normalised
    log-probabilities by ``log(lambda p_pub + (1 - lambda) softmax(logits / T))`` (a ``logaddexp``, in
    ``dtype``); the top-p cut then acts on the mixture; a support keeps, of each row's kept tokens, those in
    the support, and the rest of the row's mass joins the tail outcome.  Each transform acts on one row and
    public inputs, so the votes keep Observation 1's sensitivity (one teacher changes at most its own vote).

    ``cache`` (optional, a dict the caller empties whenever ``logits`` change): keeps the top-p or support cut of
    these logits (or, for mixing without a cut, the mixed rows), which do not depend on the key, so that a retry
    at the same position (a new key) only races again on new noise."""
    import torch

    if not isinstance(key, StepKey):
        raise TypeError(f"key must be a StepKey, got {type(key).__name__}")
    check_histograms(histograms)
    temperature = check_real("temperature", temperature, minimum=0.0, min_open=True)
    if top_p is not None:
        top_p = check_real("top_p", top_p, minimum=0.0, maximum=1.0, min_open=True)
        if top_p >= 1.0:
            top_p = None
    if logits.ndim != 2:
        raise ValueError(f"logits must be a 2-d (teachers, vocabulary) tensor, got shape {tuple(logits.shape)}")
    if public is not None:
        if not isinstance(public, PublicPrior):
            raise TypeError(f"public must be a PublicPrior or None, got {type(public).__name__}")
        public.check_vocab(int(logits.shape[1]))
        if not public.active:
            public = None
    dtype = torch.float32 if dtype is None else dtype
    n, vocab = logits.shape
    prior = None if public is None else public.digest
    support = None if public is None else public.support
    device = logits.device
    if histograms == "independent":
        ids = np.arange(n) if teacher_ids is None else np.asarray(teacher_ids)
        if ids.shape != (n,):
            raise ValueError(f"teacher_ids must hold one index per teacher ({n}), got {ids.shape}")
        return _independent(_scaled(logits, temperature, dtype, public, None), teacher_uniforms(key, ids), top_p,
                            support)
    noise, tail_noise = shared_noise(key, vocab)
    minus_log_u = torch.from_numpy(-np.log(noise)).to(device=device, dtype=dtype)
    if top_p is None and support is None:  # every retry races on the whole rows (a mixture is kept in cache)
        scaled = _scaled(logits, temperature, dtype, public, cache)
        return torch.argmax(scaled + minus_log_u, dim=1).to(torch.int32).cpu().numpy()
    cut_key = (temperature, top_p, dtype, prior)
    cut = None if cache is None else cache.get(cut_key)
    if cut is None:  # a retry reuses the cut: the rows themselves are not needed again
        scaled = _scaled(logits, temperature, dtype, public, None)
        if top_p is not None:
            rows, cols, _, log_norm, tail = _top_p_entries(scaled, top_p)
            kept = scaled[rows, cols]
            if support is not None:
                rows, cols, kept, tail = _in_support(rows, cols, kept, log_norm, tail, support, vocab)
        else:
            rows, cols, kept, log_norm, tail = _support_entries(scaled, support)
        cut = (rows, cols, kept, log_norm, tail)
        if cache is not None:
            cache[cut_key] = cut
    rows, cols, kept, log_norm, tail = cut
    # The race among each row's kept tokens; ties (probability zero) go to the smallest token id.
    score = kept + minus_log_u[cols]
    best = torch.full((n,), -torch.inf, dtype=dtype, device=device).scatter_reduce(0, rows, score, "amax")
    winner = torch.where(score == best[rows], cols, vocab)
    votes = torch.full((n,), vocab, dtype=torch.long, device=device).scatter_reduce(0, rows, winner, "amin")
    # The tail outcome races too: log tail - log u_tail against the best kept log p_j - log u_j.
    tail_score = torch.log(tail) - float(np.log(tail_noise))
    tail_wins = tail_score > best.to(torch.float64) - log_norm
    votes = torch.where(tail_wins, torch.full_like(votes, TAIL_VOTE), votes)
    return votes.to(torch.int32).cpu().numpy()


def _scaled(logits, temperature: float, dtype, public, cache):
    """``logits / T`` in ``dtype``; with public-prior mixing, the rows' log-mixture
    ``log(lambda p_pub + (1 - lambda) softmax(logits / T))`` instead (kept in ``cache`` when one is given: it
    does not depend on the key).  Either is a row's log-probabilities up to a constant of the row, which is all
    the race needs."""
    import torch

    scaled = logits.to(dtype) / temperature
    if public is None or public.mix == 0.0:
        return scaled
    mix_key = ("mixture", temperature, dtype, public.digest)
    if cache is not None and mix_key in cache:
        return cache[mix_key]
    with np.errstate(divide="ignore"):
        log_public = torch.from_numpy(np.log(public.probs)).to(device=scaled.device, dtype=dtype)
    if public.mix == 1.0:
        mixed = log_public.expand(scaled.shape[0], -1).contiguous()
    else:
        own = torch.log_softmax(scaled, dim=1) + float(np.log1p(-public.mix))
        mixed = torch.logaddexp(own, log_public + float(np.log(public.mix)))
    if cache is not None:
        cache[mix_key] = mixed
    return mixed


def _support_entries(scaled, support: np.ndarray):
    """The race's entries when only a public support cuts: every row keeps the support's tokens, and its tail is
    the rest of its mass (``1 - sum`` over the support, float64).  Same layout as the top-p cut:
    ``(rows, cols, kept, log_norm, tail)`` with ``kept`` the entries of ``scaled``."""
    import torch

    device = scaled.device
    n = scaled.shape[0]
    cols_one = torch.from_numpy(np.array(support, dtype=np.int64)).to(device)  # a copy: the prior's is read-only
    log_norm = _log_normaliser(scaled)
    block = scaled[:, cols_one]
    mass = torch.exp(block.to(torch.float64) - log_norm[:, None]).sum(dim=1)
    tail = torch.clamp(1.0 - mass, 0.0, 1.0)
    rows = torch.arange(n, device=device).repeat_interleave(cols_one.numel())
    cols = cols_one.repeat(n)
    return rows, cols, block.reshape(-1), log_norm, tail


def _in_support(rows, cols, kept, log_norm, tail, support: np.ndarray, vocab: int):
    """Of a top-p cut's kept entries, those in the public ``support``; the others' mass joins each row's tail."""
    import torch

    keep = _support_mask(support, vocab, kept.device)[cols]
    dropped = torch.exp(kept[~keep].to(torch.float64) - log_norm[rows[~keep]])
    tail = torch.clamp(tail.index_add(0, rows[~keep], dropped), 0.0, 1.0)
    return rows[keep], cols[keep], kept[keep], tail


def _support_mask(support: np.ndarray, size: int, device):
    """A boolean vector of length ``size`` that is true on the support's token ids."""
    import torch

    mask = np.zeros(size, dtype=bool)
    mask[np.asarray(support, dtype=np.int64)] = True
    return torch.from_numpy(mask).to(device)


def _log_normaliser(scaled):
    """``logsumexp`` of each row in ``scaled``'s dtype (torch's fused kernel), returned as float64."""
    import torch

    return torch.logsumexp(scaled, dim=1).to(torch.float64)


def _top_p_entries(scaled, top_p: float):
    """The top-p cut of every row: ``(rows, cols, probs, log_norm, tail)``, the kept entries (row-major, each
    row by decreasing probability), their float64 probabilities, each row's float64 log-normaliser and
    dropped mass.  Looks at the tokens within each margin of :data:`ensembles.keyed_votes.TOP_P_MARGINS` in turn (module docstring);
    a row is settled once the tokens looked at hold mass ``top_p``, since they are a prefix of its order."""
    import torch

    device = scaled.device
    n = scaled.shape[0]
    log_norm = _log_normaliser(scaled)
    row_max = scaled.max(dim=1).values
    pending = torch.arange(n, device=device)
    kept_rows, kept_cols, kept_probs = [], [], []
    tail = torch.empty(n, dtype=torch.float64, device=device)
    for margin in keyed_votes.TOP_P_MARGINS:
        sub = scaled[pending]
        r, c = torch.nonzero(sub >= (row_max[pending] - margin)[:, None], as_tuple=True)
        logp = sub[r, c].to(torch.float64) - log_norm[pending][r]
        # nonzero is row-major with ascending ids: a stable sort by -logp, then by row, gives each row in
        # decreasing probability with ties by token id (the order of TeacherDistributions.top_p).
        order = torch.argsort(-logp, stable=True)
        order = order[torch.argsort(r[order], stable=True)]
        r, c, probs = r[order], c[order], torch.exp(logp[order])
        running = torch.cumsum(probs, dim=0)
        starts = torch.searchsorted(r, torch.arange(pending.numel(), device=device))
        ends = torch.cat([starts[1:], torch.tensor([r.numel()], device=device)])
        offset = torch.cat([torch.zeros(1, dtype=torch.float64, device=device), running])[starts]
        keep = top_p_keep(probs, running - probs - offset[r], top_p)
        mass = torch.cat([torch.zeros(1, dtype=torch.float64, device=device), running])[ends] - offset
        done = (mass >= top_p - TOP_P_TOLERANCE) if np.isfinite(margin) else torch.ones_like(mass, dtype=torch.bool)
        settled = done[r] & keep
        kept_rows.append(pending[r[settled]])
        kept_cols.append(c[settled])
        kept_probs.append(probs[settled])
        kept_mass = torch.zeros(pending.numel(), dtype=torch.float64, device=device).index_add_(
            0, r[settled], probs[settled])
        tail[pending[done]] = torch.clamp(1.0 - kept_mass[done], 0.0, 1.0)
        pending = pending[~done]
        if pending.numel() == 0:
            break
    rows, cols, probs = torch.cat(kept_rows), torch.cat(kept_cols), torch.cat(kept_probs)
    return rows, cols, probs, log_norm, tail


def _independent(scaled, uniforms: np.ndarray, top_p: float | None, support=None) -> np.ndarray:
    """Cold PATE: row ``i`` votes the first token (in id order, the tail last) whose running probability
    exceeds ``uniforms[i]`` times the row's total, in float64, ``_COLD_ROWS`` rows at a time.  A public
    ``support`` zeroes the tokens outside it, whose mass joins the tail."""
    import torch

    n, vocab = scaled.shape
    device = scaled.device
    if top_p is None:
        tail = torch.zeros(n, dtype=torch.float64, device=device)
    else:
        rows, cols, probs, _, tail = _top_p_entries(scaled, top_p)
    outside = None if support is None else ~_support_mask(support, vocab, device)
    draws = torch.from_numpy(uniforms).to(device)
    votes = np.empty(n, dtype=np.int32)
    for start in range(0, n, _COLD_ROWS):
        stop = min(n, start + _COLD_ROWS)
        if top_p is None:
            chunk = scaled[start:stop].to(torch.float64)
            dense_rows = torch.softmax(chunk, dim=1)
        else:
            dense_rows = torch.zeros((stop - start, vocab), dtype=torch.float64, device=device)
            mine = (rows >= start) & (rows < stop)
            dense_rows[rows[mine] - start, cols[mine]] = probs[mine]
        chunk_tail = tail[start:stop]
        if outside is not None:
            chunk_tail = chunk_tail + dense_rows[:, outside].sum(dim=1)
            dense_rows[:, outside] = 0.0
        table = torch.cat([dense_rows, chunk_tail[:, None]], dim=1)
        cumulative = torch.cumsum(table, dim=1)
        target = draws[start:stop] * cumulative[:, -1]
        index = torch.searchsorted(cumulative, target[:, None], right=True)[:, 0]
        # Land on a token of positive mass: the last one when rounding pushes the draw past the end.
        positive = table > 0
        last = vocab - torch.argmax(positive.flip(1).to(torch.int8), dim=1)
        index = torch.minimum(index, last)
        index = torch.where(index == vocab, torch.full_like(index, TAIL_VOTE), index)
        votes[start:stop] = index.to(torch.int32).cpu().numpy()
    return votes
