# syntax=docker/dockerfile:1
# The gateway as a container: slim Python 3.11, the package installed from this repository
# (runtime dependencies only, no test extras), running as an unprivileged user.
#   docker build -t s3-gateway .
#   docker run -v /mnt/nvme/gw:/var/lib/gateway -p 9000:9000 \
#     -e GATEWAY_UPSTREAM_ENDPOINT=https://s3.us-east-1.amazonaws.com \
#     -e GATEWAY_ACCESS_KEY=... -e GATEWAY_SECRET_KEY=... s3-gateway
#   docker exec <container> gateway status        # the admin API, from inside
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A fixed uid/gid, so a hostPath data directory can be chowned to it in advance.
RUN groupadd --system --gid 10001 gateway \
 && useradd --system --uid 10001 --gid gateway --no-create-home \
      --home-dir /var/lib/gateway --shell /usr/sbin/nologin gateway

# Only what the package build needs (.dockerignore keeps tests, venvs and data out): the
# runtime's exact pins (requirements/serve.txt: no demo upstream, no test extras), then the
# package without dependencies.
COPY requirements/serve.txt /src/requirements/
COPY pyproject.toml README.md /src/
COPY gateway /src/gateway
RUN pip install -r /src/requirements/serve.txt && pip install --no-deps /src && rm -rf /src \
 && mkdir -p /var/lib/gateway/data && chown -R gateway:gateway /var/lib/gateway

# S3 on every interface of the container. The admin API (it can pause the flusher) stays
# on the container's loopback, where the HEALTHCHECK and `docker exec ... gateway status`
# reach it; to expose it, set GATEWAY_ADMIN_LISTEN=0.0.0.0:9001 together with
# GATEWAY_ADMIN_TOKEN or GATEWAY_ADMIN_TOKEN_FILE (the gateway refuses to start without one
# off loopback). The Helm chart does exactly that, for the kubelet's probes.
ENV GATEWAY_LISTEN=0.0.0.0:9000 \
    GATEWAY_ADMIN_LISTEN=127.0.0.1:9001 \
    GATEWAY_DATA_DIR=/var/lib/gateway/data \
    GATEWAY_ADMIN=http://127.0.0.1:9001

# Acknowledged-but-unflushed writes live here: mount the node's NVMe, never the container
# layer (a new container would lose them).
VOLUME ["/var/lib/gateway"]
EXPOSE 9000 9001
USER 10001:10001

# /healthz answers 200 while the process lives (no curl in slim images: use Python).
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9001/healthz', timeout=4).status == 200 else 1)"]

# SIGTERM starts the drain (writes get 503 SlowDown, flushing goes on for
# GATEWAY_SHUTDOWN_DRAIN_TIMEOUT); give `docker stop -t` more than that.
STOPSIGNAL SIGTERM
ENTRYPOINT ["gateway"]
CMD ["serve"]
