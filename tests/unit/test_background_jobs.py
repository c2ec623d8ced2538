"""The suite's background jobs (tests/background.py): a job started by the process whose test asks
for it reports its exit status and output through its files, as one started by the controller of
a pytest-xdist run does to the workers."""

from __future__ import annotations

import sys

import pytest

from tests import background


def test_a_job_reports_its_exit_status_and_output_through_its_files() -> None:
    background.define("unit-echo", [], [sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], timeout=60)
    done = background.result("unit-echo")
    assert (done.returncode, done.stdout.strip()) == (3, "out")
    assert background.result("unit-echo") is done  # asked again: the same outcome, not a second run
    assert (background.SCRATCH / "unit-echo.rc").read_text().strip() == "3"


def test_a_job_past_its_timeout_is_stopped_with_its_output_in_the_error() -> None:
    background.define("unit-slow", [], [sys.executable, "-c", "import time; print('begun', flush=True); time.sleep(60)"],
                      timeout=2)
    with pytest.raises(AssertionError, match=r"did not finish in 2 s:\nbegun"):
        background.result("unit-slow")
