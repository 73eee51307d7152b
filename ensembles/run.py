"""One private generation run, shared by ``pate-accountant demo`` and ``pate-accountant generate`` (docs/demo.md).

:func:`private_run` partitions instruction records between ``n`` in-context teachers, loads a local causal
LM (:class:`~ensembles.backends.transformers_backend.TransformersBackend`), builds the mechanism and the
accountant, opens a NEW SQLite ledger with run metadata (mechanism parameters, seed or ``"OS entropy"``,
software version), generates ``K`` records with :class:`~ensembles.generation.PrivateGenerator` (public
fallback: the same model with only the shared prefix, so records always complete), verifies the ledger
and returns a JSON-able dict.

Every check on the inputs (records, teachers, mechanism, accountant, model path, ledger path) happens
before the ledger is created, so a bad input never spends budget.  The returned dict and the ledger hold
no prompt text: only the generated records, counts, outcome classes and parameters.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from pate_accountant import __version__

__all__ = [
    "ACCOUNTANTS",
    "MECHANISMS",
    "RunInputError",
    "build_accountant",
    "build_mechanism",
    "check_inputs",
    "default_demo_ledger",
    "demo_model_path",
    "private_run",
]

MECHANISMS = ("dp-argmax", "boundary-dp-argmax", "dp-weighted-sampling", "boundary-dp-weighted-sampling")
ACCOUNTANTS = ("basic", "advanced", "pld", "target-charging")
RELATIONS = ("replace-one", "add-remove-one")


class RunInputError(ValueError):
    """A bad input found before anything was charged (the CLI turns it into exit status 2)."""


def build_mechanism(name: str, epsilon: float, delta: float, relation: str = "replace-one"):
    """The per-step mechanism ``name`` (one of :data:`MECHANISMS`) with per-step ``(epsilon, delta)``."""
    from mechanisms import BoundaryWrapper, DPArgMax, DPWeightedSampling

    if name not in MECHANISMS:
        raise RunInputError(f"mechanism must be one of {MECHANISMS}, got {name!r}")
    if relation not in RELATIONS:
        raise RunInputError(f"relation must be one of {RELATIONS}, got {relation!r}")
    try:
        if name == "dp-argmax":
            return DPArgMax(epsilon, delta, relation=relation)
        if name == "boundary-dp-argmax":
            return BoundaryWrapper(DPArgMax(epsilon, delta, relation=relation))
        if name == "boundary-dp-weighted-sampling":
            return BoundaryWrapper(DPWeightedSampling(epsilon, delta, relation=relation))
        return DPWeightedSampling(epsilon, delta, relation=relation)
    except (TypeError, ValueError) as exc:
        raise RunInputError(f"mechanism {name}: {exc}") from None


def build_accountant(name: str, budget, ledger=None):
    """The accountant ``name`` (one of :data:`ACCOUNTANTS`) with ``budget=(epsilon, delta)``."""
    from pate_accountant.accountants import (
        AdvancedCompositionAccountant,
        BasicCompositionAccountant,
        PldAccountant,
        TargetChargingAccountant,
    )

    classes = {
        "basic": BasicCompositionAccountant,
        "advanced": AdvancedCompositionAccountant,
        "pld": PldAccountant,
        "target-charging": TargetChargingAccountant,
    }
    if name not in classes:
        raise RunInputError(f"accountant must be one of {ACCOUNTANTS}, got {name!r}")
    try:
        return classes[name](budget=budget, ledger=ledger)
    except (TypeError, ValueError) as exc:
        raise RunInputError(f"accountant {name}: {exc}") from None


def check_inputs(records, num_teachers: int, mechanism, accountant_name: str, budget) -> None:
    """Refuse, before anything is charged: no records, more teachers than records, an accountant that does
    not support the mechanism's event, or a budget that cannot pay for a single step."""
    from pate_accountant.errors import PateAccountantError

    if not records:
        raise RunInputError("the data set is empty: no records to give the teachers")
    if num_teachers < 1:
        raise RunInputError(f"--teachers must be at least 1, got {num_teachers}")
    if num_teachers > len(records):
        raise RunInputError(f"cannot give {num_teachers} teachers a record each: the data set has only "
                            f"{len(records)} usable records")
    probe = build_accountant(accountant_name, budget)  # in memory: no ledger is touched
    try:
        affordable = probe.can_afford(mechanism.event)
    except PateAccountantError as exc:
        raise RunInputError(f"accountant {accountant_name} cannot account for this mechanism: {exc}") from None
    if not affordable:
        raise RunInputError(f"the budget (epsilon {budget[0]:g}, delta {budget[1]:g}) cannot pay for a single "
                            f"step of this mechanism under the {accountant_name} accountant")


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="private tokens", unit="tok", leave=False, dynamic_ncols=True)


def private_run(
    *,
    model,
    records,
    num_teachers: int,
    ledger_path,
    mechanism: str = "dp-argmax",
    accountant: str = "basic",
    step_epsilon: float = 2.0,
    step_delta: float = 1e-6,
    relation: str = "replace-one",
    epsilon: float = 100.0,
    delta: float = 1e-5,
    num_records: int = 3,
    max_tokens: int = 24,
    seed: int | None = None,
    temperature: float = 1.0,
    top_p: float | None = None,
    threads: int | None = None,
    progress: bool = False,
    command: str = "generate",
    model_label: str | None = None,
    data_label: str | None = None,
) -> dict:
    """Run private generation end to end and return a JSON-able result (module docstring).

    ``model``: a local model folder, ``.gguf`` file or folder holding one; ``records``: Dolly-format dicts;
    ``ledger_path``: a file that must not exist yet; ``(step_epsilon, step_delta)``: the mechanism's per-step
    parameters; ``(epsilon, delta)``: the accountant's total budget.  Raises :class:`RunInputError` (or
    ``ValueError`` from the backend for an unknown model path) before the ledger exists.
    """
    from ensembles.backends.transformers_backend import TransformersBackend
    from ensembles.data import OPEN_SLOT, partition_records, teacher_prompts
    from ensembles.generation import PrivateGenerator
    from pate_accountant.ledger import Ledger, describe_mechanism, describe_seed

    started = time.perf_counter()
    records = list(records)
    if num_records < 1:
        raise RunInputError(f"--records must be at least 1, got {num_records}")
    if max_tokens < 1:
        raise RunInputError(f"--max-tokens must be at least 1, got {max_tokens}")
    seed_text = describe_seed(seed)
    budget = (float(epsilon), float(delta))
    mech = build_mechanism(mechanism, step_epsilon, step_delta, relation)
    check_inputs(records, num_teachers, mech, accountant, budget)
    ledger_path = Path(ledger_path)
    if ledger_path.exists():
        raise RunInputError(f"ledger file {str(ledger_path)!r} already exists: each run writes a new ledger "
                            "(give another --ledger path, or audit that one with `pate-accountant audit`)")
    if not ledger_path.parent.is_dir():
        raise RunInputError(f"ledger folder {str(ledger_path.parent)!r} does not exist")

    backend = TransformersBackend(model, threads=threads, top_p=None, temperature=1.0)  # ValueError: bad path
    public = TransformersBackend(backend.model, backend.tokenizer, threads=threads)

    rng = np.random.default_rng(seed)
    parts = partition_records(records, num_teachers, rng)
    shared_prefix, prompts = teacher_prompts(parts)
    public_prompt = OPEN_SLOT  # the open slot only: no private record
    try:  # prompts that do not fit the context window: refused before the ledger exists
        backend.check_prompts(prompts, shared_prefix)
    except ValueError as exc:
        raise RunInputError(f"--teachers {num_teachers}: {exc} (use more teachers or shorter records)") from None

    metadata = {
        "command": command,
        "mechanism": describe_mechanism(mech),
        "mechanism_name": mechanism,
        "accountant": accountant,
        "budget": {"epsilon": budget[0], "delta": budget[1]},
        "seed": seed_text,
        "software_version": __version__,
        "model": model_label if model_label is not None else str(model),
        "data": data_label if data_label is not None else "records",
        "num_data_records": len(records),
        "num_teachers": num_teachers,
        "records_requested": num_records,
        "max_tokens": max_tokens,
        "histograms": "coordinated",
        "fallback": "public (same model, shared prefix only)",
        "temperature": temperature,
        "top_p": top_p,
        "stop": "newline",
    }

    ledger = Ledger.open(str(ledger_path))
    try:
        ledger.set_run_metadata(metadata)
        acct = build_accountant(accountant, budget, ledger)
        generator = PrivateGenerator(
            backend, mech, acct, histograms="coordinated", fallback="public", public_backend=public,
            public_prompt=public_prompt, max_tokens=max_tokens, stop_strings=("\n",), top_p=top_p,
            temperature=temperature,
        )
        bar = _progress_bar(num_records * max_tokens, progress)
        if bar is not None:
            original_append = backend.append

            def append(token_id, _original=original_append):
                _original(token_id)
                bar.update(1)

            backend.append = append
        out_records = []
        try:
            for _ in range(num_records):
                result = generator.generate(prompts, shared_prefix=shared_prefix, rng=rng)
                counts = result.outcome_counts()
                out_records.append({
                    "text": result.text.strip(),
                    "stop_reason": result.stop_reason,
                    "num_tokens": len(result.token_ids),
                    "charged_runs": result.num_charged_runs,
                    "outcomes": counts,
                    "private_tokens": counts.get("token", 0),
                    "fallback_tokens": counts.get("fallback", 0),
                })
                if bar is not None:
                    bar.update(max_tokens - len(result.token_ids))
                if result.stop_reason == "budget":
                    break
        finally:
            if bar is not None:
                bar.close()
        spent = tuple(float(x) for x in acct.spent())
        rows = ledger.row_count
        verdict = ledger.verify()
    finally:
        ledger.close()

    return {
        "command": command,
        "records": out_records,
        "spent": {"epsilon": spent[0], "delta": spent[1]},
        "budget": {"epsilon": budget[0], "delta": budget[1]},
        "within_budget": bool(spent[0] <= budget[0] * (1 + 1e-9) and spent[1] <= budget[1] * (1 + 1e-9)),
        "charged_runs": sum(r["charged_runs"] for r in out_records),
        "private_tokens": sum(r["private_tokens"] for r in out_records),
        "fallback_tokens": sum(r["fallback_tokens"] for r in out_records),
        "ledger": {"path": str(ledger_path), "rows": rows},
        "audit": {
            "ok": bool(verdict.ok),
            "message": verdict.message,
            "rows": verdict.rows,
            "spent": None if verdict.spent is None else [float(x) for x in verdict.spent],
            "head_hash": verdict.head_hash,
        },
        "parameters": metadata,
        "wall_seconds": round(time.perf_counter() - started, 3),
    }


def default_demo_ledger(folder=".") -> Path:
    """``./pate-demo.sqlite``, or ``./pate-demo-YYYYmmdd-HHMMSS[-k].sqlite`` when that already exists."""
    folder = Path(folder)
    path = folder / "pate-demo.sqlite"
    if not path.exists():
        return path
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = folder / f"pate-demo-{stamp}.sqlite"
    k = 1
    while path.exists():
        path = folder / f"pate-demo-{stamp}-{k}.sqlite"
        k += 1
    return path


def demo_model_path() -> Path:
    """The embedded SmolLM2 as a converted safetensors folder (converting the GGUF once, with a message)."""
    import sys

    from ensembles.backends import transformers_backend as tb

    gguf = tb.smollm2_path()
    stat = gguf.stat()
    import hashlib

    key = hashlib.sha256(f"{gguf.name}|{stat.st_size}|{int(stat.st_mtime)}".encode()).hexdigest()[:16]
    cached = tb.default_cache_dir() / "gguf" / f"{gguf.stem}-{key}"
    if not (cached / "config.json").is_file():
        print("pate-accountant: converting the embedded SmolLM2 model once (about 20 s; cached in "
              f"{tb.default_cache_dir()})", file=sys.stderr, flush=True)
    return tb.convert_gguf(gguf)

