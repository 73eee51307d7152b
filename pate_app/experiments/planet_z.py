"""Planet Z: Hot (coordinated) versus Cold (independent) histograms of a real model's answers.

The curated task of the paper (Section 5.2, Figure "frequency_cdf"/"coveragesparsity", and Appendix D.1,
Remark D.1 and the tau-robust mass figure).  ``n`` teachers each see a prompt that says numbers are eaten
on planet Z and lists the breakfast numbers of one named inhabitant: a random permutation of a shared
set ``C`` of ``k`` three-digit numbers plus the teacher's own private three-digit number (outside ``C``).
The prompt asks for one breakfast number.  ``C`` is what should transfer; the name, the private number and
the order are teacher-specific.

What differs from the paper, and why (docs/results.md, section planet-z):

* the model is SmolLM2-135M-Instruct (embedded, CPU) or any local Llama folder/GGUF (``--model``), not
  Llama-3-8B-Instruct; the prompt wording is ours; the assistant turn is opened with a short lead-in
  ("A breakfast number on planet Z is ") because the 135M model otherwise starts most replies with words;
* SmolLM2 spells numbers digit by digit, so a teacher's answer distribution is computed over **whole
  answers**: :class:`~pate_app.experiments.answer_scoring.AnswerScorer` gives the model's probability of
  every candidate number (all 900, or ``C`` plus the private numbers) as a complete reply prefix, by
  teacher-forced scoring on the teacher's KV cache; the rest of the teacher's mass is its tail (never
  released).  The resulting ``TeacherDistributions`` has one "token" per number (id = number - 100);
* Hot and Cold histograms are then drawn from it with :func:`~ensembles.histograms.coordinated_votes` and
  :func:`~ensembles.histograms.independent_votes`, like :func:`pate_app.experiments.histograms.histograms_experiment`
  does for the model-free stand-in, and the same metrics are reported: average yield, coverage, support
  size, the total variation distance of the transferred distribution to the average teacher
  distribution, the tau-robust mass ``P(tau)`` (Remark D.1) and the maximum average answer probability;
* a CPU run affords hundreds of teachers, not the paper's ``n = 10^4``; the model-free variant
  (:func:`ensembles.synthetic.planet_z_like` through ``histograms_experiment``) runs at the paper's scale
  ``n = 10^4, r = 1000`` for ``k = 20`` and ``k = 100`` and is part of the result (``model_free``).

Cold PATE's counts concentrate: by the Chernoff-Hoeffding relative-entropy bound for sums of independent
Bernoulli variables, ``Pr[count_j >= T] <= exp(-n D(T/n || pbar_j))`` where ``pbar_j`` is answer ``j``'s
average probability, so its coverage is 0 with probability at least ``1 - delta`` from the threshold
:func:`cold_zero_threshold` on (a union bound over answers and samples).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from ensembles import metrics
from ensembles.distributions import TeacherDistributions
from ensembles.histograms import coordinated_votes, independent_votes
from ensembles.metrics import cold_zero_threshold as _cold_zero_threshold
from pate_accountant.validation import check_int, check_real
from pate_app.experiments import histograms as experiments
from pate_app.plotting import COLORS, new_figure, styled

__all__ = [
    "DESCRIPTION",
    "FULL_RUNTIME",
    "HELP",
    "NAME",
    "SIZES",
    "add_arguments",
    "build_prompts",
    "cold_zero_threshold",
    "make_task",
    "plot",
    "run",
    "summary",
]

NAME = "planet-z"
HELP = "Planet Z (Section 5.2, App. D.1): Hot vs Cold histograms of a real model's whole-number answers"
DESCRIPTION = (
    "The paper's curated Planet Z task (Section 5.2, Appendix D.1). n teachers prompt a language model "
    "(default: the embedded SmolLM2-135M-Instruct; --model for any local Llama folder or GGUF, on the GPU "
    "when there is one) with a shared set C of k three-digit numbers, a private number and a name, and ask "
    "for a breakfast number. Each teacher's probability of every candidate number as a whole answer is "
    "computed by teacher-forced scoring; Hot (coordinated) and Cold (independent) vote histograms are drawn "
    "from these distributions and compared by average yield, coverage, support size, total variation to "
    "the average distribution and the tau-robust mass, against the threshold T. The model-free variant "
    "(planet_z_like teachers at the paper's n = 10^4, r = 1000) runs too (--no-model: only it)."
)
SIZES = {
    "full": {
        "teachers": 512,
        "common_size": 20,
        "samples": 1000,
        "candidates": "all",
        "min_prob": 1e-3,
        "model_free_teachers": 10_000,
        "model_free_samples": 1000,
        "model_free_common_sizes": [20, 100],
    },
    "quick": {
        "teachers": 16,
        "common_size": 10,
        "samples": 200,
        "candidates": "listed",
        "min_prob": 1e-3,
        "model_free_teachers": 500,
        "model_free_samples": 200,
        "model_free_common_sizes": [20],
    },
}
FULL_RUNTIME = (
    "12 to 16.5 minutes on a shared 2-core CPU, almost all of it scoring 512 teachers with SmolLM2; "
    "the model-free runs at n = 10^4 take about 22 s"
)

#: The three-digit numbers: answer id ``a`` is the number ``100 + a``.
FIRST_NUMBER = 100
NUM_NUMBERS = 900
#: Failure probability of the Cold-coverage-is-zero bound (union over answers and samples).
COLD_ZERO_DELTA = 1e-6
CANDIDATE_SETS = ("all", "listed")
#: Thresholds T/n at which the paper reports coverage and support (Appendix D.1, k = 20 and k = 100); the
#: model run's threshold grid includes ceil(fraction * n) for each.
PAPER_FRACTIONS = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.1, 0.2, 0.5)

#: First names of the inhabitants (one drawn per teacher).
NAMES = (
    "Ada", "Bruno", "Chen", "Dara", "Emil", "Fatima", "Goran", "Hana", "Ivo", "Jonas", "Kemal", "Lena",
    "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Vera", "Wen", "Ximena",
    "Yusuf", "Zoe", "Aiko", "Bilal", "Carmen", "Dmitri", "Elif", "Felix", "Greta", "Hugo", "Ines", "Jamal",
    "Kira", "Luca", "Mira", "Nils",
)
#: Our wording of the paper's prompt (the question first, so that more of it is a shared prefix).
USER_TEMPLATE = (
    "On planet Z, people eat numbers. Name one number that a person on planet Z could eat for breakfast. "
    "For example, {name} from planet Z ate these numbers for breakfast: {numbers}."
)
#: The opening of the reply: the answer is the number that follows it.
REPLY_LEAD = "A breakfast number on planet Z is "


# -- options -----------------------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    """``--model``, ``--teachers``, ``--common-size``, ``--samples``, ``--candidates``, ``--min-prob``,
    ``--batch-size``, ``--threads``, ``--no-model``."""
    parser.add_argument("--model", metavar="PATH", default=None,
                        help="local Llama model folder or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--teachers", metavar="N", type=int, default=None,
                        help="number of teachers n of the model run (default: the size's)")
    parser.add_argument("--common-size", metavar="K", type=int, default=None,
                        help="size k of the shared number set C (default: the size's)")
    parser.add_argument("--samples", metavar="R", type=int, default=None,
                        help="histograms r drawn per ensemble type (default: the size's)")
    parser.add_argument("--candidates", choices=CANDIDATE_SETS, default=None,
                        help="answers scored: all 900 three-digit numbers, or only C and the private numbers")
    parser.add_argument("--min-prob", metavar="P", type=float, default=None,
                        help="answer prefixes below this probability are not expanded (their mass joins the tail)")
    parser.add_argument("--batch-size", metavar="B", type=int, default=None,
                        help="teachers per forward pass (default: 32 on CPU, 64 on a GPU)")
    parser.add_argument("--threads", metavar="T", type=int, default=None,
                        help="CPU threads for the model (default: 2)")
    parser.add_argument("--no-model", action="store_true",
                        help="skip the language model: run only the model-free variant")


def _options(quick: bool, seed, options: dict) -> dict:
    size = SIZES["quick" if quick else "full"]
    seed = check_int("--seed", seed, minimum=0)
    teachers = options.get("teachers")
    common_size = options.get("common_size")
    samples = options.get("samples")
    candidates = options.get("candidates")
    min_prob = options.get("min_prob")
    resolved = {
        "seed": seed,
        "quick": bool(quick),
        "teachers": check_int("--teachers", size["teachers"] if teachers is None else teachers, minimum=2),
        "common_size": check_int(
            "--common-size", size["common_size"] if common_size is None else common_size,
            minimum=1, maximum=NUM_NUMBERS - 1,
        ),
        "samples": check_int("--samples", size["samples"] if samples is None else samples, minimum=1),
        "candidates": size["candidates"] if candidates is None else candidates,
        "min_prob": check_real(
            "--min-prob", size["min_prob"] if min_prob is None else min_prob, minimum=0.0, maximum=1.0, max_open=True
        ),
        "model_free_teachers": size["model_free_teachers"],
        "model_free_samples": size["model_free_samples"],
        "model_free_common_sizes": list(size["model_free_common_sizes"]),
        "no_model": bool(options.get("no_model", False)),
        "model": options.get("model"),
        "batch_size": options.get("batch_size"),
        "threads": options.get("threads"),
    }
    if resolved["candidates"] not in CANDIDATE_SETS:
        raise ValueError(f"--candidates must be one of {', '.join(CANDIDATE_SETS)}, got {resolved['candidates']!r}")
    for name in ("batch_size", "threads"):
        if resolved[name] is not None:
            resolved[name] = check_int(f"--{name.replace('_', '-')}", resolved[name], minimum=1)
    if resolved["model"] is not None:
        path = Path(resolved["model"]).expanduser()
        if not path.exists():
            raise ValueError(f"--model: {str(path)!r} does not exist (give a local model folder or .gguf file)")
        resolved["model"] = str(path)
    return resolved


# -- the task ----------------------------------------------------------------------------------------------


def make_task(num_teachers: int, common_size: int, rng: np.random.Generator) -> dict:
    """Draw ``C`` (``k`` of the 900 three-digit numbers, sorted), and per teacher a name, a private number
    outside ``C`` and the order in which its ``k + 1`` numbers are listed."""
    n = check_int("num_teachers", num_teachers, minimum=1)
    k = check_int("common_size", common_size, minimum=1, maximum=NUM_NUMBERS - 1)
    numbers = FIRST_NUMBER + np.arange(NUM_NUMBERS)
    common = np.sort(rng.choice(numbers, size=k, replace=False))
    others = np.setdiff1d(numbers, common)
    private = rng.choice(others, size=n)
    names = rng.choice(len(NAMES), size=n)
    listed = []
    for i in range(n):
        listed.append([int(x) for x in rng.permutation(np.append(common, private[i]))])
    return {
        "common": [int(c) for c in common],
        "private": [int(p) for p in private],
        "names": [NAMES[j] for j in names],
        "listed": listed,
    }


def build_prompts(tokenizer, task: dict) -> tuple[str, list[str]]:
    """``(shared_prefix, teacher_suffixes)``: the chat-formatted prompts (plain text when the tokenizer has
    no chat template), ending with :data:`REPLY_LEAD`, split where the teacher-specific part begins."""
    marker = "\x00"

    def render(name: str, numbers: str) -> str:
        text = USER_TEMPLATE.format(name=name, numbers=numbers)
        if getattr(tokenizer, "chat_template", None):
            chat = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            )
            return chat + REPLY_LEAD
        return text + "\n" + REPLY_LEAD

    skeleton = render(marker, "")
    head = skeleton[: skeleton.index(marker)]
    cut = head.rstrip(" ")  # the space before the name stays with the name (natural tokenization)
    prefix = head[: len(cut)]
    suffixes = []
    for name, numbers in zip(task["names"], task["listed"]):
        full = render(name, ", ".join(str(x) for x in numbers))
        if not full.startswith(prefix):  # pragma: no cover - a template that moves text around
            raise ValueError("the chat template does not keep the prompt's opening as a common prefix")
        suffixes.append(full[len(prefix):])
    return prefix, suffixes


# -- analysis helpers --------------------------------------------------------------------------------------


def cold_zero_threshold(average, num_teachers: int, num_samples: int, delta: float = COLD_ZERO_DELTA):
    """:func:`ensembles.metrics.cold_zero_threshold` with this experiment's default ``delta``."""
    return _cold_zero_threshold(average, num_teachers, num_samples, delta)


def _per_sample_coverage_se(votes: np.ndarray, thresholds: np.ndarray) -> list[float]:
    """Standard error of the mean coverage over the ``r`` samples, per threshold."""
    per_sample = np.array([metrics.coverage(votes[h : h + 1], thresholds) for h in range(votes.shape[0])])
    if votes.shape[0] < 2:
        return [0.0] * thresholds.size
    return [float(x) for x in per_sample.std(axis=0, ddof=1) / np.sqrt(votes.shape[0])]


def _describe(values: np.ndarray) -> dict:
    stats = (("mean", np.mean), ("median", np.median), ("min", np.min), ("max", np.max))
    return {name: float(fn(values)) for name, fn in stats}


def _sweep(votes: np.ndarray, thresholds: np.ndarray, average: np.ndarray) -> dict:
    """The Section 5 metrics of one ensemble type, in the layout of ``histograms_experiment``'s ``hot``/``cold``
    plus ``coverage_se``, ``total_variation`` and ``frequency`` (mean count / n per answer)."""
    n = votes.shape[1]
    tv = [
        metrics.total_variation(metrics.transferred_distribution(votes, int(t), average.size), average)
        for t in thresholds
    ]
    counts = np.bincount(votes[votes >= 0].ravel(), minlength=average.size)
    return {
        "coverage": [float(x) for x in metrics.coverage(votes, thresholds)],
        "coverage_se": _per_sample_coverage_se(votes, thresholds),
        "support_size": [int(x) for x in metrics.support_size(votes, thresholds)],
        "average_yield": [float(x) for x in metrics.average_yield(votes, thresholds)],
        "total_variation": [float(x) for x in tv],
        "max_count": _describe(metrics.max_counts(votes)),
        "margin": _describe(metrics.margins(votes)),
        "frequency": [float(x) for x in counts / (votes.shape[0] * n)],
    }


# -- the model run -----------------------------------------------------------------------------------------


def _model_part(opts: dict, progress: bool) -> dict:
    import torch
    from tqdm import tqdm

    from ensembles.backends.transformers_backend import TransformersBackend
    from pate_app.experiments.answer_scoring import AnswerScorer
    from pate_app.run import demo_model_path


    n, k, r = opts["teachers"], opts["common_size"], opts["samples"]
    task_seed, vote_seed = np.random.SeedSequence([opts["seed"], 52]).spawn(2)
    task = make_task(n, k, np.random.default_rng(task_seed))
    if opts["model"] is None:

        model_path, model_name = demo_model_path(), "SmolLM2-135M-Instruct (embedded)"
    else:
        model_path, model_name = opts["model"], opts["model"]
    cuda = torch.cuda.is_available()
    batch_size = opts["batch_size"] or (64 if cuda else 32)
    started = time.perf_counter()
    backend = TransformersBackend(model_path, batch_size=batch_size, threads=opts["threads"])
    load_seconds = time.perf_counter() - started

    prefix, suffixes = build_prompts(backend.tokenizer, task)
    common = np.asarray(task["common"])
    private = np.asarray(task["private"])
    if opts["candidates"] == "all":
        numbers = FIRST_NUMBER + np.arange(NUM_NUMBERS)
    else:
        numbers = np.union1d(common, private)
    scorer = AnswerScorer(backend, [str(x) for x in numbers], min_prob=opts["min_prob"])
    started = time.perf_counter()
    with tqdm(total=n, desc="planet-z scoring", unit="teacher", disable=not progress, dynamic_ncols=True) as bar:
        scored = scorer.score(suffixes, prefix, progress=bar.update)
    score_seconds = time.perf_counter() - started

    # One "token" per three-digit number; unscored numbers have probability 0; the rest is the tail.
    probs = np.zeros((n, NUM_NUMBERS))
    probs[:, numbers - FIRST_NUMBER] = scored
    teachers = TeacherDistributions.from_dense(probs, tail=np.clip(1.0 - probs.sum(axis=1), 0.0, None))
    average = teachers.average()

    vote_rng = np.random.default_rng(vote_seed)
    started = time.perf_counter()
    hot_votes = coordinated_votes(teachers, r, vote_rng)
    cold_votes = independent_votes(teachers, r, vote_rng)
    paper_points = np.ceil(np.asarray(PAPER_FRACTIONS) * n).astype(np.int64)
    thresholds = np.union1d(experiments.threshold_grid(n), paper_points[paper_points >= 1])
    hot = _sweep(hot_votes, thresholds, average)
    cold = _sweep(cold_votes, thresholds, average)
    robust = [float(x) for x in metrics.robust_mass(teachers, thresholds)]
    taus = np.arange(1, n + 1)
    robust_all = [float(x) for x in metrics.robust_mass(teachers, taus)]
    vote_seconds = time.perf_counter() - started

    common_ids = common - FIRST_NUMBER
    dense = teachers.to_dense()
    private_mass = float(dense[np.arange(n), private - FIRST_NUMBER].mean())
    common_mass = float(average[common_ids].sum())
    number_mass = float(average.sum())
    max_average = float(average.max())
    t_list = [int(t) for t in thresholds]
    positive = np.flatnonzero(np.asarray(cold["coverage"]) > 0)
    zero_index = int(positive[-1]) + 1 if positive.size else 0
    zero_from = t_list[zero_index] if zero_index < len(t_list) else None
    bound = cold_zero_threshold(average, n, r)
    top = np.argsort(-average, kind="stable")[:15]
    common_flag = np.isin(np.arange(NUM_NUMBERS), common_ids)
    return {
        "parameters": {
            "num_teachers": n,
            "num_samples": r,
            "common_size": k,
            "seed": opts["seed"],
            "model": model_name,
            "device": str(backend.device),
            "dtype": str(backend.dtype).replace("torch.", ""),
            "candidates": opts["candidates"],
            "num_candidates": int(numbers.size),
            "min_prob": opts["min_prob"],
            "batch_size": batch_size,
            "vocab_size": NUM_NUMBERS,
            "answer_id": "number - 100",
        },
        "prompt": {
            "user_template": USER_TEMPLATE,
            "reply_lead": REPLY_LEAD,
            "example": prefix + suffixes[0],
            "shared_prefix_tokens": len(backend.encode(prefix)),
            "teacher_tokens_mean": float(np.mean([len(backend.encode(s)) for s in suffixes])),
            "scored_nodes_per_teacher": scorer.expanded_nodes / n,
        },
        "common_numbers": task["common"],
        "common_tokens": [int(x) for x in common_ids],
        "thresholds": t_list,
        "threshold_fractions": [t / n for t in t_list],
        "hot": hot,
        "cold": cold,
        "robust_mass": robust,
        "robust_mass_curve": {"tau": [int(t) for t in taus], "mass": robust_all},
        "max_average_probability": max_average,
        "common_mass": common_mass,
        "answers": {
            "number_mass": number_mass,
            "common_mass": common_mass,
            "private_mass": private_mass,
            "other_number_mass": max(0.0, number_mass - common_mass - private_mass),
            "tail_mass": float(teachers.average_tail),
            "average": [float(x) for x in average],
            "common_spread": [float(x) for x in dense[:, common_ids].std(axis=0)],
            "top": [
                {"number": int(j + FIRST_NUMBER), "average": float(average[j]), "in_common": bool(common_flag[j])}
                for j in top
            ],
        },
        "cold_zero_bound": {
            "threshold": bound,
            "delta": COLD_ZERO_DELTA,
            "bound": "Chernoff-Hoeffding: Pr[count >= T] <= exp(-n D(T/n || average probability)), "
            "union over answers and samples",
        },
        "summary": {
            "hot_median_max_count_fraction": hot["max_count"]["median"] / n,
            "cold_median_max_count_fraction": cold["max_count"]["median"] / n,
            "cold_coverage_zero_from": zero_from,
            "hot_coverage_there": hot["coverage"][zero_index] if zero_from is not None else None,
            "robust_mass_there": robust[zero_index] if zero_from is not None else None,
        },
        "seconds": {
            "load": round(load_seconds, 2),
            "scoring": round(score_seconds, 2),
            "votes_and_metrics": round(vote_seconds, 2),
        },
    }


def run(*, quick: bool, seed: int, progress: bool, **options) -> dict:
    """The whole experiment (see the module docstring); deterministic for a seed (wall times aside)."""
    opts = _options(quick, seed, options)
    started = time.perf_counter()
    model = None if opts["no_model"] else _model_part(opts, progress)
    model_free = []
    for k in opts["model_free_common_sizes"]:
        part = experiments.histograms_experiment(
            opts["model_free_teachers"], opts["model_free_samples"], k, opts["seed"], progress=progress
        )
        # Conservative: every one of the at most 901 answers (900 numbers, one junk token) is given the
        # maximum average probability.
        pmax = np.full(NUM_NUMBERS + 1, part["max_average_probability"])
        part["cold_zero_bound"] = {
            "threshold": cold_zero_threshold(pmax, opts["model_free_teachers"], opts["model_free_samples"]),
            "delta": COLD_ZERO_DELTA,
            "bound": "Chernoff-Hoeffding as for the model run, every answer at the maximum average probability",
        }
        model_free.append(part)
    parameters = {key: opts[key] for key in ("quick", "seed", "teachers", "common_size", "samples", "candidates",
                                             "min_prob", "model_free_teachers", "model_free_samples",
                                             "model_free_common_sizes", "no_model")}
    parameters["model"] = opts["model"] or "embedded SmolLM2-135M-Instruct"
    return {
        "experiment": NAME,
        "parameters": parameters,
        "model": model,
        "model_free": model_free,
        "wall_seconds": round(time.perf_counter() - started, 2),
    }


# -- report ------------------------------------------------------------------------------------------------


def summary(result: dict) -> str:
    """The model run's distribution facts, threshold table and claims; one line per model-free run."""
    lines = []
    model = result["model"]
    if model is not None:
        p = model["parameters"]
        a = model["answers"]
        n = p["num_teachers"]
        lines.append(
            f"Planet Z with {p['model']} on {p['device']}: n={n} teachers, k={p['common_size']}, "
            f"r={p['num_samples']} histograms per ensemble, {p['num_candidates']} candidate answers "
            f"({p['candidates']}), min_prob={p['min_prob']:g}, seed={p['seed']}"
        )
        lines.append(
            f"average mass: three-digit numbers {a['number_mass']:.3f} (C {a['common_mass']:.3f}, private "
            f"{a['private_mass']:.3f}, other {a['other_number_mass']:.3f}); tail {a['tail_mass']:.3f}; "
            f"max average answer probability {model['max_average_probability']:.3f} "
            f"(n x that = {n * model['max_average_probability']:.1f} votes)"
        )
        lines.append("")
        lines.append(experiments.format_table(model))
        lines.append("")
        lines.append(experiments.format_summary(model))
        bound = model["cold_zero_bound"]["threshold"]
        lines.append(
            "Chernoff bound: Cold coverage is 0 for T >= "
            + (f"{bound} (delta {model['cold_zero_bound']['delta']:g})" if bound is not None else "no T <= n")
        )
        above = [i for i, t in enumerate(model["thresholds"]) if t > n * model["max_average_probability"]]
        hot, cold = model["hot"], model["cold"]
        holds = all(hot["coverage"][i] >= cold["coverage"][i] and hot["support_size"][i] >= cold["support_size"][i]
                    for i in above)
        lines.append(
            f"Hot coverage and support >= Cold at all {len(above)} thresholds above n x max average probability: "
            + ("yes" if holds else "NO")
        )
        s = model["seconds"]
        lines.append(
            f"model load {s['load']:.1f} s, scoring {s['scoring']:.1f} s, "
            f"votes and metrics {s['votes_and_metrics']:.1f} s"
        )
    for part in result["model_free"]:
        bound = part["cold_zero_bound"]["threshold"]
        lines.append(
            "model-free planet_z_like: " + experiments.format_summary(part)
            + (f"; Chernoff bound: Cold coverage is 0 for T >= {bound}" if bound is not None else "")
        )
    lines.append(f"total {result['wall_seconds']:.1f} s")
    return "\n".join(lines)


def _canvas(nrows: int = 1, ncols: int = 1, size=(6.4, 4.4)):

    fig = new_figure(size)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


_HOT = {"color": COLORS["hot"], "marker": "o", "markersize": 3, "label": "Hot (coordinated)"}
_COLD = {"color": COLORS["cold"], "marker": "s", "markersize": 3, "label": "Cold (independent)"}


@styled
def _plot_model_metrics(model: dict, path: Path) -> None:
    """Paper Figure "frequency_cdf": yield, coverage, TV against T, and coverage against support size."""
    p = model["parameters"]
    n = p["num_teachers"]
    t = np.asarray(model["thresholds"], dtype=np.float64)
    fig, axes = _canvas(2, 2, size=(10.0, 7.6))
    fig.suptitle(
        f"Planet Z, {p['model']}: n={n}, k={p['common_size']}, r={p['num_samples']}, seed={p['seed']}"
    )
    hot, cold = model["hot"], model["cold"]
    panels = [
        (axes[0, 0], "average_yield", "average yield per sample"),
        (axes[0, 1], "coverage", "coverage (transferred mass)"),
        (axes[1, 0], "total_variation", "TV(transferred, average distribution)"),
    ]
    for ax, key, label in panels:
        ax.plot(t, hot[key], **_HOT)
        ax.plot(t, cold[key], **_COLD)
        ax.axvline(n * model["max_average_probability"], color="gray", linestyle=":", linewidth=1,
                   label="n x max average probability")
        if key == "coverage":
            ax.plot(t, model["robust_mass"], color="black", linestyle="--", label="robust mass P(tau = T)")
        ax.set_xscale("log")
        ax.set_xlabel("threshold T (votes)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    ax = axes[1, 1]
    ax.plot(hot["support_size"], hot["coverage"], **_HOT)
    ax.plot(cold["support_size"], cold["coverage"], **_COLD)
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlabel("support size (answers reaching T in some sample)")
    ax.set_ylabel("coverage")
    ax.set_title("Coverage against support size, sweeping T")
    ax.grid(True, alpha=0.3)
    handles, labels = axes[0, 1].get_legend_handles_labels()  # one legend for the four panels, under them
    fig.legend(handles, labels, loc="outside lower center", ncols=4)
    fig.savefig(path)


@styled
def _plot_robust_mass(result: dict, path: Path) -> None:
    """Appendix D.1 figure "taurobust": P(tau) against tau / n."""
    fig, axes = _canvas()
    ax = axes[0, 0]
    model = result["model"]
    if model is not None:
        curve = model["robust_mass_curve"]
        n = model["parameters"]["num_teachers"]
        ax.plot(np.asarray(curve["tau"]) / n, curve["mass"], color=COLORS["hot"],
                label=f"{model['parameters']['model']} (n={n}, k={model['parameters']['common_size']})")
    for part, style in zip(result["model_free"], ("--", "-.", ":")):
        p = part["parameters"]
        ax.plot(part["threshold_fractions"], part["robust_mass"], color="black", linestyle=style,
                label=f"model-free planet_z_like (n={p['num_teachers']}, k={p['common_size']})")
    ax.set_xlabel("tau / n")
    ax.set_ylabel("tau-robust mass P(tau)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Mass of the average distribution that a support of tau votes can carry")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.savefig(path)


@styled
def _plot_answers(model: dict, path: Path) -> None:
    """Appendix D.1 figures "averageprob_freq": average probability and mean Hot/Cold vote frequency per number."""
    numbers = FIRST_NUMBER + np.arange(NUM_NUMBERS)
    common = np.zeros(NUM_NUMBERS, dtype=bool)
    common[model["common_tokens"]] = True
    fig, axes = _canvas(3, 1, size=(9.0, 8.0))
    rows = [
        (model["answers"]["average"], "average probability over teachers"),
        (model["cold"]["frequency"], "Cold: mean votes / n"),
        (model["hot"]["frequency"], "Hot: mean votes / n"),
    ]
    for ax, (values, label) in zip(axes[:, 0], rows):
        values = np.asarray(values)
        ax.bar(numbers[~common], values[~common], width=1.0, color=COLORS["fail"], label="not in C")
        ax.bar(numbers[common], values[common], width=2.0, color=COLORS["queries"], label="in C (the common answers)")
        ax.set_ylabel(label)
        ax.set_xlim(FIRST_NUMBER - 5, FIRST_NUMBER + NUM_NUMBERS + 5)
        ax.grid(True, alpha=0.3)
    axes[0, 0].legend()
    axes[-1, 0].set_xlabel("answer (three-digit number)")
    p = model["parameters"]
    axes[0, 0].set_title(f"Planet Z answers, {p['model']}: n={p['num_teachers']}, k={p['common_size']}")
    fig.savefig(path)


def plot(result: dict, out_dir) -> list[Path]:
    """PNG figures: ``planet_z_metrics.png`` (yield, coverage, TV, coverage vs support),
    ``planet_z_answers.png`` (per-number averages), ``planet_z_robust_mass.png`` (P(tau)) and, per
    model-free run, ``planet_z_model_free_k{K}_coverage.png`` / ``..._support.png`` (drawn by
    :func:`pate_app.experiments.histograms.plot_histograms_experiment`)."""

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    model = result["model"]
    if model is not None:
        for name, draw in (("planet_z_metrics.png", _plot_model_metrics), ("planet_z_answers.png", _plot_answers)):
            draw(model, out / name)
            paths.append(out / name)
    _plot_robust_mass(result, out / "planet_z_robust_mass.png")
    paths.append(out / "planet_z_robust_mass.png")
    for part in result["model_free"]:
        k = part["parameters"]["common_size"]
        with tempfile.TemporaryDirectory() as scratch:
            for drawn in experiments.plot_histograms_experiment(part, scratch):
                target = out / f"planet_z_model_free_k{k}_{drawn.name.removeprefix('histograms_')}"
                target.write_bytes(drawn.read_bytes())
                paths.append(target)
    return paths
