"""What ``demo`` and ``generate`` share: their run options and the report of one private run (docs/demo.md)."""

from __future__ import annotations

import shlex
import sys
import time

from pate_app.defaults import DEMO_DEFAULTS
from pate_app.options import (
    BUDGET_DELTA_HELP,
    BUDGET_EPSILON_HELP,
    STEP_DELTA_HELP,
    STEP_EPSILON_HELP,
    add_option,
    add_verbose_option,
    delta,
    nonnegative_int,
    open_unit,
    positive_float,
    positive_int,
    print_json,
    scale,
    step_epsilon,
    top_k_or_auto,
    unit,
)

__all__ = ["add_budget_options", "add_defaulted", "add_run_options", "run_and_report", "spec_from_args"]


def add_defaulted(p, flag: str, help: str, **kwargs) -> None:
    """The option ``flag`` with the demo's default for it (:data:`~pate_app.defaults.DEMO_DEFAULTS`, under the
    option's name), said at the end of its ``help``: ``(default 0.7)``."""
    default = DEMO_DEFAULTS[flag.removeprefix("--").replace("-", "_")]
    shown = f"{default:g}" if isinstance(default, float) else default
    p.add_argument(flag, default=default, help=f"{help} (default {shown})", **kwargs)


def add_budget_options(p, *, default: bool) -> None:
    """``--budget-epsilon``/``--budget-delta`` (formerly ``--epsilon``/``--delta``): the data set's total budget;
    ``default``: the demo's, else required unless a ``--config`` file gives it (a budget is the data owner's
    decision: docs/cli.md; :func:`require` checks)."""
    d = DEMO_DEFAULTS
    add_option(p, "--budget-epsilon", "--epsilon", metavar="E", type=positive_float,
               default=d["epsilon"] if default else None,
               help=BUDGET_EPSILON_HELP + (f" (default {d['epsilon']:g})" if default else
                                           " (required, here or in --config)"))
    add_option(p, "--budget-delta", "--delta", metavar="D", type=open_unit,
               default=d["delta"] if default else None,
               help=BUDGET_DELTA_HELP + (f" (default {d['delta']:g})" if default else " (required, here or in --config)"))


def require(args, *names: str) -> None:
    """Without ``--config``, the options ``names`` (dests) must be given: the usage error argparse gives for a
    required option."""
    if getattr(args, "config", None) is not None:
        return
    missing = [name for name in names if getattr(args, name) is None]
    if missing:
        args.parser.error("the following arguments are required: " +
                          ", ".join("--" + name.replace("_", "-") for name in missing))


def add_run_options(p) -> None:
    """The options ``demo`` and ``generate`` share, with the demo's defaults."""
    d = DEMO_DEFAULTS
    p.add_argument("--teachers", metavar="N", type=positive_int, default=None,
                   help="number of teachers n, each showing up to --records-per-teacher records (default: one per "
                        f"record up to {d['teachers']}, a multiple of the groups; {d['teachers']} under "
                        "add-remove-one, where the number of records is private)")
    add_defaulted(p, "--records", "synthetic records to generate", metavar="K", type=positive_int)
    p.add_argument("--groups", metavar="G", type=positive_int, default=1,
                   help="split the records at random into G disjoint groups of N/G teachers each, generating in "
                        "turn; the run costs what its costliest group costs (parallel composition, docs/groups.md; "
                        "default 1)")
    add_defaulted(p, "--max-tokens", "at most T tokens per record; a record also stops at a newline", metavar="T",
                  type=positive_int)
    add_defaulted(p, "--step-epsilon", STEP_EPSILON_HELP, metavar="E", type=step_epsilon)
    add_defaulted(p, "--step-delta", STEP_DELTA_HELP, metavar="D", type=delta)
    p.add_argument("--relation", choices=("replace-one", "add-remove-one"), default=d["relation"],
                   help="the privacy unit is one record: replace-one (a record's contents change; the number of "
                        "records is public) or add-remove-one (a record is added or removed; needs "
                        f"--records-per-teacher) (default {d['relation']}; docs/privacy_unit.md)")
    p.add_argument("--records-per-teacher", metavar="K", type=positive_int, default=None,
                   help="each teacher shows at most K records, placed at random; a public number that also sets each "
                        "record's share of the model's window (default under replace-one: records / teachers, "
                        "rounded up; required under add-remove-one, where the number of records is private)")
    add_defaulted(p, "--temperature", "teacher temperature", metavar="T", type=positive_float)
    add_defaulted(p, "--top-p", "teacher top-p in (0, 1]", metavar="P", type=scale)
    p.add_argument("--public-mix", metavar="LAMBDA", type=unit, default=0.0,
                   help="each teacher votes on LAMBDA x the public model's distribution + (1 - LAMBDA) x its own: "
                        "more agreement, biased towards the public model; no privacy cost (default 0: off; "
                        "docs/generation.md, 'Public prior')")
    p.add_argument("--public-top-k", metavar="K", type=top_k_or_auto, default=None,
                   help="votes outside the public model's top K tokens go to a tail that is never released: no "
                        "privacy cost (default: off); auto: the smallest K that holds 90%% of the tokens of the "
                        "--public-examples, each continued from the others (docs/generation.md, 'Public prior')")
    p.add_argument("--histograms", choices=("coordinated", "independent"), default="coordinated",
                   help="how the teachers vote: coordinated samples with shared noise (Hot PATE, the default) or "
                        "independent ones (Cold PATE, the paper's baseline); the charge is the same "
                        "(docs/generation.md)")
    p.add_argument("--subsample-teachers", metavar="Q", type=open_unit, default=None,
                   help="each step counts the votes of the teachers a fresh random draw keeps, each with "
                        "probability Q in (0, 1); the mechanism is calibrated for the teachers a step keeps on average "
                        "and the run is charged its amplified bound (privacy amplification by subsampling; votes "
                        "mechanisms only; default: every teacher; docs/mechanisms/subsampled.md)")
    p.add_argument("--public-only", action="store_true",
                   help="the public model alone: the same template and task with no private record, no teacher and "
                        "no ledger; nothing is charged. The floor a private run is judged against, and what a data "
                        "set too small for any private configuration gets (docs/generation.md)")
    p.add_argument("--public-examples", metavar="FILE", default=None,
                   help="records you declare public (a data file read as --data is, with the same fields), shown "
                        "to the public model only: its fallback, its top-K support and --public-only; never a "
                        "private record; no privacy cost (default: none; docs/generation.md)")
    p.add_argument("--teachers-see-public", action="store_true",
                   help="every teacher's prompt shows the --public-examples too, after the template's header and "
                        "before its own records (with labels, its label's own); public data, no privacy cost. "
                        "Measured: the teachers agree on what they all see, and the released records copy the "
                        "public examples (docs/utility.md); off by default")
    p.add_argument("--seed", metavar="S", type=nonnegative_int, default=None,
                   help="seed, for reproducible tests only: a seeded run has no privacy against anyone who knows "
                        "the seed (default: fresh OS entropy; the ledger records only whether a seed was given)")
    p.add_argument("--threads", metavar="K", type=positive_int, default=None, help="CPU threads (default 2)")
    p.add_argument("--signing-key", metavar="KEY", default=None,
                   help="an Ed25519 private key (PEM; `pate-accountant keygen` makes one): a run whose ledger "
                        "audits ends with a signed checkpoint of its head, which `audit --public-key` checks "
                        "(default: no signature; docs/ledger.md)")
    p.add_argument("--checkpoints", metavar="FILE", default=None,
                   help="where --signing-key appends the checkpoint (default LEDGER.checkpoints.jsonl)")
    p.add_argument("--out", metavar="FILE", default=None,
                   help="write the synthetic records to FILE, a new file: JSON lines, or CSV when the name ends in "
                        ".csv; each record as it finishes, with its label, token counts and stop reason "
                        "(docs/data.md)")
    p.add_argument("--normalise", action="store_true",
                   help="write each record's text as the utility benchmark scores it: Unicode NFC, whitespace "
                        "collapsed, a pair of quotes wrapping the whole text removed (docs/utility.md)")
    p.add_argument("--cut-records", action="store_true",
                   help="let a record start even when its group's budget may not pay for all of its --max-tokens "
                        "steps (default: a record starts only when the worst case is paid for, so the budget ends "
                        "between records; docs/generation.md)")
    p.add_argument("--keep-partial", action="store_true",
                   help="also write a record the budget cut short (marked complete: false)")
    p.add_argument("--config", metavar="FILE", default=None,
                   help="a run described in a TOML file (tables data, task, model, mechanism, accountant, budget, "
                        "output, signing; docs/data.md); options given here take precedence over it")
    p.add_argument("--json", action="store_true", help="print only the JSON result")
    p.add_argument("--no-progress", action="store_true", help="do not show the progress bar (stderr)")
    add_verbose_option(p)


def _checkpoints_flag(ledger: dict, file: str) -> str:
    """`` --checkpoints FILE`` where the ledger is a database (its checkpoints have no default file)."""
    from pate_accountant.ledger import is_ledger_url

    return f" --checkpoints {shlex.quote(str(file))}" if is_ledger_url(ledger["path"]) else ""


def pin_command(ledger: dict) -> str:
    """The ``audit`` command that checks a ledger against its heads as a run left them (``ledger``: the run
    result's ``ledger`` entry): row and run counts with their last hashes."""
    argv = ["pate-accountant", "audit", ledger["path"]]
    if ledger["rows"]:
        argv += ["--expect-head", ledger["head_hash"], "--expect-rows", str(ledger["rows"])]
    if ledger["runs"]:
        argv += ["--expect-run-head", ledger["run_head_hash"], "--expect-runs", str(ledger["runs"])]
    return shlex.join(argv)


def spec_from_args(args, **fixed):
    """The run's :class:`~pate_app.spec.RunSpec` from the parsed options (and ``--config``), checked once, with
    ``fixed`` (``demo``: the bundled sample on the embedded model) taking precedence; a bad value is a usage error
    naming the key and the value."""
    from pate_app.spec import RunSpec, SpecError

    try:
        return RunSpec.from_args(args, args.parser, **fixed)
    except SpecError as exc:
        args.parser.error(str(exc))


def run_and_report(args, spec, *, command: str) -> int:
    """Run ``spec`` (:func:`pate_app.run.private_run`), printed (or ``--json``); 0 when the ledger audits (and
    took every charge, and a requested signed checkpoint was written), 1 otherwise, 130 when interrupted.  Bad
    input is a usage error (exit 2) before anything is written."""
    from pate_app.library_output import quiet_libraries
    from pate_app.run import RunInputError, private_run

    started = time.perf_counter()
    try:
        with quiet_libraries(verbose=args.verbose):
            result = private_run(spec, progress=not args.no_progress and not args.json, command=command)
    except RunInputError as exc:
        args.parser.error(str(exc))
    except ValueError as exc:  # the backend: a model folder it cannot use, no tokenizer, ...
        args.parser.error(f"argument --model: {exc}")
    if result.get("public_only"):
        return _report_public_only(args, result, command, started)
    led = result["ledger"]
    ok = result["audit"]["ok"] and led["checkpoint_error"] is None and led["write_error"] is None
    status = INTERRUPTED if result["interrupted"] else 0 if ok else 1
    if args.json:
        print_json(result)
        return status
    p = result["parameters"]
    teachers = (f"{p['num_teachers']} teachers" if p["groups"] == 1 else
                f"{p['num_teachers']} teachers in {p['groups']} groups of {p['teachers_per_group']}")
    print(f"{command}: {teachers}, data set {p['dataset']!r} ({p['data']}), "
          f"model {p['model']}, {p['mechanism_name']} (step epsilon {spec.step_epsilon:g}, delta "
          f"{spec.step_delta:g}), {p['accountant']} accountant, {'seeded' if p['seeded'] else 'OS entropy'}")
    print(f"release     : {p['release_rule']}")
    if p.get("record_relation"):
        touches = p.get("groups_a_record_touches", 1)
        print(f"privacy unit: one record, {p['record_relation']}; each teacher shows at most "
              f"{p.get('records_per_teacher')} record(s)" + (f"; a record can change {touches} label groups, so each "
                                                            "group's steps are charged twice" if touches > 1 else ""))
    if command == "demo":
        print("note        : the demo's epsilon illustrates the pipeline at a CPU-sized ensemble of a few dozen "
              "teachers; it is not a meaningful privacy level. `pate-accountant plan best --teachers N --alpha A` "
              "plans a meaningful one for your data (docs/planning.md)")
    _print_records(result)
    print(f"records     : {records_sentence(result)}")
    s, b, before = result["spent"], result["budget"], result["spent_before"]
    print(f"spent       : epsilon {s['epsilon']:.6g}, delta {s['delta']:.3g} of the data set's budget epsilon "
          f"{b['epsilon']:g}, delta {b['delta']:g} ({result['charged_runs']} charged runs in this run; epsilon "
          f"{before['epsilon']:.6g} was spent before it)")
    r = result["remaining"]  # the one computation generate, audit and ledger list share (Remaining)
    step = "" if r["spent"] or r["another_step"] else "; not enough for another step of this mechanism"
    if not r["spent"] and r.get("records_afforded") is not None:
        step += f"; pays for {plural(r['records_afforded'], 'more whole record')} (every step charged)"
    print(f"remaining   : {r['text']}{step}")
    if led["rows"] is None:  # a database ledger that could not be reached again after a failed charge
        print(f"ledger      : {led['path']} (run {led['run']}; could not be read after the run stopped)")
    else:
        print(f"ledger      : {led['path']} ({led['rows']} rows; run {led['run']} of {led['runs']}"
              f"{', appended' if led['appended'] else ', new'})")
        print(f"head        : {led['head_hash']} ({plural(led['rows'], 'row')}; runs head {led['run_head_hash']}, "
              f"{plural(led['runs'], 'run')})")
        print(f"pin         : {pin_command(led)}  (write it down somewhere this machine cannot change: it fails if "
              "this history is ever rewritten)")
    if led["checkpoint"] is not None:
        c = led["checkpoint"]
        print(f"signed      : checkpoint of the first {c['rows']} rows by key {c['key_id']}, appended to {c['file']} "
              f"(`pate-accountant audit {shlex.quote(led['path'])} --public-key PUBLIC_KEY{_checkpoints_flag(led, c['file'])}` "
              "checks the ledger against it)")
    if led["write_error"] is not None:
        print(f"stopped     : {led['write_error']}")
    if led["checkpoint_error"] is not None:
        print(f"signed      : NOT WRITTEN: {led['checkpoint_error']} (the run is charged and its ledger audits; "
              f"`pate-accountant sign {shlex.quote(led['path'])} --key KEY{_checkpoints_flag(led, 'FILE')}` signs its head "
              "later)")
    audit = result["audit"]
    print(f"audit       : {'OK' if audit['ok'] else 'FAILED'}: {audit['message']}")
    # the run's duration depends on the data (prompt lengths): the operator's screen only, never the JSON result
    print(f"wall time   : {time.perf_counter() - started:.1f} s")
    if result["interrupted"]:
        print(f"{command}: interrupted: stopped at a step boundary; {records_sentence(result)}; every charge made is in "
              f"the ledger (audit {'OK' if audit['ok'] else 'FAILED'})", file=sys.stderr)
    return status


#: The exit status of a run stopped by Ctrl-C (128 + SIGINT, as shells report it).
INTERRUPTED = 130


def _print_records(result: dict) -> None:
    """Each record of a run's result, with its token counts and stop reason."""
    for i, record in enumerate(result["records"], start=1):
        _print_text(i, record)
        cut = "" if record["complete"] else ", cut short by the budget"
        print(f"            {plural(record['num_tokens'], 'token')}: {record['private_tokens']} private, "
              f"{record['fallback_tokens']} public fallback{'' if record['fallback_tokens'] == 1 else 's'}; stop: "
              f"{record['stop_reason']}{cut}")


def _print_text(i: int, record: dict) -> None:
    """The line of record ``i`` with its label (or group) and its text, continued lines indented under it."""
    group = (f" ({record['label']})" if "label" in record else
             f" (group {record['group']})" if "group" in record else "")
    text = "\n              ".join(record["text"].splitlines()) or "(empty)"
    print(f"  record {i}{group}: {text}")


def _report_public_only(args, result: dict, command: str, started: float) -> int:
    """The report of a ``--public-only`` run (:func:`pate_app.run.public_only_run`): 0, or 130 when interrupted."""
    if args.json:
        print_json(result)
        return INTERRUPTED if result["interrupted"] else 0
    p = result["parameters"]
    print(f"{command}: the public model alone (--public-only), data set {p['dataset']!r} ({p['data']}), model "
          f"{p['model']}, template {p['template']}: no private record reaches the model, nothing is charged, no "
          "ledger is written")
    for i, record in enumerate(result["records"], start=1):
        _print_text(i, record)
        print(f"            {plural(record['num_tokens'], 'token')}, all public; stop: {record['stop_reason']}")
    print(f"records     : {records_sentence(result)}")
    print(f"wall time   : {time.perf_counter() - started:.1f} s")
    if result["interrupted"]:
        print(f"{command}: interrupted: {records_sentence(result)}", file=sys.stderr)
        return INTERRUPTED
    return 0


def plural(count: int, noun: str) -> str:
    """``1 record``, ``2 records``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def records_sentence(result: dict) -> str:
    """What the run produced, in words: ``2 of 3 requested records; 1 cut by the budget; 0 missing`` (and
    where they were written)."""
    s = result["summary"]
    text = (f"{s['complete']} of {plural(s['requested'], 'requested record')}; {s['cut_by_budget']} cut by the "
            f"budget; {s['missing']} missing")
    out = result.get("out")
    if out is not None:
        text += f"; {plural(out['written'], 'record')} written to {out['path']}"
    return text
