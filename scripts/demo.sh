#!/usr/bin/env bash
# Set up, then start a local 3-bookie cluster (sqlite metadata), run a demo workload, stop.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/ledgerstore standalone --bookies 3 --data-dir "${LEDGERSTORE_DEMO_DIR:-ledgerstore-data}" --demo "$@"
