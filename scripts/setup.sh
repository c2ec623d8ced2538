#!/usr/bin/env bash
# Set up everything ledgerstore's cluster and tests need on a Debian machine:
# Debian packages (ZooKeeper, etcd, Java, venv, kcat), a virtualenv in .venv with every extra,
# and the contrib plugins. Safe to run again: it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
# the multi-host tests: network namespaces, veths and a bridge (iproute2), silent cuts (nftables)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v nft >/dev/null 2>&1 || need_apt+=(nftables)
# the Kafka front end's tests produce and consume with Debian's kcat (librdkafka's command-line client)
command -v kcat >/dev/null 2>&1 || need_apt+=(kcat)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
stamp=.venv/.ledgerstore-installed
installed_now=""
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] || [ -n "$(find contrib -name pyproject.toml -newer "$stamp" 2>/dev/null)" ]; then
  echo "setup: installing ledgerstore[all,test] into .venv (an editable install; setup.py compiles the hot path in place)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[all,test]'
  for d in contrib/*/; do
    if [ -f "$d/pyproject.toml" ]; then
      .venv/bin/python -m pip install -q --no-build-isolation -e "$d" 2>/dev/null || .venv/bin/python -m pip install -q -e "$d"
    fi
  done
  touch "$stamp"
  installed_now=1
fi
# The compiled hot path (Cython, compiled with the system's gcc) is built by setup.py, the build
# every wheel uses. The editable install above built it; later runs rebuild what changed since.
# Without a compiler setup.py warns and ledgerstore runs its pure-Python path
# (LEDGERSTORE_PURE_PYTHON=1 forces that path).
if [ -z "$installed_now" ]; then
  .venv/bin/python setup.py --quiet build_ext --inplace
fi
echo "setup: $(.venv/bin/ledgerstore --version --verbose | grep '^hot path:')"
# Spark finds Python data sources by listing the top-level pyspark_* modules on sys.path
# (pkgutil.iter_modules), which does not see packages served by the editable install's import
# finder: link the one such package into site-packages, where a wheel install puts it.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ln -sfn "$PWD/plugins/pyspark_ledgerstore" "$site/pyspark_ledgerstore"
echo "setup: ready (.venv/bin/ledgerstore)"
