"""Disk usage of a bookie's ledger directories (what the disk checker, the registration record
and BOOKIE_INFO report)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path


def writable_dirs(dirs: Sequence[Path], threshold: float) -> int:
    """How many of ``dirs`` are on a file system filled below ``threshold`` (a fraction): the
    directories a disk checker would still write to; one that cannot be examined is not."""
    n = 0
    for d in dirs:
        try:
            du = shutil.disk_usage(d)
        except OSError:
            continue
        n += du.total > 0 and du.used / du.total < threshold
    return n


def disk_usage(dirs: Sequence[Path]) -> tuple[int, int, int]:
    """(total, used, free) bytes of the file systems holding ``dirs``, each file system counted
    once; a directory that cannot be examined is left out."""
    total = used = free = 0
    seen = set()
    for d in dirs:
        try:
            st = os.statvfs(d)
        except OSError:
            continue
        if st.f_fsid in seen:
            continue
        seen.add(st.f_fsid)
        du = shutil.disk_usage(d)
        total += du.total
        used += du.used
        free += du.free
    return total, used, free
