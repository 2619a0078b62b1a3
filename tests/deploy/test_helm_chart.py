"""helm/s3-gateway, rendered and linted by Helm's own engine (helm-python-sdk: Helm v4's Go
library over ctypes; no helm binary, no cluster). The rendered manifests are checked for
the properties the chart promises in values.yaml."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from gateway import config

CHART = Path(__file__).resolve().parents[2] / "helm" / "s3-gateway"
CI_VALUES: dict[str, Any] = yaml.safe_load((CHART / "ci" / "test-values.yaml").read_text())
# GATEWAY_* variables read by `gateway status|drain` (the CLI), not by `gateway serve`.
CLI_ENV = {"GATEWAY_ADMIN"}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def render(**over: Any) -> dict[str, list[dict[str, Any]]]:
    """Manifests by kind, from the CI values with ``over`` merged in."""
    with helm.Chart.load(CHART) as chart:
        files = chart.render(values=_merge(CI_VALUES, over), name="gw", namespace="ml")
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for name, text in files.items():
        if not name.endswith(".yaml"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                by_kind.setdefault(doc["kind"], []).append(doc)
    return by_kind


def render_error(**over: Any) -> str:
    with pytest.raises(helm.HelmRenderError) as exc, helm.Chart.load(CHART) as chart:
        chart.render(values=_merge(CI_VALUES, over), name="gw", namespace="ml")
    return str(exc.value)


def pod_spec(manifests: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    (daemonset,) = manifests["DaemonSet"]
    spec: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return spec


def gateway_container(manifests: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    (container,) = [c for c in pod_spec(manifests)["containers"] if c["name"] == "gateway"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_lint_is_clean_with_ci_values() -> None:
    report = helm.lint(CHART, CI_VALUES, strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
    assert report["total_charts_linted"] == 1


def test_defaults_refuse_to_render_without_upstream_and_credentials() -> None:
    assert "upstream.endpoint is required" in render_error(upstream={"endpoint": ""})
    message = render_error(clientCredentials={"accessKey": "", "secretKey": ""})
    assert "clientCredentials.existingSecret" in message


def test_default_kinds() -> None:
    manifests = render()
    assert sorted(manifests) == ["DaemonSet", "Secret", "Service", "ServiceAccount"]
    # client credentials, the admin token and the fleet secret
    assert len(manifests["Secret"]) == 3
    # the node-local Service and the fleet's headless one
    assert len(manifests["Service"]) == 2


def test_probes_on_the_admin_port() -> None:
    c = gateway_container(render())
    ports = {p["name"]: p for p in c["ports"]}
    assert ports["admin"]["containerPort"] == 9001 and "hostPort" not in ports["admin"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    env = env_of(c)
    # httpGet probes reach the pod IP: the admin listener must not be loopback-only.
    assert env["GATEWAY_ADMIN_LISTEN"] == "0.0.0.0:9001"
    assert env["GATEWAY_ADMIN"] == "http://127.0.0.1:9001"


def test_prestop_drain_and_grace_period() -> None:
    manifests = render()
    c = gateway_container(manifests)
    command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:4] == ["gateway", "drain", "--wait", "--timeout"]
    assert int(command[4]) == 600
    grace = pod_spec(manifests)["terminationGracePeriodSeconds"]
    assert grace == 600 + 30 + 30  # preStop drain + shutdown drain + margin
    custom = render(drain={"timeoutSeconds": 120}, terminationGracePeriodSeconds=200)
    assert pod_spec(custom)["terminationGracePeriodSeconds"] == 200
    assert gateway_container(custom)["lifecycle"]["preStop"]["exec"]["command"][4] == "120"


def test_grace_period_not_above_the_drains_is_refused() -> None:
    message = render_error(drain={"timeoutSeconds": 600}, terminationGracePeriodSeconds=630)
    assert "terminationGracePeriodSeconds (630) must exceed" in message
    assert "(630)" in message and "mid-drain" in message


def test_drain_disabled_removes_the_hook() -> None:
    manifests = render(drain={"enabled": False})
    assert "lifecycle" not in gateway_container(manifests)
    assert pod_spec(manifests)["terminationGracePeriodSeconds"] == 30 + 30


def test_data_on_host_path_with_permission_fix() -> None:
    spec = pod_spec(render())
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["data"]["hostPath"] == {
        "path": "/mnt/nvme/s3-gateway",
        "type": "DirectoryOrCreate",
    }
    (init,) = spec["initContainers"]
    assert init["command"] == ["chown", "10001:10001", "/var/lib/gateway"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    mounts = {m["name"]: m["mountPath"] for m in gateway_container(render())["volumeMounts"]}
    assert mounts["data"] == "/var/lib/gateway"
    assert env_of(gateway_container(render()))["GATEWAY_DATA_DIR"].startswith(mounts["data"])


def test_ephemeral_data_volume() -> None:
    spec = pod_spec(
        render(data={"type": "ephemeral", "ephemeral": {"storageClass": "nvme", "size": "1Ti"}})
    )
    assert "initContainers" not in spec
    data = next(v for v in spec["volumes"] if v["name"] == "data")
    claim = data["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert claim["storageClassName"] == "nvme"
    assert claim["resources"]["requests"]["storage"] == "1Ti"
    assert "data.type must be" in render_error(data={"type": "nfs"})
    # Admin binds the pod IP: no token, no start; the chart says so instead.
    assert "admin.token" in render_error(admin={"token": {"create": False, "existingSecret": ""}})


def test_security_context_and_resources() -> None:
    manifests = render()
    spec, c = pod_spec(manifests), gateway_container(manifests)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 10001
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert c["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}
    # A read-only root needs a writable /tmp.
    assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/tmp", "/var/lib/gateway"}


def test_node_local_access_host_port_service_or_host_network() -> None:
    manifests = render()
    s3_port = next(p for p in gateway_container(manifests)["ports"] if p["name"] == "s3")
    assert s3_port["hostPort"] == 9000
    service = next(s for s in manifests["Service"] if s["metadata"]["name"] == "gw-s3-gateway")
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    assert {p["name"] for p in service["spec"]["ports"]} == {"s3", "admin"}
    no_host_port = render(s3={"hostPort": 0}, service={"enabled": False}, fleet={"enabled": False})
    assert "Service" not in no_host_port
    assert all("hostPort" not in p for p in gateway_container(no_host_port)["ports"])
    host_net = render(hostNetwork=True)
    assert pod_spec(host_net)["hostNetwork"] is True
    assert pod_spec(host_net)["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert all("hostPort" not in p for p in gateway_container(host_net)["ports"])


def test_placement_values() -> None:
    spec = pod_spec(
        render(
            nodeSelector={"nvidia.com/gpu.present": "true"},
            tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        )
    )
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_client_credentials_created_or_existing() -> None:
    manifests = render()
    client = next(s for s in manifests["Secret"] if s["metadata"]["name"] == "gw-s3-gateway-client")
    assert base64.b64decode(client["data"]["secretKey"]) == b"ci-secret-key"
    env = env_of(gateway_container(manifests))
    assert env["GATEWAY_SECRET_KEY"] == {
        "secretKeyRef": {"name": "gw-s3-gateway-client", "key": "secretKey"}
    }
    existing = render(
        clientCredentials={"existingSecret": "job-keys", "accessKey": "", "secretKey": ""}
    )
    names = [s["metadata"]["name"] for s in existing["Secret"]]
    assert "gw-s3-gateway-client" not in names
    assert env_of(gateway_container(existing))["GATEWAY_ACCESS_KEY"] == {
        "secretKeyRef": {"name": "job-keys", "key": "accessKey"}
    }


def test_upstream_credentials_irsa_or_secret() -> None:
    role = {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/gw"}
    manifests = render(serviceAccount={"annotations": role})
    (account,) = manifests["ServiceAccount"]
    assert account["metadata"]["annotations"] == role
    assert pod_spec(manifests)["serviceAccountName"] == account["metadata"]["name"]
    assert "envFrom" not in gateway_container(manifests)
    with_secret = gateway_container(render(upstream={"existingSecret": "upstream-keys"}))
    assert with_secret["envFrom"] == [{"secretRef": {"name": "upstream-keys"}}]


def test_admin_token_secret_mounted_for_the_cli() -> None:
    manifests = render()
    admin = next(s for s in manifests["Secret"] if s["metadata"]["name"] == "gw-s3-gateway-admin")
    assert len(base64.b64decode(admin["data"]["token"])) == 40
    env = env_of(gateway_container(manifests))
    assert env["GATEWAY_ADMIN_TOKEN_FILE"] == "/etc/s3-gateway/admin/token"
    volume = next(v for v in pod_spec(manifests)["volumes"] if v["name"] == "admin-token")
    assert volume["secret"]["secretName"] == "gw-s3-gateway-admin"
    # An operator's own Secret instead of the generated one.
    own = render(admin={"token": {"create": False, "existingSecret": "ops-admin"}})
    assert env_of(gateway_container(own))["GATEWAY_ADMIN_TOKEN_FILE"] == (
        "/etc/s3-gateway/admin/token"
    )
    volume = next(v for v in pod_spec(own)["volumes"] if v["name"] == "admin-token")
    assert volume["secret"]["secretName"] == "ops-admin"
    assert len(own["Secret"]) == 2  # the client credentials and the fleet secret


def test_limits_and_capacity_reach_the_gateway_as_real_options(tmp_path: Path) -> None:
    env = env_of(
        gateway_container(
            render(
                gateway={
                    "capacity": "800GiB",
                    "flushBandwidth": "2GiB",
                    "laneRate": "1000",
                    "extraEnv": [{"name": "GATEWAY_COMMIT_MARKERS", "value": ".metadata"}],
                }
            )
        )
    )
    assert env["GATEWAY_CAPACITY"] == "800GiB"
    assert env["GATEWAY_FLUSH_BANDWIDTH"] == "2GiB"
    assert env["GATEWAY_LANE_RATE"] == "1000"
    assert env["GATEWAY_COMMIT_MARKERS"] == ".metadata"
    # Every GATEWAY_* the chart sets is an option `gateway serve` reads, and parses.
    known = {"GATEWAY_" + config.flag_name(n).upper().replace("-", "_") for n in config._OPTIONS}
    serve_env = {k: v for k, v in env.items() if k.startswith("GATEWAY_") and k not in CLI_ENV}
    assert set(serve_env) - known == set()
    # The admin API binds the pod IP, so the chart MUST hand the gateway a token (it would
    # refuse to start); the mounted file is stood in for by a real one here.
    assert env["GATEWAY_ADMIN_LISTEN"].startswith("0.0.0.0:")
    token_file = tmp_path / "token"
    token_file.write_text("t" * 40)
    serve_env["GATEWAY_ADMIN_TOKEN_FILE"] = str(token_file)
    peer_secret = tmp_path / "peerSecret"
    peer_secret.write_text("s" * 48)
    serve_env["GATEWAY_PEER_SECRET_FILE"] = str(peer_secret)
    settings = config.load(None, {k: v for k, v in serve_env.items() if isinstance(v, str)} | {
        "GATEWAY_ACCESS_KEY": "k",
        "GATEWAY_SECRET_KEY": "s",
    })  # fmt: skip
    assert settings.admin_token_file == token_file
    assert settings.capacity_bytes == 800 << 30
    assert settings.listen == "0.0.0.0:9000" and settings.log_format == "json"


def test_service_monitor_toggle() -> None:
    assert "ServiceMonitor" not in render()
    (monitor,) = render(serviceMonitor={"enabled": True, "labels": {"release": "prom"}})[
        "ServiceMonitor"
    ]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "admin" and endpoint["path"] == "/metrics"
    assert endpoint["authorization"]["credentials"] == {
        "name": "gw-s3-gateway-admin",
        "key": "token",
    }
    message = render_error(serviceMonitor={"enabled": True}, service={"enabled": False})
    assert "serviceMonitor.enabled needs service.enabled" in message


def notes(**over: Any) -> str:
    with helm.Chart.load(CHART) as chart:
        files = chart.render(values=_merge(CI_VALUES, over), name="gw", namespace="ml")
    return str(files["s3-gateway/templates/NOTES.txt"])


def prefetch_init_container(**over: Any) -> dict[str, Any]:
    """The init container NOTES.txt prints for training pods, parsed."""
    text = notes(**over)
    snippet = text[text.index("  initContainers:") :]
    (container,) = yaml.safe_load(snippet)["initContainers"]
    return dict(container)


def test_restore_init_container_is_printed_for_training_pods() -> None:
    assert "initContainers" not in notes()  # only once restore.bucket is set
    c = prefetch_init_container(restore={"bucket": "train", "prefix": "ckpt/", "durableOnly": True})
    assert c["image"] == gateway_container(render())["image"]
    script = c["args"][0]
    assert "gateway latest" in script and "gateway prefetch" in script and "--wait" in script
    env = env_of(c)
    assert env["GATEWAY_ADMIN"] == "http://gw-s3-gateway.ml.svc:9001"  # the node-local Service
    assert env["GATEWAY_ADMIN_TOKEN"] == {
        "secretKeyRef": {"name": "gw-s3-gateway-admin", "key": "token"}
    }
    assert env["RESTORE_BUCKET"] == "train" and env["RESTORE_PREFIX"] == "ckpt/"
    assert env["RESTORE_FLAGS"] == "--durable" and env["RESTORE_TIMEOUT"] == "1800"
    relaxed = env_of(prefetch_init_container(restore={"bucket": "train", "durableOnly": False}))
    assert relaxed["RESTORE_FLAGS"] == ""


def test_read_options_reach_the_gateway() -> None:
    env = env_of(gateway_container(render(gateway={"readPartSize": "16MiB"})))
    assert env["GATEWAY_READ_PART_SIZE"] == "16MiB" and env["GATEWAY_READ_CONCURRENCY"] == "32"


def test_the_fleet_is_a_headless_service_over_every_pod_with_node_names_and_a_secret() -> None:
    manifests = render()
    peers = next(s for s in manifests["Service"] if s["metadata"]["name"] == "gw-s3-gateway-peers")
    (daemonset,) = manifests["DaemonSet"]
    assert peers["spec"]["clusterIP"] == "None"
    # Not-ready pods stay listed: a restarting node holding unflushed shards is still asked.
    assert peers["spec"]["publishNotReadyAddresses"] is True
    assert peers["spec"]["selector"] == daemonset["spec"]["selector"]["matchLabels"]
    assert peers["spec"]["ports"] == [{"name": "s3", "port": 9000, "targetPort": "s3",
                                       "protocol": "TCP"}]  # fmt: skip
    container = gateway_container(manifests)
    env = env_of(container)
    assert env["GATEWAY_PEERS"] == "dns:gw-s3-gateway-peers.ml.svc:9000"
    assert env["GATEWAY_PEER_SECRET_FILE"] == "/etc/s3-gateway/fleet/peerSecret"
    assert env["GATEWAY_PEER_LEASE"] == "3"
    node_name = next(e for e in container["env"] if e["name"] == "NODE_NAME")
    assert node_name["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    secret = next(s for s in manifests["Secret"] if s["metadata"]["name"] == "gw-s3-gateway-fleet")
    assert len(base64.b64decode(secret["data"]["peerSecret"])) == 48
    volume = next(v for v in pod_spec(manifests)["volumes"] if v["name"] == "fleet-secret")
    assert volume["secret"]["secretName"] == "gw-s3-gateway-fleet"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["fleet-secret"]["mountPath"] == "/etc/s3-gateway/fleet"
    assert config.load(None, {"GATEWAY_PEERS": env["GATEWAY_PEERS"]}).peers == env["GATEWAY_PEERS"]


def test_the_fleet_secret_can_be_an_existing_one_and_the_fleet_turned_off() -> None:
    own = render(fleet={"secret": {"create": False, "existingSecret": "ops-fleet"}})
    volume = next(v for v in pod_spec(own)["volumes"] if v["name"] == "fleet-secret")
    assert volume["secret"]["secretName"] == "ops-fleet"
    assert all(s["metadata"]["name"] != "gw-s3-gateway-fleet" for s in own["Secret"])
    off = render(fleet={"enabled": False})
    env = env_of(gateway_container(off))
    assert "GATEWAY_PEERS" not in env and "NODE_NAME" not in env
    assert [s["metadata"]["name"] for s in off["Service"]] == ["gw-s3-gateway"]
    assert all(v["name"] != "fleet-secret" for v in pod_spec(off)["volumes"])
