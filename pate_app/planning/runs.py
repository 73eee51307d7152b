"""The ``generate`` command a target-charging or plain plan prints, and what that exact run is charged and can
release (docs/planning.md, docs/tutorial.md): :func:`run_plan` (the boundary-wrapped DPArgMax under the
target-charging accountant, at step epsilon ``eps0 / 2``) and :func:`plain_run_plan` (DPArgMax under basic
composition), with the exact noise bound ``L`` of :class:`mechanisms.DPArgMax` behind their release thresholds
``n/2 + L + 1`` (the paper's ``C_delta/eps0`` teachers assume ``L = ln(1/delta0)/eps0``).
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

from mechanisms import DPArgMax
from mechanisms import registry as mechanisms_registry
from pate_accountant import planning, registry
from pate_accountant.tct import boundary_wrapper_q

#: The run a target-charging plan describes (docs/tutorial.md): DPArgMax in the boundary wrapper, charged by the
#: target-charging accountant under replace-one, with step epsilon eps0 / 2 (the wrapper's target level is twice
#: its inner epsilon).  ``DATA`` and ``LEDGER`` are left for the user to fill in.
RUN_MECHANISM, RUN_ACCOUNTANT, RUN_RELATION = "boundary-dp-argmax", "target-charging", "replace-one"
RUN_PLACEHOLDERS = {
    "DATA": "your records (JSON lines, JSON or CSV; docs/data.md) with at least as many records as teachers, or "
            "'bundled' (the 201-record sample shipped with the package)",
    "LEDGER": "the data set's ledger file (created by the first run, appended to by the next)",
}


def _number(x: float) -> str:
    """``x`` written so that it reads back exactly (``1``, ``1e-06``, ``0.0063``)."""
    text = f"{x:.15g}"
    return text if float(text) == x else repr(float(x))


def _round_down(x: float, digits: int = 6) -> float:
    """``x`` to ``digits`` significant digits, never above ``x`` (a planned run never charges more than planned)."""
    exact = Decimal(x)
    step = Decimal(1).scaleb(exact.adjusted() - digits + 1)
    return float(exact.quantize(step, rounding=ROUND_FLOOR))


def _round_up(x: float, digits: int = 6) -> float | None:
    """``x`` to ``digits`` significant digits, never below ``x`` (a budget that pays for the planned run);
    ``None`` for an infinite or non-positive ``x``."""
    if not math.isfinite(x) or x <= 0.0:
        return None
    exact = Decimal(x)
    return float(exact.quantize(Decimal(1).scaleb(exact.adjusted() - digits + 1), rounding=ROUND_CEILING))


def _generate_run(mechanism: str, accountant: str, num_teachers: int, step_epsilon: float, step_delta: float,
                  budget_epsilon: float, budget_delta: float, error_bound: int) -> dict:
    """What every printed run has: its ``generate`` command (``argv``, ``DATA`` and ``LEDGER`` left to fill in),
    its parameters, and its release threshold ``n/2 + L + 1`` for the exact noise bound ``L``: its fraction of
    ``n``, whether it is within ``n``, and the fewest teachers that bring it within ``n`` (``2L + 1``)."""
    argv = ["pate-accountant", "generate", "--data", "DATA", "--ledger", "LEDGER", "--mechanism", mechanism,
            "--accountant", accountant, "--relation", RUN_RELATION, "--teachers", str(num_teachers),
            "--step-epsilon", _number(step_epsilon), "--step-delta", _number(step_delta),
            "--budget-epsilon", _number(budget_epsilon), "--budget-delta", _number(budget_delta)]
    threshold = num_teachers // 2 + error_bound + 1
    return {
        "command": " ".join(argv), "argv": argv, "placeholders": RUN_PLACEHOLDERS,
        "mechanism": mechanism, "accountant": accountant, "relation": RUN_RELATION, "num_teachers": num_teachers,
        "step_epsilon": step_epsilon, "step_delta": step_delta,
        "budget": {"epsilon": budget_epsilon, "delta": budget_delta},
        "error_bound": error_bound, "release_threshold": threshold, "threshold_fraction": threshold / num_teachers,
        "can_release": threshold <= num_teachers, "teachers_to_release": 2 * error_bound + 1,
    }


def run_accountant_composition() -> tuple[str, float]:
    """The composition and query-delta share of the accountant a printed run is charged by (the
    ``target-charging`` accountant as ``generate`` builds it: its defaults)."""
    accountant = registry.accountant_class(RUN_ACCOUNTANT)()
    return accountant.composition, accountant.query_delta_share


def run_plan(*, eps0: float, num_teachers: int, budget_epsilon: float, budget_delta: float, step_delta: float):
    """The ``generate`` command that runs a target-charging plan at level ``eps0`` with ``num_teachers`` teachers,
    and what that exact run will be charged and can release: its q and per-query delta, the target hits and
    queries its budget affords, and its release threshold ``n/2 + L + 1`` with the exact noise bound ``L`` of
    :class:`mechanisms.DPArgMax` (the paper's ``C_delta/eps0`` teachers assume ``L = ln(1/delta0)/eps0``).

    Returns ``(run, charged)``: ``charged`` is the :func:`pate_accountant.planning.target_hits` plan of that run
    (its own target level ``2 x step epsilon``, ``q``, step delta, and its accountant's composition and
    query-delta share), the one figure a plan headlines; ``None``, with ``run["refused"]`` saying why, when the
    run cannot pay for one query.  Any other ``ValueError`` (a level past the planning limit) propagates."""
    step_epsilon = _round_down(eps0 / 2.0)
    composition, share = run_accountant_composition()
    charged, refused = None, None
    try:
        charged = planning.target_hits(budget_epsilon, budget_delta, 2.0 * step_epsilon,
                                       q=boundary_wrapper_q(step_epsilon), delta0=step_delta,
                                       composition=composition, query_delta_share=share)
    except ValueError as exc:
        message = str(exc)
        if message.startswith("q "):  # the run's q, which its step epsilon sets
            raise ValueError(f"eps0 = {eps0:g}: the printed run's q, that of its boundary wrapper at step epsilon "
                             f"{_number(step_epsilon)}, {message[2:]}") from None
        if not message.startswith("delta0 "):  # only "the per-query deltas leave no query" is an answer
            raise
        refused = message
    try:
        wrapper = mechanisms_registry.build_mechanism(RUN_MECHANISM, step_epsilon, step_delta, RUN_RELATION)
    except ValueError as exc:
        raise ValueError(f"eps0 = {eps0:g}: the printed run's {RUN_MECHANISM} at step epsilon {_number(step_epsilon)} "
                         f"and step delta {_number(step_delta)} cannot be built: {exc}") from None
    run = {
        **_generate_run(RUN_MECHANISM, RUN_ACCOUNTANT, num_teachers, step_epsilon, step_delta, budget_epsilon,
                        budget_delta, wrapper.inner.error_bound),
        "target_level": wrapper.epsilon, "q": wrapper.q, "composition": composition,
        "hits": None, "max_queries": None, "per_query_delta": None, "refused": refused,
    }
    if charged is not None:
        run.update(hits=charged.hits, max_queries=charged.max_queries, per_query_delta=charged.per_query_delta)
    return run, charged


def plain_run_plan(*, eps0: float, num_teachers: int, num_queries: int, budget_delta: float,
                   step_delta: float) -> dict:
    """The ``generate`` command that runs ``num_queries`` steps of :class:`mechanisms.DPArgMax` at ``(eps0,
    step_delta)`` under basic composition (every step charged, no wrapper), with the budget those steps cost:
    ``num_queries x eps0`` (rounded up) and ``--budget-delta`` (checked against ``num_queries x step_delta``)."""
    step_epsilon = _round_down(eps0)
    mechanism = DPArgMax(step_epsilon, step_delta, relation=RUN_RELATION)
    budget_epsilon = _round_up(max(num_queries, 1) * step_epsilon)
    return {
        **_generate_run("dp-argmax", "basic", num_teachers, step_epsilon, step_delta, budget_epsilon, budget_delta,
                        mechanism.error_bound),
        "steps": num_queries, "steps_delta": num_queries * step_delta,
        "delta_fits": num_queries * step_delta <= budget_delta,
    }
