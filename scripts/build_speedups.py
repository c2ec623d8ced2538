"""Compile ledgerstore's optional hot path in place: ``core/ledgerstore/proto/_speedups.pyx`` (the
codec's and the digest's per-entry loops), ``core/ledgerstore/client/_adds.pyx`` (a writer's
pending adds and their in-order acknowledgement) and ``plugins/ledgerstore_entrylog/_records.pyx`` (the
entry log's record headers, with core's C helpers).

Run by ``scripts/setup.sh``. Needs Cython (the ``test`` extra) and a C compiler (Debian's gcc);
without either it prints a warning and exits 0, and ledgerstore runs its pure-Python path
(``ledgerstore.proto.speedups``). Rebuilds only what changed.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "core" / "ledgerstore" / "proto"
CLIENT = ROOT / "core" / "ledgerstore" / "client"
ENTRYLOG = ROOT / "plugins" / "ledgerstore_entrylog"


def build() -> None:
    from Cython.Build import cythonize
    from setuptools import Distribution, Extension

    common: dict[str, Any] = {"include_dirs": [str(PROTO)], "depends": [str(PROTO / "_speedups_c.h")],
                              "extra_compile_args": ["-O2"]}
    exts = [Extension("ledgerstore.proto._speedups", [str(PROTO / "_speedups.pyx")], **common),
            Extension("ledgerstore.client._adds", [str(CLIENT / "_adds.pyx")], extra_compile_args=["-O2"]),
            Extension("ledgerstore_entrylog._records", [str(ENTRYLOG / "_records.pyx")], **common)]
    modules = cythonize(exts, build_dir=str(ROOT / "build" / "cython"), quiet=True,
                        compiler_directives={"language_level": 3})
    dist = Distribution({"name": "ledgerstore-speedups", "ext_modules": modules,
                         "package_dir": {"ledgerstore": "core/ledgerstore", "ledgerstore_entrylog": str(ENTRYLOG)}})
    cmd = dist.get_command_obj("build_ext")
    cmd.build_lib = str(ROOT / "build" / "speedups-lib")  # type: ignore[attr-defined]
    cmd.build_temp = str(ROOT / "build" / "speedups")  # type: ignore[attr-defined]
    dist.run_command("build_ext")
    for ext in modules:
        built = Path(cmd.get_ext_fullpath(ext.name))  # type: ignore[attr-defined]
        package, _, _ = ext.name.rpartition(".")
        dest = ROOT / dist.package_dir[package.split(".")[0]] / Path(*package.split(".")[1:]) / built.name
        install(built, dest)


def install(built: Path, dest: Path) -> None:
    """Put ``built`` at ``dest`` by renaming a copy over it: a running process that has the old
    module loaded keeps its (unlinked) file, where copying into it would change its code under it."""
    if dest.exists() and dest.read_bytes() == built.read_bytes():
        return
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.copy(built, tmp)
    os.replace(tmp, dest)


def main() -> int:
    try:
        build()
    except ImportError as exc:
        print(f"setup: warning: Cython is not installed ({exc}); ledgerstore runs its pure-Python hot path",
              file=sys.stderr)
    except Exception as exc:  # a compiler missing or failing: any error of the build means the fallback
        print(f"setup: warning: building the compiled hot path failed ({type(exc).__name__}: {exc}); "
              "ledgerstore runs its pure-Python hot path (install gcc and python3-dev, then run "
              "scripts/setup.sh again)", file=sys.stderr)
    else:
        print("setup: compiled hot path built (ledgerstore.proto._speedups, ledgerstore.client._adds, "
              "ledgerstore_entrylog._records)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
