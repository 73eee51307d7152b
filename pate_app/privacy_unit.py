"""The record is the unit of privacy (docs/privacy_unit.md): what one record changed, added or removed can do to a
run's teachers and groups, and the public numbers that shape a teacher.

A run's guarantee is stated for records, under one of :data:`RECORD_RELATIONS`.  Records are placed in the
teachers' public slots (:func:`ensembles.data.place_records`), so one record changes the records of at most one
teacher of a group, whose vote then moves (:data:`TEACHER_RELATION`: the relation of the mechanisms' events,
paper Section 3.2, Observation 1); :func:`record_relation` says how many groups a record can touch, and
:func:`records_per_teacher` how many records a teacher shows.
"""

from __future__ import annotations

import math

from pate_app.errors import RunInputError

__all__ = ["DEFAULT_TEACHERS", "RECORD_RELATIONS", "RELATIONS", "TEACHER_RELATION", "default_teachers",
           "record_relation", "records_per_teacher"]

#: The most teachers a run takes when ``--teachers`` is not given (:func:`default_teachers`).
DEFAULT_TEACHERS = 64

#: The relations a run may be asked for (``--relation``): of records.
RELATIONS = ("replace-one", "add-remove-one")

#: What one record can do to the teachers of a run, whatever the record-level relation (docs/privacy_unit.md):
#: the records are placed in public slots (:func:`~ensembles.data.place_records`), so one record changed, added or
#: removed changes the records of one teacher of a group, and that teacher's vote moves: the teachers' relation is
#: replace-one.  (Teacher-level add/remove, one vote appearing or vanishing, never describes a run: the number of
#: teachers is fixed.)
TEACHER_RELATION = "replace-one"

#: The record-level relations a run's guarantee is stated under, as the ledger's run metadata names them.
RECORD_RELATIONS = {
    "replace-one": "one record replaced by another (the number of records is public; a label, if any, may change)",
    "replace-one-within-label": "one record replaced by another of the same label (the labels are public)",
    "add-remove-one": "one record added or removed",
}


def record_relation(relation: str, labelled: bool, labels_public: bool) -> tuple[str, int]:
    """``(record-level relation, groups one record can change)`` of a run under ``--relation relation``;
    ``labelled``: the groups are two or more labels; ``labels_public``: ``--labels-public``.

    * No label groups: a record sits in one teacher of one group, whatever the relation: 1 group.
    * Labels, add-remove-one: an added or removed record joins or leaves its own label's group: 1 group.
    * Labels, replace-one, private labels: the replaced record may leave one label's group and the new one join
      another's: 2 groups, and both pay (:meth:`~pate_accountant.accountants.base.Accountant.parallel_groups`).
    * Labels declared public: the relation is replace-one within a label: 1 group."""
    if relation not in RELATIONS:
        raise RunInputError(f"relation must be one of {RELATIONS}, got {relation!r}")
    if not labelled or relation == "add-remove-one":
        return relation, 1
    if labels_public:
        return "replace-one-within-label", 1
    return relation, 2


def default_teachers(relation: str, num_records: int, groups: int) -> int:
    """``--teachers`` when it is not given: under replace-one, where the number of records is public, one teacher
    per record up to :data:`DEFAULT_TEACHERS`; under add-remove-one, where it is private, that many.  Rounded down
    to a multiple of ``groups`` (the groups or labels split the teachers evenly), at least one teacher a group."""
    most = DEFAULT_TEACHERS if relation == "add-remove-one" else min(DEFAULT_TEACHERS, int(num_records))
    return max(int(groups), most - most % int(groups))


def records_per_teacher(given: int | None, relation: str, num_records: int, num_teachers: int) -> int:
    """The most records one teacher shows: ``given`` (``--records-per-teacher``), else, under replace-one, where
    the number of records is public, ``ceil(num_records / num_teachers)`` (every record has a place).  Under
    add-remove-one the number of records is private: a teacher's share cannot come from it, and ``given`` is
    required (refused by :class:`~pate_app.spec.RunSpec`)."""
    if given is not None:
        return int(given)
    if relation == "add-remove-one":
        raise RunInputError("--relation add-remove-one needs --records-per-teacher K (docs/privacy_unit.md)")
    return max(1, math.ceil(num_records / num_teachers))
