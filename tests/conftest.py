from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

# Under pytest-xdist (make test runs a worker a core), each worker takes its share of the cores, set
# before torch is imported: OpenMP threads of two workers on the same cores spin-wait on each other.
if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
    os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // workers))

# The commands' default backend (auto) measures the installed inference runtimes once per model
# and machine: the tests of the commands pin vitkit's own path; tests/test_backends.py covers auto.
os.environ.setdefault("VITKIT_BACKEND", "torch")

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now: tests that start torchrun take one each,
    so that two of them running at once (pytest-xdist) never share a rendezvous."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build) -> Path:
    """A folder that ``build(folder)`` fills, made once for the whole test run: pytest-xdist's
    workers share it (the first to ask builds it under a lock, the others wait and read it).
    Tests must copy it before changing it.

    Args:
        tmp_path_factory: pytest's factory.
        name: the folder's name, unique among such folders.
        build: fills the (empty, existing) folder.

    Returns:
        The folder.
    """
    import fcntl

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' common parent
    folder, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build that failed part-way
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


FIXTURES = Path(os.environ.get("VITKIT_FIXTURES", REPO.parent / "shared" / "fixtures" / "official"))


@pytest.fixture(scope="session")
def fixtures() -> Path:
    if not FIXTURES.is_dir():
        pytest.skip(f"official fixtures not found at {FIXTURES} (set VITKIT_FIXTURES)")
    return FIXTURES
