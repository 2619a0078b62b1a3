"""The embedded demo upstream (`gateway serve` without --upstream-endpoint, what `make run`
starts): it lives in memory, so the gateway must never claim anything is durable in it
across a restart. Its data dir starts empty at every start, and the banner says so."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import GatewayProcess, error_status, flush_state, read_body

DEMO_KEY, DEMO_SECRET = "demo", "demo-secret-key"


class DemoGateway(GatewayProcess):
    """The gateway as `make run` starts it: no upstream endpoint, no client keys."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(
            data_dir, "(embedded)", access_key=DEMO_KEY, secret_key=DEMO_SECRET, domain=None
        )

    def command(self) -> list[str]:
        full = super().command()
        drop = {"--upstream-endpoint", "--upstream-region", "--access-key", "--secret-key"}
        out: list[str] = []
        skip = False
        for arg in full:
            if skip:
                skip = False
            elif arg in drop:
                skip = True
            else:
                out.append(arg)
        return out


@pytest.fixture
def demo(tmp_path: Path) -> Any:
    gw = DemoGateway(tmp_path / "demo-data")
    yield gw
    gw.stop()


def test_a_demo_restart_starts_empty_and_says_so(demo: DemoGateway) -> None:
    demo.start()
    s3 = demo.client()
    s3.put_object(Bucket="demo", Key="ckpt/step_1/rank_0.pt", Body=b"weights")
    demo.drained(bucket="demo")
    assert flush_state(s3.head_object(Bucket="demo", Key="ckpt/step_1/rank_0.pt")) == "durable"
    assert read_body(s3.get_object(Bucket="demo", Key="ckpt/step_1/rank_0.pt")) == b"weights"
    assert "it starts empty too" in demo.logged("it starts empty too")

    demo.restart(hard=False)
    s3 = demo.client()
    # The in-memory upstream is new and empty: the gateway says the same, not "durable".
    with pytest.raises(ClientError) as missing:
        s3.head_object(Bucket="demo", Key="ckpt/step_1/rank_0.pt")
    assert error_status(missing.value) == 404
    assert s3.list_objects_v2(Bucket="demo").get("KeyCount") == 0
    status = demo.status()
    assert (status["pending_objects"], status["flushed_objects"]) == (0, 0)
    banner = demo.logged("was emptied at this start", after="===== start #2")
    assert "DEMO MODE" in banner and "was emptied at this start" in banner


def test_the_demo_never_empties_a_data_dir_of_a_real_upstream(
    gateway_factory: Any, bucket: str
) -> None:
    real = gateway_factory()
    real.client().put_object(Bucket=bucket, Key="precious", Body=b"not a demo")
    real.stop()
    journal = real.data_dir / "journal.db"
    before = journal.stat().st_size
    demo = DemoGateway(real.data_dir)
    done = subprocess.run(
        demo.command(), env=demo.environment(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert "holds data but no demo mark" in done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr
    assert journal.stat().st_size == before
    real.start()
    assert read_body(real.client().get_object(Bucket=bucket, Key="precious")) == b"not a demo"


def test_the_demo_without_its_extra_says_how_to_get_it(tmp_path: Path) -> None:
    """A production install has no moto (the demo extra): `gateway serve` without
    --upstream-endpoint then says in one line what to do. (A package named moto that fails
    to import stands in for its absence.)"""
    shim = tmp_path / "shim" / "moto"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'moto'\", name='moto')\n"
    )
    gw = DemoGateway(tmp_path / "data")
    env = {**gw.environment(), "PYTHONPATH": str(shim.parent)}
    done = subprocess.run(gw.command(), env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "gateway: cannot start: no --upstream-endpoint given, and the embedded demo upstream "
        "is not installed (moto is missing): give --upstream-endpoint, or install the demo "
        "extra (make run does; pip install -r requirements/demo.txt)"
    ]
