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
    "Budget planning (docs/planning.md): `plan best` compares every run generate offers (target-charged and "
    "plain DPArgMax and DPWS, the Gaussian aggregators, groups; with --public-agreement the public-candidate query "
    "under target charging, individual charging and PLD) for your teachers, budget and agreement and prints "
    "the one that buys the most private tokens first, with its generate command; the other subcommands answer "
    "how many target hits / yields a budget buys, which eps0 and how many teachers for a wanted number of tokens, "
    "plain vs target vs individual charging for one run shape, and the BassilyTT margin condition. "
    "`pate-accountant plan --plot` draws the Section 6 figures (target hits vs eps0; the alpha sweep of token / "
    "fail / target probabilities)."
)

#: ``plan --plot`` / ``plan figures`` output folder.
PLAN_OUT = "results/plan"
PLAN_SUBCOMMANDS = ("best", "hits", "yields", "for-tokens", "compare", "margin", "figures")
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
    "max_plannable_tokens": 1_381_551, "max_eps0_for_one_third": 0.6238107163648713, "MAX_PLAN_TEACHERS": 1_000_000,
}
#: ``plan best --teachers``: all the run's teachers, at most planning.MAX_PLAN_TEACHERS.
best_teachers = whole_number(f"a positive integer of at most {LIMITS['MAX_PLAN_TEACHERS']} (docs/ranges.md)", 1,
                             LIMITS["MAX_PLAN_TEACHERS"])


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
            add_option(p, "--step-delta", "--delta0", "--aggregator-delta", metavar="D", type=step_delta_type,
                       default=None,
                       help="delta of one run of the boundary-wrapped inner mechanism, delta_A, in [1e-300, 1): the "
                       "--step-delta of the printed run, the delta0 of its plan and of the paper's C_delta = "
                       "2 ln(1/delta0) (its teachers C_delta/eps0). Every query, hit or not, pays "
                       "w = 1-(1-delta_A)^2 in delta; half of --budget-delta is reserved for them, so the budget also "
                       "limits the queries (max_queries; docs/tct_and_individual.md, section 1). Default: the largest "
                       "value on the 1-2-5 grid, at most 1e-6, that pays "
                       "for four times the queries the plan's hits take in expectation (compare: the queries it "
                       "compares; docs/planning.md). Plain composition reads it as each query's delta")
            p.add_argument("--q", action=_Removed, why=REMOVED_Q)
            p.add_argument("--composition", action=_Removed, why=REMOVED_COMPOSITION)
        p.add_argument("--json", action="store_true", help="print only the JSON result")

    p = sub.add_parser("best", help="the run that buys the most private tokens for your teachers, budget and agreement",
                       description="Compare every run generate offers (target-charged boundary-wrapped DPArgMax and "
                       "DPWS, the same inners and the Gaussian aggregators under PLD composition, each in one group and "
                       "in groups that divide the teachers; with --public-agreement also the public-candidate query "
                       "BetweenThresholds under target charging, individual charging and PLD) on the paper's "
                       "alpha-mixture agreement model, each at its best step epsilon and delta, and print the one that buys the most expected private tokens first, with its generate "
                       "command, then the runners-up; or, when none releases a token, about how many teachers would "
                       "(docs/planning.md).")
    p.add_argument("--teachers", metavar="N", type=best_teachers, required=True,
                   help="all the run's teachers N (in G groups, N / G each; G divides N), at most 10^6")
    p.add_argument("--alpha", metavar="A", type=fraction_q, required=True,
                   help="agreement in (0, 1]: each teacher's mass on the token the teachers share (paper Section 6's "
                   "alpha mixture; 1 = identical teachers)")
    add_option(p, "--budget-epsilon", "--epsilon", metavar="E", type=positive_float, default=1.0,
               help=f"{BUDGET_EPSILON_HELP}, in (0, {LIMITS['MAX_BUDGET_EPSILON']:g}] (default 1)")
    add_option(p, "--budget-delta", "--delta", metavar="D", type=open_unit, default=1e-6,
               help=f"{BUDGET_DELTA_HELP}, in [1e-300, 1) (default 1e-6)")
    p.add_argument("--relation", choices=("replace-one", "add-remove-one"), default="replace-one",
                   help="the run's relation of records, as generate's --relation (one record moves one teacher's "
                        "vote under either; default replace-one; docs/privacy_unit.md)")
    p.add_argument("--records", metavar="K", type=count, default=None,
                   help="synthetic records the run generates, as generate's --records (default: as many as the "
                   "budget needs)")
    p.add_argument("--max-tokens", metavar="T", type=count, default=24,
                   help="at most T tokens per record, as generate's --max-tokens (default 24)")
    p.add_argument("--vocab-size", metavar="V", type=count, default=DEFAULT_VOCAB_SIZE,
                   help=f"the model's vocabulary, which GNMax noises token by token (default {DEFAULT_VOCAB_SIZE}, the "
                   "embedded SmolLM2's; a larger one lowers the Gaussian figures)")
    p.add_argument("--runners-up", metavar="K", type=count0, default=DEFAULT_RUNNERS_UP,
                   help=f"runners-up printed after the best run (default {DEFAULT_RUNNERS_UP})")
    p.add_argument(PUBLIC_AGREEMENT_OPTION, metavar="P", type=unit, default=None,
                   help="in [0, 1]: your assumption of how often the public model's candidate token is the teachers' "
                   "shared token. With it, the public-candidate query generate runs (between-thresholds) is compared "
                   "too, under target charging, individual charging (the worst teacher charged on every hit) and PLD; "
                   "without it (the default) it is not, since the agreement model does not say (docs/planning.md)")
    p.add_argument("--json", action="store_true", help="print only the JSON result")
    p.set_defaults(handler=_run_plan_best, parser=p)

    p = sub.add_parser("hits", help="target hits a budget buys (and plain eps0-DP queries for comparison)",
                       description="Largest number of target hits with TCT epsilon <= --budget-epsilon "
                       "(planning.target_hits), next to plain composition of eps0-DP queries.")
    common(p)
    p.add_argument("--teachers", type=count, default=None,
                   help="teachers n of the printed run, at most 2^53 (default C_delta/eps0 with the run's step delta as "
                   "delta0); the hits do not depend on n")
    p.set_defaults(handler=_run_plan_hits, parser=p)

    p = sub.add_parser("yields", help="expected yields (tokens) a budget buys (paper: eps0 n / 2 per hit)",
                       description="Expected yields = hits x eps0 n / 2 (planning.yields), the paper's relation "
                       "for alpha <= T/n; n defaults to C_delta/eps0, C_delta = 2 ln(1/step delta).")
    common(p)
    p.add_argument("--teachers", type=count, default=None, help="number of teachers n, at most 2^53 (default C_delta/eps0)")
    p.set_defaults(handler=_run_plan_yields, parser=p)

    p = sub.add_parser("for-tokens", help="which eps0 and how many teachers for a wanted number of tokens",
                       description="Largest eps0 (fewest teachers n = C_delta/eps0) whose budget buys at least "
                       "--tokens yields (planning.plan_for_tokens); never overshoots the budget.")
    p.add_argument("--tokens", type=count, required=True,
                   help=f"wanted number of yields (tokens); at most about {LIMITS['MAX_SEARCH_STEPS']:.0e} q C_delta / 2 "
                   f"({LIMITS['max_plannable_tokens']} at the defaults; docs/ranges.md)")
    common(p, eps0=False)
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
                   help="teachers charged per hit (default min(n, ceil(C_delta/eps0)), about 2L, with C_delta = "
                   "2 ln(1/step delta))")
    p.add_argument("--individual-q", type=fraction_q, default=None,
                   help="q for individual charging (default: the q of the printed run)")
    p.add_argument("--budget-epsilon", type=positive_float, default=None,
                   help="also report how many queries each accounting affords within this epsilon")
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
    "aggregator_delta": "--step-delta", "eta": "--eta", "alpha": "--alpha",
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


def _step_delta(args, eps0: float, budget_epsilon: float | None = None, queries: int | None = None) -> float:
    """The printed run's step delta (``delta_A``, the plan's ``delta0`` and the ``delta0`` of its ``C_delta``):
    ``--step-delta``, else the largest one (at most 1e-6, ``planning.DEFAULT_AGGREGATOR_DELTA``) whose query reserve
    pays for ``queries``, by default four times the private draws the run's hits take in expectation
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
                      query_delta_share=share, ceiling=planning.DEFAULT_AGGREGATOR_DELTA)


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
        (f"queries, hit or not  : at most {r.max_queries} (each pays w = {r.per_query_delta:.4g}; "
        f"{r.reserved_delta:.4g} of delta reserved)")
    ]


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
        (f"  basic composition charges {run['steps']} steps x step epsilon {_number(run['step_epsilon'])} "
        f"(the budget above) and {run['steps_delta']:.3g} of delta"),
    ]
    if not run["delta_fits"]:
        lines.append(f"  WARNING: {run['steps']} steps need delta {run['steps_delta']:.3g}, more than --budget-delta "
                     f"{run['budget']['delta']:g}: the run stops early (lower --step-delta or raise --budget-delta)")
    return lines + _threshold_lines(run, "most tokens would be public fallbacks")




def _threshold_lines(run: dict, above_n: str, more: str = "") -> list[str]:
    """The release threshold line of a run block, and the warning (``above_n``: what follows) when it is above
    ``n``."""
    n, t = run["num_teachers"], run["release_threshold"]
    lines = [(f"  release threshold n/2 + L + 1 = {t} of {n} teachers (T/n = {t / n:.3f}; exact L = "
             f"{run['error_bound']})")]
    if not run["can_release"]:
        lines.append(f"  WARNING: the threshold is above n: only the noise can carry a count over it, so {above_n}; "
                     f"2L+1 = {run['teachers_to_release']} teachers bring it within n{' ' + more if more else ''}")
    return lines


def run_lines(run: dict) -> list[str]:
    """The run block of a plan's text answer (:func:`run_plan`); a run whose budget pays for no target hit (which
    ``generate`` refuses before anything is written) is not offered as one to run, only said so."""
    if run["refused"] is not None or not run["hits"]:
        why = run["refused"] or (f"its budget (epsilon {run['budget']['epsilon']:g}) affords no target hit at level "
                                 f"{_number(run['target_level'])}")
        return [f"no target-charging run to print: {why}, so generate would refuse it (raise --budget-epsilon, or "
                "run with plain composition below)"]
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


def _check_eps0(args) -> None:
    """``--eps0``, checked before anything is planned with it."""
    from pate_accountant import planning

    _plan_call(args, planning.teachers_for, eps0=args.eps0)


def _teachers(args, step_delta: float) -> int:
    """``--teachers``, or the paper's ``C_delta/eps0`` rounded up with the run's step delta as ``delta0``; checks
    the count."""
    from pate_accountant import planning
    from pate_accountant.validation import MAX_COUNT, check_real

    exact = _plan_call(args, planning.teachers_for, options={"delta0": "--step-delta"}, eps0=args.eps0,
                       delta0=step_delta)
    if args.teachers is None:
        return math.ceil(exact * (1 - 1e-12))
    _plan_call(args, check_real, name="num_teachers", value=args.teachers, minimum=0.0, min_open=True,
               maximum=MAX_COUNT)
    return args.teachers


def _budget_line(args, run: dict) -> str:
    return (f"budget (epsilon {args.budget_epsilon:g}, delta {args.budget_delta:g}), target level eps0 "
            f"{run['target_level']:g}, q {run['q']:.4g}, {run['composition']} composition inside")


def _run_plan_hits(args: argparse.Namespace) -> int:
    _plan_no_top_plot(args)
    _check_eps0(args)
    step_delta = _step_delta(args, args.eps0, args.budget_epsilon)
    n = _teachers(args, step_delta)
    run, r = _charged_run(args, args.eps0, n, args.budget_epsilon, step_delta)
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
    _check_eps0(args)
    step_delta = _step_delta(args, args.eps0, args.budget_epsilon)
    n = _teachers(args, step_delta)
    run, hits = _charged_run(args, args.eps0, n, args.budget_epsilon, step_delta)
    r = _plan_call(args, planning.yields_for_hits, options={"delta0": "--step-delta"}, plan=hits,
                   num_teachers=n, aggregator_delta=step_delta)
    return _plan_print(args, "yields", r, [
        (f"budget (epsilon {r.epsilon:g}, delta {r.delta:g}), eps0 {r.eps0:g}, q {r.q:.4g}, n = {n} teachers "
        f"(C_delta/eps0 = {r.min_teachers:.1f}, C_delta = {r.c_delta:.4f})"),
        f"target hits (ours)      : {r.hits}",
        *([] if r.max_queries is None else [f"queries, hit or not     : at most {r.max_queries} (delta0 {r.delta0:g})"]),
        f"yields per hit eps0 n/2 : {r.yields_per_hit:.2f}",
        f"expected yields (ours)  : {r.yields:.1f}",
        (f"paper: (10 eps0)^-2 hits: {r.paper_hits:.1f} -> {r.paper_yields:.1f} yields "
        f"(0.005 n^2/C_delta = {r.paper_formula_yields:.1f})"),
    ], run, (_headline_assumption(run), _exact_l_assumption(run)))


def _run_plan_for_tokens(args: argparse.Namespace) -> int:
    import dataclasses

    from pate_accountant import planning
    from pate_accountant.tct import boundary_wrapper_q
    _plan_no_top_plot(args)
    composition, share = run_accountant_composition()
    # The hits a budget buys do not depend on the per-query delta (its reserve is a share of its own): search
    # with the given one, or the smallest on offer.
    search_delta = args.step_delta if args.step_delta is not None else planning.MIN_STEP_DELTA

    def search(q: float, step_delta: float):
        return _plan_call(args, planning.plan_for_tokens, options={"q": "--budget-epsilon"}, tokens=args.tokens,
                          epsilon=args.budget_epsilon, delta=args.budget_delta, q=q, delta0=search_delta,
                          composition=composition, aggregator_delta=step_delta, query_delta_share=share)

    def plan(step_delta: float):
        r = search(1.0 / 3.0, step_delta)
        run_q = boundary_wrapper_q(_round_down(r.eps0 / 2.0))
        if run_q < r.q:  # above eps0 about 0.62 the run's q is below 1/3: plan with it (a smaller eps0, a larger q)
            r = search(run_q, step_delta)
        return r

    # One step delta: the run's, also the delta0 of C_delta (the plan's teachers C_delta/eps0).  Without
    # --step-delta, plan at the largest on offer (1e-6), choose the run's from that plan's queries and plan again with
    # it, until the choice is the step delta planned with (a smaller step delta means a larger C_delta, fewer hits
    # needed and fewer queries).  Should the choice keep moving, the smaller one is kept: it pays for more queries.
    if args.step_delta is not None:
        step_delta = args.step_delta
        r = plan(step_delta)
    else:
        step_delta = planning.DEFAULT_AGGREGATOR_DELTA
        r = plan(step_delta)
        for _ in range(4):
            chosen = _step_delta(args, r.eps0, r.epsilon)
            if chosen == step_delta:
                break
            step_delta = chosen
            r = plan(step_delta)
        else:
            chosen = _step_delta(args, r.eps0, r.epsilon)
            if chosen < step_delta:  # the last plan's queries need a smaller one, whose plan needs no more
                step_delta = chosen
                r = plan(step_delta)
    run, hits = _charged_run(args, r.eps0, r.num_teachers, r.epsilon, step_delta)
    # The headline's hits are the printed run's, at its target level (eps0 rounded down to six digits).
    r = dataclasses.replace(
        r, q=hits.q, hits=hits.hits, epsilon_spent=hits.epsilon_spent, epsilon_next_hit=hits.epsilon_next_hit,
        max_queries=hits.max_queries, expected_yields=hits.hits * hits.eps0 * r.num_teachers / 2.0,
        delta0=hits.delta0, per_query_delta=hits.per_query_delta, reserved_delta=hits.reserved_delta,
    )
    return _plan_print(args, "for-tokens", r, [
        (f"wanted {r.tokens} yields within (epsilon {r.epsilon:g}, delta {r.delta:g}), q {r.q:.4g}, "
        f"{r.composition} composition inside"),
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
    _check_eps0(args)
    step_delta = _step_delta(args, args.eps0, queries=args.queries)
    composition, share = run_accountant_composition()
    r = _plan_call(args, planning.compare_accounting, num_queries=args.queries, eps0=args.eps0, delta=args.budget_delta,
                   num_teachers=args.teachers, target_rate=args.target_rate, charged_per_hit=args.charged_per_hit,
                   q=boundary_wrapper_q(_round_down(args.eps0 / 2.0)), individual_q=args.individual_q,
                   delta0=step_delta, composition=composition, aggregator_delta=step_delta,
                   budget_epsilon=args.budget_epsilon, query_delta_share=share)
    plain = ", ".join(f"{m} {e:.4f}" for m, e in r.plain.items())
    lines = [
        (f"{r.num_queries} queries at eps0 {r.eps0:g}, delta {r.delta:g}, {r.num_teachers} teachers, "
        f"target rate {r.target_rate:g} -> {r.hits} hits, {r.charged_per_hit} teachers charged per hit"),
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
        lines = [(f"BassilyTT margin eta {r.eta:g}, (epsilon {r.epsilon:g}, delta {r.delta:g}): {r.tokens} tokens need "
                 f"n >= {r.n_required:.2f} teachers ({r.num_teachers})")]
    else:
        r = _plan_call(args, planning.bassily_tt_tokens, eta=args.eta, epsilon=args.budget_epsilon, delta=args.budget_delta,
                       num_teachers=args.teachers)
        m = f"{r.m_max}" if r.m_max is not None else f"about 10^{r.log10_m_max:.1f}"
        lines = [(f"BassilyTT margin eta {r.eta:g}, (epsilon {r.epsilon:g}, delta {r.delta:g}): "
                 f"{r.num_teachers:g} teachers afford m_max = {m} tokens")]
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


# -- plan best: the run that buys the most private tokens (issue 23, item 4) ---------------------------------

#: The (mechanism, accountant) pairs ``plan best`` compares: target charging of the boundary-wrapped DPArgMax and
#: DPWS, and plain composition of the same inners and of the Gaussian aggregators by the PLD accountant (the
#: tightest plain composition the runs offer).  Every other runnable pair is listed as not compared, with why.
BEST_CONFIGURATIONS = (
    ("boundary-dp-argmax", "target-charging"),
    ("boundary-dp-weighted-sampling", "target-charging"),
    ("dp-argmax", "pld"),
    ("dp-weighted-sampling", "pld"),
    ("gaussian-threshold-argmax", "pld"),
    ("gaussian-argmax", "pld"),
)
GAUSSIAN = ("gaussian-argmax", "gaussian-threshold-argmax")
#: The rates of ``--subsample-teachers`` ``plan best`` compares for the Gaussian aggregators under PLD, which charges
#: them by the exact PLD of their subsampled noisy counts (docs/mechanisms/subsampled.md).
SUBSAMPLE_RATES = (0.5, 0.25, 0.1)
#: ``(mechanism, accountant, rate)``: the Gaussian aggregators on Poisson-subsampled teachers.
SUBSAMPLED_CONFIGURATIONS = tuple((name, "pld", rate) for name in GAUSSIAN for rate in SUBSAMPLE_RATES)
#: The public-candidate query generate runs (docs/tct_and_individual.md, "In generate"): BetweenThresholds on the
#: count of the public model's candidate among the teachers included at a random rate, thresholds from n.
PUBLIC_CANDIDATE = "between-thresholds"
#: The pairs ``plan best --public-agreement P`` adds: the public-candidate query as a q-target (target charging),
#: under individual charging (planned for the worst teacher charged on every hit) and as a pure step (PLD).
PUBLIC_CANDIDATE_CONFIGURATIONS = (
    (PUBLIC_CANDIDATE, "target-charging"),
    (PUBLIC_CANDIDATE, "individual-charging"),
    (PUBLIC_CANDIDATE, "pld"),
)
#: The option that states the public model's agreement with the teachers.
PUBLIC_AGREEMENT_OPTION = "--public-agreement"
#: Why the public-candidate query is not compared without ``--public-agreement``.
PUBLIC_AGREEMENT_WHY = (
    "BetweenThresholds asks whether the teachers back the public model's candidate token, and the agreement model "
    "does not say how often that candidate is the teachers' shared token: give --public-agreement P (your "
    "assumption, in [0, 1]) to compare it under target charging, individual charging and pld")
#: GNMax's largest noise (mechanisms.gaussian.MAX_SIGMA): a step epsilon that would need more is not tried.
GAUSSIAN_MAX_SIGMA = 1e4
#: The step epsilons compared: the 1-2-5 grid from 1e-5 to 50 (the largest step epsilon a run takes); those whose
#: budget search would pass the planning limit (docs/ranges.md) are left out for each budget.
BEST_STEP_EPSILONS = tuple(float(f"{m}e{k}") for k in range(-5, 2) for m in (1, 2, 5))
#: How many step deltas are compared below the largest (a decade apart).
BEST_STEP_DELTA_DECADES = 10
#: A run plan prints records enough for the budget to end its run before them with this probability.
RECORDS_QUANTILE = 0.99
#: Default number of runners-up printed after the best configuration.
DEFAULT_RUNNERS_UP = 5


def _sigma_guess(e: float, d: float) -> float:
    """About the noise ``calibrate_sigma(e, d)`` finds under replace-one (the classical Gaussian mechanism's
    ``sqrt(2 ln(1.25/d) x 2) / e``; two counts move), to skip a calibration that cannot pay off."""
    return math.sqrt(4.0 * math.log(1.25 / d)) / e


def _grid_value(mantissa: int, exponent: int) -> float:
    return float(f"{mantissa}e{exponent}")


def best_step_deltas(budget_delta: float) -> tuple[float, ...]:
    """The step deltas ``plan best`` compares for the DPArgMax and DPWS configurations: the largest value on the
    1-2-5 grid at most a quarter of ``--budget-delta`` (target charging reserves half of it for the per-query
    weights ``w ~ 2 delta``, so a larger one pays for no query), and the values one to five decades below."""
    exponent = math.floor(math.log10(budget_delta / 4.0)) + 1
    top = None
    while top is None:
        for mantissa in (5, 2, 1):
            if _grid_value(mantissa, exponent) <= budget_delta / 4.0:
                top = (mantissa, exponent)
                break
        exponent -= 1
    values = [_grid_value(top[0], top[1] - k) for k in range(BEST_STEP_DELTA_DECADES)]
    return tuple(v for v in values if v >= MIN_DELTA)


def gaussian_step_delta(budget_delta: float) -> float:
    """The one step delta the Gaussian configurations are compared at: PLD composes a GNMax step by its noise
    alone, and the step epsilons sweep the noise, so one delta suffices (the largest of
    :func:`best_step_deltas`, at least the GNMax floor 1e-14)."""
    return max(best_step_deltas(budget_delta)[0], 1e-14)


#: The vocabulary ``plan best`` assumes for GNMax, which noises every token of it: the embedded SmolLM2's.
DEFAULT_VOCAB_SIZE = 49152


def _gaussian_noise(sigma: float, bound: int):
    """GNMax's noise (mechanisms/gaussian.py): the discrete Gaussian ``P[X = x] ~ exp(-x^2 / (2 sigma^2))`` on
    ``{-bound, ..., bound}``: ``(pmf, survival)``, ``pmf[x + bound] = P[X = x]`` and ``survival(k) = P[X >= k]`` for
    an integer array ``k``."""
    import numpy as np

    x = np.arange(-bound, bound + 1, dtype=np.float64)
    log_w = -(x * x) / (2.0 * sigma * sigma)
    pmf = np.exp(log_w - np.logaddexp.reduce(log_w))
    tail = np.concatenate([np.cumsum(pmf[::-1])[::-1], [0.0]])  # tail[i] = P[X >= i - bound]

    def survival(k):
        k = np.asarray(k, dtype=np.int64)
        return np.where(k <= -bound, 1.0, tail[np.clip(k + bound, 0, 2 * bound + 1)])

    return pmf, survival


def _gaussian_outcomes(mechanism, num_teachers: int, threshold: int | None, vocab_size: int):
    """``(token, exact)`` of GNMax on the agreement model's histograms (:func:`per_count_outcomes`)."""
    import numpy as np
    from scipy.signal import fftconvolve

    n, bound = num_teachers, mechanism.truncation_bound
    pmf, survival = _gaussian_noise(mechanism.sigma, bound)
    # g(v): a lower bound on the top voted token's winning (and clearing the threshold) when its noisy count is v:
    # each of the other vocab_size - 1 tokens has at most one vote, so its noisy count reaches v with probability
    # at most P[1 + X >= v] (a union bound; a tie counts as a loss).
    values = np.arange(1 - bound, n + bound + 1)
    g = np.clip(1.0 - (vocab_size - 1) * survival(values - 1), 0.0, 1.0)
    if threshold is not None:
        g[values < threshold] = 0.0
    # token[m] = E[g(m + X)] for the top count m = 1..n: a correlation of g with the noise law.
    token = np.empty(n + 1)
    token[1:] = np.clip(fftconvolve(g, pmf[::-1], mode="valid"), 0.0, 1.0)
    token[0] = token[1]  # no shared token: the top count is one of the teachers' own tokens
    return token, threshold is not None and threshold >= bound + 2


def _subsampled_gaussian_outcomes(name: str, mechanism, num_teachers: int, vocab_size: int):
    """A lower bound on ``token[c]`` of GNMax on teachers subsampled at ``q = mechanism.rate``: the shared token
    keeps ``k ~ Binomial(c, q)`` of its ``c`` votes and every other kept teacher still votes a token of its own, so
    ``token[c] = sum_k P[k] token'[k]`` with ``token'`` the inner GNMax's bound (:func:`_gaussian_outcomes`, its
    threshold set from the votes a step keeps on average), and ``token'[0] = 0`` (no shared vote kept: counted as
    no release)."""
    import numpy as np
    from scipy import stats

    n, inner = int(num_teachers), mechanism.inner
    threshold = getattr(inner, "threshold", None) if name == "gaussian-threshold-argmax" else None
    kept, _ = _gaussian_outcomes(inner, n, threshold, vocab_size)
    kept[0] = 0.0
    counts = np.arange(n + 1)
    thinning = stats.binom.pmf(counts[None, :], counts[:, None], mechanism.rate)  # [c, k]: k of c votes kept
    return np.clip(thinning @ kept, 0.0, 1.0)


def per_count_outcomes(name: str, mechanism, num_teachers: int, vocab_size: int = DEFAULT_VOCAB_SIZE, *,
                       inclusion=None):
    """``(token, target, exact)`` of one step of the run mechanism ``name`` (built as ``mechanism``) with ``n =
    num_teachers`` teachers on the agreement model's histograms (:func:`pate_accountant.planning.agreement_count_pmf`):
    the shared token has ``c`` votes and each of the other ``n - c`` teachers one vote for a token of its own.
    ``token[c]`` and ``target[c]`` (index ``c = 0..n``) are the probabilities that the step releases a private
    token and, for a boundary wrapper, that it hits the target; ``exact`` says whether ``token`` is the
    mechanism's exact law (``output_distribution``, computed here in closed form for this family;
    ``tests/test_plan_configurations.py`` checks both against it) or a lower bound.  ``inclusion``: DPWS's
    ``inclusion_probabilities(n)``, when already computed.

    * DPArgMax: the top count is ``m = max(c, 1)``; it releases with ``yield_probability(m, n)``.
    * DPWS: ``fail = (1 - pi*(c)) (1 - pi*(1))^(n-c)`` (``inclusion_probabilities``); any included token is
      released.
    * boundary wrappers: ``P[target] = a/(1 + a)``, ``a = min(1 - pi, 1/2)`` with ``pi`` the inner law's largest
      outcome (``target_from_outside_mass``), and a token with ``(1 - P[target]) P[inner releases]``; for DPWS
      the shared token's share is ``pi*(c) E[1/(1 + K)]``, ``K ~ Bin(n - c, pi*(1))``, and the rest of the
      released mass is split evenly between the ``n - c`` own tokens.
    * GNMax on subsampled teachers (``--subsample-teachers``): :func:`_subsampled_gaussian_outcomes`, a lower
      bound.
    * GNMax (``gaussian-argmax``, ``gaussian-threshold-argmax``; noise ``X`` on ``[-T, T]`` on every one of the
      ``vocab_size`` tokens): counted only when the top voted token (``m = max(c, 1)`` votes) wins outright, and
      clears the threshold ``n//2 + 1``, with the other tokens' chance to reach its noisy count ``v`` bounded by
      ``(vocab_size - 1) P[1 + X >= v]`` (each has at most one vote): a lower bound (GNMax also releases a token
      nobody voted for when the noise decides), exact for the threshold form when ``n//2 + 1 >= T + 2`` (then no
      other token can clear it).
    """
    import numpy as np

    from mechanisms.boundary_wrapper import target_from_outside_mass

    n = int(num_teachers)
    c = np.arange(n + 1)
    m = np.maximum(c, 1)
    inner = getattr(mechanism, "inner", mechanism)
    wrapped = inner is not mechanism
    zero = np.zeros(n + 1)
    if name in GAUSSIAN and getattr(mechanism, "rate", None) is not None:  # on subsampled teachers
        return _subsampled_gaussian_outcomes(name, mechanism, n, vocab_size), zero, False
    if name in GAUSSIAN:
        threshold = n // 2 + 1 if name == "gaussian-threshold-argmax" else None
        token, exact = _gaussian_outcomes(mechanism, n, threshold, vocab_size)
        return token, zero, exact
    if name in ("dp-argmax", "boundary-dp-argmax"):
        released = np.asarray(inner.yield_probability(m, n), dtype=np.float64)
        if not wrapped:
            return released, zero, True
        target = target_from_outside_mass(np.minimum(released, 1.0 - released))
        return (1.0 - target) * released, target, True
    if name in ("dp-weighted-sampling", "boundary-dp-weighted-sampling"):
        table = np.asarray(inner.inclusion_probabilities(n) if inclusion is None else inclusion, dtype=np.float64)
        own = float(table[1]) if n >= 1 else 0.0
        rest = (n - c).astype(np.float64)
        with np.errstate(divide="ignore"):
            log_fail = np.log1p(-table) + rest * math.log1p(-own)
        released = -np.expm1(log_fail)
        if not wrapped:
            return released, zero, True
        fail = np.exp(log_fail)
        if own > 0.0:  # E[1/(1 + K)], K ~ Bin(rest, own)
            alone = -np.expm1((rest + 1.0) * math.log1p(-own)) / ((rest + 1.0) * own)
        else:
            alone = np.ones(n + 1)
        shared = table * alone
        with np.errstate(divide="ignore", invalid="ignore"):
            single = np.where(rest > 0, np.maximum(released - shared, 0.0) / np.maximum(rest, 1.0), 0.0)
        outside = np.where(fail >= np.maximum(shared, single), released,
                           np.where(shared >= single, fail + np.maximum(released - shared, 0.0), 1.0 - single))
        target = target_from_outside_mass(outside)
        return (1.0 - target) * released, target, True
    raise ValueError(f"mechanism {name!r}: plan best has no law for it")


def public_candidate_outcomes(mechanism, num_teachers: int, shared, other, public_agreement: float) -> dict:
    """One step of the public-candidate query (``mechanism``, a :class:`mechanisms.BetweenThresholds` built for
    ``n = num_teachers`` teachers) on the agreement model, when the public model's candidate is the teachers'
    shared token with probability ``P = public_agreement``: ``shared`` and ``other`` are the laws of the counted
    teachers ``c'`` when it is (the shared token's count) and when it is not (a token of one teacher's own, one
    vote) (:meth:`BestPlanner.included`).  ``above`` and ``between`` release the candidate, ``between`` is the
    target hit (it charges the counted teachers).

    * ``target``: ``P E[between(c'_shared)] + (1 - P) E[between(c'_other)]``, every hit (the other token's one vote
      gives at least the hits of a token nobody votes for: more hits, more charges);
    * ``token``: ``P (E[release(c'_shared)] - release(0))``, the releases of the shared token beyond those of a
      candidate no teacher votes for (noise alone): a lower bound on the private tokens, which counts neither a
      released candidate the teachers do not share (the public model's token, as a fallback would be) nor the
      noise's share;
    * ``counted_per_hit``: ``E[c' | between]``, the teachers a hit charges on average.
    """
    import numpy as np

    table = mechanism.outcome_table(np.arange(int(num_teachers) + 1))
    between, released = table[:, 1], table[:, 1] + table[:, 2]
    p = float(public_agreement)
    shared, other = np.asarray(shared), np.asarray(other)
    k_shared, k_other = np.arange(shared.size), np.arange(other.size)
    target = p * float(shared @ between[:shared.size]) + (1.0 - p) * float(other @ between[:other.size])
    counted = (p * float((k_shared * shared) @ between[:shared.size])
               + (1.0 - p) * float((k_other * other) @ between[:other.size]))
    token = p * max(0.0, float(shared @ released[:shared.size]) - float(released[0]))
    return {"token": min(token, 1.0), "target": min(target, 1.0),
            "counted_per_hit": counted / target if target > 0.0 else 0.0, "noise_release": float(released[0])}


class BestPlanner:
    """Compares the runs of :data:`BEST_CONFIGURATIONS` for one budget, relation and agreement ``alpha``
    (docs/planning.md, ``plan best``).  What does not depend on the number of teachers (the mechanisms, the
    accountants' limits) is computed once and reused for every group size."""

    def __init__(self, *, budget_epsilon: float, budget_delta: float, relation: str, alpha: float,
                 max_tokens: int, records: int | None = None, vocab_size: int = DEFAULT_VOCAB_SIZE,
                 public_agreement: float | None = None):
        self.budget = (float(budget_epsilon), float(budget_delta))
        self.vocab_size = int(vocab_size)
        self.relation, self.alpha, self.max_tokens, self.records = relation, float(alpha), int(max_tokens), records
        #: ``--public-agreement``: the probability that the public model's candidate is the shared token (``None``:
        #: not stated, and the public-candidate query is not compared).
        self.public_agreement = None if public_agreement is None else float(public_agreement)
        pairs = BEST_CONFIGURATIONS + (PUBLIC_CANDIDATE_CONFIGURATIONS if self.public_agreement is not None else ())
        #: ``(mechanism, accountant, rate)``: ``rate`` that of ``--subsample-teachers`` (``None``: every teacher).
        self.configurations = tuple((name, accountant, None) for name, accountant in pairs) + SUBSAMPLED_CONFIGURATIONS
        self._included: dict = {}
        self._mechanisms: dict = {}
        self._limits: dict = {}
        self._pmfs: dict = {}
        self._inclusion: dict = {}
        self.refused: dict = {}  # mechanism -> why generate refuses to build it (at some step on the grid)
        self.built: set = set()  # the mechanisms built at some step

    # -- what does not depend on n ------------------------------------------------------------------------------
    def grid(self, name: str) -> list[tuple[float, float]]:
        if name in GAUSSIAN:
            deltas = (gaussian_step_delta(self.budget[1]),)
        elif name == PUBLIC_CANDIDATE:  # a pure query: generate checks its step delta and leaves it unused
            deltas = best_step_deltas(self.budget[1])[:1]
        else:
            deltas = best_step_deltas(self.budget[1])
        return [(e, d) for e in BEST_STEP_EPSILONS for d in deltas]

    def mechanism(self, name: str, e: float, d: float, num_teachers: int | None = None, rate: float | None = None):
        """The mechanism ``name`` at step ``(e, d)`` as ``generate`` builds it (``None`` when it refuses); ``rate``:
        on teachers subsampled at that rate (``--subsample-teachers``).  The threshold form of GNMax is the
        calibrated ``gaussian-argmax`` (the same noise and event) with the threshold ``n//2 + 1`` of the teachers a
        step counts (``num_teachers``, or the :func:`~pate_app.run.kept_teachers` of them when subsampled; without
        them, the plain form): what ``for_teachers`` builds, calibrated once."""
        built = "gaussian-argmax" if name == "gaussian-threshold-argmax" else name
        key = (built, e, d, num_teachers) if name == PUBLIC_CANDIDATE else (built, e, d, rate)
        if key not in self._mechanisms:
            from pate_app.run import TEACHER_RELATION, RunInputError, build_mechanism

            try:  # BetweenThresholds: its thresholds from the teachers of one group; one record moves one vote
                self._mechanisms[key] = build_mechanism(built, e, d, TEACHER_RELATION, num_teachers=(
                    num_teachers if name == PUBLIC_CANDIDATE else None), subsample=rate)
            except RunInputError as exc:
                self._mechanisms[key] = None
                self.refused.setdefault(built, str(exc))
            else:
                self.built.add(built)
        base = self._mechanisms[key]
        if base is None or built == name or num_teachers is None:  # (BetweenThresholds: built == name)
            return base
        from mechanisms import GaussianThresholdArgMax
        from pate_app.run import SubsampledTeachers, kept_teachers

        plain, votes = (base, num_teachers) if rate is None else (base.inner, kept_teachers(num_teachers, rate))
        thresholded = GaussianThresholdArgMax(plain.sigma, relation=plain.relation, epsilon=plain.epsilon,
                                              threshold=votes // 2 + 1)
        return thresholded if rate is None else SubsampledTeachers(thresholded, rate, base.relation)

    def within_planning_limit(self, level: float) -> bool:
        """Whether a budget search at ``level`` stays within the planning limit (docs/ranges.md)."""
        from pate_accountant import planning

        key = ("level", level)
        if key not in self._limits:
            epsilon, delta = self.budget
            self._limits[key] = planning.estimated_steps(epsilon, delta, level) <= planning.MAX_SEARCH_STEPS
        return self._limits[key]

    def limits(self, accountant: str, mechanism):
        """:func:`pate_accountant.planning.step_limits` of ``mechanism`` under ``accountant`` (``None``: refused)."""
        from pate_accountant import planning
        from pate_accountant.errors import PateAccountantError

        key = (accountant, mechanism.event)
        if key not in self._limits:
            try:
                if accountant == "individual-charging":
                    self._limits[key] = self._individual_limits(mechanism)
                else:
                    self._limits[key] = planning.step_limits(accountant, mechanism.event, *self.budget)
            except (PateAccountantError, ValueError):
                self._limits[key] = None
        return self._limits[key]

    def individual_accountant(self, mechanism, num_teachers: int):
        """The individual-charging accountant ``generate`` builds for the public-candidate ``mechanism`` with
        ``num_teachers`` teachers (``Accountant.for_run``): its per-teacher limit is derived from the budget for the
        query's epsilon and gap.  Raises ``ValueError`` when the budget affords no charge."""
        from pate_accountant import registry

        return registry.accountant_class("individual-charging").for_run(
            budget=self.budget, mechanism=mechanism, num_teachers=num_teachers)

    def _individual_limits(self, mechanism):
        """Individual charging planned for the worst teacher charged on every hit: the run's hits are at most the
        per-teacher limit (a sound plan whoever is counted), and a pure query has no query limit."""
        from pate_accountant import planning
        from pate_accountant.tct import NO_LIMIT

        accountant = self.individual_accountant(mechanism, 1)  # the limit does not depend on the teachers
        tau = accountant.per_teacher_limit
        return planning.StepLimits("individual-charging", *self.budget, None, int(tau), NO_LIMIT, False)

    def included(self, n: int):
        """``(shared, other)``: the laws of the counted teachers ``c'`` (:func:`pate_accountant.planning.
        included_count_pmf`) when the candidate is the shared token (its count from the agreement model) and
        when it is another token (one vote: a token of one teacher's own, the most any other token has in the
        model)."""
        if n not in self._included:
            from pate_accountant import planning

            self._included = {n: (planning.included_count_pmf(self.count_pmf(n), n),
                                  planning.included_count_pmf([0.0, 1.0], n))}
        return self._included[n]

    def count_pmf(self, n: int):
        if n not in self._pmfs:
            from pate_accountant import planning

            self._pmfs = {n: planning.agreement_count_pmf(n, self.alpha)}  # one size at a time
        return self._pmfs[n]

    # -- one configuration at one group size --------------------------------------------------------------------
    def evaluate(self, name: str, accountant: str, num_teachers: int, groups: int, floor: float = 0.0,
                 rate: float | None = None) -> dict | None:
        """The best step ``(epsilon, delta)`` of one configuration with ``groups`` groups of ``num_teachers //
        groups`` teachers (``rate``: subsampled at it): the entry with the most expected private tokens, or ``None``
        when no step releases more than ``floor``.  A step whose charged steps alone (each releasing at most one
        token) cannot beat the best so far is not evaluated."""
        from pate_accountant import planning

        n = num_teachers // groups
        if n < 1:
            return None
        best = None
        for e, d, mechanism, limits, bound in self._candidates(name, accountant, n, groups, rate):
            if bound <= max(floor, 0.0 if best is None else best["expected_private_tokens"]):
                continue
            if name == PUBLIC_CANDIDATE:
                law = public_candidate_outcomes(mechanism, n, *self.included(n), self.public_agreement)
                p_token, p_target, exact = law["token"], law["target"], False
                if p_token <= 0.0:
                    continue
                records, cap = self._records(limits, p_target, groups)
                expectation = planning.run_expectation(limits, p_token, p_target, groups=groups, steps_per_group=cap)
                entry = self._entry(name, accountant, num_teachers, groups, e, d, expectation, p_token, p_target,
                                    exact, records, limits, mechanism)
                entry["counted_per_hit"] = law["counted_per_hit"]
                entry["public_agreement"] = self.public_agreement
                if entry["expected_private_tokens"] > max(floor, 0.0 if best is None else
                                                          best["expected_private_tokens"]):
                    best = entry
                continue
            inclusion = None
            if name.endswith("dp-weighted-sampling"):  # the plain and the wrapped DPWS share their inner's table
                inner = getattr(mechanism, "inner", mechanism)
                key = (inner.epsilon, inner.delta, n)
                if key not in self._inclusion:
                    self._inclusion = {key: inner.inclusion_probabilities(n),
                                       **{k: v for k, v in self._inclusion.items() if k[2] == n}}
                inclusion = self._inclusion[key]
            token, target, exact = per_count_outcomes(name, self.mechanism(name, e, d, n, rate) if rate else mechanism,
                                                      n, self.vocab_size, inclusion=inclusion)
            pmf = self.count_pmf(n)
            p_token, p_target = float(pmf @ token), float(pmf @ target)
            if p_token <= 0.0:
                continue
            records, cap = self._records(limits, p_target, groups)
            expectation = planning.run_expectation(limits, p_token, p_target, groups=groups, steps_per_group=cap)
            entry = self._entry(name, accountant, num_teachers, groups, e, d, expectation, p_token, p_target, exact,
                                records, limits, mechanism)
            entry["subsample_teachers"] = rate
            if entry["expected_private_tokens"] > max(floor, 0.0 if best is None else best["expected_private_tokens"]):
                best = entry
        if best is not None:
            best["built"] = self.mechanism(name, best["step_epsilon"], best["step_delta"], n, rate)
        return best

    def _entry(self, name, accountant, num_teachers, groups, e, d, expectation, p_token, p_target, exact, records,
               limits, mechanism) -> dict:
        return {
            "mechanism": name, "accountant": accountant, "groups": groups, "teachers": num_teachers,
            "teachers_per_group": num_teachers // groups, "step_epsilon": e, "step_delta": d,
            "expected_private_tokens": expectation.tokens, "expected_steps": expectation.steps,
            "token_probability": p_token, "target_probability": p_target,
            "figure": "expected value" if exact and expectation.exact else "lower bound",
            "law_exact": bool(exact), "records": records, "max_tokens": self.max_tokens,
            "limits": _limits_dict(limits), "level": mechanism.event.epsilon, "subsample_teachers": None,
        }

    def _candidates(self, name: str, accountant: str, n: int, groups: int, rate: float | None = None) -> list:
        """``(e, d, mechanism, limits, bound)`` of every step on the grid that ``generate`` would run with ``n``
        teachers per group and whose budget pays for a step, ``bound`` being the most tokens it could release (its
        charged steps, each releasing at most one), largest first."""
        from pate_app.run import RunInputError, check_noise_floor, check_reachable

        out = []
        cap = None if self.records is None else self.records * self.max_tokens // groups
        for e, d in self.grid(name):
            if e > 2.0 * self.budget[0] or not self.within_planning_limit(
                    2.0 * e if name.startswith("boundary-") else e):  # a wrapper's target level is 2e
                continue  # one step would spend the budget; a search past the planning limit
            if name in GAUSSIAN and _sigma_guess(e, d) > min(GAUSSIAN_MAX_SIGMA, 2.0 * n):
                continue  # more noise than GNMax takes, or than twice the votes: it would release next to nothing
            if name == PUBLIC_CANDIDATE and 1.0 / e > 2.0 * n:
                continue  # Laplace noise of scale 1/e above twice the votes: the noise, not the teachers, decides
            mechanism = self.mechanism(name, e, d, n if name == PUBLIC_CANDIDATE else None, rate)
            if mechanism is None:
                continue
            try:
                check_reachable(mechanism, n)
                if name in GAUSSIAN:  # noise that decides the releases over the vocabulary: generate refuses it
                    check_noise_floor(self.mechanism(name, e, d, n, rate), n, self.vocab_size)
            except RunInputError:
                continue
            limits = self.limits(accountant, mechanism)
            if limits is None:
                continue
            if limits.max_steps is not None:
                bound = groups * (limits.max_steps if cap is None else min(limits.max_steps, cap))
            else:
                share = _query_share(limits, groups) if cap is None else min(_query_share(limits, groups), cap)
                bound = 0 if limits.max_hits == 0 else groups * share
            if bound > 0:
                out.append((e, d, mechanism, limits, bound))
        out.sort(key=lambda item: -item[4])
        return out

    def _records(self, limits, p_target: float, groups: int) -> tuple[int, int]:
        """``(records, steps per group)``: ``--records`` (the user's, else enough for the budget to end the run
        first with probability :data:`RECORDS_QUANTILE`, rounded up to whole records of ``--max-tokens`` per
        group) and the steps each group is counted for: an even share of them (``generate`` gives the records to
        the groups in turn and drops a group whose budget is spent, so no group gets fewer while the others run)."""
        from pate_accountant import planning

        if self.records is None:
            if limits.max_steps is not None:
                need = limits.max_steps
            else:  # a pure query has no query limit: at most the planning limit on steps, per group
                need = planning.steps_to_hits_quantile(limits.max_hits, p_target, RECORDS_QUANTILE,
                                                       _query_share(limits, groups))
            records = groups * max(1, math.ceil(need / self.max_tokens))
        else:
            records = self.records
        return records, records * self.max_tokens // groups

    def compare(self, num_teachers: int, group_sizes) -> list[dict]:
        """Every configuration at every group count of ``group_sizes``, best first: each configuration's best step
        at each group count (a group count that cannot beat the configuration's best at fewer groups is left
        out)."""
        entries, floors = [], {}
        for groups in group_sizes:
            for name, accountant, rate in self.configurations:
                if groups > 1 and accountant == "individual-charging":
                    continue  # generate runs individual charging in one group (its charges are per teacher)
                key = (name, accountant, rate)
                entry = self.evaluate(name, accountant, num_teachers, groups, floors.get(key, 0.0), rate)
                if entry is not None:
                    entries.append(entry)
                    floors[key] = max(floors.get(key, 0.0), entry["expected_private_tokens"])
        entries.sort(key=lambda x: -x["expected_private_tokens"])
        return entries

    def individual_details(self, entry: dict, mechanism) -> dict:
        """What an individual-charging entry assumes and what the other assumption would give: the per-teacher
        limit of the accountant ``generate`` builds; the ranked, conservative plan (the worst teacher charged on
        every hit: the run planned to that many hits); and the optimistic one (the charges spread evenly, about
        ``E[c' | hit]`` teachers a hit, :func:`pate_accountant.planning.individual_charges`, the rule of ``plan
        compare``): its hits, tokens (with records enough for them) and, at the planned hits, each plan's worst
        teacher's epsilon (:func:`pate_accountant.accountants.individual.individual_epsilon`)."""
        from pate_accountant import planning
        from pate_accountant.accountants.individual import individual_epsilon
        from pate_accountant.tct import NO_LIMIT

        n = entry["teachers_per_group"]
        accountant = self.individual_accountant(mechanism, n)
        tau = int(accountant.per_teacher_limit)
        g = min(n, max(1, math.ceil(entry["counted_per_hit"] * (1 - 1e-12))))
        config = accountant.config()

        def epsilon(charges: int) -> float:
            return individual_epsilon(charges, accountant.epsilon0, accountant.q, self.budget[1],
                                      relation=accountant.relation, composition=config["composition"])

        even_hits = planning.individual_charging_hits(tau, g, n, "even")
        limits = planning.StepLimits("individual-charging", *self.budget, None, even_hits, NO_LIMIT, False)
        records, cap = self._records(limits, entry["target_probability"], 1)
        even = planning.run_expectation(limits, entry["token_probability"], entry["target_probability"],
                                        steps_per_group=cap)
        worst_charges = planning.individual_charges(tau, g, n, "worst")
        even_charges = planning.individual_charges(tau, g, n, "even")
        return {
            "per_teacher_limit": tau, "charged_per_hit": g, "relation": accountant.relation, "ranked": "worst_teacher",
            "worst_teacher": {"hits": planning.individual_charging_hits(tau, g, n, "worst"),
                              "charges_at_planned_hits": worst_charges, "epsilon_at_planned_hits": epsilon(worst_charges)},
            "even_spread": {"hits": even_hits, "expected_private_tokens": even.tokens, "expected_steps": even.steps,
                            "records": records, "charges_at_planned_hits": even_charges,
                            "epsilon_at_planned_hits": epsilon(even_charges)},
        }

    def releases(self, num_teachers: int, at_least: float = 1.0) -> dict | None:
        """The first configuration found (one group of ``num_teachers``) expected to release at least
        ``at_least`` private tokens, or ``None``."""
        cheap_first = sorted(self.configurations, key=lambda triple: triple[0].endswith("weighted-sampling"))
        for name, accountant, rate in cheap_first:  # DPWS's inclusion table is the slowest law to compute
            entry = self.evaluate(name, accountant, num_teachers, 1, floor=at_least * (1.0 - 1e-12), rate=rate)
            if entry is not None and entry["expected_private_tokens"] >= at_least:
                return entry
        return None


def _limits_dict(limits) -> dict:
    """An entry's ``limits``: ``queries`` is ``None`` for a pure query, which its accountant does not limit."""
    from pate_accountant.tct import NO_LIMIT

    if limits.max_steps is not None:
        return {"steps_per_group": limits.max_steps, "capped": limits.capped}
    return {"hits_per_group": limits.max_hits,
            "queries": None if limits.max_queries >= NO_LIMIT else limits.max_queries}


def _query_share(limits, groups: int) -> int:
    """The queries one of ``groups`` groups is counted for when its records are sized: an even share of the query
    limit, or for a pure query (no query limit) the planning limit on steps."""
    from pate_accountant import planning
    from pate_accountant.tct import NO_LIMIT

    if limits.max_queries >= NO_LIMIT:
        return planning.MAX_PLAN_STEPS
    return limits.max_queries // groups


def group_counts(num_teachers: int) -> tuple[int, ...]:
    """The group counts ``plan best`` compares: ``generate --groups G`` needs ``G`` to divide ``--teachers``, so the
    divisors of ``N`` that leave each group at least two teachers, about one per doubling (the largest divisor up to
    each power of two), 1 first."""
    divisors = sorted({d for k in range(1, math.isqrt(num_teachers) + 1) if num_teachers % k == 0
                       for d in (k, num_teachers // k) if num_teachers // d >= 2} | {1})
    out, power = [], 1
    while power <= divisors[-1]:
        below = [d for d in divisors if d <= power]
        if below[-1] not in out:
            out.append(below[-1])
        power *= 2
    return tuple(out)


def needed_teachers(planner: BestPlanner, num_teachers: int) -> int | None:
    """About the fewest teachers (one group) for which some configuration is expected to release at least one
    private token: doubling from ``num_teachers``, then bisection (``None`` when even
    :data:`pate_accountant.planning.MAX_PLAN_TEACHERS` do not)."""
    from pate_accountant import planning

    lo, hi = num_teachers, None
    candidate = num_teachers
    while hi is None:
        candidate = min(2 * candidate, planning.MAX_PLAN_TEACHERS)
        if planner.releases(candidate) is not None:
            hi = candidate
        elif candidate == planning.MAX_PLAN_TEACHERS:
            return None
        else:
            lo = candidate
    while hi - lo > max(1, lo // 100):  # to about 1%
        middle = (lo + hi) // 2
        if planner.releases(middle) is not None:
            hi = middle
        else:
            lo = middle
    return hi


def best_run_argv(entry: dict, relation: str) -> list[str]:
    """The ``generate`` command of a ``plan best`` entry (``DATA`` and ``LEDGER`` left to fill in); ``--groups``
    only with more than one group."""
    budget = entry["budget"]
    argv = ["pate-accountant", "generate", "--data", "DATA", "--ledger", "LEDGER", "--mechanism", entry["mechanism"],
            "--accountant", entry["accountant"], "--relation", relation, "--teachers", str(entry["teachers"])]
    if relation == "add-remove-one":  # the number of records is private: a teacher's places are given
        argv += ["--records-per-teacher", "K"]
    if entry["groups"] > 1:
        argv += ["--groups", str(entry["groups"])]
    if entry.get("subsample_teachers") is not None:
        argv += ["--subsample-teachers", _number(entry["subsample_teachers"])]
    argv += ["--step-epsilon", _number(entry["step_epsilon"]), "--step-delta", _number(entry["step_delta"]),
             "--budget-epsilon", _number(budget["epsilon"]), "--budget-delta", _number(budget["delta"]),
             "--records", str(entry["records"]), "--max-tokens", str(entry["max_tokens"])]
    return argv


def check_best_run(entry: dict, relation: str, mechanism=None, vocab_size: int = DEFAULT_VOCAB_SIZE) -> None:
    """``generate``'s own pre-run checks (:mod:`pate_app.run`) on a ``plan best`` entry, without a model: its
    mechanism builds as ``generate`` builds it (the threshold form with each group's teachers; ``mechanism``: the
    one already built so), its accountant accounts for it and affords one step, its release threshold is within
    reach of each group, and its noise does not decide the releases over a vocabulary of ``vocab_size`` tokens.
    Raises ``RunInputError``."""
    from pate_app.run import (
        TEACHER_RELATION,
        build_mechanism,
        check_groups,
        check_inputs,
        check_noise_floor,
        check_reachable,
    )

    n = check_groups(entry["groups"], entry["teachers"], entry["accountant"])
    budget = (entry["budget"]["epsilon"], entry["budget"]["delta"])
    if mechanism is None:
        mechanism = build_mechanism(entry["mechanism"], entry["step_epsilon"], entry["step_delta"], TEACHER_RELATION,
                                    num_teachers=n, subsample=entry.get("subsample_teachers"))
    check_inputs(range(entry["teachers"]), n, mechanism, entry["accountant"], budget)
    check_reachable(mechanism, n)
    check_noise_floor(mechanism, n, vocab_size)


def _not_compared(planner: BestPlanner, entries: list[dict]) -> list[dict]:
    """Every runnable (mechanism, accountant) pair ``plan best`` does not compare, with why; and every compared
    pair that has no entry (``entries``), with why."""
    from mechanisms import registry as mechanisms_registry
    from pate_accountant import registry

    compared = {(name, accountant) for name, accountant, _rate in planner.configurations}
    found = {(entry["mechanism"], entry["accountant"]) for entry in entries}
    out = []
    for name in mechanisms_registry.run_mechanism_names():
        for accountant in registry.run_accountant_names():
            if (name, accountant) in compared:
                if (name, accountant) not in found:
                    built = "gaussian-argmax" if name == "gaussian-threshold-argmax" else name
                    if built not in planner.built and built in planner.refused:
                        why = planner.refused[built]
                    elif name == PUBLIC_CANDIDATE and planner.public_agreement == 0.0:
                        why = (f"{PUBLIC_AGREEMENT_OPTION} 0: the public model's candidate is never the teachers' "
                               "shared token, so BetweenThresholds releases no token the teachers back")
                    else:
                        why = ("no step epsilon and delta on the grid that generate would run with these teachers, in "
                               "any number of groups, releases a private token within this budget")
                    out.append({"mechanism": name, "accountant": accountant, "why": why})
                continue
            if name == PUBLIC_CANDIDATE and planner.public_agreement is None:
                why = PUBLIC_AGREEMENT_WHY
            elif accountant == "individual-charging":
                why = INDIVIDUAL_CHARGING_WHY
            elif accountant in ("basic", "advanced"):
                why = ("composes the same steps as pld by a looser bound on their (epsilon, delta): never more steps "
                       "than pld's exact privacy loss distribution, up to its discretisation")
            elif accountant == "target-charging":
                why = ("the target-charging accountant charges only q-target queries (a boundary-wrapped mechanism or "
                       "BetweenThresholds)")
            elif name.startswith("boundary-"):
                why = ("as a plain step the wrapper costs (2 epsilon, 2 delta) of its inner and releases less than it: "
                       "its plain inner is compared instead")
            elif (name, "pld") not in compared:
                why = "plan best has no law of this mechanism on the agreement model"
            elif accountant == "rdp":
                why = ("its steps carry a delta, which an RDP curve cannot: generate refuses the pair (rdp takes the "
                       "pure steps)")
            else:
                why = "not compared"
            out.append({"mechanism": name, "accountant": accountant, "why": why})
    if "individual-charging" not in registry.run_accountant_names():
        out.append({"mechanism": "between-thresholds", "accountant": "individual-charging",
                    "why": f"generate does not run individual charging; {INDIVIDUAL_CHARGING_WHY}"})
    return out


#: Why ``plan best`` does not compare individual charging with a mechanism other than the public-candidate query.
INDIVIDUAL_CHARGING_WHY = (
    "the individual-charging accountant charges only BetweenThresholds queries (the paper's individual-charging "
    "scheme, generate's public-candidate query): generate refuses it with any other mechanism")


def _entry_lines(rank: int | None, entry: dict) -> list[str]:
    """The text of one compared run: what it is, what it buys, its limits and its command."""
    groups = entry["groups"]
    what = (f"{entry['mechanism']} charged by {entry['accountant']}, "
            f"{'1 group' if groups == 1 else f'{groups} groups'} of {entry['teachers_per_group']} teachers, step "
            f"epsilon {_number(entry['step_epsilon'])}, step delta {_number(entry['step_delta'])}")
    head = "best run: " if rank is None else f"{rank}. "
    pad = "  " if rank is None else " " * (len(head) + 2)
    limits = entry["limits"]
    if "steps_per_group" in limits:
        afford = (f"its budget affords {'at least ' if limits['capped'] else ''}{limits['steps_per_group']} charged "
                  f"steps{' per group' if groups > 1 else ''}")
    elif entry["accountant"] == "individual-charging":
        afford = (f"its budget affords {limits['hits_per_group']} charges per teacher: planned as "
                  f"{limits['hits_per_group']} hits, the worst teacher charged on every hit (conservative)")
    elif limits["queries"] is None:
        afford = (f"its budget affords {limits['hits_per_group']} target hits{' per group' if groups > 1 else ''} and "
                  f"any number of queries (a pure query)")
    else:
        afford = (f"its budget affords {limits['hits_per_group']} target hits{' per group' if groups > 1 else ''} and "
                  f"{limits['queries']} queries{' in all' if groups > 1 else ''}")
    if entry["mechanism"] == PUBLIC_CANDIDATE:
        what += f" (unused: a pure query), public agreement {entry['public_agreement']:g}"
    if entry.get("subsample_teachers") is not None:
        what += f", each step on the teachers a draw keeps with probability {_number(entry['subsample_teachers'])}"
    lines = [
        f"{head}{what}",
        (f"{pad}expected private tokens {entry['expected_private_tokens']:.1f} ({entry['figure']}): "
        f"{entry['tokens_per_epsilon']:.1f} per unit of epsilon, {entry['tokens_per_record']:.2f} per record of "
        f"{entry['max_tokens']} tokens"),
        f"{pad}{afford}; {entry['expected_steps']:.0f} steps expected, each releasing a private token with "
        f"probability {entry['token_probability']:.3g}"
        + (f" (and hitting the target with {entry['target_probability']:.3g})" if "hits_per_group" in limits else ""),
        f"{pad}{entry['run']['command']}",
    ]
    individual = entry.get("individual")
    if individual is not None:
        even, worst = individual["even_spread"], individual["worst_teacher"]
        lines[-1:-1] = [
            (f"{pad}optimistic, not ranked: charges spread evenly over the {entry['teachers']} teachers (about "
             f"{individual['charged_per_hit']} counted per hit) would allow {even['hits']} hits and "
             f"{even['expected_private_tokens']:.1f} expected private tokens ({even['records']} records)"),
            (f"{pad}at the planned {worst['hits']} hits the worst teacher's epsilon is "
             f"{worst['epsilon_at_planned_hits']:.4g} charged on every hit, {even['epsilon_at_planned_hits']:.4g} "
             f"spread evenly"),
        ]
    return lines


def _not_compared_lines(items: list[dict]) -> list[str]:
    """One line per reason: the mechanisms and accountants it covers (``every run mechanism`` when it covers
    them all)."""
    from mechanisms import registry as mechanisms_registry

    by_reason: dict = {}
    for item in items:
        by_reason.setdefault(item["why"], []).append((item["mechanism"], item["accountant"]))
    every = set(mechanisms_registry.run_mechanism_names())
    lines = []
    for why, pairs in by_reason.items():
        mechanisms = sorted({m for m, _ in pairs})
        accountants = sorted({a for _, a in pairs})
        if len(pairs) == len(mechanisms) * len(accountants):  # a product: say it once
            who = "every run mechanism" if set(mechanisms) == every else ", ".join(mechanisms)
            what = f"{who} under {', '.join(accountants)}"
        else:
            what = ", ".join(f"{m} under {a}" for m, a in pairs)
        lines.append(f"  - {what}: {why}")
    return lines


def _best_assumptions(args) -> list[str]:
    from pate_app.run import NOISE_RELEASE_LIMIT

    deltas = ", ".join(_number(d) for d in best_step_deltas(args.budget_delta))
    return [
        (f"agreement (paper Section 6, the alpha mixture): every teacher puts mass alpha = {args.alpha:g} on one shared "
        "token and the rest on a token of its own; with coordinated votes the shared token's count is BetaBin(n, "
        "alpha/(1-alpha), 1) and each other teacher votes for its own token, at every step independently. Real "
        "text agrees more at some steps and less at others: the token figures hold for this model, not for your "
        "data."),
        ("privacy: the hits, queries and steps are the limits the printed run's own accountant puts on it at this "
        "budget (generate stops the run there"
        + ("; individual charging: below" if args.public_agreement is not None else "")
        + "), computed by that accountant's code: no figure assumes more."),
        ("tokens: private tokens (released by the mechanism; public fallbacks are not counted), from the "
        "mechanisms' exact laws on the model's histograms; an 'expected value' is the expectation under the "
        "model, a 'lower bound' is less than it: GNMax counted only where the top voted token wins outright against "
        f"the other {args.vocab_size - 1} tokens of the vocabulary (a union bound; GNMax also releases tokens nobody "
        "voted for), and several groups under target charging counted up to an even share each of the one query "
        "limit they share. 'No run releases a private token' means none is expected to release one."),
        (f"records: each record runs to --max-tokens ({args.max_tokens}); a record that stops earlier at a newline "
        "leaves steps, and budget, unused. Without --records the run gets enough records for its budget to end it "
        f"first with probability {RECORDS_QUANTILE:g}. With groups, generate gives the records to the groups in turn "
        "(a group whose budget is spent drops out); the plan counts each group up to an even share of them."),
        ("groups: --groups G (a divisor of --teachers) splits the records at random into G disjoint groups, each an "
        "ensemble of teachers / G teachers; the run's guarantee is the largest of the groups' (parallel composition, "
        "docs/groups.md), so each group may spend the budget while the tokens add up. Target charging shares its "
        "query limit between the groups."),
        (f"step parameters: each configuration's best step epsilon on the 1-2-5 grid from 1e-5 to 50 and step delta "
        f"among {deltas} (the Gaussian ones at {_number(gaussian_step_delta(args.budget_delta))}: PLD charges a GNMax "
        "step by its noise alone, which the step epsilon sweeps). Skipped: a step epsilon above twice the budget's, "
        f"a budget search past the planning limit ({LIMITS['MAX_SEARCH_STEPS']:.0e} steps), a step generate would "
        "refuse (a release threshold out of the teachers' reach, or GNMax noise that alone releases a token no teacher "
        f"voted for with probability above {NOISE_RELEASE_LIMIT:.0%} over the vocabulary of --vocab-size: "
        "docs/generation.md), "
        "GNMax noise above twice the votes (BetweenThresholds: "
        "its noise scale 1/epsilon), and a step whose "
        "charged steps alone could not beat the best found."),
        *_public_candidate_assumptions(args),
    ]


def _public_candidate_assumptions(args) -> list[str]:
    """What the public-candidate entries assume (``--public-agreement``), or that they were not compared."""
    if args.public_agreement is None:
        return [f"public candidate: not compared; {PUBLIC_AGREEMENT_OPTION} P states how often the public model's "
                "candidate is the teachers' shared token, which the agreement model does not say."]
    return [
        (f"public candidate ({PUBLIC_CANDIDATE}, {PUBLIC_AGREEMENT_OPTION} {args.public_agreement:g}): at every step "
         f"the public model's candidate is the teachers' shared token with probability P = {args.public_agreement:g}, "
         "independently of the votes, and then has the shared token's count above; otherwise it is a token of one "
         "teacher's own (one vote, the most any other token has in this model). The query counts the teachers "
         "included at a rate nu ~ U[1/n, 1] who vote for it (exact law of that count), with the thresholds "
         "generate sets from the teachers of a group (low = ceil(n/5), high = low + ceil(2/epsilon)). Its tokens are "
         "a lower bound: releases of the shared token, less those the noise alone gives a candidate no teacher votes "
         "for; a released candidate the teachers do not share is the public model's token, as a fallback would be, "
         "and is not counted. Every 'between' outcome is a hit, whichever the candidate."),
        ("individual charging: the ranked figure plans for the worst teacher charged on every hit (as if every hit "
         "counted the same teachers), so the run is planned to the per-teacher limit of the accountant generate "
         "builds (under replace-one the limit of half the budget, by group privacy: docs/tct_and_individual.md, "
         "section 4): sound whoever is counted. generate does not stop there: it removes each teacher at its limit "
         "and goes on with the others while the records last, tokens the figure does not count. The optimistic "
         "figure, not ranked, spreads each hit's charges (E[c' | hit] teachers, rounded up) evenly over the teachers, "
         "the rule of `plan compare`; the real overlap lies between the two."),
        (f"pure queries: {PUBLIC_CANDIDATE} pays no per-query delta, so target and individual charging put no limit on "
         f"its queries and the plan counts at most {LIMITS['MAX_PLAN_QUERIES']:.0e} steps per group; its --step-delta "
         "is checked by generate and unused."),
    ]


def _run_plan_best(args: argparse.Namespace) -> int:
    from pate_accountant import planning
    from pate_accountant.validation import check_epsilon
    from pate_app.run import RunInputError

    _plan_no_top_plot(args)
    _plan_call(args, check_epsilon, name="epsilon", value=args.budget_epsilon, maximum=planning.MAX_BUDGET_EPSILON,
               why="docs/ranges.md")
    planner = BestPlanner(budget_epsilon=args.budget_epsilon, budget_delta=args.budget_delta, relation=args.relation,
                          alpha=args.alpha, max_tokens=args.max_tokens, records=args.records,
                          vocab_size=args.vocab_size, public_agreement=args.public_agreement)
    entries = []
    for entry in planner.compare(args.teachers, group_counts(args.teachers)):
        built = entry.pop("built")
        _finish_entry(entry, args)
        try:
            check_best_run(entry, args.relation, built, args.vocab_size)
        except RunInputError:  # generate would refuse it: never printed
            continue
        if entry["accountant"] == "individual-charging":
            entry["individual"] = planner.individual_details(entry, built)
        entries.append(entry)
    ranking, seen = [], set()
    for entry in entries:  # the best of each (mechanism, accountant, subsampling rate), best first
        key = (entry["mechanism"], entry["accountant"], entry.get("subsample_teachers"))
        if key not in seen:
            seen.add(key)
            ranking.append(entry)
    fits = bool(ranking) and ranking[0]["expected_private_tokens"] >= 1.0
    payload = {
        "command": "plan best", "teachers": args.teachers, "alpha": args.alpha,
        "budget": {"epsilon": args.budget_epsilon, "delta": args.budget_delta}, "relation": args.relation,
        "records": args.records, "max_tokens": args.max_tokens, "vocab_size": args.vocab_size,
        "public_agreement": args.public_agreement, "fits": fits,
        "best": ranking[0] if fits else None, "runners_up": ranking[1:1 + args.runners_up] if fits else [],
        "configurations": entries, "needed_teachers": None, "with_needed_teachers": None,
        "not_compared": _not_compared(planner, entries), "assumptions": _best_assumptions(args),
    }
    if not fits:
        m = needed_teachers(planner, args.teachers)
        payload["needed_teachers"] = m
        if m is not None:
            for entry in planner.compare(m, (1,)):
                built = entry.pop("built")
                _finish_entry(entry, args)
                try:
                    check_best_run(entry, args.relation, built, args.vocab_size)
                except RunInputError:
                    continue
                if entry["accountant"] == "individual-charging":
                    entry["individual"] = planner.individual_details(entry, built)
                payload["with_needed_teachers"] = entry
                break
    if args.json:
        print_json(payload)
        return 0
    print(f"plan best: {args.teachers} teachers, agreement alpha {args.alpha:g}, "
          + ("" if args.public_agreement is None else f"public agreement {args.public_agreement:g}, ")
          + f"budget (epsilon {args.budget_epsilon:g}, delta {args.budget_delta:g}), {args.relation}, "
          + (f"{args.records} records" if args.records is not None else "records as the budget needs")
          + f" of at most {args.max_tokens} tokens")
    if fits:
        for line in _entry_lines(None, ranking[0]):
            print(line)
        if payload["runners_up"]:
            print("runners-up:")
            for rank, entry in enumerate(payload["runners_up"], start=2):
                for line in _entry_lines(rank, entry):
                    print(f"  {line}")
    else:
        m = payload["needed_teachers"]
        if m is None:
            print(f"no run releases a private token at this budget with {args.teachers} teachers; no number of "
                  f"teachers up to {planning.MAX_PLAN_TEACHERS} does at agreement alpha {args.alpha:g}: raise the budget")
        else:
            print(f"no run releases a private token at this budget with {args.teachers} teachers; you need about {m}")
            print(f"(every run compared is expected to release less than one private token at agreement alpha "
                  f"{args.alpha:g})")
            if payload["with_needed_teachers"] is not None:
                print(f"with {m} teachers (one group) the best run is expected to release "
                      f"{payload['with_needed_teachers']['expected_private_tokens']:.1f} private tokens:")
                for line in _entry_lines(None, payload["with_needed_teachers"])[1:]:
                    print(line)
    print("not compared:")
    for line in _not_compared_lines(payload["not_compared"]):
        print(line)
    print("assumptions:")
    for item in payload["assumptions"]:
        print(f"  - {item}")
    return 0


def _finish_entry(entry: dict, args) -> None:
    """The figures derived from an entry, and its ``generate`` command."""
    entry["budget"] = {"epsilon": args.budget_epsilon, "delta": args.budget_delta}
    entry["relation"] = args.relation
    entry["tokens_per_epsilon"] = entry["expected_private_tokens"] / args.budget_epsilon
    entry["tokens_per_record"] = entry["max_tokens"] * entry["token_probability"]
    argv = best_run_argv(entry, args.relation)
    entry["run"] = {"command": " ".join(argv), "argv": argv, "placeholders": RUN_PLACEHOLDERS}
