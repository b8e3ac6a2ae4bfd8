"""Every public name of gpext and gpext_bench is exported through ``__all__`` and documented (cf. GPflow's test_all.py)."""

import importlib
import inspect
import pkgutil

import pytest

import gpext
import gpext_bench

SKIP = {"gpext.integrations.botorch"}  # optional extra, tested separately


def _modules():
    names = []
    for package in (gpext, gpext_bench):
        names.append(package.__name__)
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            leaf = info.name.split(".")[-1]
            if leaf.startswith("_") or any(info.name.startswith(s) for s in SKIP):
                continue
            names.append(info.name)
    return names


@pytest.mark.parametrize("modname", _modules())
def test_module_has_all_and_docstrings(modname):
    mod = importlib.import_module(modname)
    assert mod.__doc__, f"{modname} has no module docstring"
    assert hasattr(mod, "__all__"), f"{modname} defines no __all__"
    for name in mod.__all__:
        assert hasattr(mod, name), f"{modname}.__all__ lists missing name {name}"
        obj = getattr(mod, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"{modname}.{name} has no docstring"


def test_public_classes_and_functions_are_exported():
    """Public callables defined in a module are listed in its ``__all__``."""
    missing = []
    for modname in _modules():
        mod = importlib.import_module(modname)
        for name, obj in vars(mod).items():
            if name.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if getattr(obj, "__module__", None) == modname and name not in mod.__all__:
                missing.append(f"{modname}.{name}")
    assert not missing, f"public names missing from __all__: {missing}"
