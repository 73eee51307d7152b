"""One private generation run, shared by ``pate-accountant demo`` and ``pate-accountant generate`` (docs/demo.md).

:func:`private_run` partitions instruction records between ``n`` in-context teachers, builds the mechanism and
the accountant, claims the data set's SQLite ledger (creating it, or joining it when it exists: a ledger
belongs to one data set and its budget spans every run over that data set) before the slow start, loads a
local causal LM (:class:`~ensembles.backends.transformers_backend.TransformersBackend`), records the run's metadata
(mechanism parameters, accountant, budget, whether the run was seeded, software version: never the seed),
generates ``K`` records with :class:`~ensembles.generation.PrivateGenerator` (public fallback: the same
model with only the shared prefix, so records always complete), verifies the ledger and returns a
JSON-able dict.

Every check on the inputs (records, teachers, mechanism and whether its release threshold is within reach
of ``n`` teachers, accountant, model path, an existing ledger's data set, accountant and remaining budget)
happens before anything is written, so a bad input never spends budget and never creates a ledger file.
The ledger is claimed before the model loads (data set, accountant and budget stored in a new ledger, checked
against an existing one), so a second run given the same path with another budget is refused at once; a run
that is refused after the claim (its prompts do not fit the model, the model does not load) removes the
ledger it created, unless another run has joined it meanwhile.
The returned dict and the ledger hold no prompt text and no seed: only the generated records, outcome
classes, counts of charged runs and parameters.

Seeds.  A seed makes a run reproducible, and for the same reason removes its privacy against anyone who
knows the seed: they can re-run both neighbouring data sets and compare.  A seeded run prints a warning on
stderr, and the seed is never written into a shareable artifact (ledger, JSON result, stdout).

The package, in the order a run meets it (each module imports only those above it):

* :mod:`pate_app.run.mechanism`: the mechanism and the accountant, built from their registered names;
* :mod:`pate_app.run.checks`: what a run is refused for from its spec and records alone, with the nearest
  configurations that run;
* :mod:`pate_app.run.backends`: the model's path, the teachers' and the public model's backends, the shards and
  the Ray address;
* :mod:`pate_app.run.ledger`: the data set's ledger found, checked, claimed, signed and read back;
* :mod:`pate_app.run.prompts`: the records fitted to the model's window and placed in the teachers' prompts;
* :mod:`pate_app.run.public`: what the public model is shown, and ``--public-top-k auto``;
* :mod:`pate_app.run.interrupt` and :mod:`pate_app.run.output`: Ctrl-C, the progress bar, ``--out`` and the
  result's shared parts;
* :mod:`pate_app.run.public_only`: ``--public-only``, the public model alone;
* :mod:`pate_app.run.stages`: :func:`private_run` in named stages, and :func:`synthesize`.

A test that replaces a name a stage calls patches it in the module that calls it (``_backends`` in
:mod:`pate_app.run.stages`, ``_public_backend`` in :mod:`pate_app.run.public` and
:mod:`pate_app.run.public_only`, ``demo_model_path`` and ``_ray_installed`` in :mod:`pate_app.run.backends`,
``append_checkpoint`` in :mod:`pate_app.run.ledger`).
"""

# Every name below is one that code, tests, benchmarks or docs reach as ``pate_app.run.NAME``; ``__all__`` keeps the
# list this module had before it became a package, and synthesize.
from ensembles.backends import transformers_backend as tb  # noqa: F401
from ensembles.generation import PrivateGenerator, public_generate_many  # noqa: F401
from mechanisms.subsampled import SubsampledTeachers  # noqa: F401
from pate_app.errors import RunInputError
from pate_app.privacy_unit import RECORD_RELATIONS, TEACHER_RELATION, record_relation, records_per_teacher
from pate_app.run.backends import (  # noqa: F401
    _backends,
    _public_backend,
    _resolve_model,
    check_workers,
    demo_model_path,
    parse_ray_address,
    probe_ray_address,
)
from pate_app.run.checks import (  # noqa: F401
    _STEP_GRID,
    NOISE_RELEASE_LIMIT,
    _percent,
    _plan_run,
    _RunPlan,
    check_groups,
    check_inputs,
    check_noise_floor,
    check_reachable,
    fit_teachers,
    mechanisms_for,
    nearest_configurations,
    noise_release,
    release_rule,
    run_refusal,
    zcdp_charge_warning,
)
from pate_app.run.ledger import MAX_RECORDS_AFFORDED, _dataset_ledger  # noqa: F401
from pate_app.run.mechanism import (  # noqa: F401
    RELATIONS,
    build_accountant,
    build_mechanism,
    kept_teachers,
    spec_mechanism,
    subsampled_mechanism,
    voters,
)
from pate_app.run.output import RunProgress, _record_text  # noqa: F401
from pate_app.run.prompts import _fit_to_window, group_prompts, run_prompts  # noqa: F401
from pate_app.run.public import (  # noqa: F401
    measure_public_support,
    public_block,
    public_prompt_list,
    public_support_contexts,
    teacher_public_blocks,
)
from pate_app.run.public_only import PUBLIC_ROWS, public_only_run  # noqa: F401
from pate_app.run.stages import private_run, synthesize
from pate_app.spec import load_task  # noqa: F401

__all__ = [
    "RECORD_RELATIONS",
    "TEACHER_RELATION",
    "RunInputError",
    "build_accountant",
    "build_mechanism",
    "check_groups",
    "check_inputs",
    "check_reachable",
    "check_workers",
    "demo_model_path",
    "group_prompts",
    "private_run",
    "record_relation",
    "records_per_teacher",
    "run_prompts",
    "synthesize",
]
