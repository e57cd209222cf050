"""PySpark's zip compiled in place: the same modules, imported from their bytecode, once."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from infra.spark.pyspark_zip import compile_zip


def test_a_zip_is_compiled_once_and_its_modules_import_from_their_bytecode(tmp_path: Path) -> None:
    path = tmp_path / "lib.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("pkg/__init__.py", "NAME = 'pkg'\n")
        archive.writestr("pkg/mod.py", "def where():\n    return where.__code__.co_filename\n")
        archive.writestr("pkg/old.py", "print 'python 2'\n")  # not compiled: left to whoever imports it
        archive.writestr("pkg/data.txt", "kept")
    path.chmod(0o644)

    assert compile_zip(path) == 2
    assert compile_zip(path) == 0  # done already
    assert path.stat().st_mode & 0o777 == 0o644
    with zipfile.ZipFile(path) as archive:
        assert sorted(archive.namelist()) == [
            "pkg/__init__.py",
            "pkg/__init__.pyc",
            "pkg/data.txt",
            "pkg/mod.py",
            "pkg/mod.pyc",
            "pkg/old.py",
        ]
        assert archive.read("pkg/data.txt") == b"kept"
    imported = subprocess.run(
        [sys.executable, "-c", "import pkg.mod; print(pkg.mod.__file__); print(pkg.mod.where())"],
        env={"PYTHONPATH": str(path)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert imported == [f"{path}/pkg/mod.pyc", f"{path}/pkg/mod.py"]


def test_no_zip_nothing_to_compile(tmp_path: Path) -> None:
    assert compile_zip(tmp_path / "absent.zip") == 0
