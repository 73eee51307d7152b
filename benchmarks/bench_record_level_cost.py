"""What charging at record level costs (issue 31; docs/privacy_unit.md, docs/results.md).

Two fixes change what a budget buys, in the same configuration:

* private labels under replace-one: a replaced record may leave one label group and join another, so both groups
  pay (``parallel_groups(G, touches=2)``).  Printed: the charged steps each label group gets from the budget
  before (``touches=1``, the envelope alone, which under-counted) and after, the groups taking turns; a private
  token needs a charged step, so the tokens scale with it at the same release rate.
* add/remove-one of records: one record moves one teacher's vote (the teachers are fixed), so the mechanisms run
  under replace-one of teachers instead of add/remove-one.  Printed: the noise (DPArgMax's ``L``, GNMax's sigma)
  at the same step budget before and after.

    .venv/bin/python benchmarks/bench_record_level_cost.py

Accounting only (no model), a few seconds.
"""

from __future__ import annotations

from mechanisms import DPArgMax
from mechanisms import registry as mechanisms_registry
from pate_accountant.errors import BudgetExhaustedError
from pate_accountant.registry import accountant_class

BUDGET = (10.0, 1e-6)
LABEL_CASES = [  # (mechanism, step epsilon, step delta, accountant, labels)
    ("gaussian-argmax", 1.0, 1e-7, "pld", 2),
    ("gaussian-argmax", 2.0, 1e-7, "pld", 4),
    ("gaussian-argmax", 0.5, 1e-8, "pld", 4),
    ("dp-argmax", 1.0, 1e-8, "basic", 4),
    ("dp-argmax", 1.0, 1e-8, "pld", 4),
]


def steps_per_group(name: str, epsilon: float, delta: float, accountant: str, labels: int, touches: int) -> int:
    """Charged steps of the first label group when the groups take turns until the budget refuses one."""
    mechanism = mechanisms_registry.build_mechanism(name, epsilon, delta, "replace-one")
    parent = accountant_class(accountant)(budget=BUDGET)
    groups = parent.parallel_groups(labels, touches=touches)
    steps = 0
    while True:
        for group in groups:
            if not group.can_afford(mechanism.event):
                return steps
            group.compose(mechanism.event)
        steps += 1


def main() -> None:
    print(f"budget (epsilon {BUDGET[0]:g}, delta {BUDGET[1]:g}); charged steps per label group, groups in turn")
    print(f"{'mechanism':<16} {'step (eps, delta)':<18} {'accountant':<10} {'labels':>6} {'before':>7} {'after':>6} "
          f"{'after/before':>12}")
    for name, epsilon, delta, accountant, labels in LABEL_CASES:
        try:
            before = steps_per_group(name, epsilon, delta, accountant, labels, 1)
            after = steps_per_group(name, epsilon, delta, accountant, labels, 2)
        except BudgetExhaustedError:
            continue
        print(f"{name:<16} {f'({epsilon:g}, {delta:g})':<18} {accountant:<10} {labels:>6} {before:>7} {after:>6} "
              f"{after / before:>12.2f}")
    print()
    print("add/remove-one of records: the noise at the same step budget, teacher relation before -> after")
    for epsilon, delta in [(1.0, 1e-6), (2.0, 1e-6), (4.0, 1e-6)]:
        before = DPArgMax(epsilon, delta, relation="add-remove-one").error_bound
        after = DPArgMax(epsilon, delta, relation="replace-one").error_bound
        print(f"  DPArgMax ({epsilon:g}, {delta:g}): L {before} -> {after} (a release needs a noisy count above n/2 + L)")
    for epsilon, delta in [(1.0, 1e-7), (2.0, 1e-7)]:
        before = mechanisms_registry.build_mechanism("gaussian-argmax", epsilon, delta, "add-remove-one").sigma
        after = mechanisms_registry.build_mechanism("gaussian-argmax", epsilon, delta, "replace-one").sigma
        print(f"  GNMax ({epsilon:g}, {delta:g}): sigma {before:.3g} -> {after:.3g} votes")


if __name__ == "__main__":
    main()
