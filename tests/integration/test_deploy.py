"""The worked deployment example (4 bookies, auto-recovery on) starts from its config files, elects an
auditor, passes simpletest and stops cleanly."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from ledgerstore.cluster import free_ports

ROOT = Path(__file__).resolve().parents[2]


def test_deploy_example_runs_from_its_config_files(tmp_path: Path) -> None:
    deploy = tmp_path / "deploy"
    shutil.copytree(ROOT / "deploy", deploy, ignore=shutil.ignore_patterns("data"))
    zk = free_ports(1)[0]
    base_b, base_h = consecutive_free_ports(4), consecutive_free_ports(4)
    env = dict(os.environ, ZK_PORT=str(zk), BOOKIE_PORT_BASE=str(base_b), HTTP_PORT_BASE=str(base_h),
               LEDGERSTORE=str(Path(sys.executable).with_name("ledgerstore")))
    out = subprocess.run(["bash", str(deploy / "tryout.sh"), "--check"], env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr + _logs(deploy)
    assert "simpletest ok" in out.stdout
    assert f"auditor: 127.0.0.1:{base_b}" in out.stdout, out.stdout  # the smallest bookie id is elected
    assert out.stdout.count(f"127.0.0.1:{base_b}") >= 1
    for cfg in ("bookie-1.toml", "bookie-2.toml", "bookie-3.toml", "bookie-4.toml", "client.toml"):
        check = subprocess.run([sys.executable, "-m", "ledgerstore", "config", "check", str(deploy / cfg)],
                               capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stderr
    # everything it started has stopped: the bookies' logs end with a clean shutdown
    for i in (1, 2, 3, 4):
        log = (deploy / "data" / f"bookie-{i}.log").read_text()
        assert "ready" in log and "Traceback" not in log, log[-2000:]


def consecutive_free_ports(n: int) -> int:
    """The first of ``n`` consecutive ports free on 127.0.0.1 (the example numbers bookies by port)."""
    import random
    import socket

    for _ in range(200):
        base = random.randint(20000, 60000)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no run of free ports found")


def _logs(deploy: Path) -> str:
    return "".join(f"\n--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted((deploy / "data").glob("*.log")))
