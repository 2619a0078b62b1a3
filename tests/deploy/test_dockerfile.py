"""Static checks of the Dockerfile and .dockerignore.

No Docker engine runs where the tests run, so the image is not built here; these tests
check the file's promises instead: slim Python 3.11, non-root, the package installed
without test extras, `gateway serve` as entrypoint, a HEALTHCHECK on the admin /healthz,
the data directory as a VOLUME, both listeners on 0.0.0.0 through real GATEWAY_* options.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from pathlib import Path

from gateway import config

ROOT = Path(__file__).resolve().parents[2]


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = (ROOT / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def args_of(name: str) -> list[str]:
    return [rest for word, rest in instructions() if word == name]


def env() -> dict[str, str]:
    out: dict[str, str] = {}
    for rest in args_of("ENV"):
        for item in shlex.split(rest):
            key, _, value = item.partition("=")
            out[key] = value
    return out


def test_slim_python_311_base() -> None:
    (base,) = args_of("FROM")
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", base), base


def test_runs_as_a_non_root_user() -> None:
    users = args_of("USER")
    assert users, "no USER: the gateway would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    assert int(user) >= 1000 or re.fullmatch(r"[a-z_][a-z0-9_-]*", user)
    # The user is created, and owns the data directory.
    runs = " ".join(args_of("RUN"))
    assert "useradd" in runs and f"--uid {user}" in runs
    assert "chown -R gateway:gateway /var/lib/gateway" in runs


def test_installs_the_runtime_lock_and_the_package_without_extras() -> None:
    """The runtime's exact pins (requirements/serve.txt: no demo upstream, no test tools),
    then the package itself with no dependencies of its own choosing."""
    runs = " ".join(args_of("RUN"))
    installs = re.findall(r"pip install ([^&]+)", runs)
    assert [i.split() for i in installs] == [
        ["-r", "/src/requirements/serve.txt"],
        ["--no-deps", "/src"],
    ]
    copied = [shlex.split(c)[:-1] for c in args_of("COPY")]
    sources = {src for srcs in copied for src in srcs if not src.startswith("--")}
    assert sources == {"requirements/serve.txt", "pyproject.toml", "README.md", "gateway"}
    for src in sources:
        assert (ROOT / src).exists()


def test_entrypoint_is_gateway_serve() -> None:
    (entrypoint,) = args_of("ENTRYPOINT")
    (cmd,) = args_of("CMD")
    assert entrypoint == '["gateway"]' and cmd == '["serve"]'


def test_listeners_through_real_options() -> None:
    """S3 on every interface; the admin API on loopback (no token is baked into an image,
    and off loopback the gateway refuses to start without one)."""
    variables = env()
    assert variables["GATEWAY_LISTEN"] == "0.0.0.0:9000"
    assert variables["GATEWAY_ADMIN_LISTEN"] == "127.0.0.1:9001"
    known = {"GATEWAY_" + config.flag_name(n).upper().replace("-", "_") for n in config._OPTIONS}
    serve_vars = {k for k in variables if k.startswith("GATEWAY_")} - {"GATEWAY_ADMIN"}
    assert serve_vars <= known
    settings = config.load(None, {k: variables[k] for k in serve_vars})
    assert str(settings.data_dir) == variables["GATEWAY_DATA_DIR"]
    exposed = " ".join(args_of("EXPOSE")).split()
    assert {"9000", "9001"} <= set(exposed)


def test_healthcheck_calls_admin_healthz() -> None:
    (check,) = args_of("HEALTHCHECK")
    admin_port = env()["GATEWAY_ADMIN_LISTEN"].rsplit(":", 1)[1]
    assert f"127.0.0.1:{admin_port}/healthz" in check
    assert "CMD" in check and "curl" not in check  # slim images have no curl


def test_data_dir_is_a_volume() -> None:
    (volume,) = args_of("VOLUME")
    paths = [p.strip(' "') for p in volume.strip("[]").split(",")]
    data_dir = env()["GATEWAY_DATA_DIR"]
    assert any(data_dir == p or data_dir.startswith(p.rstrip("/") + "/") for p in paths)


def test_dockerignore_keeps_only_build_inputs() -> None:
    rules = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def ignored(path: str) -> bool:
        result = False
        for rule in rules:
            negate = rule.startswith("!")
            pattern = rule.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
                result = not negate
        return result

    for path in (
        ".venv/bin/python",
        "tests/harness.py",
        "gateway-data/journal.db",
        ".git/HEAD",
        "requirements/test.txt",
    ):
        assert ignored(path), path
    for path in (
        "pyproject.toml",
        "README.md",
        "requirements/serve.txt",
        "gateway/app.py",
        "gateway/admin/static/status.html",
    ):
        assert not ignored(path), path
