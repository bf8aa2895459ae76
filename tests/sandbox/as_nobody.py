"""A standalone copy of the sandbox modules, run by the system python as `nobody` (setpriv): how the non-root tests
reach the sandbox's non-root path from a root test run."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from tracerl.io import sandbox

PYTHON = shutil.which("python3", path="/usr/bin:/bin")
HERE = Path(__file__).parent


@contextmanager
def nobody_copy(files: Sequence[str], prefix: str) -> Iterator[tuple[Path, Path]]:
    """(code, host_tmp): `code` holds the sandbox package under its own name (tracerl/io/sandbox/) and `files`
    (names in this folder), readable by all; `host_tmp` is a world-writable temporary folder for the probe's TMPDIR.
    Both are removed afterwards."""
    code = Path(tempfile.mkdtemp(prefix=f"{prefix}-code-"))
    host_tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}-tmp-", dir="/tmp"))
    try:
        package = code / "tracerl" / "io"
        package.mkdir(parents=True)
        for folder in (package.parent, package):
            (folder / "__init__.py").touch()
            os.chmod(folder, 0o755)
        shutil.copytree(Path(sandbox.__file__).parent, package / "sandbox",
                        ignore=shutil.ignore_patterns("__pycache__"))
        os.chmod(package / "sandbox", 0o755)
        for name in files:
            shutil.copy(HERE / name, code / name)
        os.chmod(code, 0o755)
        os.chmod(host_tmp, 0o1777)
        yield code, host_tmp
    finally:
        shutil.rmtree(code, ignore_errors=True)
        shutil.rmtree(host_tmp, ignore_errors=True)


def run_as_nobody(code: Path, host_tmp: Path, probe: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """`probe` (a file of `code`) run by the system python as uid and gid 65534 with no groups, `code` first on its
    path, TMPDIR and HOME in `host_tmp`."""
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", PYTHON, "-s",
                           str(code / probe), str(code), str(code), *args],
                          env={"PATH": "/usr/bin:/bin", "TMPDIR": str(host_tmp), "HOME": str(host_tmp)},
                          cwd="/", capture_output=True, text=True, timeout=timeout)
