"""Synthetic instruction generation from Dolly-style records: Hot vs Cold next-token histograms (paper Section 5.1).

The paper's natural task (Section 5.1, Figures "Dolly15k diversity transfer" and "Dolly15k more benefits",
Appendix "Further details for the instruction generation demonstration"): instructions without context and
shorter than 256 characters are split between ``n`` teachers; each teacher is a language model prompted with
its part as few-shot examples and asked for one new instruction.  For a few partial instructions ``R``
(prefixes), every teacher's next-token distribution is read once and ``r`` coordinated (Algorithm 1, Hot
PATE) and ``r`` independent (Cold PATE) vote histograms are drawn from them.  Per prefix we report

* coverage (transferred probability mass) and transferred support size against the threshold ``T``
  (:func:`ensembles.metrics.coverage`, :func:`ensembles.metrics.support_size`), and the average yield;
* the largest count of a histogram in one try and the best of ``retries`` (10) tries with fresh shared
  randomness (:func:`ensembles.metrics.max_counts`), and the margin between the top two counts
  (:func:`ensembles.metrics.margins`), one try and best of ``retries``;
* the maximum average token probability ``p_max = max_j (1/n) sum_i p_ij``: independent counts concentrate
  around ``n p_j``, so Cold coverage vanishes once ``T/n`` is clearly above ``p_max``;
  :func:`ensembles.metrics.cold_zero_threshold` (Chernoff-Hoeffding per token, union over the
  tokens and the ``r`` samples, failure probability ``COLD_BOUND_DELTA``) gives the ``T`` from which no
  Cold count is that high in any sample, except with that probability.

Prefixes: the empty prefix (the first token of the instruction) or a fixed start text (``--start``), then
each next prefix appends the *majority token*: the most likely token of the ensemble's average
distribution that does not end the instruction (no newline, not end-of-text).  So the prefixes follow the
ensemble's greedy consensus; the distributions of every prefix are read exactly once.

Setup differences from the paper (docs/results.md, section instructions): the embedded SmolLM2-135M-Instruct instead
of the pre-trained Llama-3.1-8B; by default the small bundled Dolly-format sample (``--data`` takes a
user's ``databricks-dolly-15k.jsonl``), so ``n`` is capped by the number of records; each teacher's
distribution is truncated to its top-``p`` (0.99 by default) set with the rest an explicit tail whose
votes belong to no token (this keeps the vote kernels sparse; it lowers coverage by at most the average
tail mass, reported per prefix).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ensembles import metrics
from ensembles.data import partition_records, teacher_prompts
from ensembles.histograms import coordinated_votes, independent_votes
from ensembles.metrics import cold_zero_threshold
from pate_accountant.validation import check_int, check_real
from pate_app.experiments import model_option, records_option, size_option
from pate_app.experiments.histograms import threshold_grid
from pate_app.plotting import COLORS, new_figure, styled

__all__ = [
    "DESCRIPTION",
    "FULL_RUNTIME",
    "HELP",
    "NAME",
    "SIZES",
    "add_arguments",
    "plot",
    "run",
    "summary",
]

NAME = "instructions"
HELP = "Hot vs Cold next-token histograms of in-context teachers writing a new instruction (paper Sec. 5.1)"
DESCRIPTION = (
    "Split Dolly-format instructions (default: the bundled sample; --data for databricks-dolly-15k.jsonl, "
    "filtered as the paper does) between n few-shot teachers on a local causal LM (default: the embedded "
    "SmolLM2-135M-Instruct), read every teacher's next-token distribution for a few prefixes of a new "
    "instruction (the empty prefix, then the ensemble's majority token appended step by step), and draw r "
    "coordinated (Hot PATE) and r independent (Cold PATE) vote histograms per prefix: coverage and "
    "transferred support size against the threshold T, the largest count in one try and in 10 tries, and "
    "the margin between the two largest counts."
)
SIZES = {
    "full": {"teachers": 512, "prefixes": 8, "samples": 1000},
    "quick": {"teachers": 16, "prefixes": 2, "samples": 500},
}
FULL_RUNTIME = ("about 40 s on a 2-core CPU with the 201-record bundled sample, i.e. n = 201 teachers of one record "
                "each")

#: Records per teacher (the paper's 10 instructions per context); fewer when the data run out.
EXAMPLES = 10
#: Tries per step for the "max over tries" statistics (paper: 10).
RETRIES = 10
#: Per-teacher top-p truncation (the rest is a tail whose votes belong to no token).
TOP_P = 0.99
#: Failure probability of the Chernoff bound behind ``cold_zero_bound`` (ensembles.metrics.cold_zero_threshold).
COLD_BOUND_DELTA = 1e-3
#: Levels (fractions of n) at which the share of histograms whose max count / margin reaches them is kept.
SHARE_LEVELS = (0.2, 0.4, 0.6, 0.9)
#: Tokens shown per prefix (most likely under the average distribution).
TOP_TOKENS = 5


def add_arguments(parser) -> None:
    """The experiment's own options (sizes default to ``SIZES``)."""
    parser.add_argument("--data", metavar="FILE", default=None,
                        help="Dolly-format JSON lines (e.g. databricks-dolly-15k.jsonl); records with a context "
                             "or an instruction of 256 characters or more are dropped (default: the bundled "
                             "sample)")
    parser.add_argument("--model", metavar="PATH", default=None,
                        help="local model folder or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    size_option(parser, SIZES, "--teachers", "N", "number of teachers, capped by the number of records")
    size_option(parser, SIZES, "--prefixes", "K", "number of prefixes")
    size_option(parser, SIZES, "--samples", "R", "histograms per prefix and ensemble type")
    parser.add_argument("--examples", metavar="K", type=int, default=EXAMPLES,
                        help=f"records per teacher prompt (default {EXAMPLES}, as in the paper; fewer if the "
                             "data run out)")
    parser.add_argument("--retries", metavar="K", type=int, default=RETRIES,
                        help=f"tries per step for the best-of-tries statistics (default {RETRIES})")
    parser.add_argument("--top-p", metavar="P", type=float, default=TOP_P,
                        help=f"per-teacher top-p truncation, the rest a tail that votes for no token; 1 keeps "
                             f"the full distributions (slow) (default {TOP_P})")
    parser.add_argument("--start", metavar="TEXT", default="",
                        help="fixed start of the instruction before the first prefix (default: empty)")
    parser.add_argument("--threads", metavar="N", type=int, default=None,
                        help="CPU threads for the model and the vote kernels (default: 2 for the model, the "
                             "available cores up to 8 for the votes)")


# -- the run ---------------------------------------------------------------------------------------------
def _options(quick, teachers, prefixes, samples, examples, retries, top_p, threads, start):
    size = SIZES["quick" if quick else "full"]
    teachers = size["teachers"] if teachers is None else check_int("--teachers", teachers, minimum=1)
    prefixes = size["prefixes"] if prefixes is None else check_int("--prefixes", prefixes, minimum=1)
    samples = size["samples"] if samples is None else check_int("--samples", samples, minimum=1)
    examples = check_int("--examples", examples, minimum=1)
    retries = check_int("--retries", retries, minimum=1)
    if samples < retries:
        raise ValueError(f"--samples must be at least --retries ({retries}), got {samples}")
    top_p = check_real("--top-p", top_p, minimum=0.0, maximum=1.0, min_open=True)
    if threads is not None:
        threads = check_int("--threads", threads, minimum=1)
    if not isinstance(start, str):
        raise TypeError(f"--start must be a string, got {type(start).__name__}")
    if "\n" in start:
        raise ValueError("--start must not contain a newline (an instruction is one line)")
    return teachers, prefixes, samples, examples, retries, top_p, threads


def _distribution(values: np.ndarray, n: int) -> dict:
    """Quantiles (in votes) of a per-histogram statistic, and the share of histograms reaching each level."""
    values = np.asarray(values, dtype=np.float64)
    q05, q25, median, q75, q95 = np.quantile(values, [0.05, 0.25, 0.5, 0.75, 0.95])
    return {
        "mean": float(values.mean()),
        "min": int(values.min()),
        "q05": float(q05),
        "q25": float(q25),
        "median": float(median),
        "q75": float(q75),
        "q95": float(q95),
        "max": int(values.max()),
        "share_at_least": {f"{level:g}": float((values >= level * n).mean()) for level in SHARE_LEVELS},
    }


def _ensemble(votes: np.ndarray, thresholds: np.ndarray, retries: int) -> dict:
    n = votes.shape[1]
    per_try = metrics.margins(votes)
    groups = per_try.size // retries
    return {
        "coverage": [float(x) for x in metrics.coverage(votes, thresholds)],
        "support_size": [int(x) for x in metrics.support_size(votes, thresholds)],
        "average_yield": [float(x) for x in metrics.average_yield(votes, thresholds)],
        "max_count": _distribution(metrics.max_counts(votes), n),
        "max_count_retries": _distribution(metrics.max_counts(votes, retries=retries), n),
        "margin": _distribution(per_try, n),
        "margin_retries": _distribution(per_try[: groups * retries].reshape(groups, retries).max(axis=1), n),
    }


def _zero_from(thresholds: list, values: list):
    """The first threshold from which ``values`` are all 0 (``None`` if the last one is positive)."""
    positive = np.flatnonzero(np.asarray(values) > 0)
    first = int(positive[-1]) + 1 if positive.size else 0
    return thresholds[first] if first < len(thresholds) else None


def _majority_token(backend, average: np.ndarray) -> int:
    """The most likely token of the average distribution that does not end the instruction."""
    eos = backend.eos_token_id
    special = set(getattr(backend.tokenizer, "all_special_ids", []) or [])
    for token in np.argsort(-average, kind="stable")[:256]:
        token = int(token)
        if average[token] <= 0:
            break
        if token == eos or token in special or "\n" in backend.decode([token]):
            continue
        return token
    raise RuntimeError("no non-terminating token among the 256 most likely: cannot extend the prefix")


def run(*, quick: bool, seed: int, progress: bool, data=None, model=None, teachers=None, prefixes=None,
        samples=None, examples: int = EXAMPLES, retries: int = RETRIES, top_p: float = TOP_P, start: str = "",
        threads=None) -> dict:
    """The whole experiment (module docstring); deterministic for a ``seed`` on a given machine.

    Randomness: ``numpy.random.default_rng(seed)`` picks ``min(n * examples, records)`` records and
    partitions them between the ``n`` teachers (:func:`ensembles.data.partition_records`), then draws, per
    prefix, the coordinated votes and then the independent votes.  Bad option values raise ``ValueError``
    (or ``TypeError``) naming the option, before the model is loaded.
    """
    from tqdm import tqdm

    from ensembles.backends.transformers_backend import TransformersBackend


    started = time.perf_counter()
    seed = check_int("--seed", seed, minimum=0)
    teachers, num_prefixes, r, examples, retries, top_p, threads = _options(
        quick, teachers, prefixes, samples, examples, retries, top_p, threads, start)
    records, data_label = records_option(data)
    model_path, model_label = model_option(model)
    n = min(teachers, len(records))

    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(records), size=min(n * examples, len(records)), replace=False)
    parts = partition_records([records[i] for i in chosen], n, rng)
    shared_prefix, prompts = teacher_prompts(parts)
    part_sizes = [len(part) for part in parts]
    thresholds = threshold_grid(n)
    t_list = [int(t) for t in thresholds]

    results = []
    with tqdm(total=2 + 2 * num_prefixes, desc=NAME, unit="step", disable=not progress,
              dynamic_ncols=True) as bar:

        bar.set_postfix_str("loading model")
        try:
            backend = TransformersBackend(model_path, top_p=None if top_p >= 1.0 else top_p, threads=threads)
        except ValueError as exc:
            raise ValueError(f"--model: {exc}") from None
        bar.update()
        bar.set_postfix_str(f"prefill {n} teachers")
        backend.begin(prompts, shared_prefix)
        tokens: list[int] = []
        if start:
            start_text = start if start[:1].isspace() else " " + start
            for token in backend.encode(start_text):
                backend.append(token)
        bar.update()
        for k in range(num_prefixes):
            dists = backend.distributions()  # read once per prefix: every histogram below comes from it
            average = dists.average()
            entry = {
                "index": k,
                "tokens": list(tokens),
                "text": start + backend.decode(tokens) if start else backend.decode(tokens),
                "top_tokens": [
                    {"token": int(j), "text": backend.decode([int(j)]), "probability": float(average[j])}
                    for j in np.argsort(-average, kind="stable")[:TOP_TOKENS]
                ],
                "max_average_probability": float(average.max()),
                "average_tail": float(dists.average_tail),
                "cold_zero_bound": cold_zero_threshold(average, n, r, COLD_BOUND_DELTA),
            }
            bar.set_postfix_str(f"prefix {k}: Hot votes")
            hot = coordinated_votes(dists, r, rng, num_threads=threads)
            bar.update()
            bar.set_postfix_str(f"prefix {k}: Cold votes")
            cold = independent_votes(dists, r, rng, num_threads=threads)
            entry["hot"] = _ensemble(hot, thresholds, retries)
            entry["cold"] = _ensemble(cold, thresholds, retries)
            entry["cold_coverage_zero_from"] = _zero_from(t_list, entry["cold"]["coverage"])
            entry["hot_coverage_zero_from"] = _zero_from(t_list, entry["hot"]["coverage"])
            bar.update()
            if k + 1 < num_prefixes:
                token = _majority_token(backend, average)
                entry["next_token"] = token
                tokens.append(token)
                backend.append(token)
            results.append(entry)

    return {
        "experiment": NAME,
        "parameters": {
            "teachers": n,
            "teachers_requested": teachers,
            "records": len(records),
            "records_used": int(chosen.size),
            "examples_per_teacher": {"min": min(part_sizes), "max": max(part_sizes)},
            "prefixes": num_prefixes,
            "samples": r,
            "retries": retries,
            "top_p": top_p,
            "start": start,
            "continuation": "majority token of the average distribution (not ending the instruction)",
            "seed": seed,
            "quick": bool(quick),
            "data": data_label,
            "model": model_label,
            "vocab_size": int(backend.vocab_size),
            "cold_bound_delta": COLD_BOUND_DELTA,
        },
        "thresholds": t_list,
        "threshold_fractions": [t / n for t in t_list],
        "prefixes": results,
        "runtime_seconds": round(time.perf_counter() - started, 1),
    }


# -- report ----------------------------------------------------------------------------------------------
def _label(entry: dict, width: int = 28) -> str:
    text = entry["text"]
    if not text:
        return "R=(empty)"
    text = text if len(text) <= width else "..." + text[-(width - 3):]
    return f"R={text.strip()!r}"


def _nearest(thresholds: list, target: float) -> int:
    return int(np.argmin(np.abs(np.asarray(thresholds, dtype=np.float64) - target)))


def summary(result: dict) -> str:
    """Parameters, then one row per prefix: p_max, where Cold coverage ends, coverage and support at
    ``T ~ n/2``, median largest count (one try / best of tries) and median margin, Hot vs Cold."""
    p = result["parameters"]
    n = p["teachers"]
    t = result["thresholds"]
    half = _nearest(t, n / 2)
    lines = [
        f"instructions: n={n} teachers ({p['examples_per_teacher']['min']}-{p['examples_per_teacher']['max']} "
        f"records each; {p['data']}), model {p['model']}, r={p['samples']} histograms per prefix and "
        f"ensemble, top-p {p['top_p']:g}, seed {p['seed']}; {result.get('runtime_seconds')} s",
        f"columns: p_max = max average token probability; Cold0 = first T with Cold coverage 0 "
        f"(bound: Chernoff, delta {p['cold_bound_delta']:g}); cov/supp at T={t[half]} (~n/2); "
        f"max1/max{p['retries']} = median largest count, one try / best of {p['retries']}; margin = median "
        "top-minus-second count; all counts as fractions of n; H = Hot (coordinated), C = Cold (independent)",
        f"{'prefix':<32} {'p_max':>5} {'Cold0':>5} {'bound':>5} | {'cov H':>5} {'cov C':>5} | {'supp H':>6} "
        f"{'supp C':>6} | {'max1 H':>6} {'max1 C':>6} | {'maxK H':>6} {'maxK C':>6} | {'mrg H':>5} {'mrg C':>5}",
    ]
    lines.append("-" * len(lines[-1]))
    for e in result["prefixes"]:
        hot, cold = e["hot"], e["cold"]
        zero = e["cold_coverage_zero_from"]
        bound = e["cold_zero_bound"]
        lines.append(
            f"{_label(e):<32} {e['max_average_probability']:>5.2f} {'-' if zero is None else zero:>5} "
            f"{'-' if bound is None else bound:>5} | {hot['coverage'][half]:>5.2f} {cold['coverage'][half]:>5.2f} | "
            f"{hot['support_size'][half]:>6d} {cold['support_size'][half]:>6d} | "
            f"{hot['max_count']['median'] / n:>6.2f} {cold['max_count']['median'] / n:>6.2f} | "
            f"{hot['max_count_retries']['median'] / n:>6.2f} {cold['max_count_retries']['median'] / n:>6.2f} | "
            f"{hot['margin']['median'] / n:>5.2f} {cold['margin']['median'] / n:>5.2f}"
        )
    return "\n".join(lines)


_HOT = {"color": COLORS["hot"], "label": "Hot (coordinated)"}
_COLD = {"color": COLORS["cold"], "label": "Cold (independent)"}


def _grid_figure(count: int):

    cols = min(4, count)
    rows = -(-count // cols)
    fig = new_figure((3.6 * cols, 3.0 * rows + 0.6))
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[count:]:
        ax.set_visible(False)
    return fig, axes


def _title(result: dict) -> str:
    p = result["parameters"]
    return (f"{p['model']}, n={p['teachers']} teachers\n{p['data']}, r={p['samples']} histograms, "
            f"seed {p['seed']}")


@styled
def _plot_threshold_grid(result: dict, key: str, ylabel: str, path: Path, log: bool) -> Path:
    n = result["parameters"]["teachers"]
    x = np.asarray(result["threshold_fractions"])
    fig, axes = _grid_figure(len(result["prefixes"]))
    for ax, e in zip(axes, result["prefixes"]):
        ax.plot(x, e["hot"][key], marker="o", markersize=2.5, **_HOT)
        ax.plot(x, e["cold"][key], marker="s", markersize=2.5, **_COLD)
        ax.axvline(e["max_average_probability"], color="gray", linestyle=":", linewidth=1,
                   label="max average token probability")
        if e["cold_zero_bound"] is not None:
            ax.axvline(e["cold_zero_bound"] / n, color=COLORS["cold"], linestyle="--", linewidth=0.8,
                       label="Cold = 0 from here (Chernoff bound)")
        if log:
            ax.set_yscale("symlog", linthresh=1.0)
            ax.set_ylim(0.0, 2.0 * max(1, *e["hot"][key], *e["cold"][key]))
        else:
            ax.set_ylim(-0.02, 1.02)
        ax.set_title(_label(e, 40))
        ax.set_xlabel("T / n")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2)
    fig.suptitle(_title(result))
    fig.savefig(path)
    return path


def _stats(dist: dict, n: int) -> dict:
    return {"med": dist["median"] / n, "q1": dist["q25"] / n, "q3": dist["q75"] / n, "whislo": dist["q05"] / n,
            "whishi": dist["q95"] / n, "mean": dist["mean"] / n, "fliers": []}


@styled
def _plot_boxes(result: dict, keys: tuple, titles: tuple, ylabel: str, path: Path) -> Path:
    from matplotlib.patches import Patch


    n = result["parameters"]["teachers"]
    entries = result["prefixes"]
    width = max(6.4, 0.9 * len(entries) + 2.0)
    fig = new_figure((width, 3.6 * len(keys)))
    axes = fig.subplots(len(keys), 1, squeeze=False).ravel()
    positions = np.arange(len(entries), dtype=np.float64)
    for ax, key, title in zip(axes, keys, titles):
        for style, ensemble, shift in ((_HOT, "hot", -0.18), (_COLD, "cold", 0.18)):
            ax.bxp([_stats(e[ensemble][key], n) for e in entries], positions=positions + shift, widths=0.3,
                   showmeans=True, patch_artist=True,
                   boxprops={"facecolor": style["color"], "alpha": 0.35, "edgecolor": style["color"]},
                   medianprops={"color": style["color"]}, whiskerprops={"color": style["color"]},
                   capprops={"color": style["color"]},
                   meanprops={"marker": "D", "markersize": 3, "markerfacecolor": style["color"],
                              "markeredgecolor": style["color"]})
        ax.set_xticks(positions, [_label(e, 22) for e in entries], rotation=25, ha="right")
        ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, axis="y", alpha=0.3)
    fig.legend(handles=[Patch(color=_HOT["color"], alpha=0.5, label=_HOT["label"]),
                        Patch(color=_COLD["color"], alpha=0.5, label=_COLD["label"])],
               loc="outside lower center", ncols=2)
    fig.suptitle(_title(result) + "\nboxes: quartiles, whiskers: 5%-95%, diamond: mean")
    fig.savefig(path)
    return path


def plot(result: dict, out_dir) -> list[Path]:
    """Write the figures into ``out_dir`` (created if missing) and return their paths:

    * ``instructions_coverage.png`` / ``instructions_support.png``: coverage and transferred support size
      against ``T/n``, one panel per prefix (paper Figures "Dolly15k diversity transfer");
    * ``instructions_max_count.png``: the largest count per histogram, one try and best of ``retries``
      (paper Figure "Dolly15k more benefits", left and middle, and Appendix "Maximum count");
    * ``instructions_margin.png``: the margin between the two largest counts, one try and best of
      ``retries`` (paper Figure "Dolly15k more benefits", right, and Figure "Dolly15k margin").
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    k = result["parameters"]["retries"]
    return [
        _plot_threshold_grid(result, "coverage", "coverage", out / "instructions_coverage.png", log=False),
        _plot_threshold_grid(result, "support_size", "transferred support size", out / "instructions_support.png",
                             log=True),
        _plot_boxes(result, ("max_count", "max_count_retries"), ("one try", f"best of {k} tries"),
                    "largest count / n", out / "instructions_max_count.png"),
        _plot_boxes(result, ("margin", "margin_retries"), ("one try", f"best of {k} tries"),
                    "top minus second count / n", out / "instructions_margin.png"),
    ]
