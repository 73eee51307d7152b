"""The ``pate-accountant`` commands: one module per command of :data:`pate_app.COMMANDS` (the protocol is
in :mod:`pate_app`), plus the option helpers that ``demo`` and ``generate`` share."""
