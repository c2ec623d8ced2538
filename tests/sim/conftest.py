"""Fixtures of the simulation tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def quiet_logs() -> Iterator[None]:
    # the code under test logs every fault it survives; thousands of lines say nothing here
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)
