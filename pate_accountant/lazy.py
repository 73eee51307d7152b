"""Packages whose public names are imported on first use (PEP 562): ``pate_accountant``, ``mechanisms`` and
``ensembles`` list their names in a table and load a module only when one of its names is asked for, so that
importing one submodule (or the command line's ``--help``) does not load numpy, scipy or dp-accounting.
Standard library only."""

from __future__ import annotations

import importlib

__all__ = ["lazy_exports"]


def lazy_exports(package: str, table: dict, namespace: dict):
    """The ``(__getattr__, __dir__)`` of ``package``, whose public name ``NAME`` lives in module ``table[NAME]``
    (``table[NAME] == package + "." + NAME`` names a submodule itself).  A loaded name is stored in
    ``namespace`` (the package's ``globals()``), so it is imported once."""

    def __getattr__(name):
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        loaded = importlib.import_module(module)
        value = loaded if module == f"{package}.{name}" else getattr(loaded, name)
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__
