"""PySpark's zip with its modules compiled: once per environment, ``make`` runs it after installing.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on the path of every Python process it starts (its
workers' daemons, the data sources' planners, a streaming source's runner, a transformWithState operator's
driver-side worker), so each of them imports PySpark from that zip. The zip holds sources only, and Python
never caches what it compiles from a zip: every such process compiles the PySpark modules it imports, about
a second of CPU each, and a streaming query starts about ten of them, one after another. Here the zip is
written again with each module's bytecode beside its source (unchecked hash-based ``.pyc`` files, which
``zipimport`` loads as they are); the sources stay, and an interpreter of another version compiles them as
before.

The zip is replaced atomically, but only while no Spark job runs: a process that has read the old zip's
directory would read the new one at the old offsets. Hence a step of the installation, not of a job's start.

Run: .venv/bin/python -m infra.spark.pyspark_zip
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import sys
import tempfile
import zipfile
from pathlib import Path
from types import CodeType

import pyspark

#: The zip Spark puts on its Python processes' path (``PythonUtils.sparkPythonPath``).
PYSPARK_ZIP = Path(pyspark.__file__).parent / "python" / "lib" / "pyspark.zip"


#: A hash-based ``.pyc`` whose source is not checked (PEP 552: the flags' bit 0 set, bit 1 clear).
UNCHECKED_HASH_FLAGS = (0b01).to_bytes(4, "little")


def unchecked_pyc(code: CodeType, source: bytes) -> bytes:
    """The ``.pyc`` file of ``code`` compiled from ``source``: magic number, flags, the source's hash, code."""
    return (
        importlib.util.MAGIC_NUMBER
        + UNCHECKED_HASH_FLAGS
        + importlib.util.source_hash(source)
        + marshal.dumps(code)
    )


def compiled(archive: zipfile.ZipFile) -> bool:
    """Whether ``archive`` holds bytecode of this interpreter's version (a ``.pyc`` with its magic number)."""
    pycs = [name for name in archive.namelist() if name.endswith(".pyc")]
    return bool(pycs) and archive.read(pycs[0])[:4] == importlib.util.MAGIC_NUMBER


def compile_zip(path: Path = PYSPARK_ZIP) -> int:
    """Write ``path`` again with a ``.pyc`` beside each ``.py``; the number of modules compiled (0: it was
    done already, or there is no such zip)."""
    if not path.is_file():
        return 0
    with zipfile.ZipFile(path) as source:
        if compiled(source):
            return 0
        entries = [
            (info, source.read(info)) for info in source.infolist() if not info.filename.endswith(".pyc")
        ]
    count = 0
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        with zipfile.ZipFile(name, "w", zipfile.ZIP_DEFLATED) as target:
            for info, data in entries:
                target.writestr(info, data)
                if info.filename.endswith(".py"):
                    try:
                        code = compile(data, f"{path}{os.sep}{info.filename}", "exec", dont_inherit=True)
                    except SyntaxError:  # left to the interpreter that imports it, as before
                        continue
                    target.writestr(
                        zipfile.ZipInfo(info.filename + "c", info.date_time), unchecked_pyc(code, data)
                    )
                    count += 1
        os.chmod(name, path.stat().st_mode)
        os.replace(name, path)  # atomic: a process opening the zip finds the old one or the new one
    finally:
        if os.path.exists(name):
            os.unlink(name)
    return count


def main() -> None:
    count = compile_zip()
    if count:
        print(f"PySpark's zip for Spark's Python processes compiled ({count} modules): {PYSPARK_ZIP}")
    elif not PYSPARK_ZIP.is_file():
        print(f"no {PYSPARK_ZIP}: nothing to compile", file=sys.stderr)


if __name__ == "__main__":
    main()
