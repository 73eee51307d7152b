"""The runs of ``pate-accountant experiment tokens-per-epsilon`` (:mod:`pate_app.experiments.tokens_per_epsilon`):
each configuration generates on its tape until its accountant refuses the next step, or until the hard cap of
``cap`` steps, every charge going through the real accountant with an in-memory ledger that is verified at the
end (:meth:`pate_accountant.ledger.Ledger.verify`, what ``pate-accountant audit`` runs).

* :func:`run_fixed`: every step charged the same event (plain DPArgMax and DPWS, GNMax, Tang et al.) under PLD
  or RDP, the number of steps the budget affords found with the accountant's own ``can_afford``;
* :func:`run_groups`: the same in ``G`` disjoint groups of teachers through ``parallel_groups(G)`` of ONE
  accountant on ONE ledger (parallel composition, the envelope rule; docs/groups.md);
* :func:`run_tct` / :func:`run_tct_groups`: boundary-wrapped queries under target charging (paper Section 6),
  only the target hits charged, alone or in groups (the hit envelope, misses summed);
* :func:`run_individual`: the public-candidate BetweenThresholds under individual charging
  (docs/tct_and_individual.md, "In generate"), teachers removed at their per-teacher limit;
* :func:`run_invisibleink`: the peer InvisibleInk (:mod:`pate_app.experiments.peers`) on disjoint batches, each
  batch its own zCDP accountant and ledger.

Each returns an :class:`Outcome` (the steps, the private tokens, why it stopped, what it spent), which
:func:`metrics` turns into the row's reported numbers.
"""

from __future__ import annotations

import math

import attr
import numpy as np

from pate_app.experiments.peers import (
    add_remove_budget,
    invisibleink_clip,
    invisibleink_distribution,
    invisibleink_rho,
    replace_one_spent,
)
from pate_app.experiments.tokens_world import (
    ADD_REMOVE_ONE,
    CHUNK,
    NAME,
    REPLACE_ONE,
    Tape,
    VoteStream,
    World,
    public_candidates,
)

#: Steps per round of a target-charged ``-groups`` run (the groups advance in turn, one round each).
GROUP_ROUND = 32


# -- accountants and runs --------------------------------------------------------------------------------------


def _accountant(kind: str, budget, ledger=None):
    from pate_accountant.accountants import (
        PldAccountant,
        RdpAccountant,
        TargetChargingAccountant,
    )

    if kind == "target-charging":
        return TargetChargingAccountant(budget=budget, ledger=ledger, query_delta_share=0.5)
    if kind == "pld":
        return PldAccountant(budget=budget, ledger=ledger, neighboring_relation=REPLACE_ONE)
    if kind == "zcdp":
        return RdpAccountant(budget=budget, ledger=ledger, neighboring_relation=REPLACE_ONE)
    if kind in ("tang-pld", "tang-rdp"):
        cls = PldAccountant if kind == "tang-pld" else RdpAccountant
        return cls(budget=None if budget is None else add_remove_budget(*budget), ledger=ledger,
                   neighboring_relation=ADD_REMOVE_ONE)
    raise ValueError(f"unknown accountant {kind!r}")



def affordable_steps(kind: str, budget, event, cap: int, memo: dict) -> int:
    """The most steps of ``event`` (at most ``cap``) a fresh accountant of ``kind`` with ``budget`` affords,
    found with its own ``can_afford`` (doubling, then bisection); memoised: for a row whose every step is
    charged the same event the answer does not depend on the data."""
    return _affordable(kind, budget, event, cap, memo)[0]


def refused_after(kind: str, budget, event, cap: int, memo: dict) -> bool:
    """Whether that accountant refuses the step after :func:`affordable_steps` (``False``: the cap came first)."""
    return _affordable(kind, budget, event, cap, memo)[1]


def _affordable(kind: str, budget, event, cap: int, memo: dict) -> tuple[int, bool]:
    key = (kind, tuple(budget), repr(event), cap)
    if key not in memo:
        acc = _accountant(kind, budget)
        lo, hi = 0, 1
        while hi <= cap and acc.can_afford(event, hi):
            lo, hi = hi, 2 * hi
        if hi > cap:
            if acc.can_afford(event, cap):
                lo, hi = cap, cap + 1
            else:
                hi = cap
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if acc.can_afford(event, mid) else (lo, mid)
        memo[key] = (lo, lo < cap or not acc.can_afford(event, cap + 1))
    return memo[key]


@attr.s(slots=True)
class Outcome:
    """One run: the steps it ran, its releases (private tokens in order), why it stopped, what it spent."""

    steps: int = attr.ib()
    tokens: np.ndarray = attr.ib()
    hits: int = attr.ib()
    fails: int = attr.ib()
    stop: str = attr.ib()
    spent: tuple = attr.ib()
    passes: int = attr.ib()
    ledgers: int = attr.ib(default=1)
    verified: bool = attr.ib(default=False)
    #: The queries the ledger's verification counted (target charging records each query's outcome class).
    ledger_queries: int | None = attr.ib(default=None)
    #: A ``-groups`` row: each group's private tokens (``steps`` is then each group's number of steps, or the
    #: most of any group when they differ: ``group_steps``).
    group_tokens: tuple | None = attr.ib(default=None)
    #: A target-charged ``-groups`` row: each group's number of steps (groups stop at different steps).
    group_steps: tuple | None = attr.ib(default=None)


_NO_SPENT = (math.nan, math.nan)


def tape_releases(tape, steps: int) -> tuple[np.ndarray, int, int]:
    """``(private tokens, target hits, fails)`` of the tape's first ``steps`` steps.  A target hit releases
    nothing (a boundary wrapper's ``target``) unless the tape says ``hit_releases`` (BetweenThresholds'
    ``between`` releases the candidate); a fail is a step that neither released nor hit."""
    tape.ensure(steps)
    values = tape.values[:steps]
    hits = tape.hits[:steps] if hasattr(tape, "hits") else np.zeros(steps, bool)
    released = values >= 0
    if not getattr(tape, "hit_releases", False):
        released &= ~hits
    tokens = values[released]
    return tokens, int(hits.sum()), int(steps - np.count_nonzero(released | hits))


def run_fixed(kind: str, event, tape, budget, cap: int, memo: dict, *, calibrate: bool = False) -> Outcome:
    """A row whose every step is charged ``event``: ``can_afford(event, k)`` for the most steps ``k`` the budget
    affords, ``k`` releases from the tape, ``compose(event, k)``; then the next step must be refused (or the
    run reached the cap).  ``calibrate``: only the count ``k`` (the same accountant's answer, memoised) and the
    releases, no accountant or ledger of its own."""
    from pate_accountant.ledger import Ledger

    k = affordable_steps(kind, budget, event, cap, memo)
    if calibrate:
        tokens, hits, fails = tape_releases(tape, k)
        stop = "refused" if refused_after(kind, budget, event, cap, memo) else "cap"
        return Outcome(k, tokens, hits, fails, stop, _NO_SPENT, tape.passes(k), 0, True)
    ledger = Ledger.in_memory()
    acc = _accountant(kind, budget, ledger)
    if k:
        if not acc.can_afford(event, k):  # pragma: no cover - the memo is the same accountant's answer
            raise RuntimeError(f"{kind}: {k} steps of {event!r} were affordable on a fresh accountant, not now")
        tape.ensure(k)
        acc.compose(event, k)
    stop = _stop(acc, event, k, cap)
    tokens, hits, fails = tape_releases(tape, k)
    spent = replace_one_spent(*acc.spent()) if kind.startswith("tang-") else acc.spent()
    return Outcome(k, tokens, hits, fails, stop, spent, tape.passes(k), 1, bool(ledger.verify().ok))


def run_groups(kind: str, event, tapes: list, budget, cap: int, memo: dict, *, row: str = "",
               calibrate: bool = False) -> Outcome:
    """A ``-groups`` row (docs/groups.md): ``G = len(tapes)`` disjoint groups of teachers, each with its own vote
    stream and tape, charged through ``parallel_groups(G)`` of ONE accountant on ONE in-memory ledger
    (``begin_run`` first).  Each group's view affords the steps a fresh accountant affords (the envelope rule:
    a group pays only where it passes the largest count any group was charged), so each group runs ``k`` steps,
    ``can_afford(event, k)`` and ``compose(event, k)`` on its own view; the data set pays once.  The run ends
    when every group's view refuses the next step (or at the cap); private tokens are summed over the groups.
    ``calibrate``: the memoised count and the releases, no accountant or ledger."""
    from pate_accountant.ledger import Ledger

    k = affordable_steps(kind, budget, event, cap, memo)
    releases = [tape_releases(tape, k) for tape in tapes]
    tokens = np.concatenate([r[0] for r in releases])
    hits, fails = sum(r[1] for r in releases), sum(r[2] for r in releases)
    passes = sum(tape.passes(k) for tape in tapes)
    per_group = tuple(int(r[0].size) for r in releases)
    if calibrate:
        stop = "refused" if refused_after(kind, budget, event, cap, memo) else "cap"
        return Outcome(k, tokens, hits, fails, stop, _NO_SPENT, passes, 0, True, group_tokens=per_group)
    ledger = Ledger.in_memory()
    acc = _accountant(kind, budget, ledger)
    ledger.begin_run({"experiment": NAME, "row": row, "groups": len(tapes), "seeded": True})
    views = acc.parallel_groups(len(tapes))
    for view in views:
        if k:
            if not view.can_afford(event, k):  # pragma: no cover - the envelope affords what one group alone does
                raise RuntimeError(f"{kind}: {k} steps of {event!r} are not affordable for {view!r}")
            view.compose(event, k)
    stops = {_stop(view, event, k, cap) for view in views}
    stop = "cap" if "cap" in stops else "refused"
    verification = ledger.verify()
    return Outcome(k, tokens, hits, fails, stop, acc.spent(), passes, 1, bool(verification.ok),
                   verification.queries, group_tokens=per_group)


def _stop(acc, event, steps: int, cap: int) -> str:
    """``"refused"`` when the accountant refuses the next step, else ``"cap"`` (the run reached the cap)."""
    if not acc.can_afford(event, 1):
        return "refused"
    if steps < cap:  # pragma: no cover - a run stops only by refusal or at the cap
        raise RuntimeError(f"run stopped at {steps} steps while its accountant still affords {event!r}")
    return "cap"


def _tct_block(charge, limits, tape, steps: int, cap: int, own_hits: int) -> int:
    """One block of a target-charged run, after ``charge.can_afford`` accepted the next query: queries
    ``steps ..`` of ``tape``, at most ``CHUNK``, the cap and the queries ``limits`` (the target-charging
    accountant) has left, cut after the hit that takes ``own_hits`` (the hits of the queries ``charge`` records,
    so far) to the hit limit (a query runs only while ``hits < max_hits``); ``record_outcomes`` on ``charge``
    (the accountant, or one group's view) applies the accountant's one-by-one decision, halving the block if it
    refuses.  Returns the block's length."""
    from pate_accountant.errors import BudgetExhaustedError

    event = tape.mechanism.event
    if limits.max_hits is None:
        block = 1
    else:
        block = min(CHUNK, cap - steps, max(1, limits.max_queries - limits.queries))
    tape.ensure(steps + block)
    hit = tape.hits[steps:steps + block]
    if limits.max_hits is not None:
        reached = np.flatnonzero(np.cumsum(hit) >= limits.max_hits - own_hits)
        if reached.size:
            block = int(reached[0]) + 1
    while True:
        try:
            charge.record_outcomes(event, tape.hits[steps:steps + block], outcomes=tape.outcomes[steps:steps + block])
            return block
        except BudgetExhaustedError:
            if block == 1:
                raise
            block //= 2


def run_tct(tape: Tape, budget, cap: int, *, calibrate: bool = False) -> Outcome:
    """A target-charged row: queries in blocks (:func:`_tct_block`), each block checked by ``can_afford`` for
    its worst case where that allows it, and cut after the hit that exhausts the hit limit (a query runs only
    while ``hits < max_hits``); ``record_outcomes`` applies the accountant's one-by-one decision to the block.
    Releases past the cut are the queries the accountant would refuse: discarded unseen (equal in law to never
    running them, each release depending on its own histogram and noise only).  The run ends when
    ``can_afford`` refuses the next query, or at the cap.  ``calibrate``: the same accountant without a
    ledger."""
    from pate_accountant.ledger import Ledger

    ledger = None if calibrate else Ledger.in_memory()
    acc = _accountant("target-charging", budget, ledger)
    event = tape.mechanism.event
    steps = 0
    while steps < cap and acc.can_afford(event):
        steps += _tct_block(acc, acc, tape, steps, cap, acc.hits)
    stop = _stop(acc, event, steps, cap)
    tokens, hits, fails = tape_releases(tape, steps)
    if calibrate:
        return Outcome(steps, tokens, hits, fails, stop, acc.spent(), tape.passes(steps), 0, True)
    verification = ledger.verify()
    return Outcome(steps, tokens, hits, fails, stop, acc.spent(), tape.passes(steps), 1, bool(verification.ok),
                   verification.queries)


def run_tct_groups(tapes: list, budget, cap: int, *, row: str = "", calibrate: bool = False,
                   accountant_out: list | None = None) -> Outcome:
    """A target-charged ``-groups`` row (docs/groups.md): ``G = len(tapes)`` disjoint groups, each with its own
    vote stream and tape of wrapped queries, charged through ``parallel_groups(G)`` of ONE target-charging
    accountant on ONE in-memory ledger (``begin_run`` first).  Target charging pays the largest number of hits
    of any group (the envelope) and every query without a hit as it comes, summed over the groups
    (:mod:`pate_accountant.accountants.parallel`); so once one group reaches the hit limit, a query without a
    hit is refused to every group.  The groups advance nearly in lockstep, as a run's groups generate side by
    side: in rounds of :data:`GROUP_ROUND` steps, each group in turn runs its queries up to the round's end
    (:func:`_tct_block` on the group's view, with the group's own hits against the hit limit), until every
    group's view refuses its next query or the group reached the cap (per group); private tokens are summed
    over the groups.
    ``calibrate``: the same accountant without a ledger.  ``accountant_out``: a list the accountant is appended
    to (tests)."""
    from pate_accountant.ledger import Ledger

    ledger = None if calibrate else Ledger.in_memory()
    acc = _accountant("target-charging", budget, ledger)
    if ledger is not None:
        ledger.begin_run({"experiment": NAME, "row": row, "groups": len(tapes), "seeded": True})
    views = list(acc.parallel_groups(len(tapes)))
    event = tapes[0].mechanism.event
    steps, hits = [0] * len(tapes), [0] * len(tapes)
    moved, end = True, 0
    while moved:
        moved, end = False, min(cap, end + GROUP_ROUND)
        for g, (view, tape) in enumerate(zip(views, tapes)):
            while steps[g] < end and view.can_afford(event):
                block = _tct_block(view, acc, tape, steps[g], end, hits[g])
                hits[g] += int(np.count_nonzero(tape.hits[steps[g]:steps[g] + block]))
                steps[g] += block
                moved = True
    stops = {_stop(view, event, k, cap) for view, k in zip(views, steps)}
    stop = "cap" if "cap" in stops else "refused"
    releases = [tape_releases(tape, k) for tape, k in zip(tapes, steps)]
    tokens = np.concatenate([r[0] for r in releases])
    n_hits, fails = sum(r[1] for r in releases), sum(r[2] for r in releases)
    passes = sum(tape.passes(k) for tape, k in zip(tapes, steps))
    per_group = tuple(int(r[0].size) for r in releases)
    if accountant_out is not None:
        accountant_out.append(acc)
    if calibrate:
        return Outcome(max(steps), tokens, n_hits, fails, stop, acc.spent(), passes, 0, True,
                       group_tokens=per_group, group_steps=tuple(steps))
    verification = ledger.verify()
    return Outcome(max(steps), tokens, n_hits, fails, stop, acc.spent(), passes, 1, bool(verification.ok),
                   verification.queries, group_tokens=per_group, group_steps=tuple(steps))


def run_individual(mechanism, stream: VoteStream, world: World, budget, cap: int, rng: np.random.Generator, *,
                   calibrate: bool = False, accountant_out: list | None = None) -> Outcome:
    """The public-candidate BetweenThresholds under individual charging (docs/tct_and_individual.md, "In
    generate"): :class:`CandidateTape`'s query, charged by ONE
    :class:`~pate_accountant.accountants.IndividualChargingAccountant` (``for_run``: the per-teacher limit from
    the budget, the query's epsilon and gap) on ONE in-memory ledger; a ``between`` charges the counted teachers,
    a teacher at its limit is removed and abstains from then on.  Each step's counted teachers are drawn in law:
    given the stream's count ``c_v`` of the candidate among all ``n`` teachers, its voters are a uniform
    ``c_v``-subset (in this world a teacher votes a common token independently of the others given the shared
    randomness, and all share ``s``), so ``Hypergeometric(n, active, c_v)`` of them are active, each included
    with probability ``nu``; the counted set is then uniform among the active teachers.  Steps run in blocks
    cut after their first hit (a hit may remove teachers; the block's later draws are discarded unseen).  The
    run ends when no teacher is active (``can_afford`` refuses) or at the cap; a budget that affords no charge
    per teacher at this level runs nothing (``stop="refused"``, no ledger).  Passes: the active teachers and
    the public model each step.  ``accountant_out``: a list the accountant is appended to (tests)."""
    from mechanisms.between_thresholds import BELOW

    from pate_accountant.accountants import IndividualChargingAccountant
    from pate_accountant.ledger import Ledger

    n = stream.size
    ledger = None if calibrate else Ledger.in_memory()
    try:
        acc = IndividualChargingAccountant.for_run(budget=budget, ledger=ledger, mechanism=mechanism, num_teachers=n)
    except ValueError as error:
        if "does not allow a single charge" not in str(error):
            raise
        return Outcome(0, np.zeros(0, np.int64), 0, 0, "refused", (0.0, 0.0), 0, 0, True)
    event = mechanism.event
    steps = passes = hits = 0
    released = []
    while steps < cap and acc.can_afford(event):
        block = min(CHUNK, cap - steps)
        candidates, counts = public_candidates(world, stream, steps, block, rng)
        nu = rng.uniform(1.0 / n, 1.0, block)
        active = acc.num_active
        voters = counts if active == n else rng.hypergeometric(active, n - active, counts)
        counted = rng.binomial(voters, nu)
        release = mechanism.run_batch(counted, rng)
        hit = np.asarray(release.target_hit)
        first = np.flatnonzero(hit)
        indptr, indices = np.zeros(block + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)
        if first.size:
            block = int(first[0]) + 1
            indptr = indptr[:block + 1]
            indices = np.sort(rng.choice(acc.active_teachers(), size=int(counted[block - 1]), replace=False))
            indptr[-1] = indices.size
        acc.record_outcomes(event, hit[:block], (indptr, indices), outcomes=np.asarray(release.outcomes)[:block])
        values = np.where(np.asarray(release.values)[:block] != BELOW, candidates[:block], -1)
        released.append(values[values >= 0])
        hits += int(np.count_nonzero(hit[:block]))
        passes += block * (active + 1)
        steps += block
    stop = _stop(acc, event, steps, cap)
    tokens = np.concatenate(released) if released else np.zeros(0, np.int64)
    fails = steps - int(tokens.size)
    if accountant_out is not None:
        accountant_out.append(acc)
    if calibrate:
        return Outcome(steps, tokens, hits, fails, stop, _NO_SPENT, passes, 0, True)
    verification = ledger.verify()
    return Outcome(steps, tokens, hits, fails, stop, acc.spent(), passes, 1, bool(verification.ok),
                   verification.queries)


def run_invisibleink(world: World, params: dict, budget, cap: int, rho_total: float, rng, memo: dict, *,
                     calibrate: bool = False) -> tuple[Outcome, float, float]:
    """InvisibleInk on disjoint batches of ``B - 1`` teachers (the leftover teachers sit out), each batch one
    text with its own zCDP accountant and ledger, run until its accountant refuses; returns the outcome, ``C``
    and the exact on-support probability of one token of the first batch.  Texts are concatenated in batch
    order for the distinct counts.  ``calibrate``: the memoised count, no accountants or ledgers."""
    from dp_accounting import dp_event

    from pate_accountant.ledger import Ledger

    references = params["batch"] - 1
    if references > world.num_teachers:
        raise ValueError(f"InvisibleInk batch {params['batch']} needs more than the {world.num_teachers} teachers")
    clip = invisibleink_clip(rho_total, params["text"], references, params["tau"])
    event = dp_event.ZCDpEvent(invisibleink_rho(clip, references, params["tau"]))
    k = affordable_steps("zcdp", budget, event, cap, memo)
    texts, stops, spent, ok, support = [], set(), (0.0, 0.0), True, None
    batches = world.num_teachers // references
    for b in range(batches):
        tokens = np.zeros(0, dtype=np.int64)
        members = np.arange(b * references, (b + 1) * references)
        if k or b == 0:
            ids, probs = invisibleink_distribution(world, members, clip, params["tau"])
            if b == 0:
                support = float(probs[ids < world.common].sum())
        if calibrate:
            tokens = ids[rng.choice(ids.size, size=k, p=probs)] if k else tokens
            stops.add("refused" if refused_after("zcdp", budget, event, cap, memo) else "cap")
            texts.append(tokens)
            continue
        ledger = Ledger.in_memory()
        acc = _accountant("zcdp", budget, ledger)
        if k:
            if not acc.can_afford(event, k):  # pragma: no cover
                raise RuntimeError("InvisibleInk: the memoised step count is not affordable")
            tokens = ids[rng.choice(ids.size, size=k, p=probs)]
            acc.compose(event, k)
        stops.add(_stop(acc, event, k, cap))
        spent = acc.spent()
        ok = bool(ledger.verify().ok) and ok
        texts.append(tokens)
    tokens = np.concatenate(texts) if texts else np.zeros(0, np.int64)
    stop = "cap" if "cap" in stops else "refused"
    outcome = Outcome(int(tokens.size), tokens, 0, 0, stop, _NO_SPENT if calibrate else spent,
                      int(tokens.size) * params["batch"], 0 if calibrate else batches, ok)
    return outcome, clip, support


# -- metrics ---------------------------------------------------------------------------------------------------


def distinct_n(tokens: np.ndarray, order: int) -> float | None:
    """Distinct-n of a token sequence: distinct n-grams over n-grams (``None`` when it has none)."""
    tokens = np.asarray(tokens)
    if tokens.size < order:
        return None
    grams = np.stack([tokens[i:tokens.size - order + 1 + i] for i in range(order)], axis=1)
    return float(np.unique(grams, axis=0).shape[0] / grams.shape[0])


def metrics(outcome: Outcome, world: World, budget) -> dict:
    tokens = outcome.tokens
    count = int(tokens.size)
    return {
        "steps": outcome.steps,
        "private_tokens": count,
        "target_hits": outcome.hits,
        "fails": outcome.fails,
        "stop": outcome.stop,
        "capped": outcome.stop == "cap",
        "spent_epsilon": float(outcome.spent[0]),
        "spent_delta": float(outcome.spent[1]),
        "tokens_per_epsilon": count / budget[0],
        "tokens_per_record": count / world.num_teachers,
        "forward_passes": outcome.passes,
        "passes_per_token": outcome.passes / count if count else None,
        "precision": float(np.mean(tokens < world.common)) if count else None,
        "distinct_1": distinct_n(tokens, 1),
        "distinct_2": distinct_n(tokens, 2),
        "distinct_tokens": int(np.unique(tokens).size),
        "ledgers": outcome.ledgers,
        "ledgers_verified": outcome.verified,
        "ledger_queries": outcome.ledger_queries,
        **({} if outcome.group_tokens is None else {"group_tokens": list(outcome.group_tokens)}),
        **({} if outcome.group_steps is None else {"group_steps": list(outcome.group_steps)}),
    }

