#!/usr/bin/env bash
# Set up, then run the whole test suite (real ZooKeeper, etcd, Spark and bookie processes).
# tests/install builds an sdist and a wheel of this checkout, installs the wheel with its extras into
# a fresh virtualenv outside it and runs a smoke there (standalone, a client, Spark, the compiled hot
# path), then builds again without a C compiler and checks the pure-Python install.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export JAVA_HOME="${JAVA_HOME:-/usr/lib/jvm/java-17-openjdk-amd64}"
[ -d "$JAVA_HOME" ] || unset JAVA_HOME
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$PWD/.venv/bin/python"
.venv/bin/python -m ruff check core plugins contrib tests benchmarks examples scripts || { echo "ruff found problems"; exit 1; }
.venv/bin/lint-imports --no-logo || { echo "import-linter found a broken layer contract"; exit 1; }
.venv/bin/python -m mypy || { echo "mypy found problems"; exit 1; }
# Two test processes (pytest-xdist), a test file each at a time: the suite spends most of its time
# waiting on real servers, so two files at once use the cores it leaves idle. Each process picks
# its ports from a slice of its own (ledgerstore.ports); tests/background.py runs the long
# background jobs once for both. LEDGERSTORE_TEST_PROCESSES=1 runs the suite in one process.
workers="${LEDGERSTORE_TEST_PROCESSES:-2}"
if [ "$workers" -gt 1 ]; then
  exec .venv/bin/python -m pytest -p no:cacheprovider -n "$workers" --dist loadfile "$@"
fi
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
