"""ledgerstore as a user installs it: an sdist and a wheel built from this checkout with
``python -m build``, the wheel installed with its extras into a fresh virtualenv outside the
checkout (no ``--system-site-packages``; pip's cache makes it quick), and used from there.

- With a C compiler, the wheel carries the compiled hot path and uses it: ``ledgerstore
  standalone`` says so and so do its bookies' logs; a client writes and reads back a ledger;
  ``spark.read.format("ledgerstore")`` reads it with no registration call; and a user's mypy sees
  ledgerstore's types (``py.typed``).
- Without one (``CC=false``), the wheel built from the same sdist prints one warning, carries no
  compiled module, and the install works on the pure-Python path and says why.

Every process started here is stopped by its PID; the virtualenvs live in pytest's temporary
directories.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.install

ROOT = Path(__file__).resolve().parents[2]
SMOKE = Path(__file__).with_name("installed_smoke.py")
JAVA_17 = Path("/usr/lib/jvm/java-17-openjdk-amd64")
COMPILED_MODULES = ("ledgerstore/proto/_speedups", "ledgerstore/client/_adds", "ledgerstore_entrylog/_records")
BUILD_WARNING = "warning: ledgerstore: the compiled hot path was not built"


@dataclass(frozen=True)
class Dist:
    sdist: Path
    wheel: Path
    build_log: str


def run(cmd: list[str | Path], *, timeout: float = 300, **kw: object) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; on failure, an assertion that shows the end of its output."""
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]
    assert out.returncode == 0, f"{cmd} exited {out.returncode}:\n{(out.stdout + out.stderr)[-4000:]}"
    return out  # type: ignore[no-any-return]


def user_env(venv: Path, **extra: str) -> dict[str, str]:
    """The environment of a user of ``venv``: its bin first, nothing of the checkout's."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "LEDGERSTORE_PURE_PYTHON", "PYSPARK_PYTHON",
                        "PYSPARK_DRIVER_PYTHON", "CC")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and not p.startswith(str(ROOT))]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    env["VIRTUAL_ENV"] = str(venv)
    env["COLUMNS"] = "400"  # rich wraps at 80 columns when writing to a file
    return {**env, **extra}


def build(source: Path, outdir: Path, *args: str, env: dict[str, str] | None = None) -> str:
    out = run([sys.executable, "-m", "build", "--outdir", outdir, *args, source], env=env, timeout=420)
    return out.stdout + out.stderr


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """An sdist of the checkout and the wheel ``python -m build`` makes from that sdist."""
    outdir = tmp_path_factory.mktemp("dist")
    env = {k: v for k, v in os.environ.items() if k != "CC"}
    log = build(ROOT, outdir, env=env)
    (sdist,) = outdir.glob("ledgerstore-*.tar.gz")
    (wheel,) = outdir.glob("ledgerstore-*.whl")
    return Dist(sdist, wheel, log)


def fresh_venv(where: Path, requirement: str, *more: str) -> Path:
    """A new virtualenv at ``where`` with ``requirement`` (and ``more``) installed by its own pip."""
    run([sys.executable, "-m", "venv", where])
    assert "include-system-site-packages = false" in (where / "pyvenv.cfg").read_text()
    # --no-compile: the smoke needs no byte-compiled copy of pyspark's thousands of modules
    run([where / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile", requirement, *more], cwd=where, timeout=600,
        env=user_env(where))
    return where


@dataclass
class Standalone:
    proc: subprocess.Popen[bytes]
    output: Path

    def text(self) -> str:
        return self.output.read_text(errors="replace")


@pytest.fixture
def venv_dir(tmp_path: Path) -> Iterator[Path]:
    """Where a test makes its virtualenv; removed when the test ends (with pyspark it is 0.5 GB)."""
    where = tmp_path / "venv"
    yield where
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def standalone_in(venv_dir: Path) -> Iterator[list[Standalone]]:
    """Started ``ledgerstore standalone`` processes, stopped by PID when the test ends (before
    their virtualenv is removed)."""
    started: list[Standalone] = []
    yield started
    for s in started:
        if s.proc.poll() is None:
            s.proc.send_signal(signal.SIGTERM)  # it stops its bookies, then its metadata server
            try:
                s.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(s.proc.pid, signal.SIGKILL)  # its own session: it and what it started
                s.proc.wait(timeout=30)


def start_standalone(venv: Path, workdir: Path, started: list[Standalone]) -> tuple[Standalone, str]:
    """``ledgerstore standalone`` from ``venv``, run in ``workdir``; returns it and its metadata URI."""
    output = workdir / "standalone.out"
    with open(output, "wb") as fh:
        proc = subprocess.Popen([str(venv / "bin" / "ledgerstore"), "standalone", "--bookies", "3", "--port-base", "0",
                                 "--data-dir", str(workdir / "ledgerstore-data")],
                                cwd=workdir, env=user_env(venv), stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    s = Standalone(proc, output)
    started.append(s)
    deadline = time.monotonic() + 120
    while "serving; press Ctrl-C to stop" not in s.text():
        assert proc.poll() is None, f"standalone exited {proc.returncode}:\n{s.text()}"
        assert time.monotonic() < deadline, f"standalone not serving after 120s:\n{s.text()}"
        time.sleep(0.2)
    uri = next(line.split("metadata URI:", 1)[1].split()[0] for line in s.text().splitlines()
               if line.startswith("metadata URI:"))
    return s, uri


def bookie_logs(s: Standalone) -> list[str]:
    return [Path(line.split("(log: ", 1)[1].rstrip(")")).read_text() for line in s.text().splitlines()
            if line.strip().startswith("bookie ") and "(log: " in line]


def smoke(venv: Path, workdir: Path, uri: str, mode: str, *args: str) -> str:
    env = user_env(venv)
    if "--spark" in args:
        if JAVA_17.is_dir():
            env["JAVA_HOME"] = str(JAVA_17)
        env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = str(venv / "bin" / "python")
    script = workdir / SMOKE.name  # a copy: nothing of the checkout on the smoke's sys.path
    shutil.copy(SMOKE, script)
    out = run([venv / "bin" / "python", script, uri, mode, *args], cwd=workdir, env=env, timeout=300)
    assert "smoke ok" in out.stdout, out.stdout + out.stderr
    return out.stdout


def test_the_wheel_installs_with_its_extras_and_runs_the_compiled_hot_path(
        dist: Dist, tmp_path: Path, venv_dir: Path, standalone_in: list[Standalone]) -> None:
    with tarfile.open(dist.sdist) as tar:
        names = tar.getnames()
    for source in ("core/ledgerstore/proto/_speedups.pyx", "core/ledgerstore/proto/_speedups_c.h",
                   "core/ledgerstore/client/_adds.pyx", "plugins/ledgerstore_entrylog/_records.pyx", "setup.py"):
        assert any(n.endswith(f"/{source}") for n in names), f"the sdist lacks {source}"
    assert BUILD_WARNING not in dist.build_log, dist.build_log[-3000:]
    with zipfile.ZipFile(dist.wheel) as whl:
        files = whl.namelist()
    for module in COMPILED_MODULES:
        assert any(f.startswith(module) and f.endswith(".so") for f in files), f"the wheel lacks {module}"
        assert f"{module}.pyi" in files
    assert {"ledgerstore/py.typed", "ledgerstore_entrylog/py.typed", "ledgerstore_zookeeper/py.typed"} <= set(files)
    assert not [f for f in files if f.endswith((".pyx", ".c", ".h"))]

    venv = fresh_venv(venv_dir, f"{dist.wheel}[all]", "mypy")
    work = tmp_path / "work"
    work.mkdir()
    version = run([venv / "bin" / "ledgerstore", "--version", "--verbose"], cwd=work, env=user_env(venv)).stdout
    assert "hot path: compiled" in version.splitlines(), version
    s, uri = start_standalone(venv, work, standalone_in)
    assert "hot path: compiled" in s.text().splitlines(), s.text()
    logs = bookie_logs(s)
    assert len(logs) == 3 and all("hot path: compiled)" in log for log in logs), logs
    smoke(venv, work, uri, "compiled", "--spark")

    # a user's type checker sees ledgerstore's types: without py.typed, mypy finds no "library stub"
    user_code = work / "user_code.py"
    user_code.write_text("import ledgerstore.aio\n\n\n"
                         "async def f(client: ledgerstore.aio.Client) -> str:\n"
                         "    lh = await client.create_ledger(3, 3, 2, password=b'pw')\n"
                         "    return await lh.append(b'x')\n")
    out = subprocess.run([venv / "bin" / "python", "-m", "mypy", "--strict", user_code.name], cwd=work,
                         env=user_env(venv), capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and 'Incompatible return value type (got "int", expected "str")' in out.stdout, (
        out.stdout + out.stderr)


def test_without_a_compiler_the_wheel_warns_once_and_installs_the_pure_python_path(
        dist: Dist, tmp_path: Path, venv_dir: Path, standalone_in: list[Standalone]) -> None:
    with tarfile.open(dist.sdist) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    (source,) = (tmp_path / "src").iterdir()
    outdir = tmp_path / "dist"
    log = build(source, outdir, "--wheel", env=dict(os.environ, CC="false"))
    warnings = [line for line in log.splitlines() if BUILD_WARNING in line]
    assert len(warnings) == 1 and "the C compiler 'false' failed" in warnings[0], log[-3000:]
    (wheel,) = outdir.glob("ledgerstore-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        assert not [f for f in whl.namelist() if f.endswith(".so")]

    venv = fresh_venv(venv_dir, str(wheel))
    work = tmp_path / "work"
    work.mkdir()
    version = run([venv / "bin" / "ledgerstore", "--version", "--verbose"], cwd=work, env=user_env(venv)).stdout
    why = "pure Python (ledgerstore.proto._speedups is not built; a build without a working C compiler skips it)"
    assert any(line.startswith(f"hot path: {why}") for line in version.splitlines()), version
    plugins = run([venv / "bin" / "ledgerstore", "plugins"], cwd=work, env=user_env(venv)).stdout
    assert plugins.splitlines()[-1].startswith(f"hot path: {why}"), plugins
    s, uri = start_standalone(venv, work, standalone_in)
    assert f"hot path: {why}" in s.text(), s.text()
    assert all(f"hot path: {why}" in log for log in bookie_logs(s))
    smoke(venv, work, uri, "pure")
