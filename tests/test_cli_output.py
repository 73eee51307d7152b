"""Honest progress and output (issue 13, item 3): the run's progress shows a prefill phase of its own and counts
private and public-fallback tokens apart over a bar of records (its total never jumps); transformers' and
huggingface_hub's own bars are silenced while a model loads; ``--json`` leaves stderr empty; ``spent`` has
one shape in the JSON; the audit prints a run's metadata one field per line."""

from __future__ import annotations

import json

import pytest

from pate_app.commands.audit import metadata_lines
from pate_app.library_output import quiet_libraries
from pate_app.run import RunProgress


def test_progress_has_a_prefill_phase_and_counts_private_and_fallback_apart(capsys):
    progress = RunProgress(2, enabled=True)
    progress.record_starts()
    first = capsys.readouterr().err
    assert "prefill of the teachers' prompts" in first and "records 0/2" in first
    assert "<?" in first  # no ETA before a record has ended
    for outcome in ("fallback", "token", "fail", "token", "fallback"):
        progress.step(outcome)
    progress.record_ends()
    err = capsys.readouterr().err
    assert "private 2, fallback 2 (5 charged runs)" in err and "records 1/2" in err
    assert progress.bar.total == 2  # one unit per record: a record that stops early never moves the total
    progress.close()


def test_disabled_progress_is_silent(capsys):
    progress = RunProgress(3, enabled=False)
    progress.record_starts()
    progress.step("token")
    progress.record_ends()
    progress.close()
    assert capsys.readouterr().err == ""


def test_library_output_is_dropped_while_loading(capsys):
    import sys

    with quiet_libraries(drop_stderr=True):
        print("a tqdm bar drawn by a loader", file=sys.stderr)
    print("after", file=sys.stderr)
    assert capsys.readouterr().err == "after\n"


def test_library_bars_are_silenced_while_loading_and_restored_after():
    hf_logging = pytest.importorskip("transformers.utils.logging")
    hub = pytest.importorskip("huggingface_hub.utils")
    before = (hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity(), hub.are_progress_bars_disabled())
    with quiet_libraries():
        assert not hf_logging.is_progress_bar_enabled()
        assert hub.are_progress_bars_disabled()
    assert (hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity(),
            hub.are_progress_bars_disabled()) == before


def test_audit_metadata_prints_one_field_per_line():
    meta = {"model": "SmolLM2", "budget": {"epsilon": 2.0, "delta": 1e-6}, "seeded": False,
            "mechanism": {"class": "DPArgMax", "parameters": {"epsilon": 1.0}}}
    lines = metadata_lines(meta, "  ")
    keys = [line.split(" : ")[0].strip() for line in lines]
    assert keys == ["budget.delta", "budget.epsilon", "mechanism.class", "mechanism.parameters.epsilon", "model",
                    "seeded"]
    assert all(line.startswith("  ") and " : " in line for line in lines)
    assert lines[-1].endswith(": false") and lines[-2].endswith(": SmolLM2")
    assert len({line.index(" : ") for line in lines}) == 1  # one column


@pytest.mark.slow
def test_json_run_leaves_stderr_empty_and_spent_has_one_shape(tmp_path, capsys):
    """A real (tiny, embedded-model) generate --json run: nothing at all on stderr (an unseeded run has no
    warning to give), and every epsilon/delta pair of the result is one ``{"epsilon", "delta"}`` object."""
    pytest.importorskip("torch")
    from pate_accountant.cli import main

    ledger = tmp_path / "quiet.sqlite"
    status = main(["generate", "--data", "bundled", "--ledger", str(ledger), "--teachers", "16", "--records", "1",
                   "--max-tokens", "3", "--budget-epsilon", "100", "--budget-delta", "1e-3", "--json"])
    captured = capsys.readouterr()
    # At most the one status line of the one-off model conversion (on a fresh machine), nothing else.
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert status == 0 and all(line.startswith("pate-accountant: converting the embedded") for line in lines), lines
    assert len(lines) <= 1
    result = json.loads(captured.out)
    for pair in (result["spent"], result["spent_before"], result["budget"], result["audit"]["spent"]):
        assert set(pair) == {"epsilon", "delta"}
    assert main(["audit", str(ledger), "--json"]) == 0
    audit = json.loads(capsys.readouterr().out)
    assert set(audit["spent"]) == {"epsilon", "delta"} and set(audit["budget"]) == {"epsilon", "delta"}
