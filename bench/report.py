"""Write a bench script's figures into docs/benchmarks.md, between that script's marker comments.

Each script owns one section of the file, delimited by ``<!-- bench:NAME:start -->`` and
``<!-- bench:NAME:end -->``; :func:`write_section` replaces what lies between them with the figures of
the run (markdown tables), the settings it used and the machine it ran on, and leaves the rest of the
file (the hand-written header, the other scripts' sections) as it is. A section whose markers are missing
is appended at the end of the file.

Usage, at the end of a script::

    report.write_section(
        "simulator",
        script=__file__,
        tables=[report.Table(["figure", "value"], [["rows/s", f"{rate:,.0f}"]])],
        settings={"seed": 0, "days": 183},
    )

``--no-report`` (see :func:`add_flag`) prints the figures only, for quick runs with other sizes: a script
that takes it writes with :func:`write_unless_skipped`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from infra.embedded.stack import BROKER_HEAP
from infra.maven import KAFKA_VERSION

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
#: The stack the benchmarks run on, as their settings name it.
EMBEDDED_STACK = f"embedded Apache Kafka {KAFKA_VERSION} broker (heap {BROKER_HEAP}), Valkey, SQLite MLflow"


@dataclass(frozen=True)
class Table:
    """A markdown table: column headers, rows of cells (formatted as given), an optional caption."""

    headers: Sequence[str]
    rows: Sequence[Sequence[object]]
    caption: str = ""
    notes: Sequence[str] = field(default_factory=tuple)


def world_parser(doc: str | None) -> argparse.ArgumentParser:
    """A script's argument parser (its docstring as help) with the size of the simulated world:
    ``--customers`` (cards) and ``--terminals``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--customers", type=int, default=5000)
    parser.add_argument("--terminals", type=int, default=10000)
    return parser


def add_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--no-report``: print the figures without touching docs/benchmarks.md."""
    parser.add_argument(
        "--no-report",
        action="store_true",
        help=f"print only; leave {DOC.relative_to(ROOT)} as it is (for runs with other sizes)",
    )


def write_unless_skipped(
    args: argparse.Namespace,
    name: str,
    *,
    script: str,
    tables: Sequence[Table],
    settings: Mapping[str, object],
    title: str | None = None,
) -> Path | None:
    """:func:`write_section` ``name``, unless the run was given ``--no-report`` (:func:`add_flag`): the file
    written, or None."""
    if args.no_report:
        return None
    return write_section(name, script=script, tables=tables, settings=settings, title=title)


def args_settings(args: argparse.Namespace) -> dict[str, object]:
    """A script's parsed arguments as settings to report (without ``--no-report``)."""
    return {key: value for key, value in vars(args).items() if key != "no_report"}


def markers(name: str) -> tuple[str, str]:
    """The start and end marker comments of section ``name``."""
    return f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"


def markdown_row(cells: Sequence[object]) -> str:
    """One row of a GitHub markdown table (pipes in cells escaped)."""
    return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"


def markdown_header(headers: Sequence[str]) -> str:
    """The first two lines of a GitHub markdown table: its headers and the line under them."""
    return f"{markdown_row(headers)}\n{markdown_row(['---'] * len(headers))}"


def markdown_table(table: Table) -> str:
    """``table`` as GitHub markdown (pipes in cells escaped)."""
    lines = [f"*{table.caption}*", ""] if table.caption else []
    lines += [markdown_header(table.headers)]
    lines += [markdown_row(cells) for cells in table.rows]
    lines += [f"\n{note}" for note in table.notes]
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _commit() -> str:
    git = shutil.which("git")
    if git is None:
        return "unknown"
    try:
        head = subprocess.run(
            [git, "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            [git, "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head} (with uncommitted changes)" if dirty else head


def machine() -> dict[str, str]:
    """Where and when the figures were measured."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": f"{usable} usable of {os.cpu_count()} ({_cpu_model()})",
        "python": platform.python_version(),
        "os": platform.platform(terse=True),
        "commit": _commit(),
    }


def render(script: str, tables: Sequence[Table], settings: Mapping[str, object]) -> str:
    """The body of a section: the tables, then the settings and the machine."""
    where = machine()
    parts = [f"Written by `{script}` on {where.pop('date')}.", ""]
    for table in tables:
        parts += [markdown_table(table), ""]
    parts.append("Settings: " + ", ".join(f"`{key}={value}`" for key, value in settings.items()) + ".")
    parts.append("")
    parts.append("Machine: " + ", ".join(f"{key} {value}" for key, value in where.items()) + ".")
    return "\n".join(parts)


def replace_section(text: str, name: str, body: str, title: str) -> str:
    """``text`` with section ``name``'s content replaced by ``body`` (appended, under ``title``, if the
    markers are missing)."""
    start, end = markers(name)
    block = f"{start}\n{body}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text, count=1)
    return f"{text.rstrip()}\n\n## {title}\n\n{block}\n"


def write_section(
    name: str,
    *,
    script: str,
    tables: Sequence[Table],
    settings: Mapping[str, object],
    title: str | None = None,
    doc: Path = DOC,
) -> Path:
    """Replace section ``name`` of ``doc`` with ``tables`` and ``settings``; returns the file written.

    ``script`` is the bench script's path (its ``__file__``), shown relative to the repository.
    """
    path = Path(script).resolve()
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    body = render(str(shown), tables, settings)
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(replace_section(text, name, body, title or f"`{shown}`"))
    print(f"figures written to {doc.relative_to(ROOT) if doc.is_relative_to(ROOT) else doc} ({name})")
    return doc
