"""The README's examples, every one, run as written and in the README's order against a
running demo gateway (what `make run` starts): shell blocks in bash from the repository after
its own `. .venv/bin/activate`, Python blocks with the venv's Python, and the DCP script
saved as the README says and started under `torchrun` with two ranks. Only the addresses
change: the README's 127.0.0.1:9000 and :9001 become this test's ports (9000 may be taken
on a shared machine), and the `gateway` commands, which default to 127.0.0.1:9001, find
this gateway through GATEWAY_ADMIN. The examples must leave the repository as they found
it, and the README's links must lead to files of the repository."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import REPO_ROOT, list_all_keys
from test_it_demo import DemoGateway

README = REPO_ROOT / "README.md"
# The venv the README activates, as it is where these tests run (`make test` made it).
VENV = Path(sys.executable).parent.parent
TIMEOUT_S = 300


def blocks() -> list[tuple[str, str]]:
    """Every fenced block of the README, in order: (language, text)."""
    found = re.findall(r"^```(\w*)\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL)
    return [(language, text) for language, text in found]


def examples() -> list[tuple[str, str]]:
    """The blocks a reader runs: every sh and python block after the one that activates the
    venv (the blocks before it are `make run` and `make test` themselves)."""
    every = blocks()
    start = next(i for i, (_, text) in enumerate(every) if ". .venv/bin/activate" in text)
    return [(lang, text) for lang, text in every[start + 1 :] if lang in ("sh", "python")]


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


def _environment(gw: DemoGateway) -> dict[str, str]:
    """A reader's terminal: the venv first on PATH, no AWS settings of the test run."""
    env = {k: v for k, v in gw.environment().items() if not k.startswith("AWS_")}
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["GATEWAY_ADMIN"] = gw.admin
    return env


def _repository_state() -> str:
    done = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def _run(command: list[str], gw: DemoGateway, cwd: Path) -> str:
    done = subprocess.run(
        command, cwd=cwd, env=_environment(gw), capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.returncode == 0, f"{command[:2]}:\n{done.stdout}\n{done.stderr}"
    assert "command not found" not in done.stderr
    return done.stdout


def _run_shell(block: str, gw: DemoGateway) -> str:
    script = "\n".join(["set -euo pipefail", ". .venv/bin/activate", _as_here(block, gw)])
    if VENV != REPO_ROOT / ".venv":  # a suite run from another venv: activate that one
        script = script.replace(". .venv/bin/activate", f". {VENV}/bin/activate")
    return _run(["bash", "-c", script], gw, REPO_ROOT)


def _run_python(block: str, gw: DemoGateway, scratch: Path) -> str:
    code = _as_here(block, gw)
    if "dist.init_process_group" not in code:
        return _run([sys.executable, "-c", code], gw, REPO_ROOT)
    # The DCP script as the README says: saved as dcp_save.py, started on two ranks.
    (scratch / "dcp_save.py").write_text(code)
    torchrun = ["torchrun", "--standalone", "--nproc-per-node", "2", "dcp_save.py"]
    return _run(torchrun, gw, scratch)


def test_the_readme_activates_the_venv_before_its_commands() -> None:
    shell = [_commands(text) for lang, text in blocks() if lang == "sh"]
    activate = next(i for i, lines in enumerate(shell) if ". .venv/bin/activate" in lines[-1])
    later = " ".join(" ".join(lines) for lines in shell[activate + 1 :])
    commands = ("gateway drain", "gateway status", "aws --endpoint-url", "gateway latest")
    for command in (*commands, "gateway checkpoints"):
        assert command in later, f"{command!r} is not after the venv's activation"
    assert (REPO_ROOT / ".venv" / "bin" / "activate").exists() or VENV != REPO_ROOT / ".venv"


def test_every_readme_example_works_as_written(demo: DemoGateway, tmp_path: Path) -> None:
    before = _repository_state()
    out: list[str] = []
    for language, block in examples():
        if language == "sh":
            out.append(_run_shell(block, demo))
        else:
            out.append(_run_python(block, demo, tmp_path))
    text = "\n".join(out)
    assert '"drained": true' in text
    assert "flush state" in text  # gateway status printed its table
    # gateway checkpoints printed the table and waited for the newest complete checkpoint.
    assert re.search(r"^  step_3 .* durable in the bucket$", text, re.MULTILINE), text
    assert "ckpt/step_1/shard.bin" in text or "shard.bin" in text  # the AWS CLI's listing
    # The restore commands found the newest complete checkpoint: s3torchconnector's.
    assert "\nckpt/step_3/\n" in f"\n{text}"
    keys = set(list_all_keys(demo.client(), "demo", Prefix="ckpt/"))
    for step in ("ckpt/step_2/", "ckpt/step_3/"):
        assert f"{step}.metadata" in keys, sorted(keys)
    # Both ranks of the torchrun wrote their part of step_2 (DCP names files by rank).
    assert {"ckpt/step_2/__0_0.distcp", "ckpt/step_2/__1_0.distcp"} <= keys, sorted(keys)
    assert _repository_state() == before, "the examples left files in the repository"


def test_the_readme_links_lead_into_the_repository() -> None:
    """Relative links resolve to files of the repository (a clone has nothing beside it)."""
    for page in (README, *sorted((REPO_ROOT / "docs").glob("*.md"))):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = (page.parent / target).resolve()
            assert path.is_relative_to(REPO_ROOT) and path.exists(), (page.name, target)
    assert "[docs/DESIGN.md](docs/DESIGN.md)" in README.read_text()
