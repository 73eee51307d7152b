"""Exceptions raised by pate-accountant."""

from __future__ import annotations


class PateAccountantError(Exception):
    """Base class of every error this project raises on purpose."""


class BudgetExhaustedError(PateAccountantError):
    """Raised before a charged step that would take an accountant past its budget."""


class UnsupportedEventError(PateAccountantError, TypeError):
    """Raised when an accountant is asked to charge an event it cannot account for."""
