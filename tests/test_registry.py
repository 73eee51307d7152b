"""The one registry per kind: accountants (pate_accountant.registry) and mechanisms (mechanisms.registry)."""

from __future__ import annotations

import argparse

import pytest

from mechanisms import DPArgMax, registry as mechanisms_registry
from pate_accountant import registry as accountants_registry
from pate_accountant.accountants import BasicCompositionAccountant, IndividualChargingAccountant
from pate_accountant.events import EpsilonDeltaEvent
from pate_accountant.ledger import Ledger, LedgerError, accountant_class


@pytest.fixture(autouse=True)
def _scratch_registries(monkeypatch):
    """Registrations made by a test go to copies of the registries and vanish after it."""
    accountants_registry.accountant_names()  # the built-ins are loaded before the copy is taken
    monkeypatch.setattr(accountants_registry, "_ENTRIES", dict(accountants_registry._ENTRIES))
    monkeypatch.setattr(mechanisms_registry, "_ENTRIES", dict(mechanisms_registry._ENTRIES))


def _subparser_choices(parser: argparse.ArgumentParser, command: str, option: str):
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return tuple(next(a for a in sub._actions if option in a.option_strings).choices)


def test_the_cli_and_the_runs_offer_exactly_the_registered_names():
    from pate_app.cli import build_parser

    parser = build_parser()
    assert _subparser_choices(parser, "generate", "--mechanism") == mechanisms_registry.run_mechanism_names()
    assert _subparser_choices(parser, "generate", "--accountant") == accountants_registry.run_accountant_names()
    assert accountants_registry.run_accountant_names() == ("advanced", "basic", "individual-charging", "pld", "rdp",
                                                           "target-charging")


def test_every_registered_accountant_is_what_the_ledger_rebuilds():
    for kind in accountants_registry.accountant_names():
        cls = accountants_registry.accountant_class(kind)
        assert cls.kind == kind and accountant_class(kind) is cls
    assert accountant_class("individual-charging") is IndividualChargingAccountant
    with pytest.raises(LedgerError, match="unknown accountant kind 'nope'.*register_accountant"):
        accountant_class("nope")


def test_a_user_accountant_registers_once_and_replays_from_a_ledger(tmp_path):
    class CappedBasic(BasicCompositionAccountant):
        kind = "test-capped-basic"

    assert accountants_registry.register_accountant(CappedBasic) is CappedBasic
    accountants_registry.register_accountant(CappedBasic)  # the same class again: no-op

    class Impostor(BasicCompositionAccountant):
        kind = "test-capped-basic"

    with pytest.raises(ValueError, match="already registered"):
        accountants_registry.register_accountant(Impostor)
    with pytest.raises(TypeError, match="Accountant subclass"):
        accountants_registry.register_accountant(object)
    path = tmp_path / "user.sqlite"
    with Ledger.open(path) as ledger:
        acc = CappedBasic(budget=(1.0, 1e-6), ledger=ledger)
        acc.compose(EpsilonDeltaEvent(0.25), count=2)
    with Ledger.open(path, read_only=True) as ledger:
        result = ledger.verify()
        assert result.ok and result.spent[0] == pytest.approx(0.5)


def test_mechanism_registry_builds_audits_and_refuses_clashes():
    mech = mechanisms_registry.build_mechanism("dp-argmax", 1.0, 1e-6)
    assert isinstance(mech, DPArgMax) and mech.error_bound == DPArgMax(1.0, 1e-6).error_bound
    assert mechanisms_registry.mechanism_entry("weighted-sampling").name == "dp-weighted-sampling"  # earlier name
    with pytest.raises(KeyError, match="unknown mechanism 'nope'"):
        mechanisms_registry.mechanism_entry("nope")
    with pytest.raises(ValueError, match="cannot be built"):
        mechanisms_registry.build_mechanism("noisy-argmax", 1.0, 1e-6)
    with pytest.raises(ValueError, match="needs the number of teachers"):
        mechanisms_registry.build_mechanism("between-thresholds", 1.0, 1e-6)
    with pytest.raises(ValueError, match="already registered"):
        mechanisms_registry.register_mechanism("dp-argmax", build=lambda e, d, r: None, runs=True)
    with pytest.raises(ValueError, match="needs a build"):
        mechanisms_registry.register_mechanism("test-no-build", runs=True)
    with pytest.raises(ValueError, match="alias"):
        mechanisms_registry.register_mechanism("boundary-wrapper")


def test_a_user_mechanism_is_offered_to_runs():
    from pate_app.run import build_mechanism

    mechanisms_registry.register_mechanism(
        "test-strict-argmax", build=lambda e, d, r: DPArgMax(e / 2, d, relation=r), runs=True)
    assert "test-strict-argmax" in mechanisms_registry.run_mechanism_names()
    assert build_mechanism("test-strict-argmax", 2.0, 1e-6).epsilon == 1.0


def test_the_examples_in_docs_extending_run():
    """Every Python block of docs/extending.md runs, and registers what it says."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "extending.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block, "docs/extending.md", "exec"), {"__name__": "docs_example"})
    assert "team-basic" in accountants_registry.run_accountant_names()
    assert mechanisms_registry.build_mechanism("half-budget-argmax", 2.0, 1e-6).epsilon == 1.0


def test_builtin_accountant_table_matches_the_classes():
    """The registry lists the built-in kinds without importing them (fast --help): its table must name every
    built-in class by its own kind and runs flag."""
    import pate_accountant.accountants as accountants
    from pate_accountant.registry import _ENTRIES, BUILTIN_KINDS

    builtins = {entry.kind: entry.runs for entry in _ENTRIES.values() if entry.cls.__module__.startswith(
        accountants.__name__)}
    assert builtins == BUILTIN_KINDS


def test_mechanisms_package_names_its_lazy_exports():
    import mechanisms

    assert sorted(mechanisms.__all__) == sorted(mechanisms._MODULES)
    for name in mechanisms.__all__:
        assert getattr(mechanisms, name) is getattr(__import__(mechanisms._MODULES[name], fromlist=[name]), name)


def test_ensembles_package_names_its_lazy_exports():
    import importlib

    import ensembles

    for name, module in ensembles._MODULES.items():
        loaded = importlib.import_module(module)
        assert getattr(ensembles, name) is (loaded if module == f"ensembles.{name}" else getattr(loaded, name))
