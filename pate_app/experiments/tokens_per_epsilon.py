"""``pate-accountant experiment tokens-per-epsilon``: how many private tokens a budget buys when every
configuration runs until its accountant refuses, Hot and Cold PATE beside two published peers, on the same
synthetic teachers (docs/results.md, section tokens-per-epsilon).

**The world** (model-free; paper Section 6, "Synthetic teacher distributions").  ``n`` teachers, one private
record each, ``p^(i) = alpha s + (1 - alpha) r^(i)`` (:func:`ensembles.synthetic.alpha_mixture`): ``s`` is
uniform over ``K`` common tokens (ids ``0..K-1``; the paper's ``s`` "can be arbitrarily diverse"), ``r^(i)``
is teacher ``i``'s own private token.  The *public* model (what a teacher says without its private record)
knows the task's candidate pool of ``P`` tokens, which holds the ``K`` common tokens and ``P - K`` decoys,
but not which ``K`` of them the private records favour: it is uniform over the pool.  (With the public
model equal to ``s`` itself every public-prior method would return the answer without reading a record;
see docs/results.md.)  A released token is *on support* when it is one of the ``K`` common tokens.

**What is measured.**  Each *row* (a declarative :class:`RowSpec`: histograms, mechanism, accountant, grid
of per-step parameters) runs at each agreement level ``alpha`` and each total budget ``(epsilon, delta)``
under replace-one (one record, i.e. one teacher, changes) until its accountant refuses the next step, or
until the hard cap of ``cap`` steps (then its counts are lower bounds, shown ``>``).  A *private token* is
one released by the private mechanism (not a fail, not a target hit); one step is one forward pass per
participating teacher.  Reported per run: private tokens per *budget* epsilon (not per epsilon spent), per
private record (``tokens / n``: one record per teacher), forward passes per private token, the on-support
fraction (*precision*), distinct-1 / distinct-2 of the private-token sequence and its number of distinct
tokens, and whether every ledger verified (:meth:`pate_accountant.ledger.Ledger.verify`, what
``pate-accountant audit`` runs).  Every charge goes through the real accountant with an in-memory ledger.

**Choosing the per-step parameters.**  Each row has a small grid (:func:`row_specs`).  A calibration pass on
its own seed runs every grid point at every budget and estimates each point's precision over
``PRECISION_STEPS`` steps (exactly, for InvisibleInk); for each (row, alpha, budget) the point with the most
private tokens among those whose estimated precision reaches ``min_precision`` is chosen (:func:`choose`;
when none does, the most precise one, and the row is marked below the floor).  The measured pass runs the
chosen point on the measured seed: the measured votes and noise never influence the choice.  The floor
keeps a mechanism that never fails from "winning" with tokens that are mostly noise or mostly the public
model's guess.

**Rows** (:data:`ROW_NAMES`).  Hot PATE (coordinated votes, Algorithm 1) and Cold PATE (independent votes):

* ``hot-dpargmax-tct`` / ``cold-dpargmax-tct``: ``BoundaryWrapper(DPArgMax(eps0/2, delta0))`` charged by
  :class:`~pate_accountant.accountants.TargetChargingAccountant` (only target hits are charged, Section 6),
  ``delta0`` from :func:`pate_accountant.planning.step_delta_for_queries` for ``cap`` queries;
* ``hot-dpargmax-pld``: the plain DPArgMax, every query charged, composed by
  :class:`~pate_accountant.accountants.PldAccountant`;
* ``hot-gnmax-pld`` / ``cold-gnmax-pld`` / ``hot-gnmax-threshold-pld``: Gaussian aggregators (GNMax on every
  count; the thresholded form releases only above a strict majority), composed by PLD;
* ``hot-gnmax-threshold-pld-groups`` (parallel composition, docs/groups.md): the teachers split into ``G``
  disjoint groups of ``m = n // G`` (``G`` in :data:`GROUPS`), each group its own coordinated vote stream over
  its own teachers and its own thresholded GNMax (``sigma`` a fraction of ``m``, threshold ``m/2 + 1``), every
  group charged through ``parallel_groups(G)`` of ONE PLD accountant on ONE ledger (``begin_run`` first), which
  pays by the envelope rule: each group runs until its view refuses, the data set pays what one group alone
  would, the private tokens are summed over the groups.  The cap is per group (a group's step is ``m``
  forward passes, so ``G`` groups at the cap make as many passes as one ensemble at the cap);
* ``hot-gnmax-threshold-pld-prior`` (public-prior mixing, :mod:`ensembles.public_prior`): every teacher votes
  from ``lambda p_pub + (1 - lambda) p^(i)`` (``lambda`` in :data:`PRIOR_MIXES`, ``p_pub`` the world's public
  pool), the plain thresholded row's mechanism and charge otherwise; its votes reuse the plain row's seeds, so
  ``lambda = 0`` is that row exactly.  Tokens the public model proposes (decoys among them) gain votes: the
  precision column is the bias, and the precision floor applies as to every row;
* ``hot-dpws-tct`` / ``hot-dpws-pld`` / ``cold-dpws-tct`` / ``cold-dpws-pld``: the DPArgMax rows' charges with
  sparsity-preserving DP weighted sampling (:class:`mechanisms.DPWeightedSampling`) as the private selection:
  ``BoundaryWrapper(DPWeightedSampling(eps0/2, delta0))`` under target charging, or the plain DPWS with every
  query charged under PLD;
* ``hot-dpargmax-tct-groups``: ``hot-dpargmax-tct`` in ``G`` disjoint groups (as the PLD groups row: one vote
  stream per group of ``m = n // G`` teachers), every group's wrapped queries charged through
  ``parallel_groups(G)`` of ONE target-charging accountant on ONE ledger (:func:`run_tct_groups`).  Target
  charging pays the most hits of any group (the envelope) but every query without a hit as it comes, summed
  over the groups, so ``delta0`` pays for ``G cap`` queries, and once one group reaches the hit limit a query
  without a hit is refused to every group;
* ``hot-bt-public-individual`` / ``hot-bt-public-tct``: what ``generate --mechanism between-thresholds`` runs
  (docs/tct_and_individual.md, "In generate"): each step a candidate drawn from the public model (uniform over
  the pool), a rate ``nu ~ U[1/n, 1]`` and inclusions, and ``BetweenThresholds.for_teachers(epsilon, n)`` on
  the count of included teachers voting the candidate; ``above`` and ``between`` release the candidate,
  ``below`` releases nothing (generate would then fall back to the public model: not a private token).
  Charged by individual charging (only the counted teachers, on ``between``; a teacher at its per-teacher
  limit is removed; :func:`run_individual`) or by target charging (``between`` is the target).

Peers, computed on the same teacher distributions (docs/results.md states each accounting argument; the
simulations and their accounting are in :mod:`pate_app.experiments.peers`):

* ``tang-pld`` / ``tang-rdp``: Tang et al. (arXiv 2309.11765), "DP few-shot generation": Gaussian noise on the
  sum of Poisson-sampled teachers' distributions restricted to the public top-100, the argmax released;
  accounted under add-or-remove-one at a budget that implies ``(epsilon, delta)`` under replace-one.
* ``invisibleink`` / ``invisibleink-one-batch``: Vinod, Pillutla and Thakurta (arXiv 2507.02974): the
  exponential mechanism over the public logits plus the batch average of clipped private-minus-public logits,
  each text from a disjoint batch of ``B - 1`` references, charged ``2 (C/((B-1) tau))^2``-zCDP a token under
  replace-one.  ``invisibleink`` uses the published batch sizes; ``-one-batch`` puts every teacher in one batch
  (beyond the published sizes).

**The rooms.**  This module holds the rows, the sweep (calibration, choice, measured pass) and the options; the
world and its vote streams are :mod:`pate_app.experiments.tokens_world`, the peers
:mod:`pate_app.experiments.peers`, the runs under each accountant :mod:`pate_app.experiments.tokens_runs`, the
comparison, claims, figure and tables :mod:`pate_app.experiments.tokens_report`.  Their names used by the tests
and the benchmark are re-exported here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import time

import attr
import numpy as np

from pate_accountant.validation import check_int, check_real
from pate_app.experiments import parse_float_list, size_option

# The rooms (module docstring).  Some names are imported only to be read here, the experiment's one face, by the
# tests and the benchmark: the peers' formulas, the accountants, the figure's series and the tables' parameters.
from pate_app.experiments.peers import (
    TANG_TOP_K,
    TangTape,
    add_remove_budget,
    invisibleink_clip,
    invisibleink_distribution,
    invisibleink_rho,
    max_rho,
    replace_one_spent,
)
from pate_app.experiments.tokens_report import (
    _SERIES_STYLES,
    _STYLES,
    _key,
    _params,
    _plotted_series,
    check_claims,
    comparison,
    plot,
    summary,
)
from pate_app.experiments.tokens_runs import (
    Outcome,
    _accountant,
    affordable_steps,
    distinct_n,
    metrics,
    refused_after,
    run_fixed,
    run_groups,
    run_individual,
    run_invisibleink,
    run_tct,
    run_tct_groups,
    tape_releases,
)
from pate_app.experiments.tokens_world import (
    ADD_REMOVE_ONE,
    DEFAULT_COMMON,
    DEFAULT_POOL,
    NAME,
    REPLACE_ONE,
    CandidateTape,
    Tape,
    VoteStream,
    World,
    build_world,
    prior_world,
    public_candidates,
)

HELP = "private tokens per budget epsilon, run until refusal: Hot/Cold PATE under each accountant beside two peers"
DESCRIPTION = (
    "Every configuration generates until its accountant refuses (or a hard step cap) on synthetic "
    "alpha-mixture teachers (Hot PATE Section 6) at several total budgets (epsilon, delta) under replace-one, "
    "and reports private tokens per budget epsilon and per record, forward passes per private token, the "
    "on-support fraction, distinct-1/2 and distinct tokens, and whether every ledger verified. Rows: Hot and "
    "Cold PATE (DPArgMax under target charging and plain PLD, Gaussian aggregators under PLD) and the peers "
    "Tang et al. (Gaussian on averaged, Poisson-subsampled distributions; PLD and RDP) and InvisibleInk "
    "(clipped-logit exponential mechanism; zCDP), and two variants of Hot PATE's thresholded GNMax: disjoint "
    "groups of teachers under parallel composition (one accountant, envelope rule) and public-prior mixing; "
    "DPWS (DP weighted sampling) under target charging and PLD, Hot and Cold; target charging in groups; and the "
    "public model's token checked by BetweenThresholds under individual and target charging. "
    "Per-step parameters are chosen from a small grid on a separate calibration seed. Model-free."
)
SIZES = {
    "full": {"teachers": 4000, "alphas": [0.95, 0.7, 0.5, 0.3], "budgets": [1.0, 3.0, 8.0, 10.0], "cap": 20000},
    "quick": {"teachers": 1000, "alphas": [0.95, 0.5], "budgets": [1.0, 8.0], "cap": 1000},
}
#: Estimated: the sum of three full-size runs that together cover every row (docs/results.md, tokens-per-epsilon).
FULL_RUNTIME = "about 46 min wall on a shared 2-core CPU (estimated)"

DEFAULT_BUDGET_DELTA = 1e-6
#: The least on-support fraction a grid point needs to be chosen.
DEFAULT_MIN_PRECISION = 0.9
#: Calibration steps over which a grid point's precision is estimated (at most the cap).
PRECISION_STEPS = 2000
#: Offset of the calibration seed from the measured seed (the two streams share nothing).
CALIBRATION_OFFSET = 1_000_003

ROW_NAMES = (
    "hot-dpargmax-tct", "hot-dpargmax-pld", "hot-gnmax-pld", "hot-gnmax-threshold-pld",
    "cold-dpargmax-tct", "cold-gnmax-pld",
    "tang-pld", "tang-rdp", "invisibleink", "invisibleink-one-batch",
    # appended (issue 23): the rows above keep their indices, hence their seeds
    "hot-gnmax-threshold-pld-groups", "hot-gnmax-threshold-pld-prior",
    # appended (issue 23, item 5): DPWS under target charging and PLD, target charging in groups, and the
    # public-candidate BetweenThresholds under individual and target charging
    "hot-dpws-tct", "hot-dpws-pld", "cold-dpws-tct", "cold-dpws-pld", "hot-dpargmax-tct-groups",
    "hot-bt-public-individual", "hot-bt-public-tct",
)
#: Groups of the ``-groups`` rows (each of ``n // G`` teachers; leftover teachers sit out).
GROUPS = (2, 4, 8)
#: Public-prior weights ``lambda`` of the ``-prior`` rows.
PRIOR_MIXES = (0.1, 0.25)
#: Step epsilons of the public-candidate BetweenThresholds rows (thresholds from
#: :meth:`mechanisms.BetweenThresholds.for_teachers`: ``low = ceil(n/5)``, gap ``ceil(2/epsilon)``).
BT_LEVELS = (0.005, 0.01, 0.02, 0.05)


# -- rows --------------------------------------------------------------------------------------------------


@attr.s(frozen=True, slots=True)
class RowSpec:
    """One row of the table: a name, its family (``hot``, ``cold`` or ``peer``), a one-line label, the
    histograms it votes on (``coordinated``, ``independent``; ``None`` for a peer, which reads the
    distributions), its runner (``tct``, ``fixed``, ``tang``, ``invisibleink``), its accountant and the grid of
    per-step parameter dicts (``published``: whether a peer row keeps to its paper's settings).  Adding a row
    (a public prior, groups) is one more entry of :func:`row_specs`."""

    name: str = attr.ib()
    family: str = attr.ib()
    label: str = attr.ib()
    votes: str | None = attr.ib()
    runner: str = attr.ib()
    accountant: str = attr.ib()
    grid: tuple = attr.ib(converter=tuple)
    #: A peer row at its published settings (``False``: a variant beyond them, reported apart).
    published: bool = attr.ib(default=True)
    #: The row whose vote streams and tape seeds a variant shares (a ``-prior`` row: its plain row, so that
    #: ``lambda = 0`` is that row exactly); ``None``: its own.
    base: str | None = attr.ib(default=None)
    #: The private selection of a DPArgMax-family row: ``dpargmax`` (:class:`mechanisms.DPArgMax`) or ``dpws``
    #: (:class:`mechanisms.DPWeightedSampling`, sparsity-preserving DP weighted sampling).
    inner: str = attr.ib(default="dpargmax")


def _per_query_delta(delta: float, cap: int) -> float:
    from pate_accountant import planning

    return planning.step_delta_for_queries(delta, cap)


def row_specs(num_teachers: int, cap: int, delta: float, *, quick: bool = False) -> dict[str, RowSpec]:
    """The rows and their grids for ``n`` teachers, a cap of ``cap`` steps and budget delta ``delta``.

    Grids (the full size; ``quick`` keeps fewer points of the slow peers' accounting):

    * DPArgMax: target level ``eps0`` (a wrapped ``DPArgMax(eps0/2, delta0)``) or step epsilon in
      ``{0.02, 0.05, 0.1, 0.2, 0.4}``; ``delta0`` pays for ``cap`` queries;
    * GNMax: ``sigma / n`` in ``{1/256, 1/64, 1/16, 1/4}``;
    * Tang et al.: sampling rate ``q`` in ``{0.02, 0.1, 0.5}`` (the published ``q = MN/|D|`` is 0.0005 to
      0.05) times noise multiplier ``z`` in ``{1, 4, 16}`` (published 0.3 to 1.5 at ``delta = 1/|D|``;
      larger here, where ``delta = 1e-6``);
    * InvisibleInk: batch ``B`` in the published ``{8, 16, 32}`` (public prompt included), temperature
      ``tau`` in ``{0.8, 1.2}`` (the published range), text length ``T`` (which sets ``C``) in
      ``{2, 8, 32, 128, 500}`` (500 published); one batch: ``T`` in ``{cap/16, cap/4, cap, 4 cap}`` (a run
      stops at the cap first when ``T`` exceeds it);
    * groups (``hot-gnmax-threshold-pld-groups``): ``G`` in :data:`GROUPS` times ``sigma / m`` in the GNMax set,
      ``m = n // G`` teachers a group, threshold ``m/2 + 1``;
    * public prior (``hot-gnmax-threshold-pld-prior``): ``lambda`` in :data:`PRIOR_MIXES` times the GNMax
      ``sigma``, threshold ``n/2 + 1``;
    * DPWS (``*-dpws-tct`` / ``*-dpws-pld``): the DPArgMax grids with :class:`mechanisms.DPWeightedSampling` as
      the inner selection (``eps0`` a wrapped ``DPWeightedSampling(eps0/2, delta0)``, or the step epsilon);
    * target charging in groups (``hot-dpargmax-tct-groups``): ``G`` in :data:`GROUPS` times the DPArgMax
      levels; ``delta0`` pays for ``G cap`` queries, since target charging sums the groups' queries without a
      hit (the cap stays per group, as in the PLD groups row);
    * public-candidate BetweenThresholds (``hot-bt-public-*``): step epsilon in :data:`BT_LEVELS`, thresholds
      from ``BetweenThresholds.for_teachers(epsilon, n)`` (``low = ceil(n/5)``, gap ``ceil(2/epsilon)``:
      smaller levels, wider gaps; at budget epsilon 1 individual charging affords no charge at level 0.05).
    """
    delta0 = _per_query_delta(delta, cap)
    levels = (0.02, 0.05, 0.1, 0.2, 0.4)
    sigmas = tuple(max(0.1, num_teachers * f) for f in (1 / 256, 1 / 64, 1 / 16, 1 / 4))
    tct = tuple({"eps0": e, "delta0": delta0} for e in levels)
    if quick:
        tang = tuple({"q": q, "z": z} for q in (0.1, 0.5) for z in (4.0, 16.0))
        ink = tuple({"batch": b, "tau": 1.2, "text": t} for b in (8, 32) for t in (8, 128))
    else:
        tang = tuple({"q": q, "z": z} for q in (0.02, 0.1, 0.5) for z in (1.0, 4.0, 16.0))
        ink = tuple({"batch": b, "tau": tau, "text": t} for b in (8, 16, 32) for tau in (0.8, 1.2)
                    for t in (2, 8, 32, 128, 500))
    fractions = (1 / 256, 1 / 64, 1 / 16, 1 / 4)
    groups = tuple({"sigma": max(0.1, (num_teachers // g) * f), "threshold": (num_teachers // g) // 2 + 1, "groups": g}
                   for g in GROUPS if num_teachers // g >= 1 for f in fractions)
    prior = tuple({"sigma": s, "threshold": num_teachers // 2 + 1, "mix": lam} for lam in PRIOR_MIXES for s in sigmas)
    fixed = tuple({"epsilon": e, "delta0": delta0} for e in levels)
    tct_groups = tuple({"eps0": e, "delta0": _per_query_delta(delta, g * cap), "groups": g}
                       for g in GROUPS if num_teachers // g >= 1 for e in levels)
    between = tuple({"epsilon": e} for e in BT_LEVELS)
    one_batch = tuple({"batch": num_teachers + 1, "tau": tau, "text": max(1, round(cap * f))}
                      for tau in ((1.2,) if quick else (0.8, 1.2)) for f in (1 / 16, 1 / 4, 1, 4))
    rows = [
        RowSpec("hot-dpargmax-tct", "hot", "Hot PATE: boundary-wrapped DPArgMax, target charging (TCT)",
                "coordinated", "tct", "target-charging", tct),
        RowSpec("hot-dpargmax-pld", "hot", "Hot PATE: plain DPArgMax, every query charged, PLD",
                "coordinated", "fixed", "pld", fixed),
        RowSpec("hot-gnmax-pld", "hot", "Hot PATE: GNMax (Gaussian on every count), PLD",
                "coordinated", "fixed", "pld", tuple({"sigma": s} for s in sigmas)),
        RowSpec("hot-gnmax-threshold-pld", "hot", "Hot PATE: GNMax above a strict majority, else fail, PLD",
                "coordinated", "fixed", "pld", tuple({"sigma": s, "threshold": num_teachers // 2 + 1} for s in sigmas)),
        RowSpec("cold-dpargmax-tct", "cold", "Cold PATE: boundary-wrapped DPArgMax, target charging (TCT)",
                "independent", "tct", "target-charging", tct),
        RowSpec("cold-gnmax-pld", "cold", "Cold PATE: GNMax (Gaussian on every count), PLD",
                "independent", "fixed", "pld", tuple({"sigma": s} for s in sigmas)),
        RowSpec("tang-pld", "peer", "Tang et al.: Gaussian on summed Poisson-sampled distributions, argmax; PLD",
                None, "tang", "pld", tang),
        RowSpec("tang-rdp", "peer", "Tang et al.: the same mechanism; RDP", None, "tang", "rdp", tang),
        RowSpec("invisibleink", "peer", "InvisibleInk: clipped-logit exponential mechanism, published batches; zCDP",
                None, "invisibleink", "zcdp", ink),
        RowSpec("invisibleink-one-batch", "peer", "InvisibleInk: all teachers in one batch (beyond published); zCDP",
                None, "invisibleink", "zcdp", one_batch, published=False),
        RowSpec("hot-gnmax-threshold-pld-groups", "hot",
                "Hot PATE: G disjoint groups of n/G teachers, each its own votes and GNMax above its majority; "
                "one PLD accountant, parallel composition (envelope)", "coordinated", "groups", "pld", groups),
        RowSpec("hot-gnmax-threshold-pld-prior", "hot",
                "Hot PATE: every teacher mixed with the public model (lambda), GNMax above a strict majority, PLD",
                "coordinated", "fixed", "pld", prior, base="hot-gnmax-threshold-pld"),
        RowSpec("hot-dpws-tct", "hot", "Hot PATE: boundary-wrapped DPWS (DP weighted sampling), target charging (TCT)",
                "coordinated", "tct", "target-charging", tct, inner="dpws"),
        RowSpec("hot-dpws-pld", "hot", "Hot PATE: plain DPWS, every query charged, PLD",
                "coordinated", "fixed", "pld", fixed, inner="dpws"),
        RowSpec("cold-dpws-tct", "cold", "Cold PATE: boundary-wrapped DPWS, target charging (TCT)",
                "independent", "tct", "target-charging", tct, inner="dpws"),
        RowSpec("cold-dpws-pld", "cold", "Cold PATE: plain DPWS, every query charged, PLD",
                "independent", "fixed", "pld", fixed, inner="dpws"),
        RowSpec("hot-dpargmax-tct-groups", "hot",
                "Hot PATE: G disjoint groups of n/G teachers, each its own votes and boundary-wrapped DPArgMax; one "
                "target-charging accountant, parallel composition (hit envelope, misses summed)",
                "coordinated", "tct-groups", "target-charging", tct_groups),
        RowSpec("hot-bt-public-individual", "hot",
                "Hot PATE: the public model's token as candidate, BetweenThresholds on the included teachers' count "
                "(rate nu); individual charging (only counted teachers, on between)",
                "coordinated", "candidate-individual", "individual-charging", between),
        RowSpec("hot-bt-public-tct", "hot",
                "Hot PATE: the public model's token as candidate, BetweenThresholds on the included teachers' count; "
                "target charging (between is the target)", "coordinated", "candidate-tct", "target-charging", between),
    ]
    return {row.name: row for row in rows}


def _vote_mechanism(row: RowSpec, params: dict, world: World):
    from mechanisms import (
        BetweenThresholds,
        BoundaryWrapper,
        DPArgMax,
        DPWeightedSampling,
        GaussianNoisyArgMax,
        GaussianThresholdArgMax,
    )

    inner = DPWeightedSampling if row.inner == "dpws" else DPArgMax
    if row.runner in ("candidate-individual", "candidate-tct"):
        return BetweenThresholds.for_teachers(params["epsilon"], world.num_teachers)
    if row.runner in ("tct", "tct-groups"):
        return BoundaryWrapper(inner(params["eps0"] / 2, params["delta0"]))
    if "epsilon" in params:
        return inner(params["epsilon"], params["delta0"])
    if "threshold" in params:
        return GaussianThresholdArgMax(params["sigma"], vocab_size=world.vocab_size, threshold=params["threshold"])
    return GaussianNoisyArgMax(params["sigma"], vocab_size=world.vocab_size)


# -- one pass over the sweep -------------------------------------------------------------------------------------


def _rng(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng([seed, *keys])


def tape_precision(tape, steps: int, world: World) -> float | None:
    """The on-support fraction of the private tokens released in the tape's first ``steps`` steps."""
    tokens = tape_releases(tape, steps)[0]
    return float(np.mean(tokens < world.common)) if tokens.size else None


def run_pass(world: World, rows: list[RowSpec], plan: dict, delta: float, cap: int, seed: int, memo: dict, *,
             calibrate: bool = False, precision_steps: int = 0, progress=None) -> dict:
    """Run ``plan`` (``{row name: {grid point: [budget epsilons]}}``) on the streams of ``seed`` (one vote stream
    per ensemble kind, shared by every row; one tape per grid point, shared by its budgets):
    ``{(row, point, epsilon): (metrics, extra)}``.  With ``precision_steps``, ``extra["precision_estimate"]`` is
    the per-step mechanism's on-support fraction over that many steps (exact for InvisibleInk), whatever number
    of steps the budget affords: what the calibration chooses by."""
    kinds = ("coordinated", "independent")
    streams = {kind: VoteStream(world, kind, _rng(seed, 1, k)) for k, kind in enumerate(kinds)}
    specs = None
    out = {}
    for r, row in enumerate(rows):
        for p, budgets in plan.get(row.name, {}).items():
            params = row.grid[p]
            tape_rng = _rng(seed, 2, ROW_NAMES.index(row.name), p)
            if "mix" in params:
                # the public prior: its own stream on the mixed teachers, with the plain row's votes noise
                # (the same generator seed), and the plain row's tape seed at the same per-step parameters
                if specs is None:
                    specs = row_specs(world.num_teachers, cap, delta)
                plain = {k: v for k, v in params.items() if k != "mix"}
                base = specs[row.base]
                tape_rng = _rng(seed, 2, ROW_NAMES.index(base.name), list(base.grid).index(plain))
                key = (row.votes, params["mix"])
                if key not in streams:
                    streams[key] = VoteStream(prior_world(world, params["mix"]), row.votes,
                                              _rng(seed, 1, kinds.index(row.votes)), decoys=True)
                tape = Tape(_vote_mechanism(row, params, world), streams[key], tape_rng)
            elif row.runner in ("groups", "tct-groups"):
                # each group's votes: one stream per (kind, G, g), on the same seed for every grid point and row
                # (so both groups rows read the same groups' votes), each tape its own noise
                g_count, size = params["groups"], world.num_teachers // params["groups"]
                mechanism = _vote_mechanism(row, params, world)
                tape = []
                for g in range(g_count):
                    key = (row.votes, "group", g_count, g)
                    if key not in streams:
                        streams[key] = VoteStream(world, row.votes, _rng(seed, 4, g_count, g), members=(g * size, size))
                    tape.append(Tape(mechanism, streams[key], _rng(seed, 2, ROW_NAMES.index(row.name), p, g)))
            elif row.runner in ("tct", "fixed"):
                tape = Tape(_vote_mechanism(row, params, world), streams[row.votes], tape_rng)
            elif row.runner in ("candidate-tct", "candidate-individual"):
                tape = CandidateTape(_vote_mechanism(row, params, world), streams[row.votes], world, tape_rng)
            elif row.runner == "tang":
                tape = TangTape(world, params["q"], params["z"], tape_rng)
            estimate = None
            if precision_steps and row.runner in ("groups", "tct-groups"):
                tokens = np.concatenate([tape_releases(t, precision_steps)[0] for t in tape])
                estimate = float(np.mean(tokens < world.common)) if tokens.size else None
            elif precision_steps and row.runner != "invisibleink":
                estimate = tape_precision(tape, precision_steps, world)
            for eps in budgets:
                budget = (eps, delta)
                extra = {"precision_estimate": estimate} if precision_steps else {}
                if row.runner in ("tct", "candidate-tct"):
                    outcome = run_tct(tape, budget, cap, calibrate=calibrate)
                elif row.runner == "tct-groups":
                    outcome = run_tct_groups(tape, budget, cap, row=row.name, calibrate=calibrate)
                elif row.runner == "candidate-individual":
                    run_rng = _rng(seed, 5, ROW_NAMES.index(row.name), p, round(eps * 1000))
                    outcome = run_individual(tape.mechanism, tape.stream, world, budget, cap, run_rng,
                                             calibrate=calibrate)
                elif row.runner == "groups":
                    outcome = run_groups(row.accountant, tape[0].mechanism.event, tape, budget, cap, memo,
                                         row=row.name, calibrate=calibrate)
                elif row.runner == "fixed":
                    outcome = run_fixed(row.accountant, tape.mechanism.event, tape, budget, cap, memo,
                                        calibrate=calibrate)
                elif row.runner == "tang":
                    outcome = run_fixed(f"tang-{row.accountant}", tape.event(), tape, budget, cap, memo,
                                        calibrate=calibrate)
                else:
                    if ("rho", eps, delta) not in memo:
                        memo[("rho", eps, delta)] = max_rho(eps, delta)
                    rho = memo[("rho", eps, delta)]
                    ink_rng = _rng(seed, 3, ROW_NAMES.index(row.name), p, round(eps * 1000))
                    outcome, clip, support = run_invisibleink(world, params, budget, cap, rho, ink_rng, memo,
                                                              calibrate=calibrate)
                    extra["clip"] = clip
                    if precision_steps:
                        extra["precision_estimate"] = support
                out[(row.name, p, eps)] = (metrics(outcome, world, budget), extra)
                if progress is not None:
                    progress()
    return out


def _estimate(calibration: dict, key) -> float:
    value = calibration[key][1].get("precision_estimate")
    return 0.0 if value is None else value


def choose(calibration: dict, row: RowSpec, eps: float, min_precision: float) -> int:
    """The grid point of ``row`` at budget ``eps`` with the most private tokens among those whose estimated
    precision (``extra["precision_estimate"]``) reaches ``min_precision``; when none does, the one with the best
    estimated precision (the row is then marked below the floor).  Among equal counts a run that stopped at the
    cap (whose count is a lower bound) goes first, then the earlier point."""
    points = range(len(row.grid))
    good = [p for p in points if _estimate(calibration, (row.name, p, eps)) >= min_precision]
    if good:
        return max(good, key=lambda p: (calibration[(row.name, p, eps)][0]["private_tokens"],
                                        calibration[(row.name, p, eps)][0]["capped"], -p))
    return max(points, key=lambda p: (_estimate(calibration, (row.name, p, eps)),
                                      calibration[(row.name, p, eps)][0]["private_tokens"], -p))


# -- options, run ---------------------------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    """``--teachers``, ``--alphas``, ``--budgets``, ``--budget-delta``, ``--cap``, ``--rows``,
    ``--min-precision``, ``--common``, ``--pool``."""
    full, quick = SIZES["full"], SIZES["quick"]
    size_option(parser, SIZES, "--teachers", "N", "teachers n, one record each")
    parser.add_argument("--alphas", metavar="A,B,...", default=None,
                        help="comma-separated weights of the common part, each in (0, 1) (default "
                             f"{','.join(map(str, full['alphas']))}; --quick {','.join(map(str, quick['alphas']))})")
    parser.add_argument("--budgets", metavar="E,F,...", default=None,
                        help="comma-separated total epsilons of the budgets (default "
                             f"{','.join(f'{e:g}' for e in full['budgets'])}; --quick "
                             f"{','.join(f'{e:g}' for e in quick['budgets'])})")
    parser.add_argument("--budget-delta", type=float, metavar="D", default=None,
                        help=f"total delta of every budget, replace-one (default {DEFAULT_BUDGET_DELTA:g})")
    size_option(parser, SIZES, "--cap", "STEPS", "hard cap on the steps of one run")
    parser.add_argument("--rows", metavar="NAME,...", default=None,
                        help=f"comma-separated rows to run (default all: {', '.join(ROW_NAMES)})")
    parser.add_argument("--min-precision", type=float, metavar="F", default=None,
                        help="least on-support fraction of the private tokens a grid point needs to be chosen "
                             f"(default {DEFAULT_MIN_PRECISION:g})")
    parser.add_argument("--common", type=int, metavar="K", default=None,
                        help=f"common tokens of the shared part s (default {DEFAULT_COMMON})")
    parser.add_argument("--pool", type=int, metavar="P", default=None,
                        help=f"tokens the public model spreads its mass over, the common ones included (default "
                             f"{DEFAULT_POOL})")


def _options(quick, teachers, alphas, budgets, budget_delta, cap, rows, min_precision, common, pool) -> dict:
    sizes = SIZES["quick" if quick else "full"]
    opts = {
        "teachers": check_int("--teachers", sizes["teachers"] if teachers is None else teachers, minimum=2),
        "alphas": parse_float_list("--alphas", alphas, sizes["alphas"], maximum=1.0),
        "budgets": parse_float_list("--budgets", budgets, sizes["budgets"]),
        "budget_delta": check_real("--budget-delta", DEFAULT_BUDGET_DELTA if budget_delta is None else budget_delta,
                                   minimum=0.0, maximum=1.0, min_open=True, max_open=True),
        "cap": check_int("--cap", sizes["cap"] if cap is None else cap, minimum=1),
        "min_precision": check_real("--min-precision", DEFAULT_MIN_PRECISION if min_precision is None
                                    else min_precision, minimum=0.0, maximum=1.0),
        "common": check_int("--common", DEFAULT_COMMON if common is None else common, minimum=1),
        "pool": check_int("--pool", DEFAULT_POOL if pool is None else pool, minimum=1),
    }
    if opts["alphas"][-1] >= 1.0:
        raise ValueError("--alphas must be below 1 (alpha = 1 leaves no private part), got 1")
    if opts["pool"] < opts["common"]:
        raise ValueError(f"--pool must hold the {opts['common']} common tokens, got {opts['pool']}")
    if rows is None:
        names = list(ROW_NAMES)
    else:
        names = [r.strip() for r in (rows.split(",") if isinstance(rows, str) else rows) if r.strip()]
        unknown = [r for r in names if r not in ROW_NAMES]
        if unknown or not names:
            raise ValueError(f"--rows must name rows among {', '.join(ROW_NAMES)}, got {rows!r}")
    opts["rows"] = [r for r in ROW_NAMES if r in names]
    return opts


def _machine() -> dict:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpus": os.cpu_count(), "load_average": list(load) if load else None,
            "python": platform.python_version(), "platform": platform.machine()}


def run(*, quick: bool = False, seed: int = 0, progress: bool = True, teachers=None, alphas=None, budgets=None,
        budget_delta=None, cap=None, rows=None, min_precision=None, common=None, pool=None) -> dict:
    """The whole experiment (module docstring): a calibration pass over every grid point on the calibration
    seed, the choice per (row, alpha, budget), the measured pass on ``seed``."""
    from tqdm import tqdm

    seed = check_int("--seed", seed, minimum=0)
    o = _options(quick, teachers, alphas, budgets, budget_delta, cap, rows, min_precision, common, pool)
    with _quiet_absl():
        return _run(quick, seed, progress, o, tqdm)


@contextlib.contextmanager
def _quiet_absl():
    """dp-accounting's RDP code logs (through absl) each order it drops when a series does not converge for a
    large sampling rate; dropping orders keeps its bound valid, so those records are silenced here."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _run(quick: bool, seed: int, progress: bool, o: dict, tqdm) -> dict:
    n, delta, cap = o["teachers"], o["budget_delta"], o["cap"]
    specs = row_specs(n, cap, delta, quick=quick)
    chosen_rows = [specs[name] for name in o["rows"]]
    memo: dict = {}
    started, cpu_started, load_before = time.time(), time.process_time(), _machine()["load_average"]
    units = len(o["alphas"]) * len(o["budgets"]) * sum(len(r.grid) + 1 for r in chosen_rows)
    results, calibration_rows = [], []
    with tqdm(total=units, desc=NAME, unit="run", disable=not progress, dynamic_ncols=True) as bar:
        for alpha in o["alphas"]:
            world = build_world(n, alpha, o["common"], o["pool"])
            bar.set_postfix_str(f"alpha={alpha:g} calibration")
            every = {row.name: {q: list(o["budgets"]) for q in range(len(row.grid))} for row in chosen_rows}
            calib = run_pass(world, chosen_rows, every, delta, cap, seed + CALIBRATION_OFFSET, memo, calibrate=True,
                             precision_steps=min(cap, PRECISION_STEPS), progress=bar.update)
            plan: dict = {}
            for row in chosen_rows:
                for eps in o["budgets"]:
                    p = choose(calib, row, eps, o["min_precision"])
                    plan.setdefault(row.name, {}).setdefault(p, []).append(eps)
                    grid = []
                    for q in range(len(row.grid)):
                        m, extra = calib[(row.name, q, eps)]
                        grid.append({"params": dict(row.grid[q], **{k: v for k, v in extra.items() if k == "clip"}),
                                     "private_tokens": m["private_tokens"], "capped": m["capped"],
                                     "precision_estimate": extra["precision_estimate"]})
                    calibration_rows.append({"row": row.name, "alpha": alpha, "budget_epsilon": eps, "chosen": p,
                                             "grid": grid})
            bar.set_postfix_str(f"alpha={alpha:g} measured")
            measured = run_pass(world, chosen_rows, plan, delta, cap, seed, memo, progress=bar.update)
            for row in chosen_rows:
                for eps in o["budgets"]:
                    p = next(q for q, budgets in plan[row.name].items() if eps in budgets)
                    m, extra = measured[(row.name, p, eps)]
                    estimate = calib[(row.name, p, eps)][1]["precision_estimate"]
                    results.append({"row": row.name, "family": row.family, "published": row.published,
                                    "alpha": alpha, "budget_epsilon": eps, "budget_delta": delta,
                                    "params": dict(row.grid[p], **extra), "precision_estimate": estimate,
                                    "admissible": (estimate or 0.0) >= o["min_precision"], **m})
    wall, cpu = time.time() - started, time.process_time() - cpu_started
    result = {
        "experiment": NAME,
        "quick": bool(quick),
        "parameters": {
            "teachers": n, "records": n, "alphas": o["alphas"], "budgets": o["budgets"], "budget_delta": delta,
            "relation": REPLACE_ONE, "cap": cap, "min_precision": o["min_precision"], "common": o["common"],
            "pool": o["pool"], "vocab_size": n + o["pool"], "rows": o["rows"],
            "row_labels": {row.name: row.label for row in chosen_rows},
            "row_families": {row.name: row.family for row in chosen_rows},
            "grids": {row.name: [dict(g) for g in row.grid] for row in chosen_rows},
        },
        "results": results,
        "calibration": calibration_rows,
        "machine": {**_machine(), "load_average_before": load_before, "wall_seconds": round(wall, 1),
                    "cpu_seconds": round(cpu, 1)},
        "notes": [
            ("tokens_per_epsilon = private tokens / budget epsilon (not per epsilon spent); tokens_per_record = "
            "private tokens / n (one record per teacher)."),
            ("A run stops when its accountant refuses the next step (stop='refused') or at the cap (stop='cap': "
            "its counts are lower bounds)."),
            "precision: the fraction of private tokens that are common tokens of s (the knowledge to transfer).",
            "Grid points are chosen on a calibration seed (max private tokens with precision >= min_precision).",
            ("Tang et al. rows are accounted under add-or-remove-one at (epsilon/2, delta/(1+e^(epsilon/2))), "
            "which implies (epsilon, delta) under replace-one."),
            "InvisibleInk is charged 2 (C/((B-1) tau))^2 zCDP per token under replace-one (4x its paper's figure).",
        ],
    }
    result["comparison"] = comparison(result)
    result["claims"] = check_claims(result)
    return result
