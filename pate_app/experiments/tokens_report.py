"""What ``pate-accountant experiment tokens-per-epsilon`` reports (:mod:`pate_app.experiments.tokens_per_epsilon`,
docs/results.md, section tokens-per-epsilon): per (alpha, budget) the rows best first and a verdict of the best
Hot/Cold PATE row against the best peer (:func:`comparison`), the claims checked (:func:`check_claims`), the figure
(:func:`plot`: tokens per budget epsilon against alpha) and the tables (:func:`summary`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pate_app.experiments import claim_lines, formatted
from pate_app.plotting import legend_outside, new_figure, styled

# -- comparison and claims ---------------------------------------------------------------------------------------


def _key(entry: dict) -> tuple:
    """Sort key of a result entry: admissible first, then tokens (a capped count is a lower bound)."""
    return (bool(entry["admissible"]), entry["private_tokens"])


def _verdict(best_pate: dict | None, best_peer: dict | None) -> str:
    """``"pate"``, ``"peer"`` or ``"undecided"``.  Only admissible runs with tokens count; a count at the cap is
    a lower bound, so it wins only when it already exceeds the other's exact count, and two counts at the cap
    (or two without an admissible run, or equal exact counts) decide nothing."""

    def count(entry):
        return entry["private_tokens"] if entry is not None and entry["admissible"] else 0

    a, b = count(best_pate), count(best_peer)
    a_open = bool(a) and best_pate["capped"]
    b_open = bool(b) and best_peer["capped"]
    if a > b and not b_open:
        return "pate"
    if b > a and not a_open:
        return "peer"
    return "undecided"


def comparison(result: dict) -> list[dict]:
    """Per (alpha, budget): the rows sorted best first, the best Hot/Cold PATE row, the best peer at its published
    settings and the best peer of all (variants beyond the published settings included), and a verdict against
    each (``pate``, ``peer`` or ``undecided``)."""
    out = []
    p = result["parameters"]
    for eps in p["budgets"]:
        for alpha in p["alphas"]:
            entries = [r for r in result["results"] if r["alpha"] == alpha and r["budget_epsilon"] == eps]
            entries.sort(key=_key, reverse=True)
            pate = [r for r in entries if r["family"] != "peer"]
            published = [r for r in entries if r["family"] == "peer" and r["published"]]
            peers = [r for r in entries if r["family"] == "peer"]
            best_pate = pate[0] if pate else None
            best_published, best_peer = (published[0] if published else None), (peers[0] if peers else None)
            out.append({"alpha": alpha, "budget_epsilon": eps, "order": [r["row"] for r in entries],
                        "best_pate": best_pate["row"] if best_pate else None,
                        "best_published_peer": best_published["row"] if best_published else None,
                        "best_peer": best_peer["row"] if best_peer else None,
                        "winner_published": _verdict(best_pate, best_published) if best_published else None,
                        "winner": _verdict(best_pate, best_peer) if best_peer else None})
    return out


def check_claims(result: dict) -> list[dict]:
    """The claims the summary checks (:func:`pate_app.experiments.claim_lines` prints them): every ledger verifies,
    every run stopped by refusal or at the cap, and at alpha >= 0.5 the best Hot/Cold PATE row against the peers."""
    res = result["results"]
    unverified = [f"{r['row']} alpha={r['alpha']:g} eps={r['budget_epsilon']:g}" for r in res if not r["ledgers_verified"]]
    stops = {r["stop"] for r in res}
    claims = [
        {"claim": "every ledger verifies (the check `pate-accountant audit` runs)", "holds": not unverified,
         "detail": f"{sum(r['ledgers'] for r in res)} ledgers" + (f"; failed: {unverified}" if unverified else "")},
        {"claim": "every run stopped by its accountant's refusal or at the step cap", "holds": stops <= {"refused", "cap"},
         "detail": f"{sum(r['stop'] == 'refused' for r in res)} refused, {sum(r['stop'] == 'cap' for r in res)} at the cap"},
    ]
    for which, peer, what in (("winner_published", "best_published_peer", "every peer at its published settings"),
                              ("winner", "best_peer", "every peer, variants beyond the published settings included")):
        goal = [c for c in result["comparison"] if c["alpha"] >= 0.5 and c[peer] is not None]
        lost = [f"alpha={c['alpha']:g} eps={c['budget_epsilon']:g}: {c[peer]}" for c in goal if c[which] == "peer"]
        open_ = [f"alpha={c['alpha']:g} eps={c['budget_epsilon']:g}" for c in goal if c[which] == "undecided"]
        if goal:
            claims.append({
                "claim": f"at alpha >= 0.5 the best Hot/Cold PATE row releases more private tokens than {what}",
                "holds": not lost and not open_,
                # against variants beyond the peers' published settings (InvisibleInk in one batch of every
                # teacher) it is a measured comparison, not a claim (docs/results.md, tokens-per-epsilon)
                "finding": which == "winner",
                "detail": (f"wins {len(goal) - len(lost) - len(open_)} of {len(goal)} settings"
                           + (f"; a peer wins at {'; '.join(lost)}" if lost else "")
                           + (f"; undecided (both at the cap, or neither admissible) at {', '.join(open_)}"
                              if open_ else "")),
            })
    return claims


# -- plot, summary -------------------------------------------------------------------------------------------------

_STYLES = {
    "hot-dpargmax-tct": ("tab:red", "o", "-"),
    "hot-dpargmax-pld": ("tab:pink", "o", "--"),
    "hot-gnmax-pld": ("goldenrod", "s", "-"),
    "hot-gnmax-threshold-pld": ("darkorange", "D", "-"),
    "cold-dpargmax-tct": ("tab:blue", "o", ":"),
    "cold-gnmax-pld": ("tab:cyan", "s", ":"),
    "tang-pld": ("tab:green", "^", "-."),
    "tang-rdp": ("olive", "v", "-."),
    "invisibleink": ("tab:purple", "P", "-."),
    "invisibleink-one-batch": ("indigo", "X", "-."),
    "hot-gnmax-threshold-pld-groups": ("saddlebrown", "H", "--"),
    "hot-gnmax-threshold-pld-prior": ("coral", "d", "--"),
    "hot-dpws-tct": ("firebrick", "*", "-"),
    "hot-dpws-pld": ("lightcoral", "*", "--"),
    "cold-dpws-tct": ("navy", "*", ":"),
    "cold-dpws-pld": ("steelblue", "*", ":"),
    "hot-dpargmax-tct-groups": ("maroon", "h", "-"),
    "hot-bt-public-individual": ("darkgreen", "p", "-"),
    "hot-bt-public-tct": ("limegreen", "p", "--"),
}


#: The series of the figure: the best Hot PATE row and the best Cold PATE row at each alpha (their rows are in the
#: summary's tables), beside every peer row; few enough to tell apart at a glance (18 rows drawn at once were not).
_SERIES_STYLES = {
    "Hot PATE (best row)": ("tab:red", "o", "-"),
    "Cold PATE (best row)": ("tab:blue", "o", ":"),
}


def _plotted_series(result: dict, eps: float) -> list[tuple[str, list]]:
    """``(label, entries sorted by alpha)`` of each series drawn in the panel of budget ``eps``: the best Hot PATE
    and the best Cold PATE entry at each alpha (admissible first, then tokens: :func:`_key`), then each peer row."""
    here = [r for r in result["results"] if r["budget_epsilon"] == eps]
    series = []
    for label, prefix in (("Hot PATE (best row)", "hot-"), ("Cold PATE (best row)", "cold-")):
        best = {}
        for r in here:
            if r["family"] != "peer" and r["row"].startswith(prefix):
                if r["alpha"] not in best or _key(r) > _key(best[r["alpha"]]):
                    best[r["alpha"]] = r
        if best:
            series.append((label, [best[a] for a in sorted(best)]))
    for name in result["parameters"]["rows"]:
        entries = sorted((r for r in here if r["row"] == name and r["family"] == "peer"), key=lambda r: r["alpha"])
        if entries:
            series.append((name, entries))
    return series


@styled
def _plot(result: dict, path: Path) -> None:
    p = result["parameters"]
    budgets = p["budgets"]
    cols = min(2, len(budgets))
    rows_ = -(-len(budgets) // cols)
    fig = new_figure((6.2 * cols + 2.5, 4.3 * rows_))
    axes = np.atleast_1d(fig.subplots(rows_, cols, squeeze=False)).ravel()
    positive = [r["tokens_per_epsilon"] for r in result["results"] if r["tokens_per_epsilon"] > 0]
    floor = min(positive) / 3 if positive else 0.1
    for ax, eps in zip(axes, budgets):
        for name, entries in _plotted_series(result, eps):
            color, marker, line = _SERIES_STYLES.get(name) or _STYLES.get(name, ("black", "o", "-"))
            x = [r["alpha"] for r in entries]
            y = [max(r["tokens_per_epsilon"], floor) for r in entries]
            ax.plot(x, y, color=color, linestyle=line, label=name)
            for xi, yi, r in zip(x, y, entries):
                face = color if r["admissible"] else "none"
                shape = "^" if r["capped"] and r["private_tokens"] else ("v" if not r["private_tokens"] else marker)
                ax.plot([xi], [yi], marker=shape, color=color, markerfacecolor=face,
                        markersize=7 if shape in "^v" else 5, linestyle="none")
        ax.axhline(p["cap"] / eps, color="dimgray", linestyle=":", linewidth=1)
        ax.set_yscale("log")
        ax.set_xlabel("alpha (weight of the common part)")
        ax.set_ylabel("private tokens per budget epsilon")
        ax.set_title(f"budget epsilon {eps:g}, delta {p['budget_delta']:g} (replace-one)")
    for ax in axes[len(budgets):]:
        ax.set_visible(False)
    legend_outside(axes[min(cols, len(budgets)) - 1])
    fig.suptitle(f"Private tokens per budget epsilon, run until refusal: n = {p['teachers']} teachers, "
                 f"{p['common']} common tokens, public pool {p['pool']}\n^ = stopped at the cap ({p['cap']:,} steps, "
                 f"dotted line), v = no private token (drawn at the bottom), hollow = below the precision floor "
                 f"{p['min_precision']:g}")
    fig.savefig(path)


def plot(result: dict, out_dir) -> list[Path]:
    """``tokens_per_epsilon.png``: tokens per budget epsilon against alpha, one panel per budget: the best Hot PATE
    row and the best Cold PATE row at each alpha, and every peer row (:func:`_plotted_series`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tokens_per_epsilon.png"
    _plot(result, path)
    return [path]


def _count(entry: dict) -> str:
    return f"{'>' if entry['capped'] else ''}{entry['private_tokens']:,}"


def _params(params: dict) -> str:
    return " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def _say(entry: dict, winner, peer) -> str:
    return {"pate": f"{entry['best_pate']} wins", "peer": f"A PEER WINS ({peer})",
            "undecided": "undecided (a count at the cap is a lower bound, or a tie, or nothing admissible)",
            None: "no peer row"}[winner]


def summary(result: dict) -> str:
    p, m = result["parameters"], result["machine"]
    lines = [
        (f"tokens-per-epsilon: n={p['teachers']} teachers (one record each), K={p['common']} common tokens, public "
        f"pool {p['pool']}, budgets epsilon {','.join(f'{e:g}' for e in p['budgets'])} at delta "
        f"{p['budget_delta']:g} ({p['relation']}), cap {p['cap']:,} steps, precision floor {p['min_precision']:g}"),
        (f"machine: {m['cpus']} CPUs, load "
        f"{formatted(m['load_average_before'] and m['load_average_before'][0], '.2f')} "
        f"before, {m['wall_seconds']} s wall, {m['cpu_seconds']} s CPU"),
        "",
        ("columns: tokens = private tokens (> : stopped at the cap, a lower bound), tok/eps = per budget epsilon, "
        "tok/rec = per record, passes/tok = teacher forward passes per private token, prec = on-support fraction, "
        "d1/d2 = distinct-1/2, dist = distinct tokens, stop, ok = every ledger verified; * = below the precision floor "
        "(by the calibration's estimate); rows marked + are peer variants beyond their published settings"),
    ]
    width = max([24, *(len(name) for name in p["rows"])])
    header = (f"  {'row':<{width}} {'tokens':>9} {'tok/eps':>9} {'tok/rec':>8} {'passes/tok':>10} {'prec':>5} "
              f"{'d1':>6} {'d2':>6} {'dist':>5} {'stop':>7} {'ok':>3}  parameters")
    for c in result["comparison"]:
        entries = {r["row"]: r for r in result["results"] if r["alpha"] == c["alpha"]
                   and r["budget_epsilon"] == c["budget_epsilon"]}
        lines += ["", (f"alpha={c['alpha']:g}, budget epsilon={c['budget_epsilon']:g}: against the published "
                       f"peers {_say(c, c['winner_published'], c['best_published_peer'])}; against every row "
                       f"{_say(c, c['winner'], c['best_peer'])}"), header]
        for name in c["order"]:
            r = entries[name]
            lines.append(
                f" {'+' if not r['published'] else ' '}{name:<{width}} {_count(r):>9} {r['tokens_per_epsilon']:>9.1f} "
                f"{r['tokens_per_record']:>8.3f} {formatted(r['passes_per_token'], '.3g'):>10} "
                f"{formatted(r['precision'], '.3f'):>5}{' ' if r['admissible'] else '*'}"
                f"{formatted(r['distinct_1'], '.3f'):>6} {formatted(r['distinct_2'], '.3f'):>6} "
                f"{r['distinct_tokens']:>5} {r['stop']:>7} {'yes' if r['ledgers_verified'] else 'NO':>3}  {_params(r['params'])}")
    lines += claim_lines(result["claims"])
    return "\n".join(lines)
