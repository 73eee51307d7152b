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
                                              "generate", "plan"]
    refused = 6  # section 5's private run on 12 records: refused, as the page shows
    outputs = []
    for i, argv in enumerate(commands):
        if i == refused:
            assert main(argv[1:]) == 2, argv
            said = capsys.readouterr()
            shown = [b for b in _blocks("") if b.startswith("pate-accountant generate: error:")]
            assert said.err.strip().splitlines()[-1] == shown[0].strip()
            assert not (tmp_path / "support.sqlite").exists() and not (tmp_path / "synthetic.jsonl").exists()
            outputs.append(said.out)
            continue
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

    # The second path: the public model alone, one record per label in the file, nothing charged, no ledger.
    lines = [json.loads(line) for line in (tmp_path / "synthetic.jsonl").read_text().splitlines()]
    assert [line["label"] for line in lines] == ["account", "billing", "shipping"]
    assert all(line["complete"] and line["private_tokens"] == 0 and line["public_tokens"] == line["num_tokens"]
               for line in lines)
    assert "the public model alone (--public-only)" in outputs[7] and "nothing is charged" in outputs[7]
    assert not (tmp_path / "support.sqlite").exists()
    # what the text says a private run on this data would need: 30 teachers a label at step epsilon 2
    from pate_accountant import planning
    from pate_app.run import build_mechanism, noise_release

    mechanism = build_mechanism("gaussian-threshold-argmax", 2.0, 1e-7, num_teachers=30)
    assert noise_release(mechanism, 30, 49152, 50) < 0.0005  # "0.0 %"
    assert planning.step_limits("pld", mechanism.event, 10.0, 1e-6).max_steps == 20

    # The for-tokens numbers the text quotes.
    assert main([*commands[-1][1:], "--json"]) == 0
    tokens = json.loads(capsys.readouterr().out)
    text = TUTORIAL.read_text(encoding="utf-8")
    run = tokens["run"]
    assert f"{tokens['num_teachers']:,} teachers at `eps0 = {tokens['eps0']:.3g}`" in text
    assert f"`L = {run['error_bound']}`" in text and f"{run['release_threshold']:,} votes" in text
    assert f"({run['teachers_to_release']:,})" in text and not run["can_release"]
