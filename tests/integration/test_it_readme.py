"""The README's commands, run as written against a running demo gateway (what `make run`
starts): its shell lines in bash after its own `. .venv/bin/activate`, and its boto3 and s3fs
examples with Python. Only the addresses change: the README's 127.0.0.1:9000 and :9001 become
this test's ports (9000 may be taken on a shared machine), and `gateway status|drain`,
which default to 127.0.0.1:9001, find this gateway through GATEWAY_ADMIN."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import REPO_ROOT
from test_it_demo import DemoGateway

README = REPO_ROOT / "README.md"
# The venv the README activates, as it is where these tests run (`make test` made it).
VENV = Path(sys.executable).parent.parent


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL)


def _commands(block: str) -> list[str]:
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoGateway]:
    gw = DemoGateway(tmp_path_factory.mktemp("readme") / "gateway-data")
    gw.start()
    yield gw
    gw.stop()


def _as_here(text: str, gw: DemoGateway) -> str:
    return text.replace("127.0.0.1:9000", f"127.0.0.1:{gw.port}").replace(
        "127.0.0.1:9001", f"127.0.0.1:{gw.admin_port}"
    )


def test_the_readme_activates_the_venv_before_its_commands() -> None:
    shell = [_commands(b) for b in blocks("sh")]
    activate = next(i for i, lines in enumerate(shell) if ". .venv/bin/activate" in lines[-1])
    later = " ".join(" ".join(lines) for lines in shell[activate + 1 :])
    for command in ("gateway drain", "gateway status", "aws --endpoint-url"):
        assert command in later, f"{command!r} is not after the venv's activation"
    assert (REPO_ROOT / ".venv" / "bin" / "activate").exists() or VENV != REPO_ROOT / ".venv"


def test_the_readme_shell_lines_work_as_written(demo: DemoGateway, tmp_path: Path) -> None:
    # The README's Python examples first: the drain lines then have something to wait for.
    for block in blocks("python"):
        if "import boto3" in block or "import s3fs" in block:
            done = subprocess.run(
                [sys.executable, "-c", _as_here(block, demo)],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, done.stderr
            assert "ckpt/" in done.stdout
    shell = blocks("sh")
    start = next(i for i, b in enumerate(shell) if ". .venv/bin/activate" in b)
    lines = [line for line in _commands(shell[start]) if not line.startswith("make ")]
    for block in shell[start + 1 :]:
        lines += _commands(block)
    # The activation as written, from the repository; then the rest in a scratch directory.
    script = "\n".join(
        ["set -euo pipefail", f"cd {REPO_ROOT}", lines[0], f"cd {tmp_path}", *lines[1:]]
    )
    if VENV != REPO_ROOT / ".venv":  # a suite run from another venv: activate that one
        script = script.replace(". .venv/bin/activate", f". {VENV}/bin/activate")
    env = {k: v for k, v in demo.environment().items() if not k.startswith("AWS_")}
    env["GATEWAY_ADMIN"] = demo.admin
    done = subprocess.run(
        ["bash", "-c", _as_here(script, demo)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"drained": true' in done.stdout
    assert "ckpt/step_1/shard.bin" in done.stdout or "shard.bin" in done.stdout
    assert "flush state" in done.stdout  # gateway status printed its table
    assert "command not found" not in done.stderr
