#!/usr/bin/env python3
"""A ledgerstore cluster across test hosts on this machine (network namespaces; needs root).

    scripts/netcluster.py up [--bookies 5] [--clients 2] [--metadata etcd|zookeeper|sqlite] [--kafka 0]
                                                            # metadata on "meta", bookies b1.., clients c1..,
                                                            # Kafka front ends k1.. (port 9092)
    scripts/netcluster.py exec TAG HOST -- COMMAND...       # run a command on a host
    scripts/netcluster.py link-down TAG HOST                # silent partition of HOST
    scripts/netcluster.py link-up TAG HOST
    scripts/netcluster.py cut TAG HOST OTHER [OTHER...]     # HOST no longer talks to the others
    scripts/netcluster.py heal TAG [HOST]                   # undo cuts and link-downs
    scripts/netcluster.py down TAG                          # remove a cluster left behind

``up`` prints the cluster's tag, hosts and metadata URI, then runs until Ctrl-C and removes
everything it made. With ``--metadata sqlite`` the metadata host runs ``ledgerstore
metadata-server`` on TCP with a secret file, and ``up`` writes a client config naming both.
See docs/deploy-multihost.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from ledgerstore.errors import LedgerStoreError
from ledgerstore.testing.netns import KAFKA_PORT, NetCluster, attach, cut, link, remove_cluster


def _up(args: argparse.Namespace) -> None:
    bookies = [f"b{i + 1}" for i in range(args.bookies)]
    clients = [f"c{i + 1}" for i in range(args.clients)]
    fronts = [f"k{i + 1}" for i in range(args.kafka)]
    if fronts and args.metadata == "sqlite":
        raise LedgerStoreError("--kafka needs --metadata etcd or zookeeper: a kafka.toml names the metadata URI "
                               "and no metadata options (the sqlite server's secret file)")
    with NetCluster(["meta", *bookies, *clients, *fronts]) as net:
        topology = net.workdir / "topology.txt"
        topology.write_text("".join(f"{net.host(b).hostname} /rack{i % 3}\n" for i, b in enumerate(bookies)))
        extra, client_config = "", ""
        if args.metadata == "sqlite":
            server = net.start_sqlite("meta")
            metadata = server.uri(scheme="sqlite+tcp")
            options = f'metadata_options = {{ secret_file = "{server.secret_file}" }}\n'
            extra = options
            # the metadata host reaches its own server through the Unix socket next to the database
            net.init_cluster("meta", f"sqlite://{net.workdir / 'sqlite-meta' / 'meta.db'}")
            client_config = str(net.workdir / "client.toml")
            Path(client_config).write_text(f'[client]\nmetadata = "{metadata}"\n{options}')
        else:
            server = net.start_etcd("meta") if args.metadata == "etcd" else net.start_zookeeper("meta")
            metadata = server.uri("/ledgers", scheme="etcd" if args.metadata == "etcd" else "zk")
            net.init_cluster(clients[0] if clients else "meta", metadata)
        for b in bookies:
            net.start_bookie(b, metadata, extra, wait=False)
        for svc in net.services[1:]:
            net.wait_for(svc, " ready\n", 60.0)
        for k in fronts:  # Kafka clients bootstrap from HOSTNAME:9092 (run them with exec on a client host)
            net.start_kafka(k, metadata)
        print(f"cluster {net.tag} on {net.subnet} (work directory {net.workdir})")
        for h in net.hosts.values():
            print(f"  {h.name:6} {h.address:15} {h.hostname:22} netns {h.netns}")
        print(f"metadata: {metadata}\ntopology file: {topology}")
        if fronts:
            print("kafka: " + ", ".join(f"{net.host(k).hostname}:{KAFKA_PORT}" for k in fronts))
        where = f"--config {client_config}" if client_config else f"--metadata {metadata}"
        if client_config:
            print(f"client config: {client_config} (secret file {server.secret_file})")
        print(f"run a client: {sys.argv[0]} exec {net.tag} c1 -- ledgerstore shell {where} listbookies")
        print("Ctrl-C removes the cluster", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a cluster and keep it until Ctrl-C")
    up.add_argument("--bookies", type=int, default=5)
    up.add_argument("--clients", type=int, default=2)
    up.add_argument("--kafka", type=int, default=0, help="hosts k1..kN each running a Kafka front end (port 9092)")
    up.add_argument("--metadata", choices=("etcd", "zookeeper", "sqlite"), default="etcd",
                    help="the metadata server on host meta (default etcd)")
    for name in ("link-down", "link-up"):
        p = sub.add_parser(name)
        p.add_argument("tag")
        p.add_argument("host")
    p = sub.add_parser("cut")
    p.add_argument("tag")
    p.add_argument("host")
    p.add_argument("others", nargs="+")
    p = sub.add_parser("heal")
    p.add_argument("tag")
    p.add_argument("host", nargs="?")
    p = sub.add_parser("exec")
    p.add_argument("tag")
    p.add_argument("host")
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p = sub.add_parser("down")
    p.add_argument("tag")
    args = parser.parse_args()
    try:
        if args.cmd == "up":
            if not 1 <= args.bookies <= 20 or not 0 <= args.clients <= 10:
                parser.error("--bookies must be 1-20 and --clients 0-10")
            _up(args)
        elif args.cmd == "down":
            remove_cluster(args.tag)
        else:
            c = attach(args.tag)
            if args.cmd in ("link-down", "link-up"):
                link(c.bridge_ns, c.host(args.host), up=args.cmd == "link-up")
            elif args.cmd == "cut":
                cut(c.host(args.host), [c.host(o).address for o in args.others])
            elif args.cmd == "heal":
                for h in [c.host(args.host)] if args.host else list(c.hosts.values()):
                    cut(h, [])
                    link(c.bridge_ns, h, up=True)
            elif args.cmd == "exec":
                argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
                if not argv:
                    parser.error("exec needs a command after the host")
                os.execvp("ip", ["ip", "netns", "exec", c.host(args.host).netns, *argv])
    except LedgerStoreError as exc:
        print(f"netcluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
