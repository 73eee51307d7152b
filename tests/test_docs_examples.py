"""The examples users copy run as printed: the README's taste of the API and the ledger page's headline
example (refuse before running, then audit)."""

import re
from pathlib import Path

from pate_accountant.cli import main

ROOT = Path(__file__).resolve().parent.parent


def _python_block(doc: str, after: str) -> str:
    text = (ROOT / doc).read_text()
    start = text.index(after)
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    return match.group(1)


def test_the_readme_taste_of_the_api_charges_through_register(capsys):
    code = _python_block("README.md", "## A taste of the API")
    assert "register(" in code and "ThresholdWeightedSampling" not in code  # a DP mechanism, refused early
    exec(compile(code, "README.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "(1.0, 4e-08)"
    assert sum(line.startswith("Release(") for line in lines) == 4


def test_the_ledger_example_refuses_before_running_and_audits(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = _python_block("docs/ledger.md", "# The privacy ledger")
    assert "register(" in code
    exec(compile(code, "docs/ledger.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == ["3", "3", "3"] and out[3].startswith("refused before running")
    assert main(["audit", "dolly.ledger"]) == 0
    audit = capsys.readouterr().out
    assert "rows        : 3" in audit and "spent       : epsilon 0.9, delta 3e-08" in audit


def test_the_groups_example_spends_the_budget_once_per_group(capsys):
    """docs/groups.md: each of three groups charges as many steps as one accountant alone could, and the
    data set's spend stays within its budget."""
    from pate_accountant.accountants import PldAccountant
    from pate_accountant.events import EpsilonDeltaEvent

    code = _python_block("docs/groups.md", "## From Python")
    exec(compile(code, "docs/groups.md", "exec"), {})
    alone = PldAccountant(budget=(4.0, 1e-6))
    steps = 0
    while alone.can_afford(EpsilonDeltaEvent(0.5, 1e-8)):
        alone.compose(EpsilonDeltaEvent(0.5, 1e-8))
        steps += 1
    assert steps > 0
    assert capsys.readouterr().out.split() == [str(steps), "True"]


def test_the_ledger_home_example_keeps_one_budget_for_a_grown_data_set(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATE_ACCOUNTANT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATE_ACCOUNTANT_CONFIG", str(tmp_path / "config"))
    code = _python_block("docs/ledger.md", "**From Python.** `synthesize(spec, records=...)`")
    assert "open_ledger(" in code
    exec(compile(code, "docs/ledger.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["True"]
