"""Fixtures of the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ledgerstore.proto import speedups


@pytest.fixture(scope="module", params=["compiled", "pure"])
def hot_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a module's tests once on the compiled hot path and once on the pure-Python one
    (``ledgerstore.proto.speedups``). Module-scoped so hypothesis's tests can use it."""
    built = speedups.load()
    if request.param == "compiled" and built is None:
        pytest.skip("the compiled hot path is not built (scripts/setup.sh builds it) or "
                    f"{speedups.PURE_PYTHON_ENV} is set")
    saved = speedups.compiled
    speedups.compiled = built if request.param == "compiled" else None
    try:
        yield request.param
    finally:
        speedups.compiled = saved
