"""What ``pate-accountant experiment end-to-end`` reports (:mod:`pate_app.experiments.end_to_end`; docs/results.md,
section end-to-end): per part and configuration whether every run kept within its budget and Hot PATE's private
tokens minus Cold PATE's (:func:`check_claims`), the table of every run (:func:`summary`: records, charged runs,
private and fallback tokens, fail rate, target hits, epsilon spent, yields per epsilon, diversity) and three
figures (:func:`plot`: private against fallback tokens, yield per epsilon spent, diversity of the records), one
panel per part, Hot PATE (paper Algorithm 1, coordinated histograms) beside Cold PATE (independent ones).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pate_app.experiments import formatted, ratio
from pate_app.plotting import COLORS, legend_outside, new_figure, styled

#: The two ensembles ("parts") of the experiment, in report order: the language model, the synthetic table.
PARTS = ("model", "synthetic")


def _pairs(runs: list) -> dict:
    """``{configuration: {"hot": run, "cold": run}}``."""
    out: dict = {}
    for entry in runs:
        out.setdefault(entry["configuration"], {})[entry["ensemble"]] = entry
    return out


def check_claims(result: dict) -> dict:
    """Per part and configuration: every run within its budget; Hot private tokens minus Cold's."""
    claims = {}
    for part in PARTS:
        if part not in result:
            continue
        runs = result[part]["runs"]
        claims[part] = {
            "all_within_budget": all(entry["within_budget"] for entry in runs),
            "hot_minus_cold_private_tokens": {
                configuration: pair["hot"]["private_tokens"] - pair["cold"]["private_tokens"]
                for configuration, pair in _pairs(runs).items()
            },
        }
    return claims



# -- reporting -------------------------------------------------------------------------------------------
def summary(result: dict) -> str:
    noise = ("seeded simulation (seed not recorded)" if result["parameters"].get("seeded", True)
             else "model part's mechanism noise from the operating system (not seeded)")
    lines = [f"end-to-end private generation (paper Framework 2), {noise}",
             "  (rec: records produced, runs: charged runs, priv/fallbk: private/public tokens, fail: share of "
             "runs releasing nothing, hits: charged target outcomes (wrapper targets, BetweenThresholds 'between'), rec/eps and tok/eps: records and private tokens "
             "per epsilon spent, d-rec: distinct records, d-1/d-2: distinct-n ratios)"]
    header = (f"  {'configuration':<30} {'ens':<4} {'rec':>4} {'runs':>5} {'priv':>5} {'fallbk':>6} {'fail':>6} "
              f"{'hits':>6} {'eps spent':>10} {'rec/eps':>8} {'tok/eps':>8} {'d-rec':>5} {'d-1':>5} {'d-2':>5} {'budget':>6}")
    for part in PARTS:
        if part not in result:
            continue
        data = result[part]
        if part == "model":
            lines.append(f"model part: {data['model']}, {data['data']}, n = {data['teachers']} teachers")
        else:
            lines.append(f"synthetic part: n = {data['teachers']} teachers, {data['common_words']} common words, "
                         f"alpha = {data['alpha']}")
        setting = data["setting"]
        for key in ("target", "individual"):
            budget = setting[key]["budget"]
            lines.append(f"  {key} charging: per step {_describe_step(key, setting[key])}; "
                         f"budget ({budget['epsilon']:g}, {budget['delta']:g})")
        lines.append(header)
        for entry in data["runs"]:
            d = entry["diversity"]
            lines.append(
                f"  {entry['configuration']:<30} {entry['ensemble']:<4} {entry['records_produced']:>4} "
                f"{entry['charged_runs']:>5} {entry['private_tokens']:>5} {entry['fallback_tokens']:>6} "
                f"{formatted(entry['fail_rate'], '.2f'):>6} {entry['target_hits']:>6} "
                f"{formatted(entry['spent']['epsilon'], '.4g'):>10} "
                f"{formatted(entry['records_per_epsilon'], '.3g'):>8} "
                f"{formatted(entry['private_tokens_per_epsilon'], '.3g'):>8} "
                f"{d['distinct_records']:>5} {formatted(d['distinct_1_ratio'], '.2f'):>5} "
                f"{formatted(d['distinct_2_ratio'], '.2f'):>5} {'ok' if entry['within_budget'] else 'OVER':>6}"
            )
        claims = result["claims"][part]
        diffs = ", ".join(f"{c}: {v:+d}" for c, v in claims["hot_minus_cold_private_tokens"].items())
        lines.append(f"  Hot minus Cold private tokens: {diffs}; every run within budget: "
                     f"{'yes' if claims['all_within_budget'] else 'NO'}")
    lines.append(f"wall time {result['wall_seconds']:.1f} s")
    return "\n".join(lines)


def _describe_step(key: str, params: dict) -> str:
    if key == "target":
        return f"BoundaryWrapper(inner (eps {params['epsilon0']:g}, delta {params['delta0']:g}))"
    return f"BetweenThresholds(eps {params['epsilon0']:g}, low {params['low']}, high {params['high']})"


_SHORT = {
    "target-dp-argmax": "target\nDPArgMax",
    "target-dp-weighted-sampling": "target\nDPWS",
    "individual-between-thresholds": "individual\nBetweenThr.",
}


def _grouped_bars(ax, pairs: dict, metrics) -> None:
    """Bars per configuration: for Hot (orange) and Cold (blue), one bar per ``(name, getter, alpha)`` metric."""
    x = np.arange(len(pairs))
    width = 0.8 / (2 * len(metrics))
    slot = 0
    for label, color in (("hot", COLORS["hot"]), ("cold", COLORS["cold"])):
        for name, getter, alpha in metrics:
            values = [getter(pairs[c][label]) for c in pairs]
            values = [np.nan if v is None else v for v in values]
            ax.bar(x - 0.4 + width * (slot + 0.5), values, width, color=color, alpha=alpha, label=f"{label}: {name}")
            slot += 1
    ax.set_xticks(x, [_SHORT.get(c, c) for c in pairs])


#: The bars of the yields figure and of the diversity figure: ``(name, getter, alpha)`` (:func:`_grouped_bars`).
_YIELDS = (
    ("private tokens / eps", lambda r: r["private_tokens_per_epsilon"] or None, 1.0),
    ("records / eps", lambda r: r["records_per_epsilon"] or None, 0.4),
)
_DIVERSITY = (
    ("distinct records", lambda r: ratio(r["diversity"]["distinct_records"], r["diversity"]["records"]), 1.0),
    ("distinct-1", lambda r: r["diversity"]["distinct_1_ratio"], 0.6),
    ("distinct-2", lambda r: r["diversity"]["distinct_2_ratio"], 0.3),
)


def _figure(parts: list, path: Path, panel) -> Path:
    """One figure of one panel per part, each drawn by ``panel(ax, part)``, saved at ``path``."""
    fig = new_figure((5.2 * len(parts), 4.4))
    for i, part in enumerate(parts):
        panel(fig.add_subplot(1, len(parts), i + 1), part)
    fig.savefig(path)
    return path


def _tokens_panel(ax, result: dict, part: str) -> None:
    """Private tokens with the fallback tokens stacked on them, per configuration, Hot beside Cold."""
    pairs = _pairs(result[part]["runs"])
    x = np.arange(len(pairs))
    top = 0
    for offset, label, color in ((-0.2, "hot", COLORS["hot"]), (0.2, "cold", COLORS["cold"])):
        private = np.array([pairs[c][label]["private_tokens"] for c in pairs])
        fallback = np.array([pairs[c][label]["fallback_tokens"] for c in pairs])
        ax.bar(x + offset, private, 0.38, color=color, label=f"{label}: private")
        ax.bar(x + offset, fallback, 0.38, bottom=private, color=color, alpha=0.3, label=f"{label}: fallback")
        top = max(top, int((private + fallback).max()))
    ax.set_xticks(x, [_SHORT.get(c, c) for c in pairs])
    ax.set_ylim(0, 1.05 * max(top, 1))
    ax.set_ylabel("tokens (one charged run each)")
    ax.set_title(f"{part} part (n = {result[part]['teachers']}): private vs fallback tokens")
    legend_outside(ax, where="below", ncol=2)


def _bars_panel(ax, result: dict, part: str, metrics, *, ylabel: str, title: str, log: bool = False,
                top: float | None = None) -> None:
    """:func:`_grouped_bars` of ``metrics`` for one part, on a log scale or from 0 to ``top``."""
    _grouped_bars(ax, _pairs(result[part]["runs"]), metrics)
    if log:
        ax.set_yscale("log")
    if top is not None:
        ax.set_ylim(0, top)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{part} part: {title}")
    legend_outside(ax, where="below", ncol=len(metrics))


@styled
def plot(result: dict, out_dir) -> list[Path]:
    """Three figures, one panel per part (Hot orange, Cold blue, per configuration):
    ``end_to_end_tokens.png`` (private and fallback tokens), ``end_to_end_epsilon.png`` (private tokens and
    records per epsilon spent, log scale) and ``end_to_end_diversity.png`` (distinct records, distinct-1 and
    distinct-2 ratios of the produced records)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = [p for p in PARTS if p in result]
    return [
        _figure(parts, out / "end_to_end_tokens.png", lambda ax, part: _tokens_panel(ax, result, part)),
        _figure(parts, out / "end_to_end_epsilon.png", lambda ax, part: _bars_panel(
            ax, result, part, _YIELDS, ylabel="per unit of epsilon spent",
            title="yield per epsilon spent (no bar: zero)", log=True)),
        _figure(parts, out / "end_to_end_diversity.png", lambda ax, part: _bars_panel(
            ax, result, part, _DIVERSITY, ylabel="ratio", title="diversity of the produced records", top=1.05)),
    ]
