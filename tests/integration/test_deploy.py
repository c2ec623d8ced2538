"""The worked deployment example (4 bookies, auto-recovery on) starts from its config files, elects an
auditor, passes simpletest and stops cleanly; its systemd files make the user and folders its unit needs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerstore.ports import consecutive_free_ports, free_ports

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


def _logs(deploy: Path) -> str:
    return "".join(f"\n--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted((deploy / "data").glob("*.log")))


def test_the_systemd_unit_gets_its_user_and_folders_from_the_shipped_sysusers_and_tmpfiles_files(
        tmp_path: Path) -> None:
    """What deploy/README.md has an operator run on a fresh Debian machine, into a scratch root."""
    import re
    import stat

    if not (shutil.which("systemd-sysusers") and shutil.which("systemd-tmpfiles")):
        pytest.skip("systemd-sysusers / systemd-tmpfiles are not installed (apt-get install systemd)")
    if os.geteuid() != 0:
        pytest.skip("systemd-tmpfiles sets owners: run as root")
    systemd = ROOT / "deploy" / "systemd"
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    for cmd in (["systemd-sysusers", f"--root={root}", str(systemd / "ledgerstore.sysusers.conf")],
                ["systemd-tmpfiles", f"--root={root}", "--create", str(systemd / "ledgerstore.tmpfiles.conf")]):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
    users = {f[0]: f for f in (line.split(":") for line in (root / "etc" / "passwd").read_text().splitlines())}
    groups = {f[0]: f for f in (line.split(":") for line in (root / "etc" / "group").read_text().splitlines())}
    user = users["ledgerstore"]
    uid, gid = int(user[2]), int(groups["ledgerstore"][2])
    assert (int(user[3]), user[5], user[6]) == (gid, "/var/lib/ledgerstore", "/usr/sbin/nologin")
    for path, owner, mode in ((root / "etc" / "ledgerstore", (0, gid), 0o750),
                              (root / "var" / "lib" / "ledgerstore", (uid, gid), 0o750)):
        st = path.stat()
        assert ((st.st_uid, st.st_gid), stat.S_IMODE(st.st_mode)) == (owner, mode), path

    unit = (systemd / "ledgerstore-bookie@.service").read_text()
    assert "User=ledgerstore\n" in unit and "Group=ledgerstore\n" in unit
    assert "--config /etc/ledgerstore/bookie-%i.toml" in unit
    # the README's command turns the example's config into one using those folders, and it checks
    readme = (ROOT / "deploy" / "README.md").read_text()
    match = re.search(r"^(sed -e .*?\\\n\s+bookie-1\.toml) > /etc/ledgerstore/bookie-1\.toml$", readme, re.M | re.S)
    assert match, "deploy/README.md no longer shows how bookie-1.toml becomes /etc/ledgerstore/bookie-1.toml"
    cfg = tmp_path / "bookie-1.toml"
    subprocess.run(f"{match.group(1)} > {cfg}", shell=True, check=True, cwd=ROOT / "deploy", timeout=60)
    check = subprocess.run([sys.executable, "-m", "ledgerstore", "config", "check", str(cfg)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    assert 'journal_dir = "/var/lib/ledgerstore/bookie-1/journal"' in check.stdout
    assert 'token_file = "/etc/ledgerstore/admin-token"' in check.stdout
