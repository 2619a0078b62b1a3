"""Prefetch and checkpoints over real sockets: a prefix is pulled into the cache (then read
with no upstream request), a prefix that does not fit is refused before anything is
fetched and unflushed data is never evicted; checkpoints are listed newest first with
their marker and durability, and ``gateway latest`` / ``gateway prefetch --wait`` work as a
resume script uses them. The upstream is the emulator, whose log counts every request."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import GatewayProcess, payload, quoted_md5, read_body, s3_client, unique_bucket_name

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "loadtest"))

from emulator import EmulatorThread

KiB = 1024
MiB = 1024 * KiB


@pytest.fixture
def emu() -> Iterator[EmulatorThread]:
    with EmulatorThread(latency_ms=0) as server:
        yield server


@pytest.fixture
def origin(emu: EmulatorThread) -> Any:
    return s3_client(emu.url, access_key="k", secret_key="s", retries=3)


@pytest.fixture
def ebucket(origin: Any) -> str:
    name = unique_bucket_name("pf")
    origin.create_bucket(Bucket=name)
    return name


@pytest.fixture
def gw_factory(emu: EmulatorThread, tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    started: list[GatewayProcess] = []

    def make(*extra: str) -> GatewayProcess:
        gateway = GatewayProcess(tmp_path / f"data{len(started)}", emu.url, extra_args=extra)
        started.append(gateway)
        return gateway.start()

    try:
        yield make
    finally:
        for gateway in started:
            gateway.stop()


def _query(bucket: str, prefix: str) -> str:
    return urllib.parse.urlencode({"bucket": bucket, "prefix": prefix})


def _wait_done(gw: GatewayProcess, bucket: str, prefix: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        job: dict[str, Any] = gw.admin_get(f"/admin/v1/prefetch?{_query(bucket, prefix)}")
        if job["done"]:
            return job
        time.sleep(0.05)
    raise AssertionError("prefetch did not finish")


def _gets(emu: EmulatorThread) -> int:
    return sum(1 for e in emu.log if e["op"] == "GetObject")


def _cli(gw: GatewayProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args, "--admin", gw.admin],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_prefetch_pulls_a_prefix_into_the_cache(
    emu: EmulatorThread, origin: Any, ebucket: str, gw_factory: Callable[..., GatewayProcess]
) -> None:
    gw = gw_factory("--read-part-size", "1MiB")
    bodies = {
        f"ckpt/step_3/rank_{i}.pt": payload(MiB * (i % 3) + 777 * i, seed=i) for i in range(8)
    }
    for key, body in bodies.items():
        origin.put_object(Bucket=ebucket, Key=key, Body=body)
    origin.put_object(Bucket=ebucket, Key="ckpt/step_3/gone", Body=b"deleted here")
    origin.put_object(Bucket=ebucket, Key="ckpt/step_2/other", Body=b"not under the prefix")
    s3 = gw.client()
    local = payload(300 * KiB, seed="local")
    with gw.flush_paused():
        s3.put_object(Bucket=ebucket, Key="ckpt/step_3/local", Body=local)
        s3.delete_object(Bucket=ebucket, Key="ckpt/step_3/gone")
        started = gw.admin_request("POST", f"/admin/v1/prefetch?{_query(ebucket, 'ckpt/step_3/')}")
        assert started.status == 202
        job = _wait_done(gw, ebucket, "ckpt/step_3/")
        assert job["state"] == "done" and job["objects_failed"] == 0
        assert job["objects_total"] == job["objects_done"] == 9
        assert (
            job["bytes_total"] == job["bytes_done"] == sum(map(len, bodies.values())) + len(local)
        )
        assert any(p["prefix"] == "ckpt/step_3/" for p in gw.status()["prefetch"])
        for key in bodies:
            assert gw.object_state(ebucket, key)["state"] == "durable"
        fetched = _gets(emu)
        for key, body in bodies.items():
            got = s3.get_object(Bucket=ebucket, Key=key)
            assert read_body(got) == body and got["ETag"] == quoted_md5(body)
        assert _gets(emu) == fetched  # every read was local
        assert gw.status()["pending_objects"] == 2  # the local write and delete, untouched
    assert not any(
        e["key"] in ("ckpt/step_3/gone", "ckpt/step_2/other")
        for e in emu.log
        if e["op"] == "GetObject"
    )


def test_prefetch_that_does_not_fit_is_refused_and_evicts_nothing_unflushed(
    emu: EmulatorThread, origin: Any, ebucket: str, gw_factory: Callable[..., GatewayProcess]
) -> None:
    gw = gw_factory("--capacity", "10MiB")  # high watermark 9 MiB
    for i in range(3):
        origin.put_object(Bucket=ebucket, Key=f"big/shard_{i}", Body=payload(4 * MiB, seed=i))
    origin.put_object(Bucket=ebucket, Key="small/a", Body=payload(2 * MiB, seed="a"))
    refused = gw.admin_request("POST", f"/admin/v1/prefetch?{_query(ebucket, 'big/')}")
    assert refused.status == 507 and refused.json()["error"] == "InsufficientStorage"
    assert "does not fit" in refused.json()["message"]
    cli = _cli(gw, "prefetch", "--bucket", ebucket, "--prefix", "big/", "--wait")
    assert cli.returncode == 4 and "refused" in cli.stderr
    assert _gets(emu) == 0  # nothing fetched

    s3 = gw.client()
    pending = payload(6 * MiB, seed="pending")
    with gw.flush_paused():
        s3.put_object(Bucket=ebucket, Key="mine/pending", Body=pending)
        # 6 MiB unflushed + 4 MiB would pass the high watermark: refused, pending kept.
        refused = gw.admin_request("POST", f"/admin/v1/prefetch?{_query(ebucket, 'big/shard_0')}")
        assert refused.status == 507
        started = gw.admin_request("POST", f"/admin/v1/prefetch?{_query(ebucket, 'small/')}")
        assert started.status == 202
        assert _wait_done(gw, ebucket, "small/")["state"] == "done"
        assert gw.object_state(ebucket, "mine/pending")["state"] == "pending"
        assert read_body(s3.get_object(Bucket=ebucket, Key="mine/pending")) == pending


def test_prefetch_cli_waits_with_progress(
    emu: EmulatorThread, origin: Any, ebucket: str, gw_factory: Callable[..., GatewayProcess]
) -> None:
    gw = gw_factory()
    for i in range(4):
        origin.put_object(Bucket=ebucket, Key=f"ck/s1/r{i}", Body=payload(3 * MiB, seed=i))
    emu.emulator.configure(bandwidth=8 * MiB)  # a second and a half: progress is shown
    out = _cli(
        gw, "prefetch", "--bucket", ebucket, "--prefix", "ck/", "--wait", "--progress", "plain"
    )
    assert out.returncode == 0, out.stderr
    final = json.loads(out.stdout)
    assert final["state"] == "done" and final["bytes_done"] == 12 * MiB
    assert "100%" in out.stderr and "4 of 4 objects" in out.stderr
    again = _cli(gw, "prefetch", "--bucket", ebucket, "--prefix", "ck/", "--wait")
    assert again.returncode == 0 and json.loads(again.stdout)["objects_done"] == 4


def test_prefetch_bad_requests_get_json_errors(
    ebucket: str, gw_factory: Callable[..., GatewayProcess]
) -> None:
    gw = gw_factory()
    missing = gw.admin_request("POST", "/admin/v1/prefetch?prefix=x")
    assert missing.status == 400 and missing.json()["error"] == "InvalidArgument"
    nobucket = gw.admin_request("POST", f"/admin/v1/prefetch?{_query('no-such-bkt', 'x')}")
    assert nobucket.status == 404 and nobucket.json()["error"] == "NoSuchBucket"
    unknown = gw.admin_request("GET", f"/admin/v1/prefetch?{_query(ebucket, 'never/')}")
    assert unknown.status == 404
    assert gw.admin_get("/admin/v1/prefetch") == {"prefetches": []}


def test_checkpoints_newest_first_and_latest(
    origin: Any, ebucket: str, gw_factory: Callable[..., GatewayProcess]
) -> None:
    gw = gw_factory()
    for step in (9, 10, 11):
        origin.put_object(Bucket=ebucket, Key=f"run/step_{step}/__0_0.distcp", Body=b"shard")
    origin.put_object(Bucket=ebucket, Key="run/step_9/.metadata", Body=b"m9")
    origin.put_object(Bucket=ebucket, Key="run/step_10/_SUCCESS", Body=b"")
    s3 = gw.client()
    with gw.flush_paused():
        s3.put_object(Bucket=ebucket, Key="run/step_12/__0_0.distcp", Body=b"shard")
        s3.put_object(Bucket=ebucket, Key="run/step_12/.metadata", Body=b"m12")
        answer = gw.admin_get(f"/admin/v1/checkpoints?{_query(ebucket, 'run')}")
        names = [(c["name"], c["complete"], c["durable"]) for c in answer["checkpoints"]]
        assert names == [
            ("step_12", True, False),
            ("step_11", False, False),
            ("step_10", True, True),
            ("step_9", True, True),
        ]
        assert answer["checkpoints"][0]["pending_objects"] == 2
        assert answer["checkpoints"][2]["marker"] == "_SUCCESS"
        assert answer["latest_complete"] == "run/step_12/"
        assert answer["latest_durable"] == "run/step_10/"
        latest = _cli(gw, "latest", "--bucket", ebucket, "--prefix", "run/")
        assert latest.returncode == 0 and latest.stdout == "run/step_12/\n"
        durable = _cli(gw, "latest", "--bucket", ebucket, "--prefix", "run/", "--durable")
        assert durable.returncode == 0 and durable.stdout == "run/step_10/\n"
    gw.drained(bucket=ebucket)
    durable = _cli(gw, "latest", "--bucket", ebucket, "--prefix", "run/", "--durable")
    assert durable.stdout == "run/step_12/\n"
    none = _cli(gw, "latest", "--bucket", ebucket, "--prefix", "nothing/")
    assert none.returncode == 4 and "no complete checkpoint" in none.stderr


def _init_container_script(bucket: str, prefix: str) -> tuple[str, dict[str, str]]:
    """The restore init container the Helm chart prints (NOTES.txt), as script and env."""
    import helm_python as helm
    import yaml

    chart_dir = Path(__file__).resolve().parents[2] / "helm" / "s3-gateway"
    values = yaml.safe_load((chart_dir / "ci" / "test-values.yaml").read_text())
    values["restore"] = {"bucket": bucket, "prefix": prefix}
    with helm.Chart.load(chart_dir) as chart:
        text = chart.render(values=values, name="gw", namespace="ml")[
            "s3-gateway/templates/NOTES.txt"
        ]
    (container,) = yaml.safe_load(text[text.index("  initContainers:") :])["initContainers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return container["args"][0], env


def test_helm_init_container_prefetches_the_latest_checkpoint(
    emu: EmulatorThread, origin: Any, ebucket: str, gw_factory: Callable[..., GatewayProcess]
) -> None:
    gw = gw_factory()
    for step in (1, 2):
        for rank in range(3):
            key = f"run/step_{step}/__{rank}_0.distcp"
            origin.put_object(Bucket=ebucket, Key=key, Body=payload(MiB, seed=f"{step}{rank}"))
        origin.put_object(Bucket=ebucket, Key=f"run/step_{step}/.metadata", Body=b"meta")
    origin.put_object(Bucket=ebucket, Key="run/step_3/__0_0.distcp", Body=b"no marker yet")
    script, env = _init_container_script(ebucket, "run/")
    env |= {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "GATEWAY_ADMIN": gw.admin,  # instead of the Service of a cluster
    }
    done = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"prefetching s3://{ebucket}/run/step_2/" in done.stdout
    for rank in range(3):
        assert gw.object_state(ebucket, f"run/step_2/__{rank}_0.distcp")["state"] == "durable"
    fetched = {e["key"] for e in emu.log if e["op"] == "GetObject"}
    assert not any(k.startswith(("run/step_1/", "run/step_3/")) for k in fetched)

    nothing, _ = _init_container_script(ebucket, "empty/")
    quiet = subprocess.run(
        ["/bin/sh", "-c", nothing], env=env | {"RESTORE_PREFIX": "empty/"}, capture_output=True,
        text=True,
    )  # fmt: skip
    assert quiet.returncode == 0 and "no checkpoint" in quiet.stdout
    down = subprocess.run(
        ["/bin/sh", "-c", script], env=env | {"GATEWAY_ADMIN": "http://127.0.0.1:9"},
        capture_output=True, text=True,
    )  # fmt: skip
    assert down.returncode == 1  # the kubelet retries until the gateway is up
