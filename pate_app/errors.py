"""The error of a run's bad input: :class:`RunInputError`, raised before anything is charged, and the one line a
library's error becomes in it (:func:`first_line`).

It lives apart from the run description (:mod:`pate_app.spec`, which re-exports it), so that the modules below the
spec, such as the privacy unit's rules (:mod:`pate_app.privacy_unit`), raise it without importing the spec and its
loaders, and no import runs in a circle.
"""

__all__ = ["RunInputError", "first_line"]


class RunInputError(ValueError):
    """A bad input found before anything was charged (the CLI turns it into exit status 2)."""


def first_line(exc: BaseException) -> str:
    """The first line of a library's error message (its name when it has none), for a one-line usage error."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
