"""Commands some tests check only the outcome of, started in the background as soon as the run
knows it will need them (after collection), at the lowest CPU priority, and collected by those
tests when they get there.

The simulation's CI seeds and the benchmarks' ``--tiny`` shape check are CPU-bound programs whose
result alone is checked; run in line they cost the suite their whole time. Started at ``nice 19``
beside the rest of the suite, which spends most of its time waiting on real servers, they use the
CPU the other tests leave idle and seldom take any from them. A test that gets to its job before it
finished waits for it; a run that never reaches the test stops the job (by its PID) at the end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from ledgerstore.startup import set_parent_death_signal

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class Job:
    """One background command: the tests (node id prefixes) that use it and its argv."""

    name: str
    users: tuple[str, ...]
    argv: list[str]
    timeout: float
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    out: Path | None = None
    err: Path | None = None


@dataclasses.dataclass(frozen=True)
class Finished:
    """What a background command left: its exit status and output."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float


_jobs: dict[str, Job] = {}
_results: dict[str, Finished] = {}
#: where the jobs write (removed at the end of the run)
SCRATCH = Path(tempfile.mkdtemp(prefix="ledgerstore-tests-background-"))


def define(name: str, users: Sequence[str], argv: Sequence[str], timeout: float) -> None:
    """Declare a job (at import of the conftest; started only if a user of it is collected)."""
    _jobs[name] = Job(name, tuple(users), list(argv), timeout)


def start_needed(nodeids: Sequence[str]) -> None:
    """Start every declared job that one of ``nodeids`` uses."""
    for job in _jobs.values():
        if job.proc is None and any(n.startswith(u) for n in nodeids for u in job.users):
            _start(job)


def _start(job: Job) -> None:
    job.out, job.err = SCRATCH / f"{job.name}.out", SCRATCH / f"{job.name}.err"
    with job.out.open("wb") as out, job.err.open("wb") as err:
        # its own session (stopped as a group), and killed by Linux if the test process dies first
        job.proc = subprocess.Popen(["nice", "-n", "19", *job.argv], cwd=ROOT, stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL, env=os.environ.copy(), start_new_session=True,
                                    preexec_fn=lambda: set_parent_death_signal(signal.SIGKILL))
    job.started = time.monotonic()


def result(name: str) -> Finished:
    """Wait for job ``name`` (starting it now if the run did not) and return its outcome."""
    if name in _results:
        return _results[name]
    job = _jobs[name]
    if job.proc is None:
        _start(job)
    assert job.proc is not None and job.out is not None and job.err is not None
    try:
        job.proc.wait(max(1.0, job.timeout - (time.monotonic() - job.started)))
    except subprocess.TimeoutExpired:
        _stop(job)
        raise AssertionError(  # noqa: B904 - the timeout is the message, not a causef"the background job {name!r} ({' '.join(job.argv)}) did not finish in {job.timeout:.0f} s:\n"
                             f"{job.out.read_text(errors='replace')[-4000:]}\n{job.err.read_text(errors='replace')[-4000:]}")
    _results[name] = Finished(job.proc.returncode, job.out.read_text(errors="replace"),
                              job.err.read_text(errors="replace"), round(time.monotonic() - job.started, 1))
    return _results[name]


def _stop(job: Job) -> None:
    if job.proc is not None and job.proc.poll() is None:
        # its own session: the group is the PID we started, with the workers it forked
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.proc.pid, signal.SIGKILL)
        job.proc.wait(30)


def stop_all() -> None:
    """Stop every job still running (the run ends, or was interrupted, before its tests)."""
    for job in _jobs.values():
        _stop(job)
    shutil.rmtree(SCRATCH, ignore_errors=True)


def python() -> str:
    """The interpreter running the tests (the jobs run in the same environment)."""
    return sys.executable
