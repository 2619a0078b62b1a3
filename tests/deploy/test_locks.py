"""The lock files (requirements/*.txt, compiled by `make lock` from pyproject.toml's ranges)
against pyproject.toml: exact pins that satisfy its ranges, every lock agreeing with the
others, and a production install (serve.txt) and `make run` (demo.txt) that bring neither
test tools nor torch nor any CUDA package."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ("serve", "demo", "clients", "test")


def pins(lock: str) -> dict[str, str]:
    text = (ROOT / "requirements" / f"{lock}.txt").read_text()
    found = re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)", text, re.MULTILINE)
    assert found, lock
    return {canonicalize_name(name): version for name, version in found}


def project() -> dict[str, list[Requirement]]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"serve": doc["dependencies"], **doc["optional-dependencies"]}
    return {name: [Requirement(r) for r in reqs] for name, reqs in groups.items()}


def test_every_lock_satisfies_the_ranges_it_was_compiled_from() -> None:
    groups = project()
    compiled_from = {
        "serve": ["serve"],
        "demo": ["serve", "demo"],
        "clients": ["serve", "clients"],
        "test": ["serve", "demo", "clients", "test"],
    }
    for lock, names in compiled_from.items():
        pinned = pins(lock)
        for req in (r for name in names for r in groups[name]):
            version = pinned.get(canonicalize_name(req.name))
            assert version is not None, f"{req.name} missing from {lock}.txt"
            assert req.specifier.contains(version, prereleases=True), (lock, req, version)


def test_locks_agree_and_nest() -> None:
    test = pins("test")
    for lock in ("serve", "demo", "clients"):
        pinned = pins(lock)
        assert pinned.items() <= test.items(), lock
    assert pins("serve").keys() < pins("demo").keys()


def test_serving_installs_no_test_tools_and_no_torch() -> None:
    for lock in ("serve", "demo", "clients"):
        names = pins(lock).keys()
        for banned in ("pytest", "torch", "mypy", "hypothesis", "helm-python-sdk", "s3fs"):
            assert banned not in names or (lock == "clients" and banned == "s3fs"), (
                lock,
                banned,
            )
    assert "moto" not in pins("serve")  # the demo upstream is an extra
    assert "moto" in pins("demo")


def test_torch_is_the_local_cpu_wheel_and_nothing_pulls_cuda() -> None:
    assert pins("test")["torch"] == "2.13.0+cpu"
    for lock in LOCKS:
        cuda = [n for n in pins(lock) if n.startswith(("nvidia-", "cuda-", "triton"))]
        assert not cuda, (lock, cuda)
