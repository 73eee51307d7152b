"""``pate-accountant experiment end-to-end``: full private generation of a set of records (paper Framework 2).

The paper's Framework 2 (Section 1.2, "PATE framework for sequential text generation") generates a response
token by token: every teacher gives its next-token distribution, one vote histogram is drawn (coordinated:
Hot PATE, Algorithm 1; independent: Cold PATE), a DP aggregator releases a token or fails, and a failure is
answered by a fallback (a public model).  Section 6 ("Privacy analysis considerations") charges the
aggregation with the Target Charging Technique through the boundary wrapper (only ``top`` outcomes are
charged), and Appendix "DP methods for heterogeneous ensembles" (docs/tct_and_individual.md) charges
BetweenThresholds queries to the individual teachers counted in them.  The paper states the ingredients
and their guarantees but runs no end-to-end generation; this experiment runs it, with our mechanisms and
accountants, for three configurations, each under Hot and Cold histograms with the same seed, budget and
teachers:

* ``target-dp-argmax``: ``BoundaryWrapper(DPArgMax)`` (``LArgMax_L`` of paper Algorithm 2, inside
  the boundary wrapper of the paper's "Privacy analysis considerations") under :class:`~pate_accountant.accountants.TargetChargingAccountant`;
* ``target-dp-weighted-sampling``: ``BoundaryWrapper(DPWeightedSampling)`` (``LWS_L``, paper Algorithm 3) under the same accountant.  The target-charging accountant accepts a wrapped weighted
  sampler (its event's inner part is an (epsilon, delta) event) and the wrapper's ``q`` holds for
  multi-outcome inner laws (docs/mechanisms/boundary_wrapper.md), so no plain-composition stand-in is needed;
  for reference every target-charging run also reports what PLD composition of the *unwrapped* inner
  mechanism would charge for the same number of runs;
* ``individual-between-thresholds``: the individual-charging step of the paper's "DP methods for heterogeneous ensembles" (random rate ``nu``, a candidate token drawn from the
  public model, ``BetweenThresholds`` on the count of sampled teachers voting for it) under
  :class:`~pate_accountant.accountants.IndividualChargingAccountant` (teachers removed at their limit).

Every run generates up to ``K`` records with :class:`~ensembles.generation.PrivateGenerator` and the public
fallback (the same model with the public prompt only), so records complete; it stops early only when the
budget is spent.  Per run we report records produced per epsilon spent, the fail rate (charged runs that
released nothing: fail or target), private and fallback tokens, the accountant's state and the diversity
of the produced set (:func:`diversity`: distinct records, distinct-1 and distinct-2).

Two ensembles (two "parts"):

* ``model``: the embedded SmolLM2-135M-Instruct (``--model`` for another local model) with few-shot teachers
  on Dolly-format instructions (``--data``; default the bundled sample), prompts and partition as in
  :func:`pate_app.run.private_run`.  With tens of teachers (``n`` is capped by the records, and every step
  costs a forward pass per teacher on a CPU) the per-step parameters must be large for anything to pass:
  ``DPArgMax`` releases only a count above ``n/2 + L`` and ``L`` is about ``(2/eps) ln(2/delta)``.  At such levels the boundary wrapper's ``q`` is small (``q ~ e^-eps / 2``), so the
  TCT price of even the first query is hundreds of epsilon (:data:`MODEL_SETTING` documents the choice).
  This part is a working end-to-end pipeline at a privacy level that is not meaningful; the paper's regime
  needs thousands of teachers (Section 6: ``n = C_delta / eps0``).
* ``synthetic``: the paper's regime on a table of teacher distributions (a :class:`ToyBackend`):
  ``p_i = alpha s + (1 - alpha) r_i`` (Section 6's alpha mixtures, :func:`ensembles.synthetic.alpha_mixture`)
  with ``s`` uniform over ``k`` common words (one of them the end of a record) and ``r_i`` a word of teacher
  ``i`` alone, ``n`` in the thousands, per-query levels ``<= 0.1`` and a total budget of single-digit
  epsilon; the public model knows the common words but not the teachers' preferences (uniform over them).
  Here Hot PATE releases nearly every token privately and Cold PATE almost none: an independent histogram
  spreads the common mass over ``k`` words, so no count gets near ``n/2 + L`` (DPArgMax), ``L`` (DPWS) or
  the BetweenThresholds threshold, while the coordinated histogram puts it on one word.

Randomness.  On the bundled sample and the synthetic table the run is a seeded simulation (``--seed``,
default 0), reproducible like the paper's figures.  On a user's data file (``--data``) the model part draws
its mechanism noise from the operating system's cryptographic generator (and its record choice, partition
and histograms from fresh entropy) unless ``--seed`` is given: a seed that everyone knows (0) would let
anyone replay the noise.  A seeded run on a user's data warns on stderr as ``generate`` does.  The seed is
never written: the result records only whether each part was ``seeded``.

The claims, the table and the figures are drawn by :mod:`pate_app.experiments.end_to_end_report`.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ensembles.data import OPEN_SLOT, partition_records, teacher_prompts
from ensembles.distributions import TeacherDistributions
from ensembles.synthetic import alpha_mixture
from pate_accountant.validation import check_int, check_real
from pate_app.experiments import model_option, ratio, records_option, size_option
from pate_app.experiments.end_to_end_report import PARTS, _pairs, check_claims, plot, summary
from pate_app.grammar import add_option

__all__ = [
    "CONFIGURATIONS",
    "DESCRIPTION",
    "ENSEMBLES",
    "FULL_RUNTIME",
    "HELP",
    "MODEL_SETTING",
    "NAME",
    "SIZES",
    "SEEDED_WARNING",
    "SYNTHETIC_SETTING",
    "SharedPrefill",
    "add_arguments",
    "build_configuration",
    "distinct_ngrams",
    "diversity",
    "generate_records",
    "plot",
    "run",
    "run_part",
    "summarize_run",
    "summary",
    "synthetic_backends",
]

NAME = "end-to-end"
#: ``run`` takes ``seed=None``: then the bundled sample and the synthetic table use seed 0, and a user's
#: ``--data`` draws its mechanism noise from the operating system (pate_app/commands/experiment.py).
UNSEEDED_ON_USER_DATA = True
#: What a seeded run on a user's data prints on stderr (the words of ``generate``'s warning; never the seed).
SEEDED_WARNING = ("pate-accountant: warning: this run is seeded, so it has no privacy against anyone who knows the "
                  "seed (they can re-run both neighbouring data sets and compare); the seed is not recorded. Leave "
                  "--seed out for a private run.")
HELP = "Framework 2 end to end: private records under target and individual charging, Hot vs Cold"
DESCRIPTION = (
    "Generate K records privately (paper Framework 2) with the public fallback, under three configurations: "
    "the boundary-wrapped DPArgMax and DPWeightedSampling with target charging, and BetweenThresholds with "
    "individual charging; each with coordinated (Hot PATE) and independent (Cold PATE) histograms at the "
    "same seed, budget and teachers. Two ensembles: few-shot teachers on a local causal LM (default: the "
    "embedded SmolLM2-135M-Instruct on the bundled Dolly-format sample: tens of teachers, so large "
    "per-step epsilons) and a synthetic alpha-mixture table in the paper's regime (thousands of teachers, "
    "per-query eps0 <= 0.1). Reports records and private tokens per epsilon spent, fail rate, fallback "
    "tokens, the accountants' state and the diversity of the records (distinct records, distinct-1/2)."
)
SIZES = {
    "full": {"teachers": 50, "records": 8, "max_tokens": 24, "synthetic_teachers": 4000, "synthetic_records": 100},
    "quick": {"teachers": 40, "records": 1, "max_tokens": 4, "synthetic_teachers": 4000, "synthetic_records": 3},
}
FULL_RUNTIME = "about 3 to 4 minutes on a 2-core CPU"  # measured: see docs/results.md, section end-to-end

#: The configurations (mechanism + accountant), in report order.
CONFIGURATIONS = ("target-dp-argmax", "target-dp-weighted-sampling", "individual-between-thresholds")
#: Ensemble label -> PrivateGenerator ``histograms``.
ENSEMBLES = (("hot", "coordinated"), ("cold", "independent"))

#: Per-step parameters and budgets of the model part (tens of teachers), under replace-one.
#:
#: * Target charging: inner ``(eps_A, delta0) = (2, 1e-8)``, so ``L = 19`` and ``DPArgMax`` releases only a
#:   top count above ``n/2 + 19``: with ``n = 50`` a count of 44 releases with probability 0.27 and 46 with
#:   0.9; with ``n = 40`` a count of 39 with 0.27 and a unanimous one with 0.73.  The wrapped query is charged at
#:   level ``2 eps_A = 4`` with ``q = 0.071``, and the TCT bound for ``delta = 1e-5`` is 648 for the first
#:   hit (spent as soon as one query ran), 800 for two and 1160 for five: budget ``(1000, 1e-5)``, 3 hits.
#:   A smaller ``eps_A`` lets nothing through at this ``n``; a larger one makes ``q`` smaller still
#:   (``eps_A = 3``: 2844 for the first hit).
#: * Individual charging: ``BetweenThresholds(0.2, 10, 20)`` (gap times epsilon = 2, ``q = 0.40``); the
#:   per-teacher limit for ``(32, 1e-5)`` under replace-one is 11 charges (none fits below epsilon 14).
MODEL_SETTING = {
    "relation": "replace-one",
    "target": {"epsilon0": 2.0, "delta0": 1e-8, "budget": (1000.0, 1e-5)},
    "individual": {"epsilon0": 0.2, "low": 10, "high": 20, "budget": (32.0, 1e-5)},
}
#: Per-step parameters and budgets of the synthetic part (the paper's regime), under replace-one; one total
#: budget ``(8, 1e-6)`` for every configuration.
#:
#: * Target charging: inner ``(0.05, 1e-10)``: ``L = 774``, level ``0.1``, ``q = 1/3``; 43 target hits fit
#:   in ``(8, 1e-6)`` (the first costs 2.7).  With ``n = 4000`` DPArgMax can release a top count above
#:   ``n/2 + L = 2774`` (0.69 n) and surely releases one above ``n/2 + 2L = 3548``.
#: * Individual charging: ``BetweenThresholds(0.05, 500, 540)`` (``q = 0.42``), per-teacher limit 50; the
#:   threshold 500 lies above every independent count of a common word (``alpha n / k = 345`` for
#:   ``n = 4000``) by 7.75 noise scales, and far below a coordinated one (about ``alpha n``).
SYNTHETIC_SETTING = {
    "relation": "replace-one",
    "target": {"epsilon0": 0.05, "delta0": 1e-10, "budget": (8.0, 1e-6)},
    "individual": {"epsilon0": 0.05, "low": 500, "high": 540, "budget": (8.0, 1e-6)},
}
#: The synthetic ensemble: ``k`` common words (the first ends a record), weight ``alpha`` on them.
SYNTHETIC_COMMON_WORDS = 11
SYNTHETIC_ALPHA = 0.95
SYNTHETIC_MAX_TOKENS = 10
#: Model part: no top-p truncation (the full distributions are the cheapest here: a top-p cut sorts every
#: teacher's vocabulary each step), as in ``pate_app.run.private_run``.
TOP_P = None
#: Model part: teachers per forward pass (one pass for the default sizes).
BATCH_SIZE = 64
#: Relative slack when comparing a spent epsilon with the budget (float rounding of the bounds).
BUDGET_SLACK = 1e-9


# -- diversity -------------------------------------------------------------------------------------------
def distinct_ngrams(texts, n: int) -> tuple[int, int]:
    """``(distinct, total)`` word ``n``-grams over ``texts`` (whitespace-split words; n-grams never cross
    records).  ``distinct / total`` is the distinct-``n`` ratio (Li et al. 2016, "A diversity-promoting
    objective function for neural conversation models")."""
    n = check_int("n", n, minimum=1)
    seen: set = set()
    total = 0
    for text in texts:
        words = str(text).split()
        grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
        total += len(grams)
        seen.update(grams)
    return len(seen), total


def diversity(texts) -> dict:
    """Diversity of a produced set of records: number of records, distinct records (exact text match after
    stripping), and distinct word 1- and 2-grams with their distinct-n ratios (``None`` for no n-gram)."""
    texts = [str(t).strip() for t in texts]
    out = {"records": len(texts), "distinct_records": len(set(texts))}
    for n in (1, 2):
        distinct, total = distinct_ngrams(texts, n)
        out[f"distinct_{n}"] = distinct
        out[f"total_{n}"] = total
        out[f"distinct_{n}_ratio"] = ratio(distinct, total)
    return out


# -- configurations --------------------------------------------------------------------------------------
def build_configuration(configuration: str, setting: dict, num_teachers: int, records=None):
    """``(mechanism, accountant, budget)`` of one configuration (a fresh accountant).

    Target charging goes through :func:`pate_app.run.build_mechanism` / :func:`~pate_app.run.build_accountant`
    (the registered ``boundary-dp-argmax`` and ``boundary-dp-weighted-sampling``) and, with ``records``, :func:`~pate_app.run.check_inputs`.  Raises ``ValueError`` when the budget
    cannot pay for a single step."""
    from mechanisms import BetweenThresholds
    from pate_accountant.accountants import IndividualChargingAccountant
    from pate_app.run import build_accountant, build_mechanism, check_inputs


    if configuration not in CONFIGURATIONS:
        raise ValueError(f"configuration must be one of {CONFIGURATIONS}, got {configuration!r}")
    relation = setting["relation"]
    if configuration.startswith("target-"):
        params = setting["target"]
        budget = tuple(float(x) for x in params["budget"])
        name = "boundary-dp-argmax" if configuration == "target-dp-argmax" else "boundary-dp-weighted-sampling"
        mechanism = build_mechanism(name, params["epsilon0"], params["delta0"], relation)
        if records is not None:
            check_inputs(records, num_teachers, mechanism, "target-charging", budget)
        accountant = build_accountant("target-charging", budget)
    else:
        params = setting["individual"]
        budget = tuple(float(x) for x in params["budget"])
        mechanism = BetweenThresholds(params["epsilon0"], params["low"], params["high"], relation=relation)
        accountant = IndividualChargingAccountant(num_teachers, budget=budget, epsilon0=mechanism.epsilon,
                                                  q=mechanism.q, relation=relation)
    if not accountant.can_afford(mechanism.event):
        raise ValueError(f"{configuration}: the budget {budget} cannot pay for a single step")
    return mechanism, accountant, budget


def generate_records(backend, public, mechanism, accountant, *, histograms: str, prompts, shared_prefix="",
                     public_prompt="", num_records: int, max_tokens: int, stop_strings=(), top_p=None, rng,
                     mechanism_rng=None, on_record=None) -> list:
    """Up to ``num_records`` :class:`~ensembles.generation.GenerationResult` from one
    :class:`~ensembles.generation.PrivateGenerator` (public fallback) sharing ``accountant``; stops after a
    record cut short by the budget.  ``rng`` is the sampling randomness; ``mechanism_rng`` the mechanism noise
    (``None``: the operating system's, fresh for every record; a generator: a seeded simulation).
    ``on_record()`` is called once per requested record."""
    from ensembles.generation import PrivateGenerator


    generator = PrivateGenerator(
        backend, mechanism, accountant, histograms=histograms, fallback="public", public_backend=public,
        public_prompt=public_prompt, max_tokens=max_tokens, stop_strings=stop_strings, top_p=top_p,
    )
    results = []
    for index in range(num_records):
        result = generator.generate(prompts, shared_prefix=shared_prefix, rng=rng, mechanism_rng=mechanism_rng)
        results.append(result)
        if on_record is not None:
            on_record()
        if result.stop_reason == "budget":
            if on_record is not None:
                for _ in range(num_records - index - 1):
                    on_record()
            break
    return results


def _finite(value):
    value = float(value)
    return value if math.isfinite(value) else None


def _accountant_state(accountant) -> dict:

    from pate_accountant.accountants import IndividualChargingAccountant

    if isinstance(accountant, IndividualChargingAccountant):
        # Only DP outputs and public parameters: the per-teacher counters, the largest charge and the
        # removed teachers are functions of who voted for the candidates, so they stay out of the result.
        return {
            "kind": accountant.kind,
            "between_hits": int(accountant.hits),
            "queries": int(accountant.queries),
            "per_teacher_limit": accountant.per_teacher_limit,
        }
    return {
        "kind": accountant.kind,
        "target_hits": int(accountant.hits),
        "queries": int(accountant.queries),
        "max_hits": accountant.max_hits,
        "charged_tau": int(accountant.charged_tau),
    }


def _plain_composition(mechanism, runs: int, delta: float):
    """Epsilon that PLD composition of ``runs`` runs of the unwrapped inner mechanism would charge at
    ``delta`` (``None`` when infinite, e.g. once ``runs * delta0`` exceeds ``delta``)."""
    from pate_accountant.accountants import PldAccountant


    if runs == 0:
        return 0.0
    accountant = PldAccountant()
    accountant.compose(mechanism.inner.event, count=runs)
    return _finite(accountant.get_epsilon(delta))


def summarize_run(results, accountant, budget, mechanism=None, *, num_records: int) -> dict:
    """The JSON summary of one configuration's run (module docstring): counts from the step records, the
    accountant's ``spent()`` against ``budget``, diversity of the records not cut short by the budget."""
    steps = [step for result in results for step in result.steps]
    runs = len(steps)
    private = [step.token for step in steps if step.outcome == "token"]
    fallback = sum(1 for step in steps if step.outcome == "fallback")
    # A boundary-wrapper target releases nothing (target_runs); a BetweenThresholds "between" (also a charged
    # target) releases its candidate: target_hits counts both kinds.
    targets = sum(1 for step in steps if step.target_hit and step.outcome != "token")
    completed = [result for result in results if result.stop_reason != "budget"]
    texts = [result.text.strip() for result in completed]
    stops: dict = {}
    for result in results:
        stops[result.stop_reason] = stops.get(result.stop_reason, 0) + 1
    if getattr(accountant, "confidential_charges", False):
        # Individual charging: spent() is the worst teacher's loss, a function of the votes; the run's
        # public guarantee is the budget, which the per-teacher limit enforces.
        spent_eps, spent_delta = budget
    else:
        spent_eps, spent_delta = (float(x) for x in accountant.spent())
    within = spent_eps <= budget[0] * (1 + BUDGET_SLACK) and spent_delta <= budget[1] * (1 + BUDGET_SLACK)
    out = {
        "records": texts,
        "records_requested": num_records,
        "records_produced": len(completed),
        "stop_reasons": stops,
        "tokens": sum(len(result.token_ids) for result in results),
        "charged_runs": runs,
        "private_tokens": len(private),
        "fallback_tokens": fallback,
        "failed_runs": runs - len(private),
        "target_runs": targets,
        "target_hits": sum(1 for step in steps if step.target_hit),
        "fail_rate": ratio(runs - len(private), runs),
        "distinct_private_tokens": len(set(private)),
        "spent": {"epsilon": _finite(spent_eps), "delta": spent_delta},
        "spent_is": "guarantee" if getattr(accountant, "confidential_charges", False) else "accountant",
        "budget": {"epsilon": budget[0], "delta": budget[1]},
        "within_budget": bool(within),
        "records_per_epsilon": ratio(len(completed), spent_eps) if math.isfinite(spent_eps) else None,
        "private_tokens_per_epsilon": ratio(len(private), spent_eps) if math.isfinite(spent_eps) else None,
        "accountant": _accountant_state(accountant),
        "diversity": diversity(texts),
    }
    if mechanism is not None and hasattr(mechanism, "inner"):
        out["plain_composition_epsilon"] = _plain_composition(mechanism, runs, budget[1])
    return out


def run_part(backend, public, *, setting: dict, num_teachers: int, prompts, shared_prefix="", public_prompt="",
             num_records: int, max_tokens: int, stop_strings=(), top_p=None, seed: int | None, part_index: int,
             records=None, on_record=None) -> list[dict]:
    """Every configuration under Hot and Cold on one ensemble: a list of run summaries.

    Hot and Cold runs of a configuration use the same generator ``default_rng([seed, part_index, c])``
    (``c`` the configuration's index) for the sampling and the mechanism noise (a seeded simulation), the same
    budget and the same teachers.  ``seed=None``: the sampling randomness from fresh entropy and the mechanism
    noise from the operating system's cryptographic generator (a private run)."""
    runs = []
    for c, configuration in enumerate(CONFIGURATIONS):
        for label, histograms in ENSEMBLES:
            mechanism, accountant, budget = build_configuration(configuration, setting, num_teachers, records)
            rng = np.random.default_rng(None if seed is None else [seed, part_index, c])
            started = time.perf_counter()
            results = generate_records(
                backend, public, mechanism, accountant, histograms=histograms, prompts=prompts,
                shared_prefix=shared_prefix, public_prompt=public_prompt, num_records=num_records,
                max_tokens=max_tokens, stop_strings=stop_strings, top_p=top_p, rng=rng,
                mechanism_rng=None if seed is None else rng, on_record=on_record,
            )
            entry = {"configuration": configuration, "ensemble": label, "histograms": histograms}
            entry.update(summarize_run(results, accountant, budget, mechanism, num_records=num_records))
            entry["wall_seconds"] = round(time.perf_counter() - started, 3)
            runs.append(entry)
    return runs


class SharedPrefill:
    """A :class:`~ensembles.backends.transformers_backend.TransformersBackend` whose :meth:`begin` prefills a
    given set of prompts once: every record of every run starts from the same teacher prompts, so later
    ``begin`` calls with the same prompts restore a copy of the first prefill's state (KV caches and last
    logits) instead of running the model over the prompts again.  Everything else is delegated.

    It uses the backend's ``snapshot``/``restore``; a backend without them is simply prefilled every time."""

    def __init__(self, backend):
        self._backend = backend
        self._key = None
        self._saved = None

    @property
    def vocab_size(self) -> int:
        return self._backend.vocab_size

    @property
    def eos_token_id(self):
        return self._backend.eos_token_id

    def encode(self, text):
        return self._backend.encode(text)

    def decode(self, token_ids):
        return self._backend.decode(token_ids)

    def next_token_distributions(self, contexts):
        return self._backend.next_token_distributions(contexts)

    def begin(self, teacher_prompts, shared_prefix=None) -> None:
        key = (tuple(str(p) for p in teacher_prompts), str(shared_prefix))
        backend = self._backend
        if key == self._key and self._saved is not None:
            backend.restore(self._saved)
            return
        backend.begin(teacher_prompts, shared_prefix)
        self._key = key
        self._saved = backend.snapshot() if hasattr(backend, "snapshot") else None

    def distributions(self):
        return self._backend.distributions()

    def votes(self, key, **options):
        return self._backend.votes(key, **options)

    def append(self, token_id) -> None:
        self._backend.append(token_id)

    def drop_teachers(self, indices) -> None:
        self._backend.drop_teachers(indices)

    def active_teachers(self):
        return self._backend.active_teachers()


# -- the synthetic ensemble ------------------------------------------------------------------------------
def synthetic_backends(num_teachers: int, *, common_words: int = SYNTHETIC_COMMON_WORDS,
                       alpha: float = SYNTHETIC_ALPHA, seed: int = 0):
    """``(teachers, public)`` :class:`~ensembles.backends.toy.ToyBackend` pair for the synthetic part.

    Teacher ``i``: ``alpha`` spread uniformly over the ``common_words`` words ``"<eos>", "w1", ...`` and
    ``1 - alpha`` on its own word ``"t<i>"`` (:func:`ensembles.synthetic.alpha_mixture`, the same at every
    step).  The public model: uniform over the common words (it knows the task's words, not the teachers).
    """
    from ensembles.backends.toy import ToyBackend


    n = check_int("num_teachers", num_teachers, minimum=1)
    k = check_int("common_words", common_words, minimum=2)
    vocab = ["<eos>"] + [f"w{j}" for j in range(1, k)] + [f"t{i}" for i in range(n)]
    table = alpha_mixture(n, len(vocab), alpha, np.random.default_rng(seed), common_size=k, private_size=1)
    public_row = TeacherDistributions.from_sparse([np.arange(k)], [np.full(k, 1.0 / k)], len(vocab))

    class _Fixed(ToyBackend):
        """A ToyBackend over fixed sparse rows (the per-teacher Python call of a function model is the
        bottleneck at thousands of teachers): the full table is returned as is, so its vote plan is
        cached across steps; after removals, the subset."""

        def __init__(self, distributions):
            super().__init__(lambda i, _context: distributions.row(i), vocab)
            self._fixed = distributions

        def _distributions_for(self, teachers):
            if teachers.size == self._fixed.num_teachers:
                return self._fixed
            return self._fixed.subset(teachers)

    return _Fixed(table), _Fixed(public_row)


# -- the run ---------------------------------------------------------------------------------------------
def add_arguments(parser) -> None:
    """The experiment's own options (sizes default to ``SIZES``)."""
    full, quick = SIZES["full"], SIZES["quick"]
    parser.add_argument("--model", metavar="PATH", default=None,
                        help="local model folder or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--data", metavar="FILE", default=None,
                        help="Dolly-format JSON lines (default: the bundled sample)")
    parser.add_argument("--teachers", metavar="N", type=int, default=None,
                        help=f"teachers of the model part, capped by the records (default {full['teachers']}, "
                             f"the records split between them; --quick {quick['teachers']}, one record each)")
    size_option(parser, SIZES, "--records", "K", "records per run in the model part")
    size_option(parser, SIZES, "--max-tokens", "M", "tokens per record in the model part")
    parser.add_argument("--synthetic-teachers", metavar="N", type=int, default=None,
                        help=f"teachers of the synthetic part (default {full['synthetic_teachers']}; enough that "
                             "DPArgMax can release: a smaller n is refused, naming the least one)")
    size_option(parser, SIZES, "--synthetic-records", "K", "records per run in the synthetic part")
    parser.add_argument("--part", choices=("both",) + PARTS, default="both",
                        help="which ensemble to run: the language model, the synthetic table, or both (default)")
    add_option(parser, "--target-budget-epsilon", "--target-epsilon", dest="target_epsilon", metavar="EPS",
               type=float, default=None, help="model part: total budget epsilon of the target-charging runs "
               f"(default {MODEL_SETTING['target']['budget'][0]:g})")
    add_option(parser, "--individual-budget-epsilon", "--individual-epsilon", dest="individual_epsilon", metavar="EPS",
               type=float, default=None, help="model part: total budget epsilon of the individual-charging runs "
               f"(default {MODEL_SETTING['individual']['budget'][0]:g})")
    parser.add_argument("--threads", metavar="N", type=int, default=None,
                        help="CPU threads for the model (default: the backend's 2)")


def _min_synthetic_teachers() -> int:
    """The least ``n`` at which the synthetic DPArgMax can release a coordinated count of ``alpha n``
    (``alpha n > n/2 + L``)."""
    from mechanisms import DPArgMax


    params = SYNTHETIC_SETTING["target"]
    bound = DPArgMax(params["epsilon0"], params["delta0"], relation=SYNTHETIC_SETTING["relation"]).error_bound
    return int(math.floor(bound / (SYNTHETIC_ALPHA - 0.5))) + 1


def _options(quick, teachers, records, max_tokens, synthetic_teachers, synthetic_records, part,
             target_epsilon, individual_epsilon, threads) -> dict:
    size = SIZES["quick" if quick else "full"]
    out = {
        "teachers": size["teachers"] if teachers is None else check_int("--teachers", teachers, minimum=1),
        "records": size["records"] if records is None else check_int("--records", records, minimum=1),
        "max_tokens": size["max_tokens"] if max_tokens is None else check_int("--max-tokens", max_tokens, minimum=1),
        "synthetic_records": size["synthetic_records"] if synthetic_records is None
        else check_int("--synthetic-records", synthetic_records, minimum=1),
    }
    if synthetic_teachers is None:
        out["synthetic_teachers"] = size["synthetic_teachers"]
    else:
        minimum = _min_synthetic_teachers()
        out["synthetic_teachers"] = check_int("--synthetic-teachers", synthetic_teachers, minimum=1)
        if synthetic_teachers < minimum:
            raise ValueError(f"--synthetic-teachers must be at least {minimum} (DPArgMax needs alpha n > n/2 + L), "
                             f"got {synthetic_teachers}")
    if part not in ("both",) + PARTS:
        raise ValueError(f"--part must be one of {('both',) + PARTS}, got {part!r}")
    out["parts"] = PARTS if part == "both" else (part,)
    setting = {key: dict(value) if isinstance(value, dict) else value for key, value in MODEL_SETTING.items()}
    for option, key, value in (("--target-budget-epsilon", "target", target_epsilon),
                               ("--individual-budget-epsilon", "individual", individual_epsilon)):
        if value is not None:
            value = check_real(option, value, minimum=0.0, min_open=True)
            setting[key]["budget"] = (value, setting[key]["budget"][1])
    out["model_setting"] = setting
    out["threads"] = None if threads is None else check_int("--threads", threads, minimum=1)
    return out


def _check_model_setting(setting: dict, n: int, records) -> None:
    """Refuse budgets that cannot pay for one step, naming the option, before the model is loaded."""
    for configuration, option in (("target-dp-argmax", "--target-budget-epsilon"),
                                  ("target-dp-weighted-sampling", "--target-budget-epsilon"),
                                  ("individual-between-thresholds", "--individual-budget-epsilon")):
        key = "target" if configuration.startswith("target-") else "individual"
        try:
            build_configuration(configuration, setting, n, records)
        except ValueError as exc:
            raise ValueError(f"{option} {setting[key]['budget'][0]:g}: {exc}") from None


def _model_part(options: dict, *, data, model, seed: int | None, bar) -> dict:

    from ensembles.backends.transformers_backend import TransformersBackend

    records, data_label = records_option(data)
    model_path, model_label = model_option(model)
    n = min(options["teachers"], len(records))
    rng = np.random.default_rng(seed)
    if options["one_record_each"] and n < len(records):  # --quick: one record per teacher
        records = [records[i] for i in rng.choice(len(records), size=n, replace=False)]
    setting = options["model_setting"]
    _check_model_setting(setting, n, records)
    parts = partition_records(records, n, rng)
    shared_prefix, prompts = teacher_prompts(parts)


    bar.set_postfix_str("loading model")
    try:
        backend = TransformersBackend(model_path, threads=options["threads"], batch_size=BATCH_SIZE)
    except ValueError as exc:
        raise ValueError(f"--model: {exc}") from None
    public = TransformersBackend(backend.model, backend.tokenizer, threads=options["threads"])
    backend = SharedPrefill(backend)
    bar.set_postfix_str(f"model part, {n} teachers")
    runs = run_part(
        backend, public, setting=setting, num_teachers=n, prompts=prompts, shared_prefix=shared_prefix,
        public_prompt=OPEN_SLOT, num_records=options["records"], max_tokens=options["max_tokens"],
        stop_strings=("\n",), top_p=TOP_P, seed=seed, part_index=0, records=records, on_record=bar.update,
    )
    return {
        "model": model_label,
        "data": data_label,
        "seeded": seed is not None,
        "teachers": n,
        "data_records": len(records),
        "records_per_teacher": [len(part) for part in parts],
        "records_requested": options["records"],
        "max_tokens": options["max_tokens"],
        "top_p": TOP_P,
        "setting": _jsonable_setting(setting),
        "runs": runs,
    }


def _synthetic_part(options: dict, *, seed: int, bar) -> dict:
    n = options["synthetic_teachers"]
    teachers, public = synthetic_backends(n, seed=seed)
    bar.set_postfix_str(f"synthetic part, {n} teachers")
    runs = run_part(
        teachers, public, setting=SYNTHETIC_SETTING, num_teachers=n, prompts=[[] for _ in range(n)],
        num_records=options["synthetic_records"], max_tokens=SYNTHETIC_MAX_TOKENS, seed=seed, part_index=1,
        on_record=bar.update,
    )
    return {
        "seeded": True,
        "teachers": n,
        "common_words": SYNTHETIC_COMMON_WORDS,
        "alpha": SYNTHETIC_ALPHA,
        "records_requested": options["synthetic_records"],
        "max_tokens": SYNTHETIC_MAX_TOKENS,
        "setting": _jsonable_setting(SYNTHETIC_SETTING),
        "runs": runs,
    }


def _jsonable_setting(setting: dict) -> dict:
    out = {"relation": setting["relation"]}
    for key in ("target", "individual"):
        params = dict(setting[key])
        params["budget"] = {"epsilon": float(params["budget"][0]), "delta": float(params["budget"][1])}
        out[key] = params
    return out


def run(*, quick: bool, seed: int | None = None, progress: bool, model=None, data=None, teachers=None,
        records=None, max_tokens=None, synthetic_teachers=None, synthetic_records=None, part: str = "both",
        target_epsilon=None, individual_epsilon=None, threads=None) -> dict:
    """The whole experiment (module docstring); deterministic for a ``seed`` on a given machine.

    Randomness: ``default_rng(seed)`` picks the records (``--quick``: one per teacher) and partitions them;
    each configuration's Hot and Cold runs share ``default_rng([seed, part, configuration])``, for the sampling
    and the mechanism noise.  ``seed=None``: seed 0 on the bundled sample and the synthetic table; on a user's
    ``data`` file the model part draws its mechanism noise from the operating system (everything else from
    fresh entropy) and records ``seeded: false``.  A seeded run on a user's data prints
    :data:`SEEDED_WARNING` on stderr.  The seed is never written.  Bad option values raise ``ValueError``
    naming the option, before the model is loaded.
    """
    import sys

    from tqdm import tqdm

    started, cpu_started = time.perf_counter(), time.process_time()
    if seed is not None:
        seed = check_int("--seed", seed, minimum=0)
    options = _options(quick, teachers, records, max_tokens, synthetic_teachers, synthetic_records, part,
                       target_epsilon, individual_epsilon, threads)
    options["one_record_each"] = bool(quick)
    user_data = data is not None and "model" in options["parts"]
    # A user's data: its noise from the operating system unless a seed is given; public data: seed 0 by default.
    model_seed = seed if seed is not None or user_data else 0
    synthetic_seed = 0 if seed is None else seed
    seeded = model_seed is not None  # False only for a user's data without a seed
    per_part = {"model": options["records"], "synthetic": options["synthetic_records"]}
    total = sum(len(CONFIGURATIONS) * len(ENSEMBLES) * per_part[p] for p in options["parts"])
    result = {
        "experiment": NAME,
        "parameters": {
            "quick": bool(quick),
            "seeded": seeded,  # the seed itself is never written (it would let anyone replay the noise)
            "parts": list(options["parts"]),
            "configurations": list(CONFIGURATIONS),
            "ensembles": [label for label, _ in ENSEMBLES],
            "fallback": "public",
        },
    }
    if user_data and seed is not None:
        print(SEEDED_WARNING, file=sys.stderr, flush=True)
    with tqdm(total=total, desc=NAME, unit="record", disable=not progress, dynamic_ncols=True) as bar:
        if "model" in options["parts"]:
            result["model"] = _model_part(options, data=data, model=model, seed=model_seed, bar=bar)
        if "synthetic" in options["parts"]:
            result["synthetic"] = _synthetic_part(options, seed=synthetic_seed, bar=bar)
    result["claims"] = check_claims(result)
    result["wall_seconds"] = round(time.perf_counter() - started, 3)
    result["cpu_seconds"] = round(time.process_time() - cpu_started, 3)
    return result
