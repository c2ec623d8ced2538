"""The one build of ledgerstore's compiled hot path: three optional Cython extensions.

Everything else about the distribution (name, dependencies, extras, entry points, packages) is in
``pyproject.toml``; this file only declares the extensions, because they need code: a build step
that turns a failed compile into one warning and a pure-Python install.

- ``ledgerstore.proto._speedups``: the codec's and the digest's per-entry loops (``_speedups_c.h``
  holds the C helpers it shares with the entry log's module);
- ``ledgerstore.client._adds``: a writer's pending adds and their in-order acknowledgement;
- ``ledgerstore_entrylog._records``: the entry log's record headers.

Every way of building runs this: ``pip install .``, ``pip wheel .``, ``python -m build`` (Cython
comes from ``[build-system].requires``), the editable install ``scripts/setup.sh`` makes, and
``python setup.py build_ext --inplace`` (which ``scripts/setup.sh`` runs to rebuild a changed
``.pyx``). Without a working C compiler (``CC=false`` shows it) the build prints one warning,
installs none of the three, and ledgerstore runs its pure-Python twins of those loops;
``ledgerstore plugins`` then says ``hot path: pure Python (...)``. Either all three are installed or
none: the compiled modules are used together (``ledgerstore.proto.speedups``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import BaseError, CCompilerError

PROTO = "core/ledgerstore/proto"
HELPERS = f"{PROTO}/_speedups_c.h"
_COMMON: dict[str, Any] = {"extra_compile_args": ["-O2"], "optional": True}

#: the compiled hot path; the sources are relative to this file, as setuptools requires
EXTENSIONS = [
    Extension("ledgerstore.proto._speedups", [f"{PROTO}/_speedups.pyx"], include_dirs=[PROTO],
              depends=[HELPERS], **_COMMON),
    Extension("ledgerstore.client._adds", ["core/ledgerstore/client/_adds.pyx"], **_COMMON),
    Extension("ledgerstore_entrylog._records", ["plugins/ledgerstore_entrylog/_records.pyx"],
              include_dirs=[PROTO], depends=[HELPERS], **_COMMON),
]

#: the one warning a build without the compiled hot path prints
WARNING = ("warning: ledgerstore: the compiled hot path was not built ({why}); this install runs the "
           "slower pure-Python hot path. Install a C compiler and the Python headers (Debian: gcc "
           "python3-dev) and build again.")


class BuildHotPath(build_ext):
    """Cythonizes, then compiles the three extensions; all or none of them are installed."""

    def run(self) -> None:
        self._in_place = bool(self.inplace)  # setuptools clears it while it builds
        try:
            from Cython.Build import cythonize
        except ImportError as exc:
            # only a build without isolation (--no-build-isolation) can lack the build requirement
            self._give_up(f"Cython is not installed: {exc}")
            return
        translated = cythonize(self.extensions, build_dir=os.path.join(self.build_temp, "cython"), quiet=True,
                               compiler_directives={"language_level": 3})
        for ext, c_ext in zip(self.extensions, translated, strict=True):
            ext.sources = c_ext.sources  # the same Extension objects: setuptools annotated them
        super().run()

    def build_extensions(self) -> None:
        # setuptools' own handling of ``optional`` warns once per extension and keeps the others;
        # here the first failure stops the build and takes back what was built before it
        self.check_extensions_list(self.extensions)
        for ext in self.extensions:
            try:
                self.build_extension(ext)
            except CCompilerError:  # its output went to stderr above
                self._give_up(f"the C compiler {getattr(self.compiler, 'compiler_so', [''])[0]!r} failed on {ext.name}")
                return
            except (BaseError, OSError) as exc:  # a compiler that cannot run at all
                self._give_up(f"building {ext.name} failed: {exc}")
                return

    def copy_file(self, infile: str, outfile: str, *args: Any, **kwargs: Any) -> tuple[str, bool]:
        """Put a module built in place by renaming a copy over the old file: a running process that
        has the old module loaded keeps its (unlinked) file, where copying into it would change the
        code under it."""
        if not self.inplace:
            return super().copy_file(infile, outfile, *args, **kwargs)
        if Path(outfile).exists() and Path(outfile).read_bytes() == Path(infile).read_bytes():
            return outfile, False
        tmp = outfile + ".tmp"
        result = super().copy_file(infile, tmp, *args, **kwargs)
        os.replace(tmp, outfile)
        return outfile, result[1]

    def _give_up(self, why: str) -> None:
        # The wheel packs what the build directory holds: take out what this or an earlier build put
        # there. In place, take out the modules an earlier build left by their sources, which would
        # otherwise run code older than those sources.
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            filename = self.get_ext_filename(self.get_ext_fullname(ext.name))
            Path(self.build_lib, filename).unlink(missing_ok=True)
            if self._in_place:
                package = ext.name.rpartition(".")[0]
                Path(build_py.get_package_dir(package), os.path.basename(filename)).unlink(missing_ok=True)
        self.extensions = []
        print(WARNING.format(why=" ".join(why.split())), file=sys.stderr, flush=True)


setup(ext_modules=EXTENSIONS, cmdclass={"build_ext": BuildHotPath})
