"""One grammar on the command line (docs/cli.md, "One grammar"), and every plan answer that corresponds to a
run carries the exact ``generate`` command of that run (docs/tutorial.md).

* ``--budget-epsilon/--budget-delta`` are totals, ``--step-epsilon/--step-delta`` one mechanism run, in every
  command; no command has a bare ``--epsilon`` or ``--delta`` any more, and the old spellings still work for
  one release with a warning on stderr.
* ``plan hits/yields/for-tokens/compare`` print a run whose ``argv`` parses with ``generate``'s own parser into
  exactly the mechanism, accountant, relation, teachers, step parameters and budget the plan describes, and
  whose charge (target level, q, noise bound) is the one the registered mechanism really has.
"""

from __future__ import annotations

import argparse
import json
import math

import pytest

from mechanisms import registry as mechanisms_registry
from pate_accountant.cli import main
from pate_app import COMMANDS, EXPERIMENTS
from pate_app.cli import build_parser
from pate_app.commands.generate import EMBEDDED, EMBEDDED_LABEL, model_label


def _parsers():
    """Every (name, parser) of the command line: commands, plan subcommands and experiments."""
    out = []

    def walk(name, parser, only=None):
        out.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, subparser in action.choices.items():
                    if only is None or sub == only:
                        walk(f"{name} {sub}", subparser)

    for command in COMMANDS:
        if command == "experiment":  # one parser per experiment, built by naming it
            for experiment in EXPERIMENTS:
                walk(f"pate-accountant experiment {experiment}", _experiment_parser(experiment))
            continue
        walk("pate-accountant", build_parser(command), only=command)
    return out


def _experiment_parser(name):
    """The parser ``experiment NAME`` parses with (its shared and own options)."""
    parser = build_parser("experiment")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["experiment"]
    nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
    return nested[0].choices[name] if nested else sub


def _options(parser):
    return {s for a in parser._actions for s in a.option_strings}


def test_no_command_has_a_bare_epsilon_or_delta():
    names = [name for name, _ in _parsers()]
    assert any(name.endswith("experiment alpha-sweep") or "experiment" in name for name in names)
    for name, parser in _parsers():
        opts = _options(parser)
        assert not opts & {"--epsilon", "--delta", "--delta0"}, (name, sorted(opts & {"--epsilon", "--delta"}))


@pytest.mark.parametrize("command", ["generate", "demo"])
def test_run_commands_spell_totals_and_steps_alike(command):
    parser = dict(_parsers())[f"pate-accountant {command}"]
    opts = _options(parser)
    assert {"--budget-epsilon", "--budget-delta", "--step-epsilon", "--step-delta"} <= opts
    helps = {a.option_strings[0]: a.help for a in parser._actions if a.option_strings}
    assert "total" in helps["--budget-epsilon"] and "one mechanism run" in helps["--step-epsilon"]


def test_every_experiment_is_reachable_by_the_walk():
    walked = {name.split()[-1] for name, _ in _parsers() if " experiment " in name}
    assert walked == set(EXPERIMENTS)


def test_old_spellings_still_work_and_warn(capsys):
    new = ["plan", "hits", "--eps0", "0.02", "--budget-epsilon", "2", "--budget-delta", "1e-5", "--step-delta",
           "1e-10", "--json"]
    old = ["plan", "hits", "--eps0", "0.02", "--epsilon", "2", "--delta=1e-5", "--delta0", "1e-10", "--json"]
    assert main(new) == 0
    answer_new = json.loads(capsys.readouterr().out)
    assert main(old) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == answer_new
    for spelling, name in (("--epsilon", "--budget-epsilon"), ("--delta", "--budget-delta"),
                           ("--delta0", "--step-delta")):
        assert f"{spelling} is a deprecated spelling of {name}" in captured.err
    args = build_parser("generate").parse_args(["generate", "--data", "bundled", "--ledger", "x.sqlite",
                                                "--epsilon", "5", "--delta", "1e-5"])
    assert (args.budget_epsilon, args.budget_delta) == (5.0, 1e-5)


def test_a_missing_budget_names_the_new_option(capsys):
    assert main(["generate", "--data", "bundled", "--ledger", "x.sqlite", "--budget-delta", "1e-5"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error: the following arguments are required: --budget-epsilon (`" in last


def test_generate_defaults_are_shown_in_help(capsys):
    assert main(["generate", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("(default embedded;", "'bundled'", "(default dp-argmax)", "(default basic)",
                  "(default: one per record up to 64, a multiple of the groups; 64 under add-remove-one",
                  "(default 2)", "(default 1e-06)"):
        assert shown in text


def test_model_label_is_brief(tmp_path):
    folder = tmp_path / "deep" / "path" / "Llama-3.2-1B"
    folder.mkdir(parents=True)
    assert model_label(str(folder) + "/") == "Llama-3.2-1B"
    assert model_label(EMBEDDED) == EMBEDDED_LABEL
    assert str(tmp_path) not in model_label(str(folder))


PLAN_ANSWERS = [
    ["hits", "--eps0", "0.02", "--teachers", "5000", "--budget-delta", "1e-5", "--step-delta", "1e-9"],
    ["hits", "--eps0", "3"],
    ["yields", "--eps0", "0.01", "--teachers", "3000", "--budget-delta", "1e-5", "--step-delta", "1e-9"],
    ["for-tokens", "--tokens", "1000", "--budget-delta", "1e-5", "--step-delta", "1e-9"],
    ["compare", "--queries", "48", "--teachers", "64", "--eps0", "2", "--target-rate", "0.05",
     "--step-delta", "1e-6", "--budget-delta", "1e-4"],
]


def _filled(argv):
    return [{"DATA": "bundled", "LEDGER": "run.sqlite"}.get(word, word) for word in argv]


def _check_run(run, answer):
    assert run["command"] == " ".join(run["argv"])
    assert run["argv"][:2] == ["pate-accountant", "generate"]
    args = build_parser("generate").parse_args(_filled(run["argv"])[1:])
    assert args.mechanism == run["mechanism"] and args.accountant == run["accountant"]
    assert args.relation == run["relation"] and args.teachers == run["num_teachers"]
    assert (args.step_epsilon, args.step_delta) == (run["step_epsilon"], run["step_delta"])
    assert (args.budget_epsilon, args.budget_delta) == (run["budget"]["epsilon"], run["budget"]["delta"])
    mechanism = mechanisms_registry.build_mechanism(args.mechanism, args.step_epsilon, args.step_delta, args.relation)
    if run["accountant"] == "target-charging":
        # The run is charged what the plan says: target level 2 x step epsilon (never above the plan's eps0),
        # the wrapper's q, its exact noise bound.
        assert mechanism.event.epsilon == run["target_level"] <= answer["eps0"]
        assert math.isclose(run["target_level"], answer["eps0"], rel_tol=1e-5)
        assert mechanism.q == run["q"]
        assert mechanism.inner.error_bound == run["error_bound"]
    else:
        assert mechanism.event.epsilon == args.step_epsilon <= answer["eps0"]
        assert mechanism.error_bound == run["error_bound"]
        assert run["steps"] * args.step_epsilon <= args.budget_epsilon
    n = run["num_teachers"]
    assert run["release_threshold"] == n // 2 + run["error_bound"] + 1
    assert run["can_release"] == (run["release_threshold"] <= n)


@pytest.mark.parametrize("argv", PLAN_ANSWERS, ids=lambda a: " ".join(a[:3]))
def test_plan_answers_carry_the_generate_command_that_runs_them(argv, capsys):
    assert main(["plan", *argv, "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    _check_run(answer["run"], answer)
    if argv[0] == "compare":
        _check_run(answer["plain_run"], answer)
    assert main(["plan", *argv]) == 0
    text = capsys.readouterr().out
    if answer["run"]["refused"] is None and answer["run"]["hits"]:
        assert answer["run"]["command"] in text and "run this plan:" in text
    else:  # a run that pays for no target hit is one generate refuses: not offered (issue 32, item 7)
        assert answer["run"]["command"] not in text and "no target-charging run to print" in text


def test_plan_q_defaults_to_the_q_of_the_run_it_prints(capsys):
    assert main(["plan", "hits", "--eps0", "3", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["q"] == answer["run"]["q"] < 1 / 3
    # Issue 22, item 8: an option that moved only the headline is gone (a usage error naming it)
    assert main(["plan", "hits", "--eps0", "3", "--q", "1/3", "--json"]) == 2
    assert "argument --q: no longer taken" in capsys.readouterr().err


def test_plan_says_when_its_run_cannot_release_or_pay(capsys):
    # The paper's n = C_delta/eps0 with our exact L: the release threshold is above n.
    assert main(["plan", "for-tokens", "--tokens", "1000", "--budget-delta", "1e-5", "--step-delta", "1e-9",
                 "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    run = answer["run"]
    assert not run["can_release"] and run["teachers_to_release"] == 2 * run["error_bound"] + 1
    assert any("exact L" in note and "optimistic" in note for note in answer["assumptions"])
    assert main(["plan", "for-tokens", "--tokens", "1000", "--budget-delta", "1e-5", "--step-delta", "1e-9"]) == 0
    assert "WARNING: the threshold is above n" in capsys.readouterr().out
    # Budget delta 1e-6 and a step delta of 1e-6 chosen by the user: the run cannot pay for one query (a usage
    # error naming the option); the default step delta pays for the plan's queries (issue 23, item 4).
    assert main(["plan", "hits", "--eps0", "0.01", "--step-delta", "1e-6", "--json"]) == 2
    assert "argument --step-delta: delta0 must be < delta" in capsys.readouterr().err
    assert main(["plan", "hits", "--eps0", "0.01", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)["run"]
    assert run["refused"] is None and run["hits"] >= 1 and run["step_delta"] < 1e-6


def test_plan_compare_offers_no_run_that_generate_refuses(capsys):
    """Issue 32, item 7: with a budget that pays for no target hit, ``plan compare`` printed a target-charging run
    as the plan to run, which ``generate`` refuses; it now says why there is none and offers the plain run."""
    argv = ["plan", "compare", "--queries", "100", "--target-rate", "0.1", "--teachers", "50", "--eps0", "0.1"]
    assert main([*argv, "--budget-epsilon", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "run this plan:" not in out and "boundary-dp-argmax" not in out
    assert "no target-charging run to print: its budget (epsilon 0.05) affords no target hit" in out
    assert "run it with plain composition instead" in out
    assert main(argv) == 0
    assert "run this plan:" in capsys.readouterr().out


def test_plan_help_limits_are_the_planners():
    from pate_accountant import planning, tct
    from pate_app.commands.plan import LIMITS

    for name, value in LIMITS.items():
        if name.isupper():
            assert getattr(planning, name) == value, name
    assert LIMITS["max_plannable_tokens"] == planning.max_plannable_tokens(1 / 3, planning.DEFAULT_AGGREGATOR_DELTA)
    assert LIMITS["max_eps0_for_one_third"] == 2 * tct.MAX_EPSILON_FOR_ONE_THIRD


def test_audit_mechanism_help_limits_are_the_auditors():
    from mechanisms import audit
    from pate_app.commands import audit_mechanism

    assert (audit_mechanism.MAX_AUDIT_EPSILON, audit_mechanism.MAX_AUDIT_RUNS) == (audit.MAX_AUDIT_EPSILON,
                                                                                  audit.MAX_AUDIT_RUNS)
