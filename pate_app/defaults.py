"""The defaults of a run description (:class:`pate_app.spec.RunSpec`), which ``demo`` and ``generate`` show as
their options' defaults (:mod:`pate_app.commands.run_options`).  It imports nothing, so the command line's start
reads it for free."""

__all__ = ["DEMO_DEFAULTS"]

#: ``demo`` defaults, also ``generate``'s for every option but the budget (docs/demo.md explains the choice).
DEMO_DEFAULTS = {
    "teachers": 64, "records": 3, "max_tokens": 24, "mechanism": "dp-argmax", "accountant": "basic",
    "step_epsilon": 2.0, "step_delta": 1e-6, "relation": "replace-one", "epsilon": 150.0, "delta": 1e-4,
    "temperature": 0.7, "top_p": 0.9,
}
