"""``pate-accountant plan ...``: budget questions answered before a run (docs/planning.md).

The subcommands call :mod:`pate_accountant.planning`; ``plan figures`` (and its shorthand ``plan --plot``)
runs the two Section 6 experiments, ``tct-budget`` and ``alpha-sweep``, through the ``experiment``
command's own runner, so the figures have one home.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from pate_accountant.validation import MIN_DELTA
from pate_app.options import (
    BUDGET_DELTA_HELP,
    BUDGET_EPSILON_HELP,
    add_option,
    cannot_write,
    open_unit,
    positive_float,
    print_json,
    real_in,
    whole_number,
)

NAME = "plan"
HELP = "answer budget questions before a run (target hits, yields, teachers, accounting, margin)"
DESCRIPTION = (
    "Budget planning (docs/planning.md): how many target hits / yields a budget buys, which eps0 and "
    "how many teachers for a wanted number of tokens, plain vs target vs individual charging for one "
    "run shape, and the BassilyTT margin condition. `pate-accountant plan --plot` draws the "
    "Section 6 figures (target hits vs eps0; the alpha sweep of token / fail / target probabilities)."
)

#: ``plan --plot`` / ``plan figures`` output folder.
PLAN_OUT = "results/plan"
PLAN_SUBCOMMANDS = ("hits", "yields", "for-tokens", "compare", "margin", "figures")
#: The experiments ``plan figures`` runs.
FIGURE_EXPERIMENTS = ("tct-budget", "alpha-sweep")

fraction_q = real_in("a number in (0, 1] (a fraction such as 1/3 is fine)", 0.0, 1.0, min_open=True)
unit = real_in("a number in [0, 1]", 0.0, 1.0)
#: ``--step-delta``: the delta of the printed run's DPArgMax, which has none below ``MIN_DELTA`` (no pure run).
step_delta_type = real_in(f"a number in [{MIN_DELTA:g}, 1) (the printed run's DPArgMax needs a delta > 0)",
                          MIN_DELTA, 1.0, max_open=True)
count = whole_number("a positive integer", 1)
count0 = whole_number("a non-negative integer", 0)


#: The planning limits the options' help states (docs/ranges.md), written out so that building the parser
#: (``plan --help``, an argument error) imports neither numpy nor scipy; ``tests/test_cli_grammar.py`` keeps
#: them equal to :mod:`pate_accountant.planning`'s.
LIMITS = {
    "MAX_BUDGET_EPSILON": 300.0, "MIN_EPS0": 1e-300, "MAX_EPS0": 50.0, "MAX_SEARCH_STEPS": 300_000, "MIN_Q": 0.001,
    "MAX_PLAN_QUERIES": 10_000_000, "MAX_BOUND_DRAWS": 3_000_000, "MIN_TARGET_RATE": 1e-12,
    # planning.max_plannable_tokens(1/3, planning.DEFAULT_AGGREGATOR_DELTA); 2 x tct.MAX_EPSILON_FOR_ONE_THIRD
    "max_plannable_tokens": 1_381_551, "max_eps0_for_one_third": 0.6238107163648713,
}


class _Removed(argparse.Action):
    """An option that changed a plan's headline but not the run the plan prints: given, it is a usage error
    (exit 2) that names it, its value and why (docs/planning.md, "Command line")."""

    def __init__(self, option_strings, dest, why: str, **kwargs):
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)
        self.why = why

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"argument {option_string}: no longer taken (got {values}): {self.why}")


#: Why ``--q`` and ``--composition`` are gone: each changed the headline only, never the printed run.
REMOVED_Q = ("a plan's q is the q the printed run is charged, that of its boundary-wrapped DPArgMax at step "
             "epsilon eps0/2 (1/3 up to eps0 about 0.62); for another q call pate_accountant.planning")
REMOVED_COMPOSITION = ("a plan composes as the printed run's target-charging accountant does (exact optimal "
                       "composition); for DRV call pate_accountant.planning or run `experiment tct-budget`")


def add_arguments(plan) -> None:
    """The top-level ``--plot`` shorthand and one subcommand per planning question."""
    plan.add_argument("--plot", dest="plan_plot", action="store_true",
                      help="without a subcommand: draw both Section 6 figures (same as `plan figures --plot`)")
    plan.add_argument("--out", dest="plan_out", metavar="DIR", default=PLAN_OUT,
                      help=f"output folder for --plot (default: {PLAN_OUT})")
    plan.add_argument("--quick", dest="plan_quick", action="store_true", help="small, fast figures")
    plan.add_argument("--seed", dest="plan_seed", metavar="S", type=count0, default=0,
                      help="seed of the alpha sweep (default: 0)")
    plan.add_argument("--json", dest="plan_json", action="store_true", help="print only the JSON result")
    plan.add_argument("--no-progress", dest="plan_no_progress", action="store_true",
                      help="do not show the progress bar (stderr)")
    sub = plan.add_subparsers(dest="plan_command", metavar="SUBCOMMAND", required=False)

    def aggregator_delta(p, what="of the aggregator in C_delta = 2 ln(1/delta0)"):
        p.add_argument("--aggregator-delta", type=open_unit, default=1e-6, help=f"delta0 {what} (default 1e-6)")

    def common(p, *, eps0=True, budget=True, tct=True):
        if budget:
            add_option(p, "--budget-epsilon", "--epsilon", metavar="E", type=positive_float, default=1.0,
                       help=f"{BUDGET_EPSILON_HELP}, in (0, {LIMITS['MAX_BUDGET_EPSILON']:g}] (default 1)")
        add_option(p, "--budget-delta", "--delta", metavar="D", type=open_unit, default=1e-6,
                   help=f"{BUDGET_DELTA_HELP}, in [1e-300, 1) (default 1e-6)")
        if eps0:
            p.add_argument("--eps0", type=positive_float, required=True,
                           help="target level eps0: what target charging charges per target hit (a boundary-wrapped "
                           "DPArgMax of step epsilon e has eps0 = 2e), in "
                           f"[{LIMITS['MIN_EPS0']:g}, {LIMITS['MAX_EPS0']:g}]; the budget may buy at most about "
                           f"{LIMITS['MAX_SEARCH_STEPS']:.0e} eps0-DP steps (docs/ranges.md)")
        if tct:
            add_option(p, "--step-delta", "--delta0", metavar="D", type=step_delta_type, default=None,
                       help="delta of one run of the boundary-wrapped inner mechanism, delta_A, in [1e-300, 1): the "
                       "--step-delta of the printed run and the delta0 of its plan. Every query, hit or not, pays "
                       "w = 1-(1-delta_A)^2 in delta; half of --budget-delta is reserved for them, so the budget also "
                       "limits the queries (max_queries; docs/tct_and_individual.md, section 1). Default: the largest "
                       "value on the 1-2-5 grid, at most the aggregator delta (1e-6, or --aggregator-delta), that pays "
                       "for four times the queries the plan's hits take in expectation (compare: the queries it "
                       "compares; docs/planning.md). Plain composition reads it as each query's delta")
            p.add_argument("--q", action=_Removed, why=REMOVED_Q)
            p.add_argument("--composition", action=_Removed, why=REMOVED_COMPOSITION)
        p.add_argument("--json", action="store_true", help="print only the JSON result")

    p = sub.add_parser("hits", help="target hits a budget buys (and plain eps0-DP queries for comparison)",
                       description="Largest number of target hits with TCT epsilon <= --budget-epsilon "
                       "(planning.target_hits), next to plain composition of eps0-DP queries.")
    common(p)
    p.add_argument("--teachers", type=count, default=None,
                   help="teachers n of the printed run, at most 2^53 (default C_delta/eps0 with delta0 = 1e-6); the "
                   "hits do not depend on n")
    p.set_defaults(handler=_run_plan_hits, parser=p)

    p = sub.add_parser("yields", help="expected yields (tokens) a budget buys (paper: eps0 n / 2 per hit)",
                       description="Expected yields = hits x eps0 n / 2 (planning.yields), the paper's relation "
                       "for alpha <= T/n; n defaults to C_delta/eps0, C_delta = 2 ln(1/aggregator delta).")
    common(p)
    p.add_argument("--teachers", type=count, default=None, help="number of teachers n, at most 2^53 (default C_delta/eps0)")
    aggregator_delta(p)
    p.set_defaults(handler=_run_plan_yields, parser=p)

    p = sub.add_parser("for-tokens", help="which eps0 and how many teachers for a wanted number of tokens",
                       description="Largest eps0 (fewest teachers n = C_delta/eps0) whose budget buys at least "
                       "--tokens yields (planning.plan_for_tokens); never overshoots the budget.")
    p.add_argument("--tokens", type=count, required=True,
                   help=f"wanted number of yields (tokens); at most about {LIMITS['MAX_SEARCH_STEPS']:.0e} q C_delta / 2 "
                   f"({LIMITS['max_plannable_tokens']} at the defaults; docs/ranges.md)")
    common(p, eps0=False)
    aggregator_delta(p)
    p.set_defaults(handler=_run_plan_for_tokens, parser=p)

    p = sub.add_parser("compare", help="plain composition vs target charging vs individual charging",
                       description="Epsilon of one run shape under plain composition, target charging and "
                       "individual charging (planning.compare_accounting).")
    p.add_argument("--queries", type=count0, required=True,
                   help=f"number of queries in the run, at most {LIMITS['MAX_PLAN_QUERIES']:.0e}; the hits over q at most "
                   f"{LIMITS['MAX_BOUND_DRAWS']:.0e} (docs/ranges.md)")
    p.add_argument("--target-rate", type=unit, required=True,
                   help=f"fraction of queries that hit the target: 0 or in [{LIMITS['MIN_TARGET_RATE']:g}, 1]")
    p.add_argument("--teachers", type=count, required=True, help="number of teachers n, at most 2^53")
    p.add_argument("--charged-per-hit", type=count, default=None,
                   help="teachers charged per hit (default min(n, ceil(C_delta/eps0)), about 2L)")
    p.add_argument("--individual-q", type=fraction_q, default=None,
                   help="q for individual charging (default: the q of the printed run)")
    p.add_argument("--budget-epsilon", type=positive_float, default=None,
                   help="also report how many queries each accounting affords within this epsilon")
    aggregator_delta(p, "in C_delta = 2 ln(1/delta0), for the default --charged-per-hit")
    common(p, budget=False)
    p.set_defaults(handler=_run_plan_compare, parser=p)

    p = sub.add_parser("margin", help="BassilyTT margin condition: teachers for m tokens, or tokens for n teachers",
                       description="eta n >= 32 sqrt(2)/eps ln(4m/delta) sqrt(ln(2/delta)) (paper Appendix D; "
                       "planning.bassily_tt_teachers / bassily_tt_tokens).")
    p.add_argument("--eta", type=fraction_q, default=0.4, help="margin as a fraction of n (default 0.4)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--tokens", type=count, help="tokens m, at most 2^53: report the teachers needed")
    which.add_argument("--teachers", type=count, help="teachers n, at most 2^53: report the most tokens m")
    common(p, eps0=False, tct=False)
    p.set_defaults(handler=_run_plan_margin, parser=p)

    p = sub.add_parser("figures", help="the Section 6 figures' data; --plot writes the PNGs",
                       description="Run the two Section 6 experiments, `experiment tct-budget` (target hits "
                       "for total epsilon 1 vs eps0) and `experiment alpha-sweep` (BoundaryWrapper(DPArgMax) "
                       "outcome probabilities, queries and yields per hit), with their default options: their JSON "
                       "results go into --out, and with --plot their figures too.")
    p.add_argument("--plot", action="store_true", help="also write the PNG figures into --out")
    p.add_argument("--out", metavar="DIR", default=PLAN_OUT, help=f"output folder (default: {PLAN_OUT})")
    p.add_argument("--quick", action="store_true", help="small, fast figures")
    p.add_argument("--seed", metavar="S", type=count0, default=0, help="seed of the alpha sweep (default: 0)")
    p.add_argument("--json", action="store_true", help="print only the JSON result")
    p.add_argument("--no-progress", action="store_true", help="do not show the progress bar (stderr)")
    p.set_defaults(handler=_run_figures, parser=p)


#: planning parameter -> the ``plan`` option that sets it (for error messages).  ``q`` is the printed run's: its
#: step epsilon eps0/2 sets it.
_PLAN_OPTIONS = {
    "epsilon": "--budget-epsilon", "delta": "--budget-delta", "eps0": "--eps0", "q": "--eps0", "delta0": "--step-delta",
    "num_teachers": "--teachers", "tokens": "--tokens", "num_queries": "--queries", "target_rate": "--target-rate",
    "charged_per_hit": "--charged-per-hit", "individual_q": "--individual-q", "budget_epsilon": "--budget-epsilon",
    "aggregator_delta": "--aggregator-delta", "eta": "--eta",
}


def _plan_call(args, function, *, options: dict | None = None, **kwargs):
    """Run a planning function; a ValueError/TypeError it raises becomes a usage error (exit 2) that names
    the option (``options`` overrides :data:`_PLAN_OPTIONS`).  A step delta the user did not give is said to be
    the default."""
    try:
        return function(**kwargs)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        name = message.split(" ", 1)[0]
        option = {**_PLAN_OPTIONS, **(options or {})}.get(name)
        if option is not None:
            message = f"argument {option}: {message}"
        if option == "--step-delta" and getattr(args, "step_delta", None) is None:
            message += (" (--step-delta defaults to the largest that pays for four times the plan's expected "
                        f"queries; {_STEP_DELTA_HINT})")
        args.parser.error(message)


_STEP_DELTA_HINT = "give a smaller --step-delta, e.g. 1e-10, or a larger --budget-delta"


def _step_delta(args, aggregator_delta: float, eps0: float, budget_epsilon: float | None = None,
                queries: int | None = None) -> float:
    """The printed run's step delta (``delta_A``, the plan's ``delta0``): ``--step-delta``, else the largest one (at
    most the aggregator delta, the ``delta0`` of ``C_delta``) whose query reserve pays for ``queries``, by default
    four times the private draws the run's hits take in expectation
    (:func:`pate_accountant.planning.step_delta_for_queries`; issue 23, item 4)."""
    if args.step_delta is not None:
        return args.step_delta
    from pate_accountant import planning
    from pate_accountant.tct import boundary_wrapper_q

    composition, share = run_accountant_composition()
    if queries is None:
        step_epsilon = _round_down(eps0 / 2.0)
        queries = _plan_call(args, planning.expected_queries, epsilon=budget_epsilon, delta=args.budget_delta,
                             eps0=2.0 * step_epsilon, q=boundary_wrapper_q(step_epsilon), composition=composition,
                             query_delta_share=share)
    return _plan_call(args, planning.step_delta_for_queries, delta=args.budget_delta, queries=queries,
                      query_delta_share=share, ceiling=aggregator_delta)


def _plan_print(args, command: str, result, lines, run: dict | None = None, assumptions=(),
                plain_run: dict | None = None) -> int:
    """A plan's answer: ``lines``, the ``run`` block (:func:`run_plan`), the ``plain_run`` block
    (:func:`plain_run_plan`) and the assumptions (the result's and ``assumptions``); with ``--json`` the same
    as one object (the runs under their own keys).  ``result`` is a planning result or, for a run that cannot
    pay for one query, a dict of the headline's fields."""
    fields = result if isinstance(result, dict) else result.as_dict()
    notes = [*fields.pop("assumptions", ()), *assumptions]
    if args.json:
        payload = {"command": f"plan {command}", **fields, "assumptions": notes}
        if run is not None:
            payload["run"] = run
        if plain_run is not None:
            payload["plain_run"] = plain_run
        print_json(payload)
        return 0
    for line in lines:
        print(line)
    if run is not None:
        for line in run_lines(run):
            print(line)
    if plain_run is not None:
        for line in plain_run_lines(plain_run):
            print(line)
    print("assumptions:")
    for item in notes:
        print(f"  - {item}")
    return 0


def _charged_run(args, eps0: float, num_teachers: int, budget_epsilon: float, step_delta: float):
    """:func:`run_plan` through :func:`_plan_call`: a bad option is a usage error, and so is a run that cannot pay
    for one query (only a ``--step-delta`` the user chose can do that: the default pays for the plan's queries)."""
    run, charged = _plan_call(args, run_plan, eps0=eps0, num_teachers=num_teachers, budget_epsilon=budget_epsilon,
                              budget_delta=args.budget_delta, step_delta=step_delta)
    if charged is None:
        args.parser.error(f"argument --step-delta: {run['refused']} ({_STEP_DELTA_HINT})")
    return run, charged


def main(args: argparse.Namespace) -> int:
    """``plan --plot`` (the figures); a subcommand is required otherwise."""
    if not args.plan_plot:
        args.parser.error("a subcommand (" + ", ".join(PLAN_SUBCOMMANDS) + ") or --plot is required")
    args.plot, args.out, args.quick, args.seed = True, args.plan_out, args.plan_quick, args.plan_seed
    args.json, args.no_progress = args.plan_json, args.plan_no_progress
    return _run_figures(args)


def _plan_no_top_plot(args) -> None:
    if getattr(args, "plan_plot", False):
        args.parser.error("argument --plot: `plan --plot` draws the figures and takes no subcommand "
                          "(use `plan --plot` or `plan figures --plot`)")


def fraction_query_lines(r) -> list[str]:
    """The query limit of a plan with a per-query delta (``delta0 > 0``); nothing for a pure inner."""
    if getattr(r, "max_queries", None) is None:
        return []
    return [
        f"queries, hit or not  : at most {r.max_queries} (each pays w = {r.per_query_delta:.4g}; "
        f"{r.reserved_delta:.4g} of delta reserved)"
    ]


#: The run a target-charging plan describes (docs/tutorial.md): DPArgMax in the boundary wrapper, charged by the
#: target-charging accountant under replace-one, with step epsilon eps0 / 2 (the wrapper's target level is twice
#: its inner epsilon).  ``DATA`` and ``LEDGER`` are left for the user to fill in.
RUN_MECHANISM, RUN_ACCOUNTANT, RUN_RELATION = "boundary-dp-argmax", "target-charging", "replace-one"
RUN_PLACEHOLDERS = {
    "DATA": "a Dolly-format JSONL file with at least as many records as teachers, or 'bundled' (the 201-record "
            "sample shipped with the package)",
    "LEDGER": "the data set's ledger file (created by the first run, appended to by the next)",
}


def _number(x: float) -> str:
    """``x`` written so that it reads back exactly (``1``, ``1e-06``, ``0.0063``)."""
    text = f"{x:.15g}"
    return text if float(text) == x else repr(float(x))


def _round_down(x: float, digits: int = 6) -> float:
    """``x`` to ``digits`` significant digits, never above ``x`` (a planned run never charges more than planned)."""
    from decimal import ROUND_FLOOR, Decimal

    exact = Decimal(x)
    step = Decimal(1).scaleb(exact.adjusted() - digits + 1)
    return float(exact.quantize(step, rounding=ROUND_FLOOR))


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
    from pate_accountant import registry

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
    from mechanisms import registry as mechanisms_registry
    from pate_accountant import planning
    from pate_accountant.tct import boundary_wrapper_q

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
    from mechanisms import DPArgMax

    step_epsilon = _round_down(eps0)
    mechanism = DPArgMax(step_epsilon, step_delta, relation=RUN_RELATION)
    budget_epsilon = _round_up(max(num_queries, 1) * step_epsilon)
    return {
        **_generate_run("dp-argmax", "basic", num_teachers, step_epsilon, step_delta, budget_epsilon, budget_delta,
                        mechanism.error_bound),
        "steps": num_queries, "steps_delta": num_queries * step_delta,
        "delta_fits": num_queries * step_delta <= budget_delta,
    }


def plain_run_lines(run: dict) -> list[str]:
    """The plain-composition run block of ``plan compare`` (:func:`plain_run_plan`)."""
    lines = [
        "run it with plain composition instead (every query charged):",
        f"  {run['command']}",
        f"  basic composition charges {run['steps']} steps x step epsilon {_number(run['step_epsilon'])} "
        f"(the budget above) and {run['steps_delta']:.3g} of delta",
    ]
    if not run["delta_fits"]:
        lines.append(f"  WARNING: {run['steps']} steps need delta {run['steps_delta']:.3g}, more than --budget-delta "
                     f"{run['budget']['delta']:g}: the run stops early (lower --step-delta or raise --budget-delta)")
    return lines + _threshold_lines(run, "most tokens would be public fallbacks")




def _threshold_lines(run: dict, above_n: str, more: str = "") -> list[str]:
    """The release threshold line of a run block, and the warning (``above_n``: what follows) when it is above
    ``n``."""
    n, t = run["num_teachers"], run["release_threshold"]
    lines = [f"  release threshold n/2 + L + 1 = {t} of {n} teachers (T/n = {t / n:.3f}; exact L = "
             f"{run['error_bound']})"]
    if not run["can_release"]:
        lines.append(f"  WARNING: the threshold is above n: only the noise can carry a count over it, so {above_n}; "
                     f"2L+1 = {run['teachers_to_release']} teachers bring it within n{' ' + more if more else ''}")
    return lines


def run_lines(run: dict) -> list[str]:
    """The run block of a plan's text answer (:func:`run_plan`)."""
    lines = [
        "run this plan:",
        f"  {run['command']}",
        *[f"  ({name}: {what})" for name, what in run["placeholders"].items()],
        f"as that run is charged: target level {_number(run['target_level'])} = 2 x step epsilon, q {run['q']:.4g}",
    ]
    if run["refused"] is not None:
        lines.append(f"  WARNING: that run cannot pay for one query: {run['refused']}")
    else:
        queries = "any number of" if run["max_queries"] is None else f"at most {run['max_queries']}"
        lines.append(f"  its budget affords {run['hits']} target hits and {queries} queries (each pays delta "
                     f"{run['per_query_delta']:.3g})")
    compared = run.get("compared")  # plan compare: the run shape its budget was set for
    if compared is not None and (run["refused"] is not None or run["hits"] < compared["hits"] or (
            run["max_queries"] is not None and run["max_queries"] < compared["queries"])):
        lines.append(f"  WARNING: that budget does not pay for the {compared['queries']} queries and "
                     f"{compared['hits']} hits compared above: the run stops early (its accountant reserves half "
                     "of --budget-delta for the per-query deltas)")
    return lines + _threshold_lines(run, "a target hit buys about one yield (docs/results.md, alpha-sweep (d))",
                                    "and about ten times as many bring T/n near 0.55")


def _round_up(x: float, digits: int = 6) -> float | None:
    """``x`` to ``digits`` significant digits, never below ``x`` (a budget that pays for the planned run);
    ``None`` for an infinite or non-positive ``x``."""
    if not math.isfinite(x) or x <= 0.0:
        return None
    from decimal import ROUND_CEILING, Decimal

    exact = Decimal(x)
    return float(exact.quantize(Decimal(1).scaleb(exact.adjusted() - digits + 1), rounding=ROUND_CEILING))


def _exact_l_assumption(run: dict) -> str:
    return (f"expected yields use the paper's relations (eps0 n / 2 yields per hit for alpha <= T/n, with the paper's "
            f"L = ln(1/delta0)/eps0). The run above has the exact L = {run['error_bound']} and T/n = "
            f"{run['threshold_fraction']:.3f}: the yields per hit fall as T/n grows, so planned yields are optimistic "
            "unless T/n is near 0.55; at T/n >= 1 a target hit buys about one yield, 11 to 14 times fewer than planned "
            "at the paper's n (docs/results.md, alpha-sweep (d), measures the count law's yields per hit).")


def _headline_assumption(run: dict) -> str:
    return (f"the hits above are those of the printed run as its {run['accountant']} accountant charges it: "
            f"target level {_number(run['target_level'])} = 2 x its step epsilon, its q {run['q']:.4g}, its step "
            f"delta {_number(run['step_delta'])} as delta0 and the accountant's {run['composition']} composition")


def _teachers(args, aggregator_delta: float) -> int:
    """``--teachers``, or the paper's ``C_delta/eps0`` rounded up; checks ``--eps0`` and the count first."""
    from pate_accountant import planning
    from pate_accountant.validation import MAX_COUNT, check_real

    exact = _plan_call(args, planning.teachers_for, options={"delta0": "--aggregator-delta"}, eps0=args.eps0,
                       delta0=aggregator_delta)
    if args.teachers is None:
        return math.ceil(exact * (1 - 1e-12))
    _plan_call(args, check_real, name="num_teachers", value=args.teachers, minimum=0.0, min_open=True,
               maximum=MAX_COUNT)
    return args.teachers


def _budget_line(args, run: dict) -> str:
    return (f"budget (epsilon {args.budget_epsilon:g}, delta {args.budget_delta:g}), target level eps0 "
            f"{run['target_level']:g}, q {run['q']:.4g}, {run['composition']} composition inside")


def _run_plan_hits(args: argparse.Namespace) -> int:
    from pate_accountant import planning
    _plan_no_top_plot(args)
    aggregator_delta = planning.DEFAULT_AGGREGATOR_DELTA
    n = _teachers(args, aggregator_delta)
    run, r = _charged_run(args, args.eps0, n, args.budget_epsilon,
                          _step_delta(args, aggregator_delta, args.eps0, args.budget_epsilon))
    plain = ", ".join(f"{m} {k}" for m, k in r.plain_queries.items())
    return _plan_print(args, "hits", r, [
        _budget_line(args, run),
        f"target hits          : {r.hits} (epsilon spent {r.epsilon_spent:.6f}; one more hit: {r.epsilon_next_hit:.6f})",
        f"private draws bound  : k = {r.private_draws}",
        *fraction_query_lines(r),
        f"paper (10 eps0)^-2   : {r.paper_hits:.1f} (ours / paper = {r.hits / r.paper_hits:.3f})",
        f"plain eps0-DP queries: {plain}",
    ], run, (_headline_assumption(run),))


def _run_plan_yields(args: argparse.Namespace) -> int:
    from pate_accountant import planning
    _plan_no_top_plot(args)
    n = _teachers(args, args.aggregator_delta)
    run, hits = _charged_run(args, args.eps0, n, args.budget_epsilon,
                             _step_delta(args, args.aggregator_delta, args.eps0, args.budget_epsilon))
    r = _plan_call(args, planning.yields_for_hits, options={"delta0": "--aggregator-delta"}, plan=hits,
                   num_teachers=n, aggregator_delta=args.aggregator_delta)
    return _plan_print(args, "yields", r, [
        f"budget (epsilon {r.epsilon:g}, delta {r.delta:g}), eps0 {r.eps0:g}, q {r.q:.4g}, n = {n} teachers "
        f"(C_delta/eps0 = {r.min_teachers:.1f}, C_delta = {r.c_delta:.4f})",
        f"target hits (ours)      : {r.hits}",
        *([] if r.max_queries is None else [f"queries, hit or not     : at most {r.max_queries} (delta0 {r.delta0:g})"]),
        f"yields per hit eps0 n/2 : {r.yields_per_hit:.2f}",
        f"expected yields (ours)  : {r.yields:.1f}",
        f"paper: (10 eps0)^-2 hits: {r.paper_hits:.1f} -> {r.paper_yields:.1f} yields "
        f"(0.005 n^2/C_delta = {r.paper_formula_yields:.1f})",
    ], run, (_headline_assumption(run), _exact_l_assumption(run)))


def _run_plan_for_tokens(args: argparse.Namespace) -> int:
    import dataclasses

    from pate_accountant import planning
    from pate_accountant.tct import boundary_wrapper_q
    _plan_no_top_plot(args)
    composition, share = run_accountant_composition()
    # The hits a budget buys do not depend on the per-query delta (its reserve is a share of its own): search
    # with the given one, or the smallest on offer, then choose the printed run's from the plan's queries.
    search_delta = args.step_delta if args.step_delta is not None else planning.MIN_STEP_DELTA

    def search(q: float):
        return _plan_call(args, planning.plan_for_tokens, options={"q": "--budget-epsilon"}, tokens=args.tokens,
                          epsilon=args.budget_epsilon, delta=args.budget_delta, q=q, delta0=search_delta,
                          composition=composition, aggregator_delta=args.aggregator_delta, query_delta_share=share)

    r = search(1.0 / 3.0)
    run_q = boundary_wrapper_q(_round_down(r.eps0 / 2.0))
    if run_q < r.q:  # above eps0 about 0.62 the run's q is below 1/3: plan with it (a smaller eps0, a larger q)
        r = search(run_q)
    step_delta = _step_delta(args, args.aggregator_delta, r.eps0, r.epsilon)
    run, hits = _charged_run(args, r.eps0, r.num_teachers, r.epsilon, step_delta)
    # The headline's hits are the printed run's, at its target level (eps0 rounded down to six digits).
    r = dataclasses.replace(
        r, q=hits.q, hits=hits.hits, epsilon_spent=hits.epsilon_spent, epsilon_next_hit=hits.epsilon_next_hit,
        max_queries=hits.max_queries, expected_yields=hits.hits * hits.eps0 * r.num_teachers / 2.0,
        delta0=hits.delta0, per_query_delta=hits.per_query_delta, reserved_delta=hits.reserved_delta,
    )
    return _plan_print(args, "for-tokens", r, [
        f"wanted {r.tokens} yields within (epsilon {r.epsilon:g}, delta {r.delta:g}), q {r.q:.4g}, "
        f"{r.composition} composition inside",
        f"hits needed          : {r.hits_needed} (C_delta/2 = {r.c_delta / 2:.3f} yields per hit)",
        f"eps0                 : {r.eps0:.6g}",
        f"teachers             : {r.num_teachers} (C_delta/eps0 = {r.num_teachers_exact:.1f})",
        f"budgeted hits        : {r.hits} (epsilon spent {r.epsilon_spent:.6f}; one more: {r.epsilon_next_hit:.6f})",
        *fraction_query_lines(r),
        f"expected yields      : {r.expected_yields:.1f}",
        f"paper's formula      : eps0 {r.paper_eps0:.6g}, {r.paper_num_teachers:.1f} teachers",
    ], run, (_headline_assumption(run), _exact_l_assumption(run)))


def _run_plan_compare(args: argparse.Namespace) -> int:
    from pate_accountant import planning
    from pate_accountant.tct import boundary_wrapper_q
    _plan_no_top_plot(args)
    _plan_call(args, planning.teachers_for, options={"delta0": "--aggregator-delta"}, eps0=args.eps0,
               delta0=args.aggregator_delta)
    step_delta = _step_delta(args, args.aggregator_delta, args.eps0, queries=args.queries)
    composition, share = run_accountant_composition()
    r = _plan_call(args, planning.compare_accounting, num_queries=args.queries, eps0=args.eps0, delta=args.budget_delta,
                   num_teachers=args.teachers, target_rate=args.target_rate, charged_per_hit=args.charged_per_hit,
                   q=boundary_wrapper_q(_round_down(args.eps0 / 2.0)), individual_q=args.individual_q,
                   delta0=step_delta, composition=composition, aggregator_delta=args.aggregator_delta,
                   budget_epsilon=args.budget_epsilon, query_delta_share=share)
    plain = ", ".join(f"{m} {e:.4f}" for m, e in r.plain.items())
    lines = [
        f"{r.num_queries} queries at eps0 {r.eps0:g}, delta {r.delta:g}, {r.num_teachers} teachers, "
        f"target rate {r.target_rate:g} -> {r.hits} hits, {r.charged_per_hit} teachers charged per hit",
        f"plain composition    : epsilon {plain}",
        *([] if r.per_query_delta == 0.0 else [
            f"per-query delta      : w = {r.per_query_delta:.4g} on every query, Delta = {r.total_query_delta:.4g}"
        ]),
        f"target charging      : epsilon {r.target_charging:.4f}",
        f"individual charging  : epsilon {r.individual_charging:.4f} (worst teacher: {r.charges_per_teacher} charges)",
    ]
    if r.max_queries is not None:
        mq = ", ".join(f"{k} {'unlimited' if v is None else v}" for k, v in r.max_queries.items())
        lines.append(f"queries within epsilon {r.budget_epsilon:g}: {mq}")
    budget = r.budget_epsilon if r.budget_epsilon is not None else _round_up(r.target_charging)
    run = None
    if budget is not None and 0.0 < budget <= planning.MAX_BUDGET_EPSILON:
        run, _ = _charged_run(args, r.eps0, r.num_teachers, budget, step_delta)
        run["compared"] = {"hits": r.hits, "queries": r.num_queries}
    plain_run = plain_run_plan(eps0=r.eps0, num_teachers=r.num_teachers, num_queries=r.num_queries,
                               budget_delta=args.budget_delta, step_delta=step_delta)
    return _plan_print(args, "compare", r, lines, run, plain_run=plain_run)


def _run_plan_margin(args: argparse.Namespace) -> int:
    from pate_accountant import planning
    _plan_no_top_plot(args)
    if args.tokens is not None:
        r = _plan_call(args, planning.bassily_tt_teachers, eta=args.eta, epsilon=args.budget_epsilon, delta=args.budget_delta,
                       tokens=args.tokens)
        lines = [f"BassilyTT margin eta {r.eta:g}, (epsilon {r.epsilon:g}, delta {r.delta:g}): {r.tokens} tokens need "
                 f"n >= {r.n_required:.2f} teachers ({r.num_teachers})"]
    else:
        r = _plan_call(args, planning.bassily_tt_tokens, eta=args.eta, epsilon=args.budget_epsilon, delta=args.budget_delta,
                       num_teachers=args.teachers)
        m = f"{r.m_max}" if r.m_max is not None else f"about 10^{r.log10_m_max:.1f}"
        lines = [f"BassilyTT margin eta {r.eta:g}, (epsilon {r.epsilon:g}, delta {r.delta:g}): "
                 f"{r.num_teachers:g} teachers afford m_max = {m} tokens"]
    return _plan_print(args, "margin", r, lines)


def _run_figures(args: argparse.Namespace) -> int:
    """Run the Section 6 experiments with their default options into ``--out``; print their summaries."""
    from pate_app.commands.experiment import run_and_write
    from pate_app.experiments import load
    out = Path(args.out)
    results, written = {}, []
    try:
        for name in FIGURE_EXPERIMENTS:
            module = load(name)
            results[name], files = run_and_write(module, args, out, {})
            written += files
    except OSError as exc:
        return cannot_write(out, exc)
    if args.json:
        print_json({"command": "plan figures", "quick": args.quick, "experiments": results})
        return 0
    for name in FIGURE_EXPERIMENTS:
        print(load(name).summary(results[name]))
        print()
    for path in written:
        print(f"wrote {path}")
    return 0
