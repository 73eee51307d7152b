"""docs/tutorial.md, run as written: every ``pate-accountant`` command in its ``bash`` blocks exits 0 in a fresh
folder, in order (plan, generate on the bundled sample and the embedded model, audit); the ``generate``
command is the one ``plan compare`` prints, with ``DATA`` and ``LEDGER`` filled in; the plan output it shows
is the tool's output line for line; and the numbers its text quotes are the tool's."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest

#: Model lane: the tutorial's run loads the embedded SmolLM2 (about a minute on two cores).
pytestmark = pytest.mark.slow

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pate_accountant.cli import main  # noqa: E402

TUTORIAL = Path(__file__).resolve().parent.parent / "docs" / "tutorial.md"


def _blocks(kind: str) -> list[str]:
    """The fenced blocks opened by ```` ```KIND ```` (``""``: a plain fence), in order."""
    blocks, current = [], None
    for line in TUTORIAL.read_text(encoding="utf-8").splitlines():
        if current is None and line.startswith("```"):
            current = [] if line[3:].strip() == kind else False
        elif current is not None and line.startswith("```"):
            if current is not False:
                blocks.append("\n".join(current) + "\n")
            current = None
        elif current:
            current.append(line)
        elif current == []:
            current = [line]
    return blocks


def _commands() -> list[list[str]]:
    return [shlex.split(line) for block in _blocks("bash") for line in block.splitlines()
            if line.startswith("pate-accountant ")]


def test_the_tutorial_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "support.csv").write_text(_blocks("csv")[0], encoding="utf-8")  # "save these messages as ..."
    commands = _commands()
    assert [argv[1] for argv in commands] == ["plan", "generate", "audit", "keygen", "sign", "audit", "generate",
                                              "audit", "plan"]
    outputs = []
    for argv in commands:
        assert main(argv[1:]) == 0, argv
        outputs.append(capsys.readouterr().out)

    # The generate command is the plain run the plan printed, DATA and LEDGER filled in, plus its size.
    assert main([*commands[0][1:], "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    filled = [{"DATA": "bundled", "LEDGER": "tutorial.sqlite"}.get(w, w) for w in plan["plain_run"]["argv"]]
    generate = commands[1]
    assert generate[:len(filled)] == filled
    assert generate[len(filled):] == ["--records", "2", "--max-tokens", "24"]
    assert (tmp_path / "tutorial.sqlite").is_file()
    assert "verdict     : OK" in outputs[2] or "OK" in outputs[2].splitlines()[-1]
    assert (tmp_path / "operator.key").is_file() and (tmp_path / "tutorial.sqlite.checkpoints.jsonl").is_file()
    assert "signed      : OK: 1 signed checkpoint(s)" in outputs[5]
    # The pin the text describes, with the head hash and row count the audit printed.
    head = next(line.split()[3] for line in outputs[2].splitlines() if line.startswith("head hash"))
    rows = next(line.split()[2] for line in outputs[2].splitlines() if line.startswith("rows "))
    assert main(["audit", "tutorial.sqlite", "--expect-head", head, "--expect-rows", rows]) == 0
    assert "pinned      : " in capsys.readouterr().out

    # The plan output the page shows is the tool's, line for line (the placeholders' notes shortened).
    shown = [b for b in _blocks("") if b.startswith("48 queries")][0].splitlines()
    real = outputs[0].splitlines()
    for line in shown:
        if line.strip() not in ("(DATA: ...)", "(LEDGER: ...)"):
            assert line in real, line

    # The second path: one record per label in the file, the ledger's groups are the labels, audit shows what is left.
    lines = [json.loads(line) for line in (tmp_path / "synthetic.jsonl").read_text().splitlines()]
    assert 1 <= len(lines) <= 3 and {line["label"] for line in lines} <= {"account", "billing", "shipping"}
    assert all(line["complete"] and line["private_tokens"] + line["public_tokens"] == line["num_tokens"]
               for line in lines)
    assert "remaining   : " in outputs[7] and "groups: 3 groups of records" in outputs[7]
    assert "privacy unit: one record: replace-one" in outputs[7] and "counted 2 times" in outputs[7]
    assert b"courier" not in (tmp_path / "support.sqlite").read_bytes()

    # The for-tokens numbers the text quotes.
    assert main([*commands[-1][1:], "--json"]) == 0
    tokens = json.loads(capsys.readouterr().out)
    text = TUTORIAL.read_text(encoding="utf-8")
    run = tokens["run"]
    assert f"{tokens['num_teachers']:,} teachers at `eps0 = {tokens['eps0']:.3g}`" in text
    assert f"`L = {run['error_bound']}`" in text and f"{run['release_threshold']:,} votes" in text
    assert f"({run['teachers_to_release']:,})" in text and not run["can_release"]
