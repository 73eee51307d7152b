"""Parallel composition over a run's disjoint groups of records (docs/groups.md).

A run may split the data set's records at random into ``G`` disjoint groups, give each group its own ensemble
of teachers, and let each group generate its own share of the output.  A record sits in exactly one group,
so only that group's answers depend on it: for that record the run is the group's interaction alone, and the
run's guarantee is the largest of the groups' guarantees (parallel composition; the groups may read each
other's released outputs, since those do not depend on the record).  Runs still compose with each other.

How one data set accountant charges this, without a second accountant per group.  Every grouped charge
carries ``group = (scope, index)``: ``scope`` the block of groups (a ledger's run id), ``index`` the group.
For an accountant whose state is a multiset of events with a bound that grows with the multiset, whatever
the order (``parallel_composition = "event"``: basic, advanced, RDP and PLD composition), the block pays,
event by event, the largest count any one of its groups was charged (the *envelope*): a charge that takes its
group past the envelope is charged for the difference, any other is already paid for.  Each group's
multiset of events is contained in the envelope's, so each group's guarantee is at most the envelope's; and
a record's whole history, one group per run, is contained in the union of the runs' envelopes, which is
what the accountant composes.  So the reported spend bounds every record's privacy loss.

Target charging (``"hits"``) takes the envelope of target hits only.  Its bound also depends on the order of
charges (a query after the last hit counts as one more hit) and on the number of queries (each pays its
per-query delta); so every query without a hit is charged as it comes, summed over the groups.  Then the
accountant's hits are the largest of any group's, its queries at least any group's, and after any group's
query without a hit the accountant's last charge was such a query too, unless a later hit raised the
envelope above that group's hits: each group's ``tau`` (hits, plus one after a trailing non-hit query) is at
most the accountant's.  An accountant that declares nothing (``None``, individual charging) charges every
grouped charge as it comes: no saving, always sound.

The ledger stores each group's own charges (the shareable per-group spends: under target charging and plain
composition they are functions of released outputs only) with the group's index; replaying them through the
same rule gives back the same totals, so ``audit`` and ``verify`` check the envelope as they check any spend.
"""

from __future__ import annotations

import attr

from pate_accountant.accountants.base import Accountant, Charge, _release_charge
from pate_accountant.accountants.target_charging import TargetChargingAccountant
from pate_accountant.validation import check_int

__all__ = ["GroupAccountant", "ParallelGroups"]


class ParallelGroups:
    """The accountants of one block of ``num_groups`` disjoint groups (``accountant.parallel_groups(G)``):
    ``groups[g]`` (or iteration) gives group ``g``'s :class:`GroupAccountant`."""

    def __init__(self, parent: Accountant, scope: int, num_groups: int, touches: int = 1):
        self.parent, self.scope, self.num_groups, self.touches = parent, scope, num_groups, touches
        self._views = tuple(GroupAccountant(parent, (scope, g), touches) for g in range(num_groups))

    def __len__(self) -> int:
        return self.num_groups

    def __getitem__(self, index: int) -> GroupAccountant:
        check_int("group", index, minimum=0, maximum=self.num_groups - 1)
        return self._views[index]

    def __iter__(self):
        return iter(self._views)

    def __repr__(self):
        touches = "" if self.touches == 1 else f", {self.touches} touched by a record"
        return f"ParallelGroups({self.num_groups} groups of {type(self.parent).__name__}, scope {self.scope}{touches})"


class GroupAccountant(Accountant):
    """One group's accountant: the data set accountant it was made from, charged as this group.

    It has the accountant contract (``compose``, ``record``, ``record_many``, ``can_afford``, ``register``, and
    ``record_outcomes``/``record_batch`` of target charging);
    ``spent()``, ``get_epsilon`` and the
    budget are the data set's (every run, every group, as the parent reports them).  It has no state of its
    own: ``state()``/``restore()``/``replay()`` belong to the parent."""

    def __init__(self, parent: Accountant, group: tuple, touches: int = 1):  # no super().__init__: the parent holds everything
        self._parent, self._group, self._touches = parent, group, touches

    kind = "group"

    @property
    def group(self) -> tuple:
        """``(scope, index)`` of this group."""
        return self._group

    @property
    def parent(self) -> Accountant:
        return self._parent

    # -- what the parent answers ------------------------------------------------------------------------
    @property
    def budget(self):
        return self._parent.budget

    @property
    def ledger(self):
        return self._parent.ledger

    @property
    def neighboring_relation(self):
        return self._parent.neighboring_relation

    def config(self) -> dict:
        return self._parent.config()

    def spent(self) -> tuple[float, float]:
        return self._parent.spent()

    def _epsilon(self, delta: float) -> float:
        return self._parent._epsilon(delta)

    def get_epsilon(self, delta: float) -> float:
        return self._parent.get_epsilon(delta)

    # -- charges, as this group -------------------------------------------------------------------------
    @property
    def touches(self) -> int:
        """How many of the block's groups one record can change (:meth:`Accountant.parallel_groups`)."""
        return self._touches

    def _touched(self, charge):
        return self._parent._scaled(charge, self._touches)

    def compose(self, event, count: int = 1) -> None:
        self._parent._charge(self._touched(Charge(event, count, group=self._group)))

    def record(self, release) -> None:
        self._parent._charge(self._touched(_release_charge(release, group=self._group)))

    def record_many(self, releases) -> None:
        self._parent._charge_many([self._touched(_release_charge(r, "releases", group=self._group))
                                   for r in releases])

    def record_outcomes(self, event, target_hit, failed=None, *, outcomes=None) -> None:
        """A vector of queries of one ``event`` as this group's (target charging:
        :meth:`~pate_accountant.accountants.target_charging.TargetChargingAccountant.record_outcomes`).  A batch
        that ``can_afford(event, len(target_hit))`` accepted cannot be refused: that check covers the batch all
        hits (free up to the envelope) and all misses (charged as they come), and a mixed batch costs no more
        than the larger of the two in hits and in queries."""
        build = getattr(self._parent, "_outcome_charges", None)
        if build is None:
            raise AttributeError(f"{type(self._parent).__name__} records no vector of outcomes")
        self._parent._charge_many([self._touched(attr.evolve(c, group=self._group))
                                   for c in build(event, target_hit, failed, outcomes)])

    #: :meth:`record_outcomes` for a mechanism's ``BatchRelease``: target charging's own, which calls this
    #: group's ``record_outcomes``.
    record_batch = TargetChargingAccountant.record_batch

    def can_afford(self, event, count: int = 1) -> bool:
        return self._parent._can_afford(event, count, self._group, self._touches)

    def register(self, mechanism):
        return self._parent._register(mechanism, self._group, self._touches)

    def _maybe_compose(self, charge, do_compose: bool, *, enforce_budget: bool = True) -> None:
        raise TypeError("a group's accountant charges through its parent")

    # -- no state of its own ----------------------------------------------------------------------------
    def state(self):
        raise TypeError("a group's accountant has no state of its own: take the parent's state()")

    def restore(self, state) -> None:
        raise TypeError("a group's accountant has no state of its own: restore the parent")

    def replay(self, charges, *, enforce_budget: bool = False) -> None:
        raise TypeError("a group's accountant has no state of its own: replay into the parent")

    def parallel_groups(self, num_groups: int):
        raise TypeError("groups do not nest: split the records once, through the data set's accountant")

    def __repr__(self):
        return f"GroupAccountant(group {self._group[1]} of run {self._group[0]}, {self._parent!r})"


# Accountant.parallel_groups hands out this block of views; the base class cannot import this module (the views
# subclass it), so the block is registered here, on import (the package's __init__ always imports this module).
Accountant._group_block = ParallelGroups
