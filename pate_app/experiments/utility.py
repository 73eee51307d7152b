"""``pate-accountant experiment utility``: what the synthetic records are worth against real records held out of the
run, beside what the public model writes with no private data and what the same teachers write without noise
(docs/utility.md).

Private tokens per epsilon are a cost; this experiment measures the result.  On any data file the run path reads
(``--data``, ``--text-field``, ``--label-field``, ``--template``), a seeded split keeps a share of the records out
of every run (``held-out``) and gives the rest to the runs (``private``).  The rows, each scored by one protocol
(:mod:`pate_app.evaluation`) against the held-out records:

* ``ceiling``: real against real (``texts`` private records drawn at random), what no generator can beat;
* ``epsilon = infinity``: the same teachers, template and Hot votes with no noise to speak of (plain GNMax at
  step epsilon 50, sigma about 0.1, so the plurality of the votes is released at every step, no fallback, and no
  privacy); its records may copy private ones, which is why no row's text is ever written;
* ``epsilon = 0``: the public model alone with the same template (``generate --public-only``), twice: with the
  bare prompt, and with public examples (``generate --public-examples``): the records of ``--public-examples FILE``,
  else :data:`PUBLIC_EXAMPLES` records (of each label) drawn with the split's seed and kept out of both the private
  and the held-out records, standing for the few records a user may declare public;
* each private configuration at each budget ``epsilon`` of ``--budget-epsilons`` (delta ``--budget-delta``), run
  to its budget or its ``texts`` records through :class:`~pate_app.spec.RunSpec` and
  :func:`~pate_app.run.synthesize` as a user would: thresholded GNMax over the public top-50, charged by PLD,
  with Hot votes and with Cold votes on the same teachers, at the smallest step epsilon of the grid whose noise
  does not decide its releases (:func:`quiet_step_epsilon`: a rule of the teachers and the vocabulary alone, never
  tuned to a corpus); and Hot PATE's BetweenThresholds query on the public model's candidate token, charged by
  PLD at the largest step epsilon whose budget pays for every token of the records (:func:`fitted_step_epsilon`);
  and the peer InvisibleInk's clipped-logit sampling over the public top-50+ (docs/mechanisms/clipped_logits.md),
  charged by RDP as zCDP, fitted the same way.  Their public model is shown the same public examples as the
  floor's.

Each row is run ``repetitions`` times (fresh generation; the same held-out set) and reports each metric's mean and
spread.  A row whose run leaves fewer than ``texts`` scorable records is reported as not scorable, with what it
made.  The headline compares the best private row with the best epsilon = 0 row (the gain, with the standard error
of the difference of the means) and says what share of the way from epsilon = 0 to epsilon = infinity it
recovers (with a bootstrap spread over the repetitions).

Randomness: ``--seed`` (default 0 on the bundled sample) seeds the split, the draws of the ceiling and the runs;
on a user's ``--data`` the runs draw their noise from the operating system unless ``--seed`` is given (the split
then uses seed 0: it is not private).  The seed is never written.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path

import attr
import numpy as np

from pate_app.grammar import add_option

__all__ = ["DESCRIPTION", "FULL_RUNTIME", "HELP", "NAME", "SIZES", "UNSEEDED_ON_USER_DATA", "add_arguments",
           "headline", "plot", "quiet_step_epsilon", "run", "summary"]

NAME = "utility"
HELP = "what the synthetic records are worth against held-out real ones (MAUVE, two-sample AUC, accuracy)"
DESCRIPTION = (
    "Split the records into private and held-out ones; score against the held-out records (MAUVE, classifier "
    "two-sample AUC, train-on-synthetic accuracy for labelled data, distinct-n, k-NN precision and recall) the "
    "real private records (ceiling), the same teachers without noise (epsilon = infinity), the public model alone "
    "with and without public examples (epsilon = 0) and each private configuration at each budget epsilon, Hot and Cold PATE on the same teachers; "
    "print the gain of the best private row over the public model (docs/utility.md).")
SIZES = {"full": {"texts": 200, "repetitions": 3, "budget_epsilons": "1,3,10"},
         "quick": {"texts": 20, "repetitions": 2, "budget_epsilons": "3,10", "teachers_per_group": 16}}
FULL_RUNTIME = "several hours on 2 CPU cores; sized for a GPU"
UNSEEDED_ON_USER_DATA = True

#: The metrics every row reports (MAUVE first: the headline's).
METRICS = ("mauve", "auc", "tstr", "distinct_1", "distinct_2", "precision", "recall", "copies")
#: The private configurations, as generate options: the Gaussian aggregator with a strict-majority threshold over
#: the public top-50, charged by PLD, with the two kinds of votes.
CONFIGURATIONS = {
    "Hot PATE, GNMax threshold, top-50, PLD": {"mechanism": "gaussian-threshold-argmax", "accountant": "pld",
                                               "public_top_k": 50, "histograms": "coordinated"},
    "Cold PATE, GNMax threshold, top-50, PLD": {"mechanism": "gaussian-threshold-argmax", "accountant": "pld",
                                                "public_top_k": 50, "histograms": "independent"},
    "Hot PATE, BetweenThresholds on the public candidate, PLD": {"mechanism": "between-thresholds",
                                                                 "accountant": "pld", "histograms": "coordinated"},
    "InvisibleInk, clipped-logit sampling, top-50+, RDP": {"mechanism": "clipped-logit-sampling",
                                                            "accountant": "rdp", "public_top_k": 50},
}
#: What a row of ``--configurations FILE`` may set (``generate``'s options as RunSpec fields); the data, the
#: budget, the ledger, the public examples, the records and the seed are the experiment's own.
CONFIGURABLE = ("mechanism", "accountant", "step_epsilon", "step_delta", "relation", "public_mix", "public_top_k",
                "histograms", "records_per_teacher", "teachers", "groups", "template", "temperature", "top_p",
                "subsample_teachers")
#: Mechanisms whose step epsilon a row may leave out: the quietest one is computed (:func:`quiet_step_epsilon`).
#: A mechanism in both lists runs at the fitted step epsilon, or at the quietest when the fitted one is below it.
QUIET_MECHANISMS = ("gaussian-argmax", "gaussian-threshold-argmax", "gaussian-averaged-distributions")
#: Mechanisms whose step epsilon a row may leave out: the largest at which the budget pays for every token of the
#: records is computed (:func:`fitted_step_epsilon`).
FITTED_MECHANISMS = ("between-thresholds", "clipped-logit-sampling", "gaussian-averaged-distributions",
                     "svt-public-agreement")
#: The step delta of every private row (below any budget delta the experiment takes).
STEP_DELTA_SHARE = 0.1
#: The records a run of teachers is asked for beyond the texts scored (a share): a row needs ``texts`` scorable
#: ones. No teachers' run has left a record empty on the corpora of docs/utility.md, and every record of theirs
#: costs an ensemble's forward passes a token.
RECORD_MARGIN = 0.1
#: The same for the public model alone: its bare prompt left 2-7 of 30 records empty (bundled sample, fortunes, man
#: pages), and its records cost one forward pass a token.
PUBLIC_RECORD_MARGIN = 0.5
#: The share by which the public model's mean record length is lengthened in the expected length of a record
#: (:func:`expected_tokens`): the teachers' records may run longer than the public model's.
LENGTH_MARGIN = 0.25
#: Public examples drawn from the corpus (of each label) when ``--public-examples`` is not given.
PUBLIC_EXAMPLES = 4
#: A row's ``public_top_k`` that the experiment sizes on the public examples, as ``--public-top-k auto`` does
#: (:func:`~pate_app.run.measure_public_support`).
AUTO_TOP_K = "auto"
#: k of the k-NN precision and recall.
KNN_K = 3
#: Bootstrap resamples of the headline's share.
BOOTSTRAP = 2000


def add_arguments(p) -> None:
    add_option(p, "--data", metavar="FILE", default="bundled",
               help="the records: JSON lines, JSON or CSV, as generate reads them, or 'bundled' (default)")
    add_option(p, "--text-field", metavar="NAME", default="text", help="the field holding each record's text")
    add_option(p, "--label-field", metavar="NAME", default=None,
               help="the field holding each record's label: runs per label, and train-on-synthetic accuracy")
    add_option(p, "--template", metavar="NAME|FILE", default=None, help="the prompt template, as generate's")
    add_option(p, "--model", metavar="PATH", default="embedded", help="the model, as generate's (default embedded)")
    add_option(p, "--held-out", metavar="F", type=float, default=0.35,
               help="the share of the records kept out of every run and scored against (default 0.35)")
    add_option(p, "--budget-epsilons", metavar="E,E,...", default=None,
               help="the budgets epsilon of the private rows (default 1,3,10; --quick 3,10)")
    add_option(p, "--budget-delta", metavar="D", type=float, default=1e-6, help="the budgets' delta (default 1e-6)")
    add_option(p, "--texts", metavar="N", type=int, default=None,
               help="texts scored in every row (default 200, or as many as the held-out records; --quick 20)")
    add_option(p, "--repetitions", metavar="R", type=int, default=None,
               help="runs of every row (default 3; --quick 2)")
    add_option(p, "--teachers", metavar="N", type=int, default=None,
               help="teachers of the runs (default: generate's, one per private record up to 64; --quick at most 16 "
                    "a group)")
    add_option(p, "--max-tokens", metavar="T", type=int, default=24, help="tokens per record at most (default 24)")
    add_option(p, "--configurations", metavar="FILE", default=None,
               help="the private rows: a TOML file of tables, each a row's name holding generate's options as keys "
                    f"({', '.join(CONFIGURABLE)}); default: Hot and Cold PATE with GNMax threshold, top-50, PLD "
                    "(docs/utility.md)")
    add_option(p, "--teachers-see-public", action="store_true",
               help="the teachers of the noiseless and the private rows show the public examples too, as "
                    "generate --teachers-see-public does (default: off)")
    add_option(p, "--public-examples", metavar="FILE", default=None,
               help="records declared public (read as --data is), shown to the public model of the floor and of "
                    f"the private rows (default: {PUBLIC_EXAMPLES} records of each label drawn from --data and kept "
                    "out of both the private and the held-out records)")


# -- pieces ------------------------------------------------------------------------------------------------------
def quiet_step_epsilon(mechanism: str, num_teachers: int, step_delta: float, vocab_size: int,
                       support: int | None, subsample: float | None = None) -> float | None:
    """The smallest step epsilon on the grid of ``generate``'s refusals (:data:`pate_app.run._STEP_GRID`) at which
    ``mechanism`` with ``num_teachers`` teachers a group (``subsample``: a step keeps each with that probability,
    ``--subsample-teachers``) passes the noise check over ``support`` (or the vocabulary): the most steps a budget
    buys without the noise deciding the releases.  ``None`` when none does."""
    from pate_app.run import _STEP_GRID, NOISE_RELEASE_LIMIT, RunInputError, build_mechanism, noise_release

    def quiet(e: float) -> bool:  # more epsilon, less noise: monotone along the grid
        try:
            mech = build_mechanism(mechanism, e, step_delta, num_teachers=num_teachers, subsample=subsample)
        except RunInputError:
            return False
        stray = noise_release(mech, num_teachers, vocab_size, support)
        return stray is None or stray <= NOISE_RELEASE_LIMIT

    low, high = -1, len(_STEP_GRID) - 1  # the answer is in (low, high], by bisection on the grid
    if not quiet(_STEP_GRID[high]):
        return None
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if quiet(_STEP_GRID[mid]) else (mid, high)
    return _STEP_GRID[high]


def load_configurations(path) -> dict:
    """The private rows of ``--configurations FILE``: ``{name: options}`` in the file's order, each checked as a
    run description (:class:`~pate_app.spec.RunSpec`) would check it; a ``ValueError`` naming the file, the row and
    the key.  A row of a mechanism outside :data:`QUIET_MECHANISMS` and :data:`FITTED_MECHANISMS` must set its
    ``step_epsilon``."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    from pate_app.spec import RunSpec, SpecError

    where = f"--configurations {str(path)!r}"
    try:
        tables = tomllib.loads(Path(path).expanduser().read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{where}: cannot read it as TOML ({exc})") from None
    if not tables:
        raise ValueError(f"{where}: no row (a row is a table: [\"Hot PATE, my settings\"] with generate's options)")
    rows = {}
    for name, options in tables.items():
        if not isinstance(options, dict):
            raise ValueError(f"{where}: {name!r} is not a table of options")
        unknown = [key for key in options if key not in CONFIGURABLE]
        if unknown:
            raise ValueError(f"{where}: [{name}] has the key {unknown[0]!r}; a row sets {', '.join(CONFIGURABLE)}")
        try:
            RunSpec(data="records", budget_epsilon=1.0, budget_delta=1e-6, **options)
        except (SpecError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: [{name}] {exc}") from None
        if options.get("mechanism", "dp-argmax") not in QUIET_MECHANISMS + FITTED_MECHANISMS and \
                "step_epsilon" not in options:
            raise ValueError(f"{where}: [{name}] sets no step_epsilon; it is computed only for "
                             f"{', '.join(dict.fromkeys(QUIET_MECHANISMS + FITTED_MECHANISMS))}")
        rows[str(name)] = dict(options)
    return rows


@attr.s(frozen=True, auto_attribs=True)
class _Fit:
    """What a fitted row's step epsilon is fitted from when the row runs (:func:`fitted_step_epsilon`): its
    mechanism, accountant, teachers a group, step delta, budget, records a group, and the quietest step epsilon
    its noise rule allows (the fitted one is never below it)."""

    mechanism: str
    accountant: str
    per_group: int
    step_delta: float
    budget: tuple
    records_a_group: int
    quietest: float


def fitted_step_epsilon(mechanism: str, accountant: str, num_teachers: int, step_delta: float, budget: tuple,
                        steps: int, touches: int = 1) -> float | None:
    """The largest step epsilon on the grid of ``generate``'s refusals (:data:`pate_app.run._STEP_GRID`) at which
    ``mechanism`` with ``num_teachers`` teachers a group runs (its threshold in reach) and ``accountant`` pays for
    ``steps`` steps of a group within ``budget`` (each step counted ``touches`` times: a labelled run's private
    labels count twice): the least noise with which every token of the records asked for can be a charged step, so
    that the budget ends after the records, not inside them.  A rule of the teachers, the budget and the records'
    length alone; ``None`` when no grid value pays for them."""
    from pate_accountant import planning
    from pate_accountant.errors import PateAccountantError
    from pate_app.run import _STEP_GRID, RunInputError, build_mechanism, check_reachable

    def pays(e: float) -> bool:  # less epsilon, more steps: monotone along the grid
        try:
            mech = build_mechanism(mechanism, e, step_delta, num_teachers=num_teachers)
            check_reachable(mech, num_teachers)
            limits = planning.step_limits(accountant, mech.event, float(budget[0]), float(budget[1]))
        except (PateAccountantError, RunInputError, ValueError):
            return False
        afforded = limits.max_steps if limits.max_steps is not None else limits.max_hits
        return afforded is not None and afforded // touches >= steps

    low, high = 0, len(_STEP_GRID)  # the answer is _STEP_GRID[low] where pays holds on [0, low], by bisection
    if not pays(_STEP_GRID[0]):
        return None
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if pays(_STEP_GRID[mid]) else (low, mid)
    return _STEP_GRID[low]


def expected_tokens(floor: dict | None, max_tokens: int) -> int:
    """The tokens a record of a run is expected to take, from public data alone: the mean length of the records
    the public model writes with the public examples (``floor``, that row of the experiment; the same template),
    lengthened by :data:`LENGTH_MARGIN` and rounded up, at most ``max_tokens``; ``max_tokens`` when that row made
    no record."""
    lengths = [rep["tokens_per_record"] for rep in (floor or {}).get("repetitions", [])
               if rep.get("tokens_per_record") is not None]
    if not lengths:
        return int(max_tokens)
    return min(int(max_tokens), max(1, math.ceil(max(lengths) * (1 + LENGTH_MARGIN))))


def steps_needed(records: int, expected: int, max_tokens: int) -> int:
    """The charged steps a group's budget must pay for so that all its ``records`` start under ``generate``'s
    whole-records rule (a record starts only when the budget pays for ``max_tokens`` more steps) when each
    record takes ``expected`` tokens: every record but the last at its expected length, the last at its worst
    case."""
    return max(0, int(records) - 1) * int(expected) + int(max_tokens)


def _labels_and_records(data: str, text_field: str, label_field: str | None, option: str = "--data"):
    """The records of ``data`` as the run path reads them, and their labels (sorted; ``None`` without
    ``label_field``); errors name ``option``."""
    from ensembles.data import load_bundled, load_records

    try:
        loaded = (load_bundled(text_field=text_field, label_field=label_field) if data == "bundled" else
                  load_records(str(Path(data).expanduser()), text_field=text_field, label_field=label_field))
    except FileNotFoundError:
        raise ValueError(f"{option}: no such file {data!r}") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{option}: {exc}") from None
    records = list(loaded.records)
    if label_field is None:
        return records, None, loaded.text_key
    key = loaded.label_key
    records = [{**record, "label": record[key]} for record in records]
    return records, sorted({record["label"] for record in records}), loaded.text_key


def _public_examples(records: list, labels, text_key: str, path: str | None, text_field: str,
                     label_field: str | None, rng: np.random.Generator) -> tuple[list, list]:
    """``(examples, rest)``: the public examples (the records of ``path``, else :data:`PUBLIC_EXAMPLES` of
    ``records``, of each label, drawn with ``rng``) and the records left for the split, none of which is an
    example's text."""
    if path is not None:
        examples, _, _ = _labels_and_records(path, text_field, label_field, option="--public-examples")
        examples = [{text_key: record["text" if "text" in record else text_key],
                     **({"label": record["label"]} if labels is not None else {})} for record in examples]
    else:
        groups = [list(range(len(records)))] if labels is None else [
            [i for i, record in enumerate(records) if record["label"] == label] for label in labels]
        chosen = {int(i) for group in groups for i in rng.choice(group, min(PUBLIC_EXAMPLES, len(group) - 1),
                                                                 replace=False)}
        examples = [records[i] for i in sorted(chosen)]
    shown = {example[text_key] for example in examples}
    return examples, [record for record in records if record[text_key] not in shown]


def _split(records: list, held_out: float, texts: int, rng: np.random.Generator,
           labels=None) -> tuple[list, list]:
    """``(private, held_out)``: a seeded split keeping ``held_out`` of the records (at least ``texts``) out; with
    ``labels``, the same share of each label, so that the held-out records have the label mix of the private ones
    (a split that is not stratified lets the two-sample classifier tell real from real by the labels' mix)."""
    n = len(records)
    keep = max(int(texts), int(round(held_out * n)))
    order = rng.permutation(n)
    if labels is None:
        out = set(order[:keep].tolist())
    else:
        out = set()
        for label in labels:
            mine = [int(i) for i in order if records[i]["label"] == label]
            out.update(mine[:int(round(keep / n * len(mine)))])
    private = [records[i] for i in order if i not in out]
    real = [records[i] for i in order if i in out]
    if len(real) < int(texts) or len(private) < int(texts):
        raise ValueError(f"--data: {n} records cannot give {texts} held-out and {texts} private texts: use fewer "
                         "--texts or more records")
    return private, real


def _by_label_in_turn(records: list, labels) -> list:
    """``records`` reordered to take each label in turn (each label's own order kept), as a run per label makes
    them; unchanged without labels."""
    if labels is None:
        return list(records)
    queues = [[r for r in records if r["label"] == label] for label in labels]
    return [queue[i] for i in range(max(map(len, queues), default=0)) for queue in queues if i < len(queue)]


def _scores(real_vectors, real_labels, texts, labels, embed, seed: int, public_texts=()) -> dict:
    """Every metric of one set of ``texts`` (their ``labels``, or ``None``) against the held-out records, and the
    share of them that copy one of the ``public_texts`` (:func:`~pate_app.evaluation.copy_share`)."""
    from pate_app import evaluation as ev

    vectors = embed(texts)
    precision, recall = ev.knn_precision_recall(real_vectors, vectors, k=KNN_K)
    return {
        "mauve": ev.mauve_score(real_vectors, vectors, seed=seed),
        "auc": ev.two_sample_auc(real_vectors, vectors, seed=seed),
        "tstr": None if labels is None else ev.tstr_accuracy(vectors, labels, real_vectors, real_labels),
        "distinct_1": ev.distinct_n(texts, 1), "distinct_2": ev.distinct_n(texts, 2),
        "precision": precision, "recall": recall, "copies": ev.copy_share(texts, public_texts),
    }


def _summarise(row: dict) -> dict:
    """The row with each metric's mean and spread over its scored repetitions."""
    from pate_app.evaluation import spread

    scored = [rep for rep in row["repetitions"] if rep.get("scores") is not None]
    row["scorable"] = bool(scored) and len(scored) == len(row["repetitions"])
    row["mean"], row["spread"] = {}, {}
    for metric in METRICS:
        values = [rep["scores"][metric] for rep in scored if rep["scores"][metric] is not None]
        if values:
            row["mean"][metric], row["spread"][metric] = spread(values)
    return row


def asked_records(texts: int, public_only: bool = False) -> int:
    """The records a run is asked for to score ``texts`` of them: some may come out empty."""
    return math.ceil(texts * (1 + (PUBLIC_RECORD_MARGIN if public_only else RECORD_MARGIN)))


def _generate(base: dict, options: dict, private: list, labels, texts: int, folder: Path, seed):
    """One run through RunSpec and synthesize, as a user would: its records and cost (nothing of its text)."""
    from pate_app.run import synthesize
    from pate_app.spec import RunSpec

    asked = asked_records(texts, bool(options.get("public_only")))  # with labels: taken in turn, as generate does
    spec = RunSpec(**{**base, **options}, records=asked, ledger=str(folder / "run.sqlite"), seed=seed)
    return synthesize(spec, records=private, ledger_home=False)


# -- the experiment ----------------------------------------------------------------------------------------------
def run(*, quick: bool = False, seed: int | None = None, progress: bool = True, data: str = "bundled",
        text_field: str = "text", label_field: str | None = None, template: str | None = None,
        model: str = "embedded", held_out: float = 0.35, budget_epsilons: str | None = None,
        budget_delta: float = 1e-6,
        texts: int | None = None, repetitions: int | None = None, teachers: int | None = None,
        max_tokens: int = 24, public_examples: str | None = None, configurations: str | None = None,
        teachers_see_public: bool = False) -> dict:
    from ensembles.backends import transformers_backend as tb
    from pate_app import evaluation as ev
    from pate_app.run import _STEP_GRID, RunInputError, _resolve_model, fit_teachers, measure_public_support
    from pate_app.spec import RunSpec, SpecError, load_task, task_from_records

    size = SIZES["quick" if quick else "full"]
    epsilons, delta = budget_epsilons, float(budget_delta)
    sized, texts = texts is None, int(size["texts"] if texts is None else texts)
    repetitions = int(size["repetitions"] if repetitions is None else repetitions)
    try:
        budgets = [float(e) for e in (size["budget_epsilons"] if epsilons is None else epsilons).split(",")]
    except ValueError:
        raise ValueError(f"--budget-epsilons: a comma-separated list of numbers, got {epsilons!r}") from None
    if texts < 10 or repetitions < 1 or not 0.0 < held_out < 1.0 or not budgets or min(budgets) <= 0:
        raise ValueError(f"--texts (at least 10), --repetitions (at least 1), --held-out (in (0, 1)) and "
                         f"--budget-epsilons (positive) got {texts}, {repetitions}, {held_out}, {budgets}")
    configurations = CONFIGURATIONS if configurations is None else load_configurations(configurations)
    on_user_data = data != "bundled"
    if seed is not None and on_user_data:
        print("pate-accountant: warning: this utility run is seeded, so its runs have no privacy against anyone who "
              "knows the seed; leave --seed out on private data", file=sys.stderr, flush=True)
    split_rng = np.random.default_rng(0 if seed is None else seed)
    run_seed = None if (seed is None and on_user_data) else (0 if seed is None else seed)
    records, labels, text_key = _labels_and_records(data, text_field, label_field)
    examples, rest = _public_examples(records, labels, text_key, public_examples, text_field, label_field, split_rng)
    if sized:  # the size's texts, as many as this data's split holds (never under 10: _split says why)
        texts = max(10, min(texts, int(round(held_out * len(rest))), len(rest) - int(round(held_out * len(rest)))))
    private, real = _split(rest, held_out, texts, split_rng, labels)

    def say(text: str) -> None:
        if progress:
            print(f"utility: {text}", file=sys.stderr, flush=True)

    try:  # the template the run path picks for this file, the model's vocabulary, the teachers generate fits
        found = load_task(RunSpec(data=data, text_field=text_field, label_field=label_field,
                                  labels=None if labels is None else tuple(labels), template=template,
                                  budget_epsilon=1.0, budget_delta=delta))
        base = {"data": "records" if not on_user_data else Path(data).name, "text_field": text_key, "model": model,
                "template": template if template is not None else found.template.name,
                "max_tokens": int(max_tokens), "teachers": teachers, "normalise": True,
                **({} if labels is None else {"label_field": "label", "labels": tuple(labels)})}
        probe = RunSpec(**base, budget_epsilon=1.0, budget_delta=delta)
        task = task_from_records(probe, private)
        n = fit_teachers(probe, task).teachers // (1 if labels is None else len(labels))
        cap = size.get("teachers_per_group")
        if teachers is None and cap is not None and n > cap:  # the quick size's ensembles: cost grows with them
            base["teachers"] = cap * (1 if labels is None else len(labels))
            probe = RunSpec(**base, budget_epsilon=1.0, budget_delta=delta)
            n = fit_teachers(probe, task).teachers // (1 if labels is None else len(labels))
        vocab = tb.token_window(_resolve_model(probe, announce=progress)[0])[2]
    except (SpecError, RunInputError) as exc:
        raise ValueError(str(exc)) from None
    support = None
    if any(options.get("public_top_k") == AUTO_TOP_K for options in configurations.values()):
        say("sizing the public support on the public examples")
        try:  # the size --public-top-k auto measures, once for every run: the public examples are the same
            support = measure_public_support(found.template, examples, None if labels is None else tuple(labels),
                                             _resolve_model(probe, announce=False)[0])
        except RunInputError as exc:
            raise ValueError(str(exc)) from None
        say(f"the public support: the top {support.top_k} tokens hold {support.covered:.0%} of the "
            f"{support.positions} tokens of the public examples (a top 50: {support.covered_by_50:.0%})")
        configurations = {name: {**options, "public_top_k": support.top_k}
                          if options.get("public_top_k") == AUTO_TOP_K else options
                          for name, options in configurations.items()}
    say(f"{len(private)} private and {len(real)} held-out records, {len(examples)} public examples; {n} teachers a "
        "group; loading the sentence model")
    embed = ev.Embedder()
    held, _ = ev.scorable_records(real, text_key)
    real_vectors = embed([text for text, _ in held])
    real_labels = None if labels is None else [record["label"] for _, record in held]
    public_texts = [text for text, _ in ev.scorable_records(examples, text_key)[0]]  # what a copy would copy
    step_delta = STEP_DELTA_SHARE * float(delta)
    rows = []

    def scored_run(row: dict, r: int, produce) -> None:
        try:
            result = produce()
        except (RunInputError, SpecError) as exc:
            row["repetitions"].append({"refused": str(exc), "scores": None})
            return
        kept, dropped = ev.scorable_records(result["records"])
        got = [(text, record.get("label")) for text, record in kept]
        entry = {"records": len(result["records"]), "scorable_texts": len(kept), "dropped": dropped,
                 "private_tokens": result.get("private_tokens", 0), "fallback_tokens": result.get("fallback_tokens", 0),
                 "charged_runs": result.get("charged_runs", 0),
                 "tokens_per_record": (float(np.mean([record["num_tokens"] for _, record in kept])) if kept else None),
                 "spent_epsilon": result.get("spent", {}).get("epsilon", 0.0), "scores": None}
        if len(got) >= texts:
            chosen = got[:texts]
            entry["scores"] = _scores(real_vectors, real_labels, [t for t, _ in chosen],
                                      None if labels is None else [lab for _, lab in chosen], embed, seed=r,
                                      public_texts=public_texts)
        row["repetitions"].append(entry)

    # the ceiling: real private records, drawn afresh for each repetition
    row = {"row": "ceiling: real records", "kind": "ceiling", "epsilon": None, "repetitions": []}
    for r in range(repetitions):
        draw = np.random.default_rng([0 if seed is None else seed, r]).permutation(len(private))
        chosen = _by_label_in_turn([private[i] for i in draw], labels)  # as many of each label as a run makes
        usable = [(text, rec.get("label")) for text, rec in ev.scorable_records(chosen, text_key)[0]]
        scores = _scores(real_vectors, real_labels, [t for t, _ in usable[:texts]],
                         None if labels is None else [lab for _, lab in usable[:texts]], embed, seed=r,
                         public_texts=public_texts)
        row["repetitions"].append({"scorable_texts": texts, "scores": scores})
    rows.append(_summarise(row))

    with tempfile.TemporaryDirectory() as folder:
        shown = str(Path(folder) / "public-examples.jsonl")
        with open(shown, "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(example) + "\n" for example in examples)
        public = {"public_examples": shown}
        seen = {**public, "teachers_see_public": True} if teachers_see_public else {}  # the teachers' public block
        runs = [("epsilon = 0: the public model alone, bare prompt", "floor", 0.0, {"public_only": True},
                 {"budget_epsilon": 1.0, "budget_delta": delta}, None),
                (f"epsilon = 0: the public model with {len(examples)} public examples", "floor", 0.0,
                 {"public_only": True, **public}, {"budget_epsilon": 1.0, "budget_delta": delta}, None),
                ("epsilon = infinity: the same teachers without noise", "noiseless", math.inf,
                 {"mechanism": "gaussian-argmax", "accountant": "basic", "step_epsilon": 50.0, "step_delta": 1e-7,
                 **seen},
                 {"budget_epsilon": 1e9, "budget_delta": 0.5}, None)]
        for name, options in configurations.items():
            step = {"step_delta": options.get("step_delta", step_delta)}
            groups = len(labels) if labels is not None else options.get("groups", 1)
            per_group = options.get("teachers", n * (1 if labels is None else len(labels))) // groups
            if "step_epsilon" not in options and options["mechanism"] in QUIET_MECHANISMS:
                quiet = quiet_step_epsilon(options["mechanism"], per_group, step["step_delta"], vocab,
                                           options.get("public_top_k"),  # the quietest, for the row's own teachers
                                           options.get("subsample_teachers"))
                step["step_epsilon"] = quiet if quiet is not None else 50.0
            for epsilon in budgets:
                fit = None  # fitted when the row runs: to the expected record length of the floor's records
                if "step_epsilon" not in options and options["mechanism"] in FITTED_MECHANISMS:
                    fit = _Fit(options["mechanism"], options["accountant"], per_group, step["step_delta"],
                               (epsilon, delta), math.ceil(asked_records(texts) / groups),
                               step.get("step_epsilon", 0.0))
                runs.append((f"{name}, epsilon {epsilon:g}", "private", epsilon, {**options, **step, **public, **seen},
                             {"budget_epsilon": epsilon, "budget_delta": delta}, fit))
        expected = int(max_tokens)
        for label, kind, epsilon, options, budget, fit in runs:
            if fit is not None:
                e = fitted_step_epsilon(fit.mechanism, fit.accountant, fit.per_group, fit.step_delta, fit.budget,
                                        steps_needed(fit.records_a_group, expected, max_tokens),
                                        touches=1 if labels is None else 2)
                # none paid: the least; never below the quietest (the run would refuse its noise)
                options = {**options, "step_epsilon": max(e if e is not None else _STEP_GRID[0], fit.quietest)}
            row = {"row": label, "kind": kind, "epsilon": None if math.isinf(epsilon) else epsilon,
                   "configuration": {k: (len(examples) if k == "public_examples" else v) for k, v in options.items()},
                   "repetitions": []}
            for r in range(repetitions):
                say(f"{label}: run {r + 1} of {repetitions}")
                where = Path(folder) / f"{len(rows)}-{r}"
                where.mkdir()
                started = time.monotonic()
                scored_run(row, r, lambda: _generate({**base, **budget}, options, private, labels, texts, where,
                                                     None if run_seed is None else run_seed * 1000 + r))
                say(f"{label}: run {r + 1} of {repetitions} took {time.monotonic() - started:.0f} s")
            rows.append(_summarise(row))
            if kind == "floor" and options.get("public_examples"):  # the public model's records: public lengths
                expected = expected_tokens(row, max_tokens)
    result = {
        "experiment": NAME,
        "parameters": {"data": "bundled" if data == "bundled" else Path(data).name, "records": len(records),
                       "private": len(private), "held_out": len(real), "labels": labels, "texts": texts,
                       "public_examples": len(examples),
                       "public_examples_from": "drawn" if public_examples is None else Path(public_examples).name,
                       "repetitions": repetitions, "epsilons": budgets, "delta": delta, "teachers_per_group": n,
                       "step_delta": step_delta, "vocab_size": vocab, "embedding": embed.name, "knn_k": KNN_K,
                       "max_tokens": max_tokens, "expected_tokens": expected,
                       "public_support": None if support is None else support.as_dict(),
                       "configurations": list(configurations), "teachers_see_public": bool(teachers_see_public),
                       "seeded": run_seed is not None, "quick": bool(quick)},
        "rows": rows,
    }
    result["headline"] = headline(rows, seed=0 if seed is None else seed)
    return result


def headline(rows: list, metric: str = "mauve", seed: int = 0) -> dict | None:
    """The best private row against the best epsilon = 0 row on ``metric``: the gain (difference of the means,
    with the standard error of that difference) and the share of the way from epsilon = 0 to epsilon = infinity
    it recovers (a bootstrap over the repetitions gives its spread; no share unless the noiseless teachers score
    above the floor by more than twice the standard error of that difference: otherwise there is no way to recover,
    or none that the runs can tell from noise); ``None`` when a side has no scorable row.  The best private row is
    the best of those that copy the public examples no more than the floor does (the ``copies`` metric); when every
    private row copies more, the best of them is shown, never credited (no gain beyond the floor, no share)."""
    def best(kind, copies_at_most=None):
        candidates = [row for row in rows if row["kind"] == kind and row["scorable"] and metric in row["mean"]
                      and (copies_at_most is None or row["mean"].get("copies", 0.0) <= copies_at_most)]
        return max(candidates, key=lambda row: row["mean"][metric]) if candidates else None

    floor, top = best("floor"), best("noiseless")
    if floor is None or best("private") is None:
        return None
    # a private row is credited only when it copies the public examples no more than the public model does: a copy
    # of a public record scores as a real one and is worth nothing private
    floor_copies = floor["mean"].get("copies")
    private = best("private", floor_copies)
    copies_more = private is None
    if copies_more:
        private = best("private")

    def values(row):
        return np.array([rep["scores"][metric] for rep in row["repetitions"]])

    p, f = values(private), values(floor)
    gain = float(p.mean() - f.mean())
    se = math.sqrt((p.var(ddof=1) / len(p) if len(p) > 1 else 0.0) + (f.var(ddof=1) / len(f) if len(f) > 1 else 0.0))
    out = {"metric": metric, "private_row": private["row"], "floor_row": floor["row"], "gain": gain,
           "gain_spread": se, "beats_floor_by_two_spreads": bool(gain > 2 * se and not copies_more),
           "private_copies": private["mean"].get("copies"), "floor_copies": floor_copies,
           "copies_more_than_floor": copies_more, "share": None, "share_spread": None}
    if top is not None:
        t = values(top)
        # a share of a way that measurably exists: the noiseless teachers above the floor by more than twice the
        # standard error of that difference (on man pages they scored 0.99 against 0.99, and a share read 265 %)
        way_se = math.sqrt((t.var(ddof=1) / len(t) if len(t) > 1 else 0.0) + (f.var(ddof=1) / len(f) if len(f) > 1
                                                                             else 0.0))
        above = bool(t.mean() - f.mean() > 2 * way_se)
        if above and not copies_more:
            rng = np.random.default_rng(seed)
            draws = []
            for _ in range(BOOTSTRAP):
                pb, fb, tb = (rng.choice(v, v.size) for v in (p, f, t))
                if tb.mean() != fb.mean():
                    draws.append((pb.mean() - fb.mean()) / (tb.mean() - fb.mean()))
            out["share"] = float((p.mean() - f.mean()) / (t.mean() - f.mean()))
            out["share_spread"] = float(np.std(draws, ddof=1)) if len(draws) > 1 else 0.0
        out["noiseless_row"] = top["row"]
        out["noiseless_above_floor"] = above
    return out


# -- output ------------------------------------------------------------------------------------------------------
def summary(result: dict) -> str:
    p = result["parameters"]
    lines = [f"utility on {p['data']}: {p['private']} private and {p['held_out']} held-out records, {p['texts']} texts "
             f"a row, {p['repetitions']} runs a row, {p['teachers_per_group']} teachers a group, embeddings "
             f"{p['embedding']}; mean (spread) over the runs",
             f"{'row':<58} {'MAUVE':>13} {'AUC':>13} {'TSTR':>13} {'distinct-2':>10} {'recall':>7} {'copies':>7} "
             f"{'cost':>24}"]

    def cell(row, metric, width=13):
        if metric not in row["mean"]:
            return f"{'-':>{width}}"
        return f"{row['mean'][metric]:.2f} ({row['spread'][metric]:.2f})".rjust(width)

    for row in result["rows"]:
        reps = row["repetitions"]
        cost = ""
        if row["kind"] == "private":
            tokens = sum(rep.get("private_tokens", 0) for rep in reps) / len(reps)
            cost = f"{tokens:.0f} private tokens"
        if not row["scorable"]:
            made = [rep.get("scorable_texts", 0) for rep in reps if "refused" not in rep]
            ran = [rep for rep in reps if "refused" not in rep]
            why = reps[0].get("refused") if not ran else (
                f"not scorable: {min(made)} of {p['texts']} texts (a run made {max(r['records'] for r in ran)} "
                f"record(s), {max(r['dropped']['cut_by_budget'] for r in ran)} cut by the budget, in at most "
                f"{max(r['charged_runs'] for r in ran)} charged steps{_steps_needed(result)})")
            lines.append(f"{row['row']:<58} {why[:200]}")
            continue
        lines.append(f"{row['row']:<58} {cell(row, 'mauve')} {cell(row, 'auc')} {cell(row, 'tstr')} "
                     f"{cell(row, 'distinct_2', 10)} {cell(row, 'recall', 7)} {cell(row, 'copies', 7)} {cost:>24}")
    h = result["headline"]
    if h is None:
        lines.append("headline: no private row is scorable at these budgets")
    else:
        share = ("" if (h["share"] is None and h.get("noiseless_above_floor") is None) or h.get("copies_more_than_floor")
                 else
                 "; no share: the noiseless teachers are not above the public model here by more than twice the "
                 "standard error"
                 if h["share"] is None else
                 f"; it recovers {h['share']:.0%} (spread {h['share_spread']:.0%}) of the way to epsilon = infinity")
        copied = ("" if not h.get("copies_more_than_floor") else
                  f"; not credited: every private row copies the public examples more than the floor does "
                  f"({h['private_copies']:.0%} of its texts against {h['floor_copies']:.0%})")
        beats = "more" if h["gain"] > 2 * h["gain_spread"] else "not more"
        lines.append(f"headline: {h['private_row']} against {h['floor_row']}: MAUVE gain {h['gain']:+.3f} (standard "
                     f"error {h['gain_spread']:.3f}; {beats} than twice it){share}{copied}")
    return "\n".join(lines)


def _steps_needed(result: dict) -> str:
    """``"; N records of the noiseless teachers' length need about S steps"``: what a private row would spend if
    each of its tokens were a charged step, from the noiseless row's records (empty without that row)."""
    lengths = [rep["tokens_per_record"] for row in result["rows"] if row["kind"] == "noiseless"
               for rep in row["repetitions"] if rep.get("tokens_per_record")]
    if not lengths:
        return ""
    texts, per = result["parameters"]["texts"], float(np.mean(lengths))
    return f"; {texts} records of the noiseless teachers' {per:.0f} tokens need about {round(texts * per)} steps"


def plot(result: dict, out_dir) -> list[Path]:
    """``utility.png``: each metric against the budget epsilon, one line per private configuration, the floor,
    the noiseless teachers and the real records drawn across."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "utility.png"
    _plot(result, path)
    return [path]


def _plot(result: dict, path: Path) -> None:
    from matplotlib.ticker import NullLocator

    from pate_app.plotting import legend_outside, new_figure, styled

    @styled
    def draw():
        metrics = [("mauve", "MAUVE (1: like the real records)"), ("auc", "two-sample AUC (0.5: indistinguishable)")]
        if result["parameters"]["labels"]:
            metrics.append(("tstr", "train on synthetic, test on real: accuracy"))
        fig = new_figure((5.2 * len(metrics) + 2.5, 4.4))
        axes = fig.subplots(1, len(metrics))
        axes = np.atleast_1d(axes)
        rows = result["rows"]
        budgets = result["parameters"]["epsilons"]
        styles = {"ceiling": [("k", "-")] * 2, "noiseless": [("tab:purple", "--")] * 2,
                  "floor": [("tab:gray", ":"), ("tab:brown", "-.")]}  # the bare prompt, then the public examples
        drawn = [row for row in rows if row["kind"] in styles]
        style_of = {row["row"]: styles[row["kind"]][[r["kind"] for r in drawn[:i]].count(row["kind"]) % 2]
                    for i, row in enumerate(drawn)}
        for ax, (metric, title) in zip(axes, metrics):
            for row in drawn:
                if metric in row["mean"]:
                    colour, line = style_of[row["row"]]
                    m, s = row["mean"][metric], row["spread"][metric]
                    ax.axhline(m, color=colour, linestyle=line, label=row["row"])
                    ax.axhspan(m - s, m + s, color=colour, alpha=0.08)
            colours = ("tab:red", "tab:blue", "tab:green", "tab:orange", "tab:cyan", "tab:olive", "tab:pink")
            names = result["parameters"].get("configurations", list(CONFIGURATIONS))
            for colour, name in zip(colours * (1 + len(names) // len(colours)), names):
                xs, ys, es = [], [], []
                for epsilon in budgets:
                    match = [row for row in rows if row["row"] == f"{name}, epsilon {epsilon:g}"]
                    if match and match[0]["scorable"] and metric in match[0]["mean"]:
                        xs.append(epsilon)
                        ys.append(match[0]["mean"][metric])
                        es.append(match[0]["spread"][metric])
                if xs:
                    ax.errorbar(xs, ys, yerr=es, color=colour, marker="o", capsize=3, label=name)
            ax.set_xscale("log")
            ax.set_xticks(budgets, [f"{b:g}" for b in budgets])
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xlim(min(budgets) / 1.5, max(budgets) * 1.5)
            ax.set_ylim(*((0.3, 1.02) if metric == "auc" else (0.0, 1.02)))
            ax.set_xlabel("budget epsilon (delta %g)" % result["parameters"]["delta"])
            ax.set_title(title)
        missing = [row["row"] for row in rows if row["kind"] == "private" and not row["scorable"]]
        if missing:  # said above the panels, never over a line
            fig.suptitle(f"{len(missing)} of {sum(row['kind'] == 'private' for row in rows)} private rows not "
                         "scored (refused, or too few complete records): see the summary", color="tab:red",
                         fontsize=10)
        legend_outside(axes[-1])
        fig.savefig(path, dpi=110)

    draw()
