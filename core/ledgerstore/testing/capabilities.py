"""Capability checks for the conformance suites, after fsspec's capability fixtures and
SQLAlchemy's ``SuiteRequirements``: a backend declares what it supports with class flags (see
:mod:`ledgerstore.api`), and a suite case that needs a capability skips, naming the flag, on a
backend that does not declare it, instead of skipping by backend name."""

from __future__ import annotations

import pytest

__all__ = ["declares", "require", "require_not"]


def declares(plugin: object, flag: str) -> bool:
    """Whether ``plugin`` (an instance or a class) declares the capability ``flag`` true."""
    cls = plugin if isinstance(plugin, type) else type(plugin)
    if not hasattr(cls, flag):
        raise AttributeError(f"{cls.__qualname__} has no capability flag {flag!r}: not a ledgerstore plugin?")
    return bool(getattr(cls, flag))


def require(plugin: object, flag: str) -> None:
    """Skip the running test unless ``plugin`` declares ``flag`` true."""
    if not declares(plugin, flag):
        cls = plugin if isinstance(plugin, type) else type(plugin)
        pytest.skip(f"{cls.__qualname__} declares {flag} = False")


def require_not(plugin: object, flag: str) -> None:
    """Skip the running test when ``plugin`` declares ``flag`` true (a case for the fallback)."""
    if declares(plugin, flag):
        cls = plugin if isinstance(plugin, type) else type(plugin)
        pytest.skip(f"{cls.__qualname__} declares {flag} = True")
