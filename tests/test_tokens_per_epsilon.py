"""``experiment tokens-per-epsilon``: the protocol, runs that stop by refusal, ledgers that verify, tokens per
*budget* epsilon, and the peers' accounting against dp-accounting and against the mechanisms' exact laws."""

from __future__ import annotations

import math

import attr
import numpy as np
import pytest
from dp_accounting import dp_event, pld, rdp
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from pate_app.experiments import tokens_per_epsilon as tpe

SMALL = {"teachers": 600, "alphas": "0.9", "budgets": "8", "cap": 300, "rows": "hot-dpargmax-tct,invisibleink"}


@pytest.fixture(scope="module")
def small():
    """A small run of two rows with cheap accountants (one alpha, one budget): under a second once the libraries
    are imported.  The PLD and the Tang rows are exercised by the tests of their runs below."""
    return tpe.run(quick=True, seed=3, progress=False, **SMALL)


# -- the protocol and the table ------------------------------------------------------------------------------------


def test_the_module_follows_the_experiment_protocol():
    import pate_app
    from pate_app.experiments import load

    assert pate_app.EXPERIMENTS[tpe.NAME] == "pate_app.experiments.tokens_per_epsilon"
    module = load(tpe.NAME)
    assert module is tpe and module.NAME == "tokens-per-epsilon"
    assert set(tpe.SIZES) == {"full", "quick"}
    assert tpe.SIZES["full"]["alphas"] == [0.95, 0.7, 0.5, 0.3] and tpe.SIZES["full"]["teachers"] == 4000
    assert tpe.SIZES["full"]["budgets"] == [1.0, 3.0, 8.0, 10.0]
    for name in ("HELP", "DESCRIPTION", "FULL_RUNTIME", "add_arguments", "run", "plot", "summary"):
        assert getattr(tpe, name)
    from pate_accountant.events import ADD_REMOVE_ONE, REPLACE_ONE

    assert (tpe.REPLACE_ONE, tpe.ADD_REMOVE_ONE) == (REPLACE_ONE, ADD_REMOVE_ONE)


def test_every_row_is_declared_once_with_a_grid():
    rows = tpe.row_specs(4000, 20000, 1e-6)
    assert tuple(rows) == tpe.ROW_NAMES
    assert {r.family for r in rows.values()} == {"hot", "cold", "peer"}
    assert [r.name for r in rows.values() if not r.published] == ["invisibleink-one-batch"]
    for row in rows.values():
        assert row.grid and all(isinstance(p, dict) for p in row.grid)
    # the published InvisibleInk batch sizes, and the per-query delta that pays for the cap
    assert {p["batch"] for p in rows["invisibleink"].grid} == {8, 16, 32}
    assert rows["hot-dpargmax-tct"].grid[0]["delta0"] <= 0.5 * 1e-6 / 20000


def test_bad_options_are_refused_by_name():
    with pytest.raises(ValueError, match="--rows"):
        tpe.run(quick=True, progress=False, rows="no-such-row")
    with pytest.raises(ValueError, match="--alphas"):
        tpe.run(quick=True, progress=False, alphas="1.0")
    with pytest.raises(ValueError, match="--pool"):
        tpe.run(quick=True, progress=False, common=50, pool=20)


def test_a_small_run_stops_by_refusal_or_at_the_cap_and_every_ledger_verifies(small):
    assert [r["row"] for r in small["results"]] == SMALL["rows"].split(",")
    for r in small["results"]:
        assert r["stop"] in {"refused", "cap"}
        assert (r["stop"] == "cap") == (r["steps"] >= small["parameters"]["cap"]) or r["row"] == "invisibleink"
        assert r["ledgers_verified"] and r["ledgers"] >= 1
        assert r["spent_epsilon"] <= r["budget_epsilon"] and r["spent_delta"] <= r["budget_delta"]
    assert all(c["holds"] for c in small["claims"][:2])


def test_tokens_per_epsilon_is_against_the_budget_epsilon_not_the_spent_one(small):
    for r in small["results"]:
        assert r["tokens_per_epsilon"] == pytest.approx(r["private_tokens"] / r["budget_epsilon"])
        assert r["tokens_per_record"] == pytest.approx(r["private_tokens"] / small["parameters"]["teachers"])
    # a run stopped at the cap after spending a quarter of its budget: per budget epsilon, not per epsilon spent
    world = tpe.build_world(50, 0.9)
    outcome = tpe.Outcome(100, np.zeros(80, dtype=np.int64), 5, 15, "cap", (2.0, 1e-7), 5000)
    m = tpe.metrics(outcome, world, (8.0, 1e-6))
    assert m["tokens_per_epsilon"] == 10.0 and m["tokens_per_record"] == 1.6 and m["passes_per_token"] == 62.5
    assert m["capped"] and m["precision"] == 1.0 and m["distinct_tokens"] == 1


def test_the_grid_choice_comes_from_the_calibration_seed(small):
    for c in small["calibration"]:
        chosen = c["grid"][c["chosen"]]
        good = [g for g in c["grid"] if (g["precision_estimate"] or 0) >= small["parameters"]["min_precision"]]
        if good:
            assert chosen["private_tokens"] == max(g["private_tokens"] for g in good)
    measured = {(r["row"], r["budget_epsilon"]): r for r in small["results"]}
    for c in small["calibration"]:
        r = measured[(c["row"], c["budget_epsilon"])]
        assert {k: v for k, v in r["params"].items() if k != "clip"} == {
            k: v for k, v in c["grid"][c["chosen"]]["params"].items() if k != "clip"}


def test_summary_and_json_say_where_a_peer_wins():
    row = {"family": "hot", "published": True, "alpha": 0.5, "budget_epsilon": 1.0, "admissible": True,
           "capped": False, "private_tokens": 10}
    results = [dict(row, row="hot-gnmax-pld"),
               dict(row, row="tang-pld", family="peer", private_tokens=50),
               dict(row, row="invisibleink", family="peer", private_tokens=5, capped=True)]
    result = {"parameters": {"budgets": [1.0], "alphas": [0.5]}, "results": results}
    [c] = tpe.comparison(result)
    assert c["order"][0] == "tang-pld" and c["winner"] == "peer" and c["best_peer"] == "tang-pld"
    # a count at the cap is a lower bound: it wins only where it already exceeds the other's exact count
    results[1]["private_tokens"] = 3
    assert tpe.comparison(result)[0]["winner"] == "undecided"
    results[2]["capped"] = False
    assert tpe.comparison(result)[0]["winner"] == "pate"
    results[0]["admissible"] = False
    assert tpe.comparison(result)[0]["winner"] == "peer"


def test_the_summary_prints_the_best_row_first_and_the_verdicts(small):
    text = tpe.summary(small)
    assert "tokens-per-epsilon: n=600" in text and "claims:" in text
    first = text.split("parameters\n")[1].splitlines()[0]
    best = small["comparison"][0]["order"][0]
    assert best in first
    assert "against the published peers" in text


# -- the runs' mechanics ----------------------------------------------------------------------------------------------


def test_a_fixed_charge_run_stops_exactly_where_its_accountant_refuses():
    from mechanisms import GaussianNoisyArgMax

    world = tpe.build_world(100, 0.8)
    mech = GaussianNoisyArgMax(20.0, vocab_size=world.vocab_size)
    tape = tpe.Tape(mech, tpe.VoteStream(world, "coordinated", np.random.default_rng(1)), np.random.default_rng(2))
    out = tpe.run_fixed("pld", mech.event, tape, (2.0, 1e-6), 10_000, {})
    assert out.stop == "refused" and out.verified and 0 < out.steps < 10_000
    fresh = tpe._accountant("pld", (2.0, 1e-6))
    assert fresh.can_afford(mech.event, out.steps) and not fresh.can_afford(mech.event, out.steps + 1)
    capped = tpe.run_fixed("pld", mech.event, tape, (2.0, 1e-6), out.steps // 2, {})
    assert capped.stop == "cap" and capped.steps == out.steps // 2


def test_a_target_charged_run_records_every_query_and_ends_refused():
    from mechanisms import BoundaryWrapper, DPArgMax

    world = tpe.build_world(1000, 0.9)
    mech = BoundaryWrapper(DPArgMax(0.1, 1e-8))
    tape = tpe.Tape(mech, tpe.VoteStream(world, "coordinated", np.random.default_rng(4)), np.random.default_rng(5))
    out = tpe.run_tct(tape, (8.0, 1e-6), 5000)
    assert out.stop == "refused" and out.verified
    assert out.hits >= 1 and out.tokens.size > out.hits  # a hit buys several tokens at high agreement
    assert out.steps == out.tokens.size + out.hits + out.fails == out.ledger_queries  # the ledger counted each


def test_vote_streams_keep_the_laws_of_the_ensembles():
    """Coordinated: the common winner's count is BetaBin(n, alpha/(1-alpha), 1), mean alpha n.  Independent:
    the common tokens get Bin(n, alpha) votes in all.  Tolerances: 5 standard errors over 1,024 steps."""
    n, alpha, steps = 200, 0.6, 1024
    world = tpe.build_world(n, alpha)
    hot = tpe.VoteStream(world, "coordinated", np.random.default_rng(7))
    hot.ensure(steps)
    top = hot.common[:steps].max(axis=1) / n
    a = alpha / (1 - alpha)
    sd = math.sqrt(a / ((a + 1) ** 2 * (a + 2)))
    assert abs(top.mean() - alpha) < 5 * sd / math.sqrt(steps)
    assert (np.count_nonzero(hot.common[:steps], axis=1) <= 1).all()  # one common winner per coordinated step
    cold = tpe.VoteStream(world, "independent", np.random.default_rng(8))
    cold.ensure(steps)
    total = cold.common[:steps].sum(axis=1)
    assert abs(total.mean() - alpha * n) < 5 * math.sqrt(n * alpha * (1 - alpha) / steps)
    batch = hot.batch(0, 16)
    for i in range(16):
        h = batch.histogram(i)
        assert h.counts.sum() == n and (h.counts[h.tokens >= world.common] == 1).all()


def test_distinct_n_known_values():
    assert tpe.distinct_n(np.array([1, 2, 1, 2]), 1) == 0.5
    assert tpe.distinct_n(np.array([1, 2, 1, 2]), 2) == pytest.approx(2 / 3)
    assert tpe.distinct_n(np.array([7]), 2) is None


# -- the peers' accounting -----------------------------------------------------------------------------------------------


def test_tang_accounting_matches_dp_accounting_known_values():
    """One step is dp-accounting's Poisson-sampled Gaussian under add-or-remove-one: our PLD and RDP
    accountants report what dp-accounting's own accountants report for 50 such steps."""
    event = dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(4.0))
    ours = tpe._accountant("tang-pld", None)
    ours.compose(event, 50)
    theirs = pld.PLDAccountant()
    theirs.compose(event, 50)
    assert ours.get_epsilon(1e-6) == pytest.approx(theirs.get_epsilon(1e-6), rel=2e-3)
    ours_rdp = tpe._accountant("tang-rdp", None)
    ours_rdp.compose(event, 50)
    theirs_rdp = rdp.RdpAccountant()
    theirs_rdp.compose(event, 50)
    assert ours_rdp.get_epsilon(1e-6) == pytest.approx(theirs_rdp.get_epsilon(1e-6), rel=1e-9)
    assert ours_rdp.get_epsilon(1e-6) >= ours.get_epsilon(1e-6)  # PLD is the tighter of the two here


def test_the_replace_one_budget_of_tang_is_implied_by_its_add_remove_budget():
    """Remove-then-add: delta_rep(eps) <= delta_ar(eps/2) (1 + e^(eps/2)).  Checked on the Gaussian, where
    replace-one is a shift of 2 and add/remove a shift of 1, and the budget conversion is the same formula."""
    assert tpe.add_remove_budget(2.0, 1e-6) == (1.0, pytest.approx(1e-6 / (1 + math.e)))
    assert tpe.replace_one_spent(*tpe.add_remove_budget(2.0, 1e-6)) == (2.0, pytest.approx(1e-6))
    for sigma in (2.0, 5.0, 20.0):
        add_remove = pld_lib.from_gaussian_mechanism(sigma, sensitivity=1.0)
        replace = pld_lib.from_gaussian_mechanism(sigma, sensitivity=2.0)
        for eps in (0.5, 1.0, 3.0):
            bound = add_remove.get_delta_for_epsilon(eps / 2) * (1 + math.exp(eps / 2))
            assert replace.get_delta_for_epsilon(eps) <= bound


def _renyi(p: np.ndarray, q: np.ndarray, order: float) -> float:
    return float(np.log(np.sum(p ** order * q ** (1 - order))) / (order - 1))


def test_invisibleink_is_charged_what_its_exact_law_needs_under_replace_one():
    """Two candidate tokens, one reference replaced by its mirror image (clipped differences +C/-C swapped):
    the output laws' Renyi divergences stay within our rho = 2 (C/(B' tau))^2 at every order, and exceed the
    paper's (C/(B' tau))^2 / 2, which holds only when a reference moves each coordinate by C."""
    references, clip, tau = 7, 2.0, 1.0
    rho = tpe.invisibleink_rho(clip, references, tau)
    assert rho == pytest.approx(2 * (clip / (references * tau)) ** 2)
    shift = 2 * clip / references  # one coordinate up, the other down, by 2C/B' each
    base = np.zeros(2)  # public logits equal: the worst case of the Bernoulli (probabilities near 1/2)
    p = np.exp(base + np.array([shift / 2, -shift / 2]) / tau)
    q = np.exp(base + np.array([-shift / 2, shift / 2]) / tau)
    p, q = p / p.sum(), q / q.sum()
    worst = max(_renyi(p, q, a) / a for a in (1.01, 1.5, 2.0, 4.0, 8.0, 32.0))
    assert worst <= rho
    assert worst > rho / 4  # the paper's figure would under-count this pair


def test_invisibleink_clip_is_calibrated_so_the_text_length_exhausts_the_budget():
    rho_total = tpe.max_rho(3.0, 1e-6)
    fresh = tpe._accountant("zcdp", (3.0, 1e-6))
    fresh.compose(dp_event.ZCDpEvent(rho_total))
    assert fresh.get_epsilon(1e-6) <= 3.0
    over = tpe._accountant("zcdp", None)
    over.compose(dp_event.ZCDpEvent(rho_total * 1.001))
    assert over.get_epsilon(1e-6) > 3.0
    clip = tpe.invisibleink_clip(rho_total, 40, 31, 1.2)
    event = dp_event.ZCDpEvent(tpe.invisibleink_rho(clip, 31, 1.2))
    memo: dict = {}
    assert tpe.affordable_steps("zcdp", (3.0, 1e-6), event, 10_000, memo) == 40
    assert tpe.refused_after("zcdp", (3.0, 1e-6), event, 10_000, memo)
    # exactly at the cap the text is exhausted (refused); a cap below it stops the run first
    assert tpe.affordable_steps("zcdp", (3.0, 1e-6), event, 40, memo) == 40
    assert tpe.refused_after("zcdp", (3.0, 1e-6), event, 40, memo)
    assert tpe.affordable_steps("zcdp", (3.0, 1e-6), event, 30, memo) == 30
    assert not tpe.refused_after("zcdp", (3.0, 1e-6), event, 30, memo)


def test_invisibleink_step_law_is_the_closed_form_on_the_alpha_mixture():
    """All teachers agree on s, so the batch average of clipped log-ratios is log(alpha P/K) (clipped) on the
    common tokens and -C on the decoys; the on-support probability follows."""
    world = tpe.build_world(60, 0.5, common=4, pool=20)
    clip, tau = 1.5, 1.1
    ids, probs = tpe.invisibleink_distribution(world, np.arange(60), clip, tau)
    assert set(ids.tolist()) == set(np.flatnonzero(world.public > 0).tolist())
    a = min(clip, math.log(0.5 * 20 / 4))
    support = 4 * math.exp(a / tau) / (4 * math.exp(a / tau) + 16 * math.exp(-clip / tau))
    assert probs[ids < 4].sum() == pytest.approx(support, rel=1e-9)


def test_a_tang_run_reports_its_replace_one_spend_within_the_budget():
    world = tpe.build_world(200, 0.7)
    tape = tpe.TangTape(world, 0.1, 4.0, np.random.default_rng(11))
    out = tpe.run_fixed("tang-rdp", tape.event(), tape, (3.0, 1e-6), 10_000, {})
    assert out.stop == "refused" and out.verified and out.steps > 0
    assert 2.5 < out.spent[0] <= 3.0 and out.spent[1] <= 1e-6  # in replace-one terms, not the add/remove half


def test_tang_releases_the_argmax_of_the_noisy_sum_on_the_public_top_k():
    world = tpe.build_world(400, 0.7)
    tape = tpe.TangTape(world, 1.0, 0.5, np.random.default_rng(9))
    tape.ensure(10)
    assert (tape.sampled[:10] == 400).all() and tape.passes(10) == 4010
    assert (tape.values[:10] < world.common).all()  # 400/20 votes of mass on each common token, noise 0.5
    assert tape.tokens.size == tpe.TANG_TOP_K


# -- the whole quick run ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_quick_run_stops_every_row_by_refusal_or_the_cap_and_plots(tmp_path):
    result = tpe.run(quick=True, progress=False)
    assert {r["row"] for r in result["results"]} == set(tpe.ROW_NAMES)
    assert all(r["stop"] in {"refused", "cap"} and r["ledgers_verified"] for r in result["results"])
    assert result["claims"][0]["holds"] and result["claims"][1]["holds"]
    [png] = tpe.plot(result, tmp_path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- groups and the public prior (issue 23) ---------------------------------------------------------------------------


def test_the_new_rows_are_appended_so_the_old_rows_keep_their_seeds():
    assert tpe.ROW_NAMES[:10] == (
        "hot-dpargmax-tct", "hot-dpargmax-pld", "hot-gnmax-pld", "hot-gnmax-threshold-pld",
        "cold-dpargmax-tct", "cold-gnmax-pld", "tang-pld", "tang-rdp", "invisibleink", "invisibleink-one-batch")
    rows = tpe.row_specs(4000, 20000, 1e-6)
    groups, prior = rows["hot-gnmax-threshold-pld-groups"], rows["hot-gnmax-threshold-pld-prior"]
    assert {p["groups"] for p in groups.grid} == set(tpe.GROUPS)
    for p in groups.grid:  # sigma and threshold scale with the group's n/G teachers
        m = 4000 // p["groups"]
        assert p["threshold"] == m // 2 + 1 and p["sigma"] in {m * f for f in (1 / 256, 1 / 64, 1 / 16, 1 / 4)}
    assert {p["mix"] for p in prior.grid} == set(tpe.PRIOR_MIXES) and prior.base == "hot-gnmax-threshold-pld"
    assert all({k: v for k, v in p.items() if k != "mix"} in rows[prior.base].grid for p in prior.grid)


def _group_tapes(world, mech, groups, seed):
    size = world.num_teachers // groups
    return [tpe.Tape(mech, tpe.VoteStream(world, "coordinated", np.random.default_rng([seed, g]),
                                          members=(g * size, size)), np.random.default_rng([seed, 100 + g]))
            for g in range(groups)]


def test_a_groups_run_pays_once_by_the_envelope_and_releases_about_g_times_one_group():
    from mechanisms import GaussianThresholdArgMax

    n, groups, budget = 400, 4, (2.0, 1e-6)
    world = tpe.build_world(n, 0.9)
    m = n // groups
    mech = GaussianThresholdArgMax(m / 16, vocab_size=world.vocab_size, threshold=m // 2 + 1)
    out = tpe.run_groups("pld", mech.event, _group_tapes(world, mech, groups, 5), budget, 100_000, {})
    assert out.stop == "refused" and out.verified and out.ledgers == 1 and out.steps > 0
    # one group alone, on group 0's own stream and noise: the same steps, the same spend, the same tokens
    alone_tape = _group_tapes(world, mech, groups, 5)[0]
    alone = tpe.run_fixed("pld", mech.event, alone_tape, budget, 100_000, {})
    assert alone.steps == out.steps and alone.verified
    assert out.spent == pytest.approx(alone.spent, rel=1e-9)
    assert out.group_tokens[0] == alone.tokens.size and sum(out.group_tokens) == out.tokens.size
    assert 0.8 * groups * alone.tokens.size <= out.tokens.size <= 1.2 * groups * alone.tokens.size
    # sequential composition of the G groups' charges would not afford them: the envelope is what pays
    assert not tpe._accountant("pld", budget).can_afford(mech.event, 2 * out.steps)
    assert out.passes == groups * m * out.steps
    # each group votes with its own teachers: a private token released by group g is one of its members'
    start = 0
    for g, count in enumerate(out.group_tokens):
        tokens = out.tokens[start:start + count]
        private = tokens[tokens >= world.common]
        assert ((private >= world.common + g * m) & (private < world.common + (g + 1) * m)).all()
        start += count


def test_the_groups_row_in_a_run_verifies_and_sums_its_groups():
    result = tpe.run(quick=True, seed=1, progress=False, teachers=400, alphas="0.9", budgets="3", cap=200,
                     rows="hot-gnmax-threshold-pld-groups")
    [r] = result["results"]
    assert r["ledgers_verified"] and r["stop"] in {"refused", "cap"} and len(r["group_tokens"]) == r["params"]["groups"]
    assert sum(r["group_tokens"]) == r["private_tokens"] and r["spent_epsilon"] <= 3.0
    assert r["tokens_per_record"] == pytest.approx(r["private_tokens"] / 400)


def test_public_prior_votes_move_to_the_public_pool_as_lambda_grows():
    n, steps = 300, 1024
    world = tpe.build_world(n, 0.6)
    decoy_share = {}
    for lam in (0.0, 0.1, 0.25):
        stream = tpe.VoteStream(tpe.prior_world(world, lam), "coordinated", np.random.default_rng(21), decoys=True)
        stream.ensure(steps)
        decoy_share[lam] = stream.decoys[:steps].sum() / (n * steps)
        batch = stream.batch(0, 32)
        for i in range(32):
            h = batch.histogram(i)
            assert h.counts.sum() == n
            decoys = (h.tokens >= world.common + n)
            assert (h.tokens[(h.tokens >= world.common) & ~decoys] < world.common + n).all()
    # each teacher votes a decoy with probability lambda (P - K) / P = 0.8 lambda (coordinated: correlated steps)
    assert decoy_share[0.0] == 0.0
    assert abs(decoy_share[0.1] - 0.08) < 0.04 and abs(decoy_share[0.25] - 0.2) < 0.06
    assert decoy_share[0.25] > decoy_share[0.1] > 0


def test_public_prior_at_lambda_zero_is_the_plain_row_and_lambda_changes_the_releases():
    n, cap, delta = 300, 400, 1e-6
    world = tpe.build_world(n, 0.9)
    specs = tpe.row_specs(n, cap, delta)
    plain = specs["hot-gnmax-threshold-pld"]
    point = 1
    params = plain.grid[point]
    prior = attr.evolve(specs["hot-gnmax-threshold-pld-prior"],
                        grid=[dict(params, mix=lam) for lam in (0.0, 0.25)])
    plan = {plain.name: {point: [8.0]}, prior.name: {0: [8.0], 1: [8.0]}}
    out = tpe.run_pass(world, [plain, prior], plan, delta, cap, 7, {}, precision_steps=cap)
    base, zero, mixed = out[(plain.name, point, 8.0)], out[(prior.name, 0, 8.0)], out[(prior.name, 1, 8.0)]
    assert zero == base  # every metric, the precision estimate included
    assert zero[0]["ledgers_verified"] and mixed[0]["ledgers_verified"]
    assert mixed[0]["steps"] == base[0]["steps"]  # the same event per step: the prior costs no budget
    assert mixed[0]["private_tokens"] != base[0]["private_tokens"] or mixed[0]["precision"] != base[0]["precision"]
    assert mixed[0]["precision"] < 1.0 == base[0]["precision"]  # decoys released: the bias towards the public model


# -- DPWS, target charging in groups, the public-candidate BetweenThresholds (issue 23, item 5) --------------------

ITEM5 = ("hot-dpws-tct", "hot-dpws-pld", "cold-dpws-tct", "cold-dpws-pld", "hot-dpargmax-tct-groups",
         "hot-bt-public-individual", "hot-bt-public-tct")


def test_the_item5_rows_are_appended_after_the_earlier_ones_with_their_grids():
    assert tpe.ROW_NAMES[:12] == (
        "hot-dpargmax-tct", "hot-dpargmax-pld", "hot-gnmax-pld", "hot-gnmax-threshold-pld",
        "cold-dpargmax-tct", "cold-gnmax-pld", "tang-pld", "tang-rdp", "invisibleink", "invisibleink-one-batch",
        "hot-gnmax-threshold-pld-groups", "hot-gnmax-threshold-pld-prior")
    assert tpe.ROW_NAMES[12:] == ITEM5
    from mechanisms import BetweenThresholds, BoundaryWrapper, DPArgMax, DPWeightedSampling

    rows = tpe.row_specs(4000, 20000, 1e-6)
    world = tpe.build_world(40, 0.9)
    for name in ITEM5[:4]:
        row = rows[name]
        twin = "hot-dpargmax-pld" if name == "cold-dpws-pld" else name.replace("dpws", "dpargmax")
        assert row.inner == "dpws" and row.grid == rows[twin].grid
        mech = tpe._vote_mechanism(row, row.grid[0], world)
        inner = mech.inner if row.runner == "tct" else mech
        assert isinstance(mech, BoundaryWrapper) == (row.runner == "tct") and isinstance(inner, DPWeightedSampling)
    groups = rows["hot-dpargmax-tct-groups"]
    assert {p["groups"] for p in groups.grid} == set(tpe.GROUPS)
    for p in groups.grid:  # misses are summed over the groups: delta0 pays for G x cap queries
        single = rows["hot-dpargmax-tct"].grid[0]["delta0"]
        assert p["delta0"] == tpe._per_query_delta(1e-6, p["groups"] * 20000) < single
        mech = tpe._vote_mechanism(groups, p, world)
        assert isinstance(mech.inner, DPArgMax) and mech.event.epsilon == pytest.approx(p["eps0"])
    for name in ITEM5[5:]:
        assert [p["epsilon"] for p in rows[name].grid] == list(tpe.BT_LEVELS)
        mech = tpe._vote_mechanism(rows[name], rows[name].grid[1], tpe.build_world(4000, 0.9))
        assert mech == BetweenThresholds.for_teachers(tpe.BT_LEVELS[1], 4000) and mech.low == 800


def test_dpws_rows_stop_by_refusal_and_cold_releases_fewer_than_hot():
    """Plain DPWS under PLD: the accountant's own count, the spend recomputed by a fresh accountant; the
    wrapped DPWS under target charging verifies.  Independent votes spread the common mass over K tokens, so
    DPWS (a token is kept with probability about c/n, never below its noise floor) releases fewer."""
    from mechanisms import BoundaryWrapper, DPWeightedSampling

    world, budget = tpe.build_world(600, 0.9), (8.0, 1e-6)
    mech = DPWeightedSampling(0.05, 1e-9)
    out = {}
    for k, kind in enumerate(("coordinated", "independent")):
        tape = tpe.Tape(mech, tpe.VoteStream(world, kind, np.random.default_rng(30 + k)), np.random.default_rng(40))
        out[kind] = tpe.run_fixed("pld", mech.event, tape, budget, 100_000, {})
        assert out[kind].stop == "refused" and out[kind].verified
    fresh = tpe._accountant("pld", budget)
    fresh.compose(mech.event, out["coordinated"].steps)
    assert fresh.spent() == pytest.approx(out["coordinated"].spent) and fresh.spent()[0] <= 8.0
    assert not fresh.can_afford(mech.event)
    assert out["independent"].tokens.size < out["coordinated"].tokens.size
    wrapped = BoundaryWrapper(DPWeightedSampling(0.1, 1e-10))
    tape = tpe.Tape(wrapped, tpe.VoteStream(world, "coordinated", np.random.default_rng(30)), np.random.default_rng(41))
    tct = tpe.run_tct(tape, budget, 5000)
    assert tct.verified and tct.stop in {"refused", "cap"} and tct.steps == tct.ledger_queries
    assert tct.spent[0] <= 8.0 and tct.spent[1] <= 1e-6


def _group_tct(n, groups, alpha, budget, cap, seed):
    from mechanisms import BoundaryWrapper, DPArgMax

    world = tpe.build_world(n, alpha)
    mech = BoundaryWrapper(DPArgMax(0.1, tpe._per_query_delta(budget[1], groups * cap)))
    tapes = _group_tapes(world, mech, groups, seed)
    out = []
    return tpe.run_tct_groups(tapes, budget, cap, accountant_out=out), out[0], tapes, mech


def test_a_groups_tct_run_stays_within_its_budget_and_pays_the_hit_envelope():
    """Target charging in groups: the accountant's hits are the most any group hit (the envelope), its queries
    those hits plus every group's queries without a hit; a fresh accountant charged that sequence reports the
    same spend, within the budget; no group ran past the point where the next query was refused."""
    budget, cap = (8.0, 1e-6), 3000
    out, acc, tapes, mech = _group_tct(800, 2, 0.9, budget, cap, 12)
    assert out.stop == "refused" and out.verified and out.ledgers == 1
    group_hits = [int(t.hits[:k].sum()) for t, k in zip(tapes, out.group_steps)]
    misses = sum(k for k in out.group_steps) - sum(group_hits)
    assert acc.hits == max(group_hits) <= acc.max_hits and sum(group_hits) == out.hits
    assert acc.queries == max(group_hits) + misses  # hits below the envelope are paid for already
    assert out.ledger_queries == sum(out.group_steps)  # the ledger keeps each group's own queries
    assert out.spent[0] <= budget[0] and out.spent[1] <= budget[1]
    fresh = tpe._accountant("target-charging", budget)
    order = [False] * misses + [True] * max(group_hits) if acc.charged_tau == acc.hits else \
        [True] * max(group_hits) + [False] * misses
    fresh.record_outcomes(mech.event, np.array(order))
    assert fresh.spent() == pytest.approx(out.spent, rel=1e-12)
    # sequential composition of the groups' hits would not fit where the groups hit more than the limit in all
    if sum(group_hits) > acc.max_hits:
        assert not tpe._accountant("target-charging", budget).can_afford(mech.event, sum(group_hits))
    # every group's view refuses its next query; releases are the groups' own
    assert all(k < cap for k in out.group_steps) and out.tokens.size == sum(out.group_tokens)
    assert out.passes == sum(400 * k for k in out.group_steps)


def test_a_groups_tct_row_in_a_run_verifies():
    result = tpe.run(quick=True, seed=2, progress=False, teachers=400, alphas="0.9", budgets="8", cap=300,
                     rows="hot-dpargmax-tct-groups")
    [r] = result["results"]
    assert r["ledgers_verified"] and r["stop"] in {"refused", "cap"} and r["spent_epsilon"] <= 8.0
    assert len(r["group_steps"]) == len(r["group_tokens"]) == r["params"]["groups"]
    assert sum(r["group_tokens"]) == r["private_tokens"] and r["steps"] == max(r["group_steps"])


def test_public_candidates_follow_the_public_model_and_read_the_candidates_count():
    world = tpe.build_world(300, 0.8)
    stream = tpe.VoteStream(world, "coordinated", np.random.default_rng(3))
    cands, counts = tpe.public_candidates(world, stream, 0, 4096, np.random.default_rng(4))
    assert set(np.unique(cands)) <= set(np.flatnonzero(world.public > 0))
    assert abs(np.mean(cands < world.common) - world.common / world.pool) < 0.03
    rows = np.arange(4096)
    common = cands < world.common
    assert (counts[common] == stream.common[rows[common], cands[common]]).all() and (counts[~common] == 0).all()


def test_the_public_candidate_under_target_charging_releases_between_and_above():
    """``between`` (the target hit) and ``above`` release the candidate, ``below`` nothing; every release is
    a token the candidate's voters back (here the common ones), and the ledger counts every query."""
    from mechanisms import BetweenThresholds

    world = tpe.build_world(200, 0.95, common=4, pool=8)
    mech = BetweenThresholds.for_teachers(0.05, 200)
    tape = tpe.CandidateTape(mech, tpe.VoteStream(world, "coordinated", np.random.default_rng(5)), world,
                             np.random.default_rng(6))
    out = tpe.run_tct(tape, (3.0, 1e-6), 20_000)
    assert out.stop == "refused" and out.verified and out.steps == out.ledger_queries
    assert out.hits == tpe._accountant("target-charging", (3.0, 1e-6)).max_hits_for(mech.event)
    codes = np.asarray(tape.outcomes[:out.steps])
    assert out.tokens.size == int(np.count_nonzero(codes != "below")) > out.hits
    assert out.fails == out.steps - out.tokens.size
    # only the public pool is ever proposed; a decoy (no votes) is released only when the noise lifts a count of
    # 0 past low = 40 (probability about e^(-0.05 x 40) / 2), the common tokens by their votes
    assert np.isin(out.tokens, np.flatnonzero(world.public > 0)).all() and np.mean(out.tokens < world.common) > 0.6
    assert out.passes == out.steps * 201


def test_the_public_candidate_under_individual_charging_keeps_every_teacher_within_its_budget():
    """Only the counted teachers are charged, on ``between``; a teacher at its limit is removed and never
    charged again; the worst teacher's guarantee is within the budget; the run ends when no teacher is left
    (refused), not at the cap."""
    from mechanisms import BetweenThresholds

    n, budget, cap = 60, (3.0, 1e-6), 200_000
    world = tpe.build_world(n, 0.98, common=2, pool=2)
    mech = BetweenThresholds.for_teachers(0.05, n)
    stream = tpe.VoteStream(world, "coordinated", np.random.default_rng(7))
    accs = []
    out = tpe.run_individual(mech, stream, world, budget, cap, np.random.default_rng(8), accountant_out=accs)
    [acc] = accs
    assert out.stop == "refused" and out.steps < cap and acc.num_active == 0 and out.verified
    limit = acc.per_teacher_limit
    assert limit >= 1 and (np.asarray(acc.counters) == limit).all()  # everyone charged up to, never past, its limit
    assert out.spent[0] <= budget[0] and out.spent[1] <= budget[1]
    assert acc.hits == out.hits and out.ledger_queries == out.steps
    assert out.tokens.size >= out.hits and (out.tokens < world.common).all()
    assert sum(acc.counters) >= out.hits  # a hit charges its counted teachers, at least one here
    # a budget that affords no charge per teacher at this level runs nothing
    none = tpe.run_individual(BetweenThresholds.for_teachers(0.5, n), stream, world, (1.0, 1e-6), cap,
                              np.random.default_rng(9))
    assert none.steps == 0 and none.stop == "refused" and none.tokens.size == 0


def test_the_public_candidate_rows_in_a_run_say_when_they_stop_at_the_cap():
    n, cap, delta = 300, 400, 1e-6
    specs = tpe.row_specs(n, cap, delta)
    rows = [attr.evolve(specs[name], grid=[{"epsilon": 0.02}]) for name in ITEM5[5:]]
    out = tpe.run_pass(tpe.build_world(n, 0.95), rows, {row.name: {0: [8.0]} for row in rows}, delta, cap, 4, {},
                       precision_steps=cap)
    for (name, _, eps), (r, extra) in out.items():
        r = dict(r, budget_epsilon=eps)
        assert r["ledgers_verified"] and r["stop"] in {"refused", "cap"} and extra["precision_estimate"] > 0
        assert (r["stop"] == "cap") == (r["steps"] >= 400) and r["steps"] <= 400
        if r["steps"]:
            assert r["spent_epsilon"] <= r["budget_epsilon"] and r["private_tokens"] >= r["target_hits"]


def test_the_figure_draws_the_best_hot_and_cold_rows_beside_each_peer(small):
    """Issue 32, item 9: 18 rows drawn at once repeated their colours; the figure draws the best Hot PATE and the
    best Cold PATE row at each alpha (the most tokens among admissible runs) and each peer row, in distinct
    colours."""
    budget = small["parameters"]["budgets"][0]
    series = dict(tpe._plotted_series(small, budget))
    peers = {r["row"] for r in small["results"] if r["family"] == "peer"}
    assert set(series) <= {"Hot PATE (best row)", "Cold PATE (best row)"} | peers and peers <= set(series)
    hot = [r for r in small["results"] if r["row"].startswith("hot-") and r["budget_epsilon"] == budget]
    if hot:
        for entry in series["Hot PATE (best row)"]:
            same = [r for r in hot if r["alpha"] == entry["alpha"]]
            assert tpe._key(entry) == max(tpe._key(r) for r in same)
    colours = [(tpe._SERIES_STYLES.get(name) or tpe._STYLES[name])[0] for name in series]
    assert len(set(colours)) == len(colours)
