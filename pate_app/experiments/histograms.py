"""``pate-accountant experiment histograms``: Hot versus Cold vote histograms (docs/cli.md).

:func:`histograms_experiment` is the Hot-versus-Cold comparison of the paper's Planet Z demonstration
(Section 5.2, Figure "coverage" and Appendix D.1), run on the model-free stand-in
:func:`ensembles.synthetic.planet_z_like`: draw ``r`` coordinated histograms (Algorithm 1, Hot PATE) and
``r`` independent histograms (Cold PATE) from the same ``n`` teachers, and sweep the threshold ``T``:

* coverage (transferred probability mass), support size and average yield per sample, Hot vs Cold;
* the tau-robust mass ``P(tau)`` of Remark D.1 at ``tau = T``, the indicative upper bound on what a
  threshold ``T`` can transfer;
* the maximum average token probability ``max_j (1/n) sum_i p_ij``: independent counts concentrate
  around ``n`` times the average probability, so Cold coverage vanishes once ``T/n`` exceeds it;
* summary statistics of the per-sample top count and margin (what DP aggregators pay for).

Everything returned is plain JSON data (lists, floats, ints, strings), deterministic for a seed.
:func:`plot_histograms_experiment` draws the figures (matplotlib, imported lazily, Agg canvas).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ensembles import metrics, synthetic
from ensembles.histograms import coordinated_votes, independent_votes
from pate_accountant.validation import check_int
from pate_app.options import int_in
from pate_app.plotting import COLORS, legend_outside, new_figure, styled

__all__ = [
    "DESCRIPTION",
    "FULL_RUNTIME",
    "HELP",
    "MAX_COMMON_SIZE",
    "MAX_SAMPLES",
    "MAX_TEACHERS",
    "MAX_VOTES",
    "NAME",
    "SIZES",
    "add_arguments",
    "plot",
    "run",
    "summary",
    "format_summary",
    "format_table",
    "histograms_experiment",
    "plot_histograms_experiment",
    "threshold_grid",
]

#: Numbers in the Planet Z stand-in (the 900 three-digit numbers) and the generalisation support used;
#: ``planet_z_like`` needs ``common_size <= num_numbers - generalization_support - 1``.
_NUM_NUMBERS = 900
_GENERALIZATION_SUPPORT = 64
MAX_COMMON_SIZE = _NUM_NUMBERS - _GENERALIZATION_SUPPORT - 1

NAME = "histograms"
HELP = "Hot vs Cold vote histograms on a Planet Z-like ensemble (coverage, support, yield)"
DESCRIPTION = (
    "Draw coordinated (Hot PATE) and independent (Cold PATE) vote histograms from a synthetic "
    "Planet Z-like ensemble and sweep the threshold T: coverage, support size and average "
    "yield, with the tau-robust mass P(T) of Remark D.1."
)
SIZES = {"full": {"teachers": 2000, "samples": 1000}, "quick": {"teachers": 300, "samples": 200}}
FULL_RUNTIME = "about 10 s on a 2-core CPU"
DEFAULT_COMMON_SIZE = 20

#: The documented ranges of the sizes (docs/ranges.md), measured on a 2-core machine: every teacher's
#: distribution over the Planet Z vocabulary costs about 30 KB (and 0.15 ms), every vote about 60 bytes and
#: 0.7 microseconds (two int64 vote matrices, Hot and Cold, and the metrics' work arrays).  At the limits the
#: run needs about 1.5 GB for the teachers or 1.8 GB and 20 s for the votes.
MAX_TEACHERS = 50_000
MAX_SAMPLES = 100_000
#: ``teachers x samples``: the size of each of the two vote matrices.
MAX_VOTES = 3 * 10**7

#: Vote draws are split into this many chunks so a progress bar moves during long runs.
_VOTE_CHUNKS = 10


def threshold_grid(num_teachers: int, size: int = 25) -> np.ndarray:
    """About ``size`` integer thresholds in ``[1, n]``: geometric up to ``n/10``, then linear up to ``n``.

    The geometric half resolves small ``T`` (where Cold PATE still transfers something), the linear half
    the large ``T`` where only coordinated histograms do.  Always contains ``1`` and ``n``; sorted,
    without repeats (so small ``n`` gives fewer points).
    """
    n = check_int("num_teachers", num_teachers, minimum=1)
    size = check_int("size", size, minimum=4)
    knee = max(1.0, n / 10.0)
    geometric = np.geomspace(1.0, knee, size // 2)
    linear = np.linspace(knee, n, size - size // 2 + 1)
    grid = np.unique(np.clip(np.rint(np.concatenate([geometric, linear])), 1, n).astype(np.int64))
    return grid


def _summary(values: np.ndarray) -> dict:
    values = np.asarray(values, dtype=np.float64)
    return {
        "mean": float(values.mean()),
        "median": float(np.median(values)),
        "min": int(values.min()),
        "max": int(values.max()),
    }


def _ensemble_metrics(votes: np.ndarray, thresholds: np.ndarray) -> dict:
    return {
        "coverage": [float(x) for x in metrics.coverage(votes, thresholds)],
        "support_size": [int(x) for x in metrics.support_size(votes, thresholds)],
        "average_yield": [float(x) for x in metrics.average_yield(votes, thresholds)],
        "max_count": _summary(metrics.max_counts(votes)),
        "margin": _summary(metrics.margins(votes)),
    }


def _first_zero(thresholds: list, values: list):
    """The first threshold from which ``values`` stay 0 (``None`` if the last value is positive)."""
    index = len(values)
    while index > 0 and values[index - 1] == 0:
        index -= 1
    return thresholds[index] if index < len(values) else None


def histograms_experiment(
    num_teachers: int,
    num_samples: int,
    common_size: int,
    seed: int,
    progress: bool = True,
) -> dict:
    """Coverage, support size and yield of Hot (coordinated) vs Cold (independent) histograms.

    Builds ``planet_z_like(num_teachers, rng, common_size=common_size)`` with
    ``rng = numpy.random.default_rng(seed)``, then draws ``num_samples`` coordinated and ``num_samples``
    independent vote vectors from the same ``rng`` (in that order, in fixed chunks), so the result is a
    deterministic function of the arguments.  ``progress`` shows a tqdm bar on stderr.

    Returns a JSON-serialisable dict:

    * ``parameters``: the arguments (``num_teachers``, ``num_samples``, ``common_size``, ``seed``) and
      the fixed family settings;
    * ``thresholds`` (``T``) and ``threshold_fractions`` (``T / n``);
    * ``hot`` and ``cold``: ``coverage``, ``support_size``, ``average_yield`` (one entry per threshold)
      and ``max_count`` / ``margin`` summaries (``mean``, ``median``, ``min``, ``max`` over samples);
    * ``robust_mass``: ``P(tau)`` at ``tau = T`` (Remark D.1);
    * ``max_average_probability``: ``max_j`` of the average teacher distribution, and
      ``common_tokens`` (the token ids of the shared set ``C``) with ``common_mass`` (average mass on ``C``);
    * ``summary``: headline numbers (see :func:`format_summary`).
    """
    from tqdm import tqdm

    n = check_int("num_teachers", num_teachers, minimum=1, maximum=MAX_TEACHERS)
    r = check_int("num_samples", num_samples, minimum=1, maximum=MAX_SAMPLES)
    k = check_int("common_size", common_size, minimum=1, maximum=MAX_COMMON_SIZE)
    if n * r > MAX_VOTES:
        raise ValueError(_too_many_votes(n, r, "num_teachers", "num_samples"))
    seed = check_int("seed", seed, minimum=0)
    rng = np.random.default_rng(seed)
    chunks = [c.size for c in np.array_split(np.arange(r), min(_VOTE_CHUNKS, r))]

    with tqdm(
        total=2 + 2 * len(chunks), desc="histograms", unit="step", disable=not progress, dynamic_ncols=True
    ) as bar:
        bar.set_postfix_str("teachers")
        teachers, common = synthetic.planet_z_like(
            n,
            rng,
            common_size=k,
            num_numbers=_NUM_NUMBERS,
            generalization_support=_GENERALIZATION_SUPPORT,
        )
        bar.update()
        drawn = {}
        for name, draw in (("hot", coordinated_votes), ("cold", independent_votes)):
            bar.set_postfix_str(f"{name} votes")
            parts = []
            for size in chunks:
                parts.append(draw(teachers, size, rng))
                bar.update()
            drawn[name] = np.concatenate(parts, axis=0)
        bar.set_postfix_str("metrics")
        thresholds = threshold_grid(n)
        hot = _ensemble_metrics(drawn["hot"], thresholds)
        cold = _ensemble_metrics(drawn["cold"], thresholds)
        robust = [float(x) for x in metrics.robust_mass(teachers, thresholds)]
        average = teachers.average()
        bar.update()

    t_list = [int(t) for t in thresholds]
    max_average = float(average.max())
    cold_zero = _first_zero(t_list, cold["coverage"])
    at_zero = t_list.index(cold_zero) if cold_zero is not None else None
    summary = {
        "hot_median_max_count_fraction": hot["max_count"]["median"] / n,
        "cold_median_max_count_fraction": cold["max_count"]["median"] / n,
        "cold_coverage_zero_from": cold_zero,
        "hot_coverage_there": hot["coverage"][at_zero] if at_zero is not None else None,
        "robust_mass_there": robust[at_zero] if at_zero is not None else None,
    }
    return {
        "experiment": "histograms",
        "parameters": {
            "num_teachers": n,
            "num_samples": r,
            "common_size": k,
            "seed": seed,
            "family": "planet_z_like",
            "vocab_size": int(teachers.vocab_size),
            "num_numbers": _NUM_NUMBERS,
            "generalization_support": _GENERALIZATION_SUPPORT,
        },
        "thresholds": t_list,
        "threshold_fractions": [t / n for t in t_list],
        "hot": hot,
        "cold": cold,
        "robust_mass": robust,
        "max_average_probability": max_average,
        "common_tokens": [int(c) for c in common],
        "common_mass": float(average[common].sum()),
        "summary": summary,
    }


def _too_many_votes(n: int, r: int, teachers: str, samples: str) -> str:
    return (f"{teachers} x {samples} = {n} x {r} = {n * r} votes per ensemble, more than {MAX_VOTES:.0e} (about "
            f"{(30e3 * n + 60 * n * r) / 1e9:.2g} GB and {0.15e-3 * n + 0.7e-6 * n * r:.0f} s; docs/ranges.md): draw fewer "
            "samples or use fewer teachers")


def format_summary(result: dict) -> str:
    """One line with the headline numbers of a :func:`histograms_experiment` result."""
    p = result["parameters"]
    s = result["summary"]
    n = p["num_teachers"]
    pmax = result["max_average_probability"]
    line = (
        f"n={n} r={p['num_samples']} k={p['common_size']} seed={p['seed']}: "
        f"median top count Hot {s['hot_median_max_count_fraction']:.3f}n vs Cold "
        f"{s['cold_median_max_count_fraction']:.3f}n (max average token probability {pmax:.3f}); "
    )
    if s["cold_coverage_zero_from"] is None:
        line += "Cold coverage stays positive on the whole grid"
    else:
        t = s["cold_coverage_zero_from"]
        line += (
            f"Cold coverage is 0 from T={t} (T/n={t / n:.3f}), where Hot coverage is "
            f"{s['hot_coverage_there']:.3f} (robust mass {s['robust_mass_there']:.3f})"
        )
    return line


def format_table(result: dict) -> str:
    """The threshold sweep of a :func:`histograms_experiment` result as a fixed-width text table."""
    header = (
        f"{'T':>7} {'T/n':>6} | {'coverage':^15} | {'support size':^15} | {'avg yield':^15} | {'robust':>6}",
        f"{'':>7} {'':>6} | {'Hot':>7} {'Cold':>7} | {'Hot':>7} {'Cold':>7} | {'Hot':>7} {'Cold':>7} | {'P(T)':>6}",
    )
    rule = "-" * len(header[0])
    rows = [*header, rule]
    hot, cold = result["hot"], result["cold"]
    for i, (t, frac) in enumerate(zip(result["thresholds"], result["threshold_fractions"])):
        rows.append(
            f"{t:>7d} {frac:>6.3f} | {hot['coverage'][i]:>7.3f} {cold['coverage'][i]:>7.3f} | "
            f"{hot['support_size'][i]:>7d} {cold['support_size'][i]:>7d} | "
            f"{hot['average_yield'][i]:>7.3f} {cold['average_yield'][i]:>7.3f} | {result['robust_mass'][i]:>6.3f}"
        )
    return "\n".join(rows)


@styled
def plot_histograms_experiment(result: dict, out_dir) -> list[Path]:
    """Write ``histograms_coverage.png`` and ``histograms_support.png`` into ``out_dir`` (created if missing).

    Coverage vs ``T`` (Hot, Cold and the robust mass ``P(T)``) and support size vs ``T`` (Hot, Cold),
    with a vertical line at ``n`` times the maximum average token probability.  Uses matplotlib's Agg
    canvas directly (no pyplot, no global backend change).  Returns the paths written.
    """

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    p = result["parameters"]
    n = p["num_teachers"]
    t = np.asarray(result["thresholds"], dtype=np.float64)
    pmax_line = n * result["max_average_probability"]
    title = f"Planet Z-like ensemble: n={n}, k={p['common_size']}, r={p['num_samples']}, seed={p['seed']}"
    hot_style = {"color": COLORS["hot"], "marker": "o", "label": "Hot (coordinated)"}
    cold_style = {"color": COLORS["cold"], "marker": "s", "label": "Cold (independent)"}

    def new_axes():
        fig = new_figure((7.2, 5.4))
        ax = fig.add_subplot()
        ax.set_xscale("log")
        ax.set_xlabel("threshold T (votes)")
        ax.set_title(title)
        ax.axvline(pmax_line, color=COLORS["threshold"], linestyle=":", linewidth=1, label="n x max average token probability")
        ax.grid(True, which="major", alpha=0.3)
        return fig, ax

    paths = []
    fig, ax = new_axes()
    ax.plot(t, result["hot"]["coverage"], **hot_style)
    ax.plot(t, result["cold"]["coverage"], **cold_style)
    ax.plot(t, result["robust_mass"], color="black", linestyle="--", label="tau-robust mass P(tau = T)")
    ax.set_ylabel("coverage (transferred probability mass)")
    ax.set_ylim(-0.02, 1.02)
    legend_outside(ax, where="below", ncol=2)
    path = out / "histograms_coverage.png"
    fig.savefig(path)
    paths.append(path)

    fig, ax = new_axes()
    ax.plot(t, result["hot"]["support_size"], **hot_style)
    ax.plot(t, result["cold"]["support_size"], **cold_style)
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_ylabel("support size (tokens reaching T in some sample)")
    legend_outside(ax, where="below", ncol=2)
    path = out / "histograms_support.png"
    fig.savefig(path)
    paths.append(path)
    return paths


def add_arguments(parser) -> None:
    """``--teachers``, ``--samples`` (override the size) and ``--common-size``."""
    full, quick = SIZES["full"], SIZES["quick"]
    parser.add_argument("--teachers", metavar="N", type=int_in(1, MAX_TEACHERS, "about 30 KB per teacher"), default=None,
                        help=f"number of teachers n, in [1, {MAX_TEACHERS}] (default: {full['teachers']}, --quick: "
                             f"{quick['teachers']}); n x r at most {MAX_VOTES:.0e}")
    parser.add_argument("--samples", metavar="R", type=int_in(1, MAX_SAMPLES), default=None,
                        help=f"histograms drawn per ensemble r, in [1, {MAX_SAMPLES}] (default: {full['samples']}, "
                             f"--quick: {quick['samples']})")
    parser.add_argument("--common-size", metavar="K", type=int_in(1, MAX_COMMON_SIZE), default=DEFAULT_COMMON_SIZE,
                        help=f"size k of the common set C of answers (default: {DEFAULT_COMMON_SIZE}, "
                             f"at most {MAX_COMMON_SIZE})")


def run(*, quick: bool = False, seed: int = 0, progress: bool = True, teachers=None, samples=None,
        common_size=DEFAULT_COMMON_SIZE) -> dict:
    """The experiment at the ``quick`` or full size (``teachers``/``samples`` override it): see
    :func:`histograms_experiment`.  A bad option raises ``ValueError`` naming it."""
    sizes = SIZES["quick" if quick else "full"]
    options = {"--teachers": (teachers, sizes["teachers"], MAX_TEACHERS),
               "--samples": (samples, sizes["samples"], MAX_SAMPLES)}
    values = {}
    for option, (given, default, largest) in options.items():
        value = default if given is None else given
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= largest:
            raise ValueError(f"argument {option}: must be an integer in [1, {largest}], got {value!r}")
        values[option] = value
    if values["--teachers"] * values["--samples"] > MAX_VOTES:
        raise ValueError("argument --teachers: " + _too_many_votes(values["--teachers"], values["--samples"],
                                                                     "--teachers", "--samples"))
    if isinstance(common_size, bool) or not isinstance(common_size, int) or not 1 <= common_size <= MAX_COMMON_SIZE:
        raise ValueError(f"argument --common-size: must be an integer in [1, {MAX_COMMON_SIZE}], got {common_size!r}")
    result = histograms_experiment(values["--teachers"], values["--samples"], common_size, seed, progress=progress)
    result["experiment"] = NAME
    return result


def plot(result: dict, out_dir) -> list[Path]:
    """The coverage and support figures (:func:`plot_histograms_experiment`)."""
    return plot_histograms_experiment(result, out_dir)


def summary(result: dict) -> str:
    """The parameters, the Hot and Cold top counts and margins, the threshold table and the headline line."""
    p = result["parameters"]
    lines = [
        f"Hot vs Cold histograms: Planet Z-like ensemble, n={p['num_teachers']} teachers, "
        f"k={p['common_size']} common answers, r={p['num_samples']} samples per ensemble, seed={p['seed']}",
        f"max average token probability {result['max_average_probability']:.4f} "
        f"(n x that = {p['num_teachers'] * result['max_average_probability']:.1f} votes); "
        f"average mass on C {result['common_mass']:.3f}",
    ]
    for name in ("hot", "cold"):
        stats = result[name]
        label = "Hot  (coordinated)" if name == "hot" else "Cold (independent)"
        lines.append(
            f"{label}: top count mean {stats['max_count']['mean']:.1f} median {stats['max_count']['median']:.1f}; "
            f"margin mean {stats['margin']['mean']:.1f} median {stats['margin']['median']:.1f}"
        )
    return "\n".join([*lines, "", format_table(result), "", format_summary(result)])
