"""Commands some tests check only the outcome of, started in the background as soon as the run
knows it will need them (after collection), at the lowest CPU priority, and collected by those
tests when they get there.

The simulation's CI seeds and the benchmarks' ``--tiny`` shape check are CPU-bound programs whose
result alone is checked; run in line they cost the suite their whole time. Started at ``nice 19``
beside the rest of the suite, which spends most of its time waiting on real servers, they use the
CPU the other tests leave idle and seldom take any from them. A test that gets to its job before it
finished waits for it; a run that never reaches the test stops the job (by its PID) at the end.

With pytest-xdist (``-n N``) the run is a controller and N worker processes. The controller
starts the jobs once the first worker reports what it collected (every worker collects the whole
suite) and stops them when every worker is done; a worker's test waits for the job through its
files in :data:`SCRATCH`, a directory the controller made and handed to the workers in the
environment (:data:`ENV`). A job nobody started at collection (a test asks for it only when it
gets there) is started by the process whose test asks, which then also stops it. Without xdist one
process plays both parts.
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
#: the environment variable that hands :data:`SCRATCH` from the controller to its workers
ENV = "LEDGERSTORE_TESTS_BACKGROUND"
#: seconds between two looks at a job's exit status file
_POLL_S = 0.5


@dataclasses.dataclass
class Job:
    """One background command: the tests (node id prefixes) that use it and its argv."""

    name: str
    users: tuple[str, ...]
    argv: list[str]
    timeout: float
    #: the command, when this process started it
    proc: subprocess.Popen[bytes] | None = None

    def path(self, suffix: str) -> Path:
        """The job's file ``suffix`` (``out``, ``err``, ``rc``: its exit status, written when it
        ends; ``started``: the time it started) in :data:`SCRATCH`."""
        return SCRATCH / f"{self.name}.{suffix}"


@dataclasses.dataclass(frozen=True)
class Finished:
    """What a background command left: its exit status and output."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float


_jobs: dict[str, Job] = {}
_results: dict[str, Finished] = {}


def _scratch() -> tuple[Path, bool]:
    """Where the jobs write, and whether this process made it (and so removes it at the end):
    the controller's directory in one of its workers, a new one elsewhere."""
    handed = os.environ.get(ENV)
    if handed and os.environ.get("PYTEST_XDIST_WORKER"):
        return Path(handed), False
    made = Path(tempfile.mkdtemp(prefix="ledgerstore-tests-background-"))
    os.environ[ENV] = str(made)  # inherited by the workers this process starts
    return made, True


#: where the jobs write
SCRATCH, _OWNER = _scratch()


def define(name: str, users: Sequence[str], argv: Sequence[str], timeout: float) -> None:
    """Declare a job (at import of the conftest; started only if a user of it is collected)."""
    _jobs[name] = Job(name, tuple(users), list(argv), timeout)


def is_worker() -> bool:
    """Whether this process is a pytest-xdist worker (the controller starts the jobs)."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


def start_needed(nodeids: Sequence[str]) -> None:
    """Start every declared job that one of ``nodeids`` uses (once per run)."""
    for job in _jobs.values():
        if not job.path("started").exists() and any(n.startswith(u) for n in nodeids for u in job.users):
            _start(job)


def _start(job: Job) -> None:
    with job.path("out").open("wb") as out, job.path("err").open("wb") as err:
        # The shell writes the exit status where every process of the run can see it. Its own
        # session (stopped as a group), and killed by Linux if the process that started it dies.
        wrapper = ["sh", "-c", '"$@"; echo $? > "$0.tmp" && mv "$0.tmp" "$0"', str(job.path("rc"))]
        job.proc = subprocess.Popen([*wrapper, "nice", "-n", "19", *job.argv], cwd=ROOT, stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL, env=os.environ.copy(), start_new_session=True,
                                    preexec_fn=lambda: set_parent_death_signal(signal.SIGKILL))
    job.path("started").write_text(repr(time.time()))


def result(name: str) -> Finished:
    """Wait for job ``name`` (starting it now if nobody did) and return its outcome."""
    if name in _results:
        return _results[name]
    job = _jobs[name]
    if not job.path("started").exists():
        _start(job)
    started = float(job.path("started").read_text())
    rc = job.path("rc")
    while not rc.exists():
        if time.time() - started > job.timeout:
            if job.proc is not None:
                _stop(job)
            raise AssertionError(f"the background job {name!r} ({' '.join(job.argv)}) did not finish in "
                                 f"{job.timeout:.0f} s:\n{_tail(job, 'out')}\n{_tail(job, 'err')}")
        if job.proc is not None and job.proc.poll() is not None and not rc.exists():
            raise AssertionError(f"the background job {name!r} ended without its exit status "
                                 f"(status {job.proc.returncode}):\n{_tail(job, 'err')}")
        time.sleep(_POLL_S)
    _results[name] = Finished(int(rc.read_text().strip()), job.path("out").read_text(errors="replace"),
                              job.path("err").read_text(errors="replace"), round(time.time() - started, 1))
    return _results[name]


def _tail(job: Job, suffix: str) -> str:
    return job.path(suffix).read_text(errors="replace")[-4000:]


def _stop(job: Job) -> None:
    if job.proc is not None and job.proc.poll() is None:
        # its own session: the group is the PID we started, with the workers it forked
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.proc.pid, signal.SIGKILL)
        job.proc.wait(30)


def stop_all() -> None:
    """Stop every job this process started and is still running (the run ends, or was
    interrupted, before its tests); the process that made :data:`SCRATCH` removes it."""
    for job in _jobs.values():
        _stop(job)
    if _OWNER:
        shutil.rmtree(SCRATCH, ignore_errors=True)


def python() -> str:
    """The interpreter running the tests (the jobs run in the same environment)."""
    return sys.executable
