#!/usr/bin/env bash
# Try the 4-bookie + ZooKeeper example on one machine, from its config files.
#   deploy/tryout.sh            start ZooKeeper and 4 bookies (auto-recovery on in each), run simpletest, serve until Ctrl-C
#   deploy/tryout.sh --check    the same, then stop everything and exit (used by the tests)
# Ports: ZK_PORT (default 2181), BOOKIE_PORT_BASE (3181), HTTP_PORT_BASE (8001). Everything it starts
# is stopped by PID when it exits.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
LS="${LEDGERSTORE:-$repo/.venv/bin/ledgerstore}"
ZK_PORT="${ZK_PORT:-2181}"
BOOKIE_PORT_BASE="${BOOKIE_PORT_BASE:-3181}"
HTTP_PORT_BASE="${HTTP_PORT_BASE:-8001}"
JAVA_HOME="${JAVA_HOME:-/usr/lib/jvm/java-17-openjdk-amd64}"
[ -x "$JAVA_HOME/bin/java" ] || JAVA_HOME="$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

mkdir -p "$here/data/zookeeper"
# the bookies' admin token (bookie-N.toml: [bookie.http] token_file); made once, readable by this user only
if [ ! -s "$here/data/admin-token" ]; then
  (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$here/data/admin-token")
fi
sed -e "s|^dataDir=.*|dataDir=$here/data/zookeeper|" -e "s|^clientPort=.*|clientPort=$ZK_PORT|" "$here/zoo.cfg" > "$here/data/zoo.cfg"
# zookeeper.jar's manifest names its dependencies; slf4j-simple (if present) sends its log to stderr
cp="/etc/zookeeper/conf:/usr/share/java/zookeeper.jar"
[ -f /usr/share/java/slf4j-simple.jar ] && cp="$cp:/usr/share/java/slf4j-simple.jar"
"$JAVA_HOME/bin/java" -Xmx256m -XX:+UseSerialGC -Dzookeeper.jmx.log4j.disable=true -cp "$cp" org.apache.zookeeper.server.quorum.QuorumPeerMain "$here/data/zoo.cfg" \
  > "$here/data/zookeeper.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  if (exec 3<>/dev/tcp/127.0.0.1/"$ZK_PORT") 2>/dev/null; then break; fi
  sleep 0.2
done
echo "zookeeper on 127.0.0.1:$ZK_PORT"

metadata="zk://127.0.0.1:$ZK_PORT/ledgers"
# bookies join a cluster, they do not create one: create it once, as BookKeeper's initnewcluster does
if ! "$LS" shell --metadata "$metadata" whatisinstanceid --json | grep -q '"instance_id": "'; then
  "$LS" shell --metadata "$metadata" initnewcluster
fi
for i in 1 2 3 4; do
  LEDGERSTORE_BOOKIE_METADATA="$metadata" \
  LEDGERSTORE_BOOKIE_LISTEN="tcp://127.0.0.1:$((BOOKIE_PORT_BASE + i - 1))" \
  LEDGERSTORE_BOOKIE_HTTP_PORT="$((HTTP_PORT_BASE + i - 1))" \
    "$LS" bookie --config "$here/bookie-$i.toml" > "$here/data/bookie-$i.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 150); do
  n=$("$LS" shell --metadata "$metadata" listbookies --json 2>/dev/null | grep -c '"bookie_id"' || true)
  [ "$n" -ge 4 ] && break
  sleep 0.2
done
"$LS" shell --metadata "$metadata" listbookies
# every bookie runs auto-recovery ([bookie.autorecovery]); one of them is elected auditor
auditor=""
for _ in $(seq 100); do
  auditor=$("$LS" shell --metadata "$metadata" whoisauditor 2>/dev/null) && break
  sleep 0.2
done
echo "auditor: ${auditor:-none elected yet}"
LEDGERSTORE_CLIENT_METADATA="$metadata" "$LS" shell --config "$here/client.toml" simpletest --entries 1000
echo "metrics: curl http://127.0.0.1:$HTTP_PORT_BASE/metrics"
echo "admin:   curl -H \"Authorization: Bearer \$(cat $here/data/admin-token)\" -X PUT http://127.0.0.1:$HTTP_PORT_BASE/api/v1/bookie/gc"
if [ "${1:-}" = "--check" ]; then
  exit 0
fi
echo "running; Ctrl-C stops ZooKeeper and the bookies"
wait
