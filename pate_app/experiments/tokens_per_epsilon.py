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

Peers, computed on the same teacher distributions (docs/results.md states each accounting argument):

* ``tang-pld`` / ``tang-rdp``: Tang et al. (arXiv 2309.11765), "DP few-shot generation": each step a
  Poisson sample (rate ``q``) of the records, each sampled teacher's next-token distribution restricted to
  the public top-100 tokens and renormalised, summed, Gaussian noise ``N(0, z^2)`` on each coordinate, the
  argmax released.  A record adds or removes a vector of L2 norm at most 1, so one step is dp-accounting's
  ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` under add-or-remove-one.  Replace-one is remove then add:
  for any three distributions ``H_{e^(a+b)}(P||R) <= H_{e^a}(P||Q) + e^a H_{e^b}(Q||R)``, so an
  add-or-remove-one budget ``(epsilon/2, delta/(1 + e^(epsilon/2)))`` gives ``(epsilon, delta)`` under
  replace-one.  The accountant runs under add-or-remove-one with that budget (an over-charge we state).
* ``invisibleink`` / ``invisibleink-one-batch``: Vinod, Pillutla and Thakurta (arXiv 2507.02974): each text
  from a disjoint batch of ``B - 1`` private references plus the public prompt; per token, the exponential
  mechanism (softmax at temperature ``tau``) over the public logits plus the batch average of the private
  minus public logits clipped to ``[-C, C]``, on the top-k+ set of the public logits.  Replacing one
  reference moves each averaged coordinate by at most ``2C/(B-1)``, so the sampler has bounded range
  ``eta = 4C/((B-1) tau)`` and is ``eta^2/8 = 2 (C/((B-1) tau))^2``-zCDP (Cesar and Rogers 2021); we charge
  that, four times the paper's ``(C/((B-1) tau))^2 / 2`` (which holds when a reference's clipped
  difference moves by ``C``, not ``2C``), through :class:`~pate_accountant.accountants.RdpAccountant` as a
  ``ZCDpEvent``.  Batches are disjoint, so the run's guarantee is each batch's (parallel composition): every
  batch has its own accountant and ledger.  ``C`` is calibrated as the paper does, from the text length
  ``T`` the budget must pay for.  ``invisibleink`` uses the published batch sizes; ``-one-batch`` puts every
  teacher in one batch (beyond the published sizes).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import platform
import time
from pathlib import Path

import attr
import numpy as np

from pate_accountant.validation import check_int, check_real
from pate_app.experiments import claim_lines
from pate_app.experiments.alpha_sweep import parse_float_list
from pate_app.plotting import legend_outside, new_figure, styled

NAME = "tokens-per-epsilon"
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
#: The world: common tokens K (the Planet Z task's 20 common numbers, Section 5.2) and the public pool P.
DEFAULT_COMMON = 20
DEFAULT_POOL = 100
#: The least on-support fraction a grid point needs to be chosen.
DEFAULT_MIN_PRECISION = 0.9
#: Calibration steps over which a grid point's precision is estimated (at most the cap).
PRECISION_STEPS = 2000
#: Steps per vote chunk (and per mechanism batch).
CHUNK = 512
#: Steps per round of a target-charged ``-groups`` run (the groups advance in turn, one round each).
GROUP_ROUND = 32
#: Offset of the calibration seed from the measured seed (the two streams share nothing).
CALIBRATION_OFFSET = 1_000_003
#: The relations, as :mod:`pate_accountant.events` spells them (not imported here: it loads dp-accounting, and
#: the command line imports this module to learn its options).
REPLACE_ONE = "replace-one"
ADD_REMOVE_ONE = "add-remove-one"
#: Tang et al.: the public top-k the distributions are restricted to ("top 100 public tokens").
TANG_TOP_K = 100

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


# -- the world -----------------------------------------------------------------------------------------------


@attr.s(frozen=True, slots=True)
class World:
    """The synthetic teachers of one ``alpha``: ``teachers`` (ids: common ``0..K-1``, private ``K..K+n-1``,
    decoys ``K+n..n+P-1``) and the public distribution ``public`` (uniform over the pool: the common tokens
    and the decoys)."""

    num_teachers: int = attr.ib()
    alpha: float = attr.ib()
    common: int = attr.ib()
    pool: int = attr.ib()
    teachers = attr.ib()
    public: np.ndarray = attr.ib()

    @property
    def vocab_size(self) -> int:
        return self.num_teachers + self.pool


def build_world(num_teachers: int, alpha: float, common: int = DEFAULT_COMMON, pool: int = DEFAULT_POOL) -> World:
    from ensembles.synthetic import alpha_mixture

    vocab = num_teachers + pool
    teachers = alpha_mixture(num_teachers, vocab, alpha, np.random.default_rng(0), common_size=common)
    public = np.zeros(vocab)
    public[:common] = 1.0 / pool
    public[common + num_teachers:] = 1.0 / pool
    return World(num_teachers, float(alpha), common, pool, teachers, public)


def prior_world(world: World, mix: float) -> World:
    """The world whose teachers are ``lambda p_pub + (1 - lambda) p^(i)`` (public-prior mixing before the vote,
    :func:`ensembles.public_prior.mix_with_public`; ``lambda = 0`` returns the same teachers)."""
    from ensembles.public_prior import mix_with_public

    return attr.evolve(world, teachers=mix_with_public(world.teachers, world.public, mix))


class VoteStream:
    """The vote histograms of one world, one ensemble kind and one seed, generated by Algorithm 1
    (:func:`ensembles.histograms.coordinated_votes`) or the independent ensemble, ``CHUNK`` steps at a time.

    Each step is kept as the counts of the ``K`` common tokens and the number ``m`` of private votes: in this
    world a private vote is a teacher's own token, so those ``m`` tokens have one vote each.  A histogram is
    rebuilt with ``m`` singletons on a random arc of the private tokens: every mechanism here treats tokens
    alike, and the released singleton is then uniform over the private tokens, as it is for the real set
    (the private voters are an exchangeable subset given ``m``), so the law of every release is unchanged.

    ``members = (start, size)``: only the teachers ``start .. start + size - 1`` vote (one group of a
    ``-groups`` row; their private tokens are theirs in the world's numbering).  ``decoys``: also count the
    votes on the public pool's decoys (a teacher mixed with the public model votes them; without mixing they
    are always zero, and the histograms are the same)."""

    def __init__(self, world: World, kind: str, rng: np.random.Generator, *, members: tuple | None = None,
                 decoys: bool = False):
        self.world, self.kind, self.rng = world, kind, rng
        self.start, self.size = (0, world.num_teachers) if members is None else (int(members[0]), int(members[1]))
        self.teachers = (world.teachers if members is None
                         else world.teachers.subset(np.arange(self.start, self.start + self.size)))
        self.decoy_ids = (np.arange(world.common + world.num_teachers, world.vocab_size) if decoys
                          else np.zeros(0, dtype=np.int64))
        self.common = np.zeros((0, world.common), dtype=np.int64)
        self.decoys = np.zeros((0, self.decoy_ids.size), dtype=np.int64)
        self.private = np.zeros(0, dtype=np.int64)
        self.offsets = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.private.size)

    def ensure(self, steps: int) -> None:
        from ensembles.histograms import coordinated_votes, independent_votes

        w = self.world
        sampler = coordinated_votes if self.kind == "coordinated" else independent_votes
        while len(self) < steps:
            votes = sampler(self.teachers, CHUNK, self.rng)
            if self.decoy_ids.size:
                pool = np.concatenate([np.arange(w.common), self.decoy_ids])
                column = np.full(w.vocab_size, -1, dtype=np.int64)
                column[pool] = np.arange(pool.size)
                where = column[np.where(votes >= 0, votes, 0)]
                where[votes < 0] = -1
                rows = np.repeat(np.arange(CHUNK), votes.shape[1]).reshape(votes.shape)
                keep = where >= 0
                counts = np.bincount(rows[keep] * pool.size + where[keep],
                                     minlength=CHUNK * pool.size).reshape(CHUNK, pool.size)
                common, decoys = counts[:, :w.common], counts[:, w.common:]
            else:
                common = np.stack([np.count_nonzero(votes == j, axis=1) for j in range(w.common)], axis=1)
                decoys = np.zeros((CHUNK, 0), dtype=np.int64)
            self.common = np.concatenate([self.common, common])
            self.decoys = np.concatenate([self.decoys, decoys])
            self.private = np.concatenate([self.private, self.size - common.sum(axis=1) - decoys.sum(axis=1)])
            self.offsets = np.concatenate([self.offsets, self.rng.integers(0, self.size, CHUNK)])

    def batch(self, start: int, stop: int):
        """The histograms of steps ``start .. stop - 1`` as a :class:`mechanisms.histogram.HistogramBatch`."""
        from mechanisms.histogram import HistogramBatch

        self.ensure(stop)
        w, rows = self.world, stop - start
        common = self.common[start:stop]
        c_sample, c_token = np.nonzero(common)
        singles = self.private[start:stop]
        s_sample = np.repeat(np.arange(rows), singles)
        first = np.repeat(np.cumsum(singles) - singles, singles)
        position = np.arange(s_sample.size) - first
        s_token = w.common + self.start + (np.repeat(self.offsets[start:stop], singles) + position) % self.size
        decoys = self.decoys[start:stop]
        d_sample, d_column = np.nonzero(decoys)
        return HistogramBatch(np.concatenate([c_sample, d_sample, s_sample]),
                              np.concatenate([c_token, self.decoy_ids[d_column], s_token]),
                              np.concatenate([common[c_sample, c_token], decoys[d_sample, d_column],
                                              np.ones(s_sample.size, np.int64)]),
                              rows, self.size)


class Tape:
    """What one mechanism releases on a vote stream, step by step, computed a chunk at a time as the runs
    need it (one tape per mechanism serves every budget: the same votes and the same noise)."""

    def __init__(self, mechanism, stream: VoteStream, rng: np.random.Generator):
        self.mechanism, self.stream, self.rng = mechanism, stream, rng
        self.values = np.zeros(0, dtype=np.int64)
        self.hits = np.zeros(0, dtype=bool)
        self.outcomes = np.zeros(0, dtype=object)

    def ensure(self, steps: int) -> None:
        while self.values.size < steps:
            start = self.values.size
            release = self.mechanism.run_batch(self.stream.batch(start, start + CHUNK), self.rng)
            hit = np.zeros(len(release), bool) if release.target_hit is None else np.asarray(release.target_hit)
            self.values = np.concatenate([self.values, release.values])
            self.hits = np.concatenate([self.hits, hit])
            self.outcomes = np.concatenate([self.outcomes, np.asarray(release.outcomes, dtype=object)])

    def passes(self, steps: int) -> int:
        return steps * self.stream.size


def public_candidates(world: World, stream: VoteStream, start: int, size: int,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``(candidates, counts)`` of steps ``start .. start + size - 1``: each step's candidate drawn from the
    public model (``world.public``: it never reads a record, so the draw is data-independent) and the stream's
    count of teachers voting it (private tokens have no public mass and are never candidates; a decoy has
    votes only in a public-prior world)."""
    pool = np.flatnonzero(world.public > 0)
    candidates = pool[rng.choice(pool.size, size=size, p=world.public[pool] / world.public[pool].sum())]
    stream.ensure(start + size)
    rows = np.arange(start, start + size)
    counts = np.zeros(size, dtype=np.int64)
    common = candidates < world.common
    counts[common] = stream.common[rows[common], candidates[common]]
    if stream.decoy_ids.size:
        column = np.searchsorted(stream.decoy_ids, candidates)
        decoy = ~common & (column < stream.decoy_ids.size)
        decoy[decoy] = stream.decoy_ids[column[decoy]] == candidates[decoy]
        counts[decoy] = stream.decoys[rows[decoy], column[decoy]]
    return candidates, counts


class CandidateTape:
    """The public-candidate BetweenThresholds query of ``generate`` (docs/tct_and_individual.md, "In generate";
    :class:`ensembles.generation.IndividualChargingAggregation`) on a vote stream, while every teacher is active:
    each step a candidate ``v`` from the public model, a rate ``nu ~ U[1/n, 1]`` (``n`` the fixed ensemble size)
    and one inclusion draw ``U_i < nu`` per teacher, and ``mechanism`` (a ``BetweenThresholds``) on the count of
    included teachers voting ``v``; ``above`` and ``between`` release ``v`` (``between`` is also the target hit),
    ``below`` releases nothing.  Inclusions are independent of the votes, so the counted number is
    ``Binomial(c_v, nu)``, the same law as drawing each teacher's inclusion.  Used by target charging (every
    budget reads the same tape) and for the calibration's precision estimate of the individual-charging row
    (whose runs, which remove teachers, draw their own steps: :func:`run_individual`)."""

    #: A target hit (``between``) releases the candidate: it is a private token (:func:`_releases`).
    hit_releases = True

    def __init__(self, mechanism, stream: VoteStream, world: World, rng: np.random.Generator):
        self.mechanism, self.stream, self.world, self.rng = mechanism, stream, world, rng
        self.values = np.zeros(0, dtype=np.int64)
        self.hits = np.zeros(0, dtype=bool)
        self.outcomes = np.zeros(0, dtype=object)

    def ensure(self, steps: int) -> None:
        from mechanisms.between_thresholds import BELOW

        n = self.stream.size
        while self.values.size < steps:
            start = self.values.size
            candidates, counts = public_candidates(self.world, self.stream, start, CHUNK, self.rng)
            counted = self.rng.binomial(counts, self.rng.uniform(1.0 / n, 1.0, CHUNK))
            release = self.mechanism.run_batch(counted, self.rng)
            self.values = np.concatenate([self.values, np.where(release.values != BELOW, candidates, -1)])
            self.hits = np.concatenate([self.hits, np.asarray(release.target_hit)])
            self.outcomes = np.concatenate([self.outcomes, np.asarray(release.outcomes, dtype=object)])

    def passes(self, steps: int) -> int:
        """Every teacher and the public model (which proposes the candidate) make one pass a step."""
        return steps * (self.stream.size + 1)


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


# -- the peers -----------------------------------------------------------------------------------------------


def _dense(teachers, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """``p^(i)_j`` for the teachers ``rows`` and the tokens ``tokens`` (a dense ``(len(rows), len(tokens))``)."""
    column = np.full(teachers.vocab_size, -1, dtype=np.int64)
    column[tokens] = np.arange(tokens.size)
    out = np.zeros((rows.size, tokens.size))
    for r, i in enumerate(rows):
        ids, probs = teachers.row(int(i))
        keep = column[ids] >= 0
        out[r, column[ids[keep]]] = probs[keep]
    return out


def public_top_k(public: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` tokens the public model ranks first (ties by token id), among those it gives mass."""
    order = np.lexsort((np.arange(public.size), -public))
    return np.sort(order[:k][public[order[:k]] > 0])


class TangTape:
    """Tang et al.'s release per step (module docstring): a Poisson sample of the teachers at rate ``q``,
    their distributions on the public top-100 renormalised and summed, ``N(0, z^2)`` on each coordinate,
    the argmax.  Forward passes: the sampled teachers plus the public model."""

    def __init__(self, world: World, q: float, z: float, rng: np.random.Generator):
        self.world, self.q, self.z, self.rng = world, q, z, rng
        self.tokens = public_top_k(world.public, TANG_TOP_K)
        dense = _dense(world.teachers, np.arange(world.num_teachers), self.tokens)
        mass = dense.sum(axis=1, keepdims=True)
        self.restricted = np.divide(dense, mass, out=np.zeros_like(dense), where=mass > 0)
        self.values = np.zeros(0, dtype=np.int64)
        self.sampled = np.zeros(0, dtype=np.int64)

    def ensure(self, steps: int) -> None:
        n = self.world.num_teachers
        while self.values.size < steps:
            mask = self.rng.random((CHUNK, n)) < self.q
            noisy = mask.astype(np.float64) @ self.restricted + self.rng.normal(0.0, self.z, (CHUNK, self.tokens.size))
            self.values = np.concatenate([self.values, self.tokens[np.argmax(noisy, axis=1)]])
            self.sampled = np.concatenate([self.sampled, mask.sum(axis=1)])

    def passes(self, steps: int) -> int:
        return int(self.sampled[:steps].sum()) + steps

    def event(self):
        from dp_accounting import dp_event

        return dp_event.PoissonSampledDpEvent(self.q, dp_event.GaussianDpEvent(self.z))


def invisibleink_rho(clip: float, references: int, tau: float) -> float:
    """Per-token zCDP of the clipped-logit exponential mechanism under replace-one (module docstring):
    bounded range ``eta = 4 C / (B' tau)`` with ``B'`` private references, so ``rho = eta^2 / 8``."""
    return 2.0 * (clip / (references * tau)) ** 2


def invisibleink_distribution(world: World, members: np.ndarray, clip: float, tau: float,
                              top_k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, probabilities)`` of one InvisibleInk step for the batch ``members``: the top-k+ set of the
    public logits (``k = |V|`` by default: every token the public model gives mass), and there the softmax of
    ``(public logit + mean clipped difference) / tau``; a zero probability has logit ``-inf``, clipped to
    ``-C``."""
    public = world.public
    finite = np.flatnonzero(public > 0)
    log_public = np.log(public[finite])
    if top_k is not None and top_k < finite.size:
        kth = np.sort(log_public)[-top_k]
        keep = log_public >= kth - 2.0 * clip / members.size
        finite, log_public = finite[keep], log_public[keep]
    probs = _dense(world.teachers, members, finite)
    with np.errstate(divide="ignore"):
        difference = np.log(probs) - log_public[None, :]
    score = (log_public + np.clip(difference, -clip, clip).mean(axis=0)) / tau
    weights = np.exp(score - score.max())
    return finite, weights / weights.sum()


def max_rho(epsilon: float, delta: float) -> float:
    """The largest ``rho`` whose ``ZCDpEvent`` our RDP accountant reports within ``(epsilon, delta)``."""
    from dp_accounting import dp_event

    from pate_accountant.accountants import RdpAccountant

    def fits(rho: float) -> bool:
        acc = RdpAccountant(neighboring_relation=REPLACE_ONE)
        acc.compose(dp_event.ZCDpEvent(rho))
        return acc.get_epsilon(delta) <= epsilon

    lo, hi = 0.0, max(1.0, epsilon)
    while fits(hi):
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def invisibleink_clip(rho_total: float, text: int, references: int, tau: float) -> float:
    """``C`` such that ``text`` tokens spend ``rho_total`` (the paper's calibration, with our per-token charge)."""
    return references * tau * math.sqrt(rho_total * (1 - 1e-9) / text / 2.0)


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


def add_remove_budget(epsilon: float, delta: float) -> tuple[float, float]:
    """The add-or-remove-one budget whose guarantee implies ``(epsilon, delta)`` under replace-one (a replaced
    record is one removal then one addition; module docstring): ``(epsilon/2, delta/(1 + e^(epsilon/2)))``."""
    return epsilon / 2.0, delta / (1.0 + math.exp(epsilon / 2.0))


def replace_one_spent(epsilon: float, delta: float) -> tuple[float, float]:
    """The replace-one guarantee that an add-or-remove-one spend ``(epsilon, delta)`` implies (remove, then add):
    ``(2 epsilon, delta (1 + e^epsilon))``; the inverse of :func:`add_remove_budget`."""
    return 2.0 * epsilon, delta * (1.0 + math.exp(epsilon))


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


def _releases(tape, steps: int) -> tuple[np.ndarray, int, int]:
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
        tokens, hits, fails = _releases(tape, k)
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
    tokens, hits, fails = _releases(tape, k)
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
    releases = [_releases(tape, k) for tape in tapes]
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
    tokens, hits, fails = _releases(tape, steps)
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
    releases = [_releases(tape, k) for tape, k in zip(tapes, steps)]
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


# -- one pass over the sweep -------------------------------------------------------------------------------------


def _rng(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng([seed, *keys])


def tape_precision(tape, steps: int, world: World) -> float | None:
    """The on-support fraction of the private tokens released in the tape's first ``steps`` steps."""
    tokens = _releases(tape, steps)[0]
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
                tokens = np.concatenate([_releases(t, precision_steps)[0] for t in tape])
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
    parser.add_argument("--teachers", type=int, metavar="N", default=None,
                        help=f"teachers n, one record each (default {full['teachers']}, --quick {quick['teachers']})")
    parser.add_argument("--alphas", metavar="A,B,...", default=None,
                        help="comma-separated weights of the common part, each in (0, 1) (default "
                             f"{','.join(map(str, full['alphas']))}; --quick {','.join(map(str, quick['alphas']))})")
    parser.add_argument("--budgets", metavar="E,F,...", default=None,
                        help="comma-separated total epsilons of the budgets (default "
                             f"{','.join(f'{e:g}' for e in full['budgets'])}; --quick "
                             f"{','.join(f'{e:g}' for e in quick['budgets'])})")
    parser.add_argument("--budget-delta", type=float, metavar="D", default=None,
                        help=f"total delta of every budget, replace-one (default {DEFAULT_BUDGET_DELTA:g})")
    parser.add_argument("--cap", type=int, metavar="STEPS", default=None,
                        help=f"hard cap on the steps of one run (default {full['cap']}, --quick {quick['cap']})")
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
    result["claims"] = _claims(result)
    return result


# -- comparison and claims ---------------------------------------------------------------------------------------


def _key(entry: dict) -> tuple:
    """Sort key of a result entry: admissible first, then tokens (a capped count is a lower bound)."""
    return (bool(entry["admissible"]), entry["private_tokens"])


def _verdict(best_pate: dict | None, best_peer: dict | None) -> str:
    """``"pate"``, ``"peer"`` or ``"undecided"``.  Only admissible runs with tokens count; a count at the cap is
    a lower bound, so it wins only when it already exceeds the other's exact count, and two counts at the cap
    (or two without an admissible run, or equal exact counts) decide nothing."""

    def count(entry):
        return entry["private_tokens"] if entry is not None and entry["admissible"] else 0

    a, b = count(best_pate), count(best_peer)
    a_open = bool(a) and best_pate["capped"]
    b_open = bool(b) and best_peer["capped"]
    if a > b and not b_open:
        return "pate"
    if b > a and not a_open:
        return "peer"
    return "undecided"


def comparison(result: dict) -> list[dict]:
    """Per (alpha, budget): the rows sorted best first, the best Hot/Cold PATE row, the best peer at its published
    settings and the best peer of all (variants beyond the published settings included), and a verdict against
    each (``pate``, ``peer`` or ``undecided``)."""
    out = []
    p = result["parameters"]
    for eps in p["budgets"]:
        for alpha in p["alphas"]:
            entries = [r for r in result["results"] if r["alpha"] == alpha and r["budget_epsilon"] == eps]
            entries.sort(key=_key, reverse=True)
            pate = [r for r in entries if r["family"] != "peer"]
            published = [r for r in entries if r["family"] == "peer" and r["published"]]
            peers = [r for r in entries if r["family"] == "peer"]
            best_pate = pate[0] if pate else None
            best_published, best_peer = (published[0] if published else None), (peers[0] if peers else None)
            out.append({"alpha": alpha, "budget_epsilon": eps, "order": [r["row"] for r in entries],
                        "best_pate": best_pate["row"] if best_pate else None,
                        "best_published_peer": best_published["row"] if best_published else None,
                        "best_peer": best_peer["row"] if best_peer else None,
                        "winner_published": _verdict(best_pate, best_published) if best_published else None,
                        "winner": _verdict(best_pate, best_peer) if best_peer else None})
    return out


def _claims(result: dict) -> list[dict]:
    res = result["results"]
    unverified = [f"{r['row']} alpha={r['alpha']:g} eps={r['budget_epsilon']:g}" for r in res if not r["ledgers_verified"]]
    stops = {r["stop"] for r in res}
    claims = [
        {"claim": "every ledger verifies (the check `pate-accountant audit` runs)", "holds": not unverified,
         "detail": f"{sum(r['ledgers'] for r in res)} ledgers" + (f"; failed: {unverified}" if unverified else "")},
        {"claim": "every run stopped by its accountant's refusal or at the step cap", "holds": stops <= {"refused", "cap"},
         "detail": f"{sum(r['stop'] == 'refused' for r in res)} refused, {sum(r['stop'] == 'cap' for r in res)} at the cap"},
    ]
    for which, peer, what in (("winner_published", "best_published_peer", "every peer at its published settings"),
                              ("winner", "best_peer", "every peer, variants beyond the published settings included")):
        goal = [c for c in result["comparison"] if c["alpha"] >= 0.5 and c[peer] is not None]
        lost = [f"alpha={c['alpha']:g} eps={c['budget_epsilon']:g}: {c[peer]}" for c in goal if c[which] == "peer"]
        open_ = [f"alpha={c['alpha']:g} eps={c['budget_epsilon']:g}" for c in goal if c[which] == "undecided"]
        if goal:
            claims.append({
                "claim": f"at alpha >= 0.5 the best Hot/Cold PATE row releases more private tokens than {what}",
                "holds": not lost and not open_,
                # against variants beyond the peers' published settings (InvisibleInk in one batch of every
                # teacher) it is a measured comparison, not a claim (docs/results.md, tokens-per-epsilon)
                "finding": which == "winner",
                "detail": (f"wins {len(goal) - len(lost) - len(open_)} of {len(goal)} settings"
                           + (f"; a peer wins at {'; '.join(lost)}" if lost else "")
                           + (f"; undecided (both at the cap, or neither admissible) at {', '.join(open_)}"
                              if open_ else "")),
            })
    return claims


# -- plot, summary -------------------------------------------------------------------------------------------------

_STYLES = {
    "hot-dpargmax-tct": ("tab:red", "o", "-"),
    "hot-dpargmax-pld": ("tab:pink", "o", "--"),
    "hot-gnmax-pld": ("goldenrod", "s", "-"),
    "hot-gnmax-threshold-pld": ("darkorange", "D", "-"),
    "cold-dpargmax-tct": ("tab:blue", "o", ":"),
    "cold-gnmax-pld": ("tab:cyan", "s", ":"),
    "tang-pld": ("tab:green", "^", "-."),
    "tang-rdp": ("olive", "v", "-."),
    "invisibleink": ("tab:purple", "P", "-."),
    "invisibleink-one-batch": ("indigo", "X", "-."),
    "hot-gnmax-threshold-pld-groups": ("saddlebrown", "H", "--"),
    "hot-gnmax-threshold-pld-prior": ("coral", "d", "--"),
    "hot-dpws-tct": ("firebrick", "*", "-"),
    "hot-dpws-pld": ("lightcoral", "*", "--"),
    "cold-dpws-tct": ("navy", "*", ":"),
    "cold-dpws-pld": ("steelblue", "*", ":"),
    "hot-dpargmax-tct-groups": ("maroon", "h", "-"),
    "hot-bt-public-individual": ("darkgreen", "p", "-"),
    "hot-bt-public-tct": ("limegreen", "p", "--"),
}


#: The series of the figure: the best Hot PATE row and the best Cold PATE row at each alpha (their rows are in the
#: summary's tables), beside every peer row; few enough to tell apart at a glance (18 rows drawn at once were not).
_SERIES_STYLES = {
    "Hot PATE (best row)": ("tab:red", "o", "-"),
    "Cold PATE (best row)": ("tab:blue", "o", ":"),
}


def _plotted_series(result: dict, eps: float) -> list[tuple[str, list]]:
    """``(label, entries sorted by alpha)`` of each series drawn in the panel of budget ``eps``: the best Hot PATE
    and the best Cold PATE entry at each alpha (admissible first, then tokens: :func:`_key`), then each peer row."""
    here = [r for r in result["results"] if r["budget_epsilon"] == eps]
    series = []
    for label, prefix in (("Hot PATE (best row)", "hot-"), ("Cold PATE (best row)", "cold-")):
        best = {}
        for r in here:
            if r["family"] != "peer" and r["row"].startswith(prefix):
                if r["alpha"] not in best or _key(r) > _key(best[r["alpha"]]):
                    best[r["alpha"]] = r
        if best:
            series.append((label, [best[a] for a in sorted(best)]))
    for name in result["parameters"]["rows"]:
        entries = sorted((r for r in here if r["row"] == name and r["family"] == "peer"), key=lambda r: r["alpha"])
        if entries:
            series.append((name, entries))
    return series


@styled
def _plot(result: dict, path: Path) -> None:
    p = result["parameters"]
    budgets = p["budgets"]
    cols = min(2, len(budgets))
    rows_ = -(-len(budgets) // cols)
    fig = new_figure((6.2 * cols + 2.5, 4.3 * rows_))
    axes = np.atleast_1d(fig.subplots(rows_, cols, squeeze=False)).ravel()
    positive = [r["tokens_per_epsilon"] for r in result["results"] if r["tokens_per_epsilon"] > 0]
    floor = min(positive) / 3 if positive else 0.1
    for ax, eps in zip(axes, budgets):
        for name, entries in _plotted_series(result, eps):
            color, marker, line = _SERIES_STYLES.get(name) or _STYLES.get(name, ("black", "o", "-"))
            x = [r["alpha"] for r in entries]
            y = [max(r["tokens_per_epsilon"], floor) for r in entries]
            ax.plot(x, y, color=color, linestyle=line, label=name)
            for xi, yi, r in zip(x, y, entries):
                face = color if r["admissible"] else "none"
                shape = "^" if r["capped"] and r["private_tokens"] else ("v" if not r["private_tokens"] else marker)
                ax.plot([xi], [yi], marker=shape, color=color, markerfacecolor=face,
                        markersize=7 if shape in "^v" else 5, linestyle="none")
        ax.axhline(p["cap"] / eps, color="dimgray", linestyle=":", linewidth=1)
        ax.set_yscale("log")
        ax.set_xlabel("alpha (weight of the common part)")
        ax.set_ylabel("private tokens per budget epsilon")
        ax.set_title(f"budget epsilon {eps:g}, delta {p['budget_delta']:g} (replace-one)")
    for ax in axes[len(budgets):]:
        ax.set_visible(False)
    legend_outside(axes[min(cols, len(budgets)) - 1])
    fig.suptitle(f"Private tokens per budget epsilon, run until refusal: n = {p['teachers']} teachers, "
                 f"{p['common']} common tokens, public pool {p['pool']}\n^ = stopped at the cap ({p['cap']:,} steps, "
                 f"dotted line), v = no private token (drawn at the bottom), hollow = below the precision floor "
                 f"{p['min_precision']:g}")
    fig.savefig(path)


def plot(result: dict, out_dir) -> list[Path]:
    """``tokens_per_epsilon.png``: tokens per budget epsilon against alpha, one panel per budget: the best Hot PATE
    row and the best Cold PATE row at each alpha, and every peer row (:func:`_plotted_series`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tokens_per_epsilon.png"
    _plot(result, path)
    return [path]


def _count(entry: dict) -> str:
    return f"{'>' if entry['capped'] else ''}{entry['private_tokens']:,}"


def _f(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _params(params: dict) -> str:
    return " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def _say(entry: dict, winner, peer) -> str:
    return {"pate": f"{entry['best_pate']} wins", "peer": f"A PEER WINS ({peer})",
            "undecided": "undecided (a count at the cap is a lower bound, or a tie, or nothing admissible)",
            None: "no peer row"}[winner]


def summary(result: dict) -> str:
    p, m = result["parameters"], result["machine"]
    lines = [
        (f"tokens-per-epsilon: n={p['teachers']} teachers (one record each), K={p['common']} common tokens, public "
        f"pool {p['pool']}, budgets epsilon {','.join(f'{e:g}' for e in p['budgets'])} at delta "
        f"{p['budget_delta']:g} ({p['relation']}), cap {p['cap']:,} steps, precision floor {p['min_precision']:g}"),
        (f"machine: {m['cpus']} CPUs, load {_f(m['load_average_before'] and m['load_average_before'][0], '.2f')} "
        f"before, {m['wall_seconds']} s wall, {m['cpu_seconds']} s CPU"),
        "",
        ("columns: tokens = private tokens (> : stopped at the cap, a lower bound), tok/eps = per budget epsilon, "
        "tok/rec = per record, passes/tok = teacher forward passes per private token, prec = on-support fraction, "
        "d1/d2 = distinct-1/2, dist = distinct tokens, stop, ok = every ledger verified; * = below the precision floor "
        "(by the calibration's estimate); rows marked + are peer variants beyond their published settings"),
    ]
    width = max([24, *(len(name) for name in p["rows"])])
    header = (f"  {'row':<{width}} {'tokens':>9} {'tok/eps':>9} {'tok/rec':>8} {'passes/tok':>10} {'prec':>5} "
              f"{'d1':>6} {'d2':>6} {'dist':>5} {'stop':>7} {'ok':>3}  parameters")
    for c in result["comparison"]:
        entries = {r["row"]: r for r in result["results"] if r["alpha"] == c["alpha"]
                   and r["budget_epsilon"] == c["budget_epsilon"]}
        lines += ["", (f"alpha={c['alpha']:g}, budget epsilon={c['budget_epsilon']:g}: against the published "
                       f"peers {_say(c, c['winner_published'], c['best_published_peer'])}; against every row "
                       f"{_say(c, c['winner'], c['best_peer'])}"), header]
        for name in c["order"]:
            r = entries[name]
            lines.append(
                f" {'+' if not r['published'] else ' '}{name:<{width}} {_count(r):>9} {r['tokens_per_epsilon']:>9.1f} {r['tokens_per_record']:>8.3f} "
                f"{_f(r['passes_per_token'], '.3g'):>10} {_f(r['precision'], '.3f'):>5}{' ' if r['admissible'] else '*'}"
                f"{_f(r['distinct_1'], '.3f'):>6} {_f(r['distinct_2'], '.3f'):>6} {r['distinct_tokens']:>5} "
                f"{r['stop']:>7} {'yes' if r['ledgers_verified'] else 'NO':>3}  {_params(r['params'])}")
    lines += claim_lines(result["claims"])
    return "\n".join(lines)
