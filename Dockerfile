# The sandbox image the Nomad and Modal backends run: sandbox_server + bubblewrap + git +
# python + pytest. Only sandbox_server/ is copied in; it imports nothing else of the project.
#
#   docker build -t hermes-rl-sandbox:latest .
#   docker run --rm --privileged -p 8080:8080 -e SANDBOX_SERVER_TOKEN=secret hermes-rl-sandbox:latest
#
# bubblewrap needs to create namespaces inside the container: run it privileged (Nomad
# docker driver `privileged = true`, which the client must allow), or with
# `--security-opt seccomp=unconfined --security-opt apparmor=unconfined --cap-add SYS_ADMIN`.
# Without that the server still starts, reports isolation unavailable in /health, and
# refuses commands; the slot pool then refuses the sandbox.
# hermes-spawn (sandbox_server/spawn_helper.c): each command's uid and limits in one exec.
FROM python:3.11-slim-bookworm AS spawn-helper
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY sandbox_server/spawn_helper.c sandbox_server/build_spawn_helper.sh /src/
RUN bash /src/build_spawn_helper.sh /src/hermes-spawn

FROM python:3.11-slim-bookworm

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends bubblewrap git util-linux ca-certificates \
    && rm -rf /var/lib/apt/lists/*

COPY sandbox_server/requirements.txt /opt/hermes/sandbox_server/requirements.txt
RUN pip install --no-cache-dir -r /opt/hermes/sandbox_server/requirements.txt pytest

COPY sandbox_server /opt/hermes/sandbox_server
COPY --from=spawn-helper /src/hermes-spawn /opt/hermes/sandbox_server/hermes-spawn
ENV PYTHONPATH=/opt/hermes PYTHONUNBUFFERED=1
WORKDIR /opt/hermes
EXPOSE 8080

# The token comes from the SANDBOX_SERVER_TOKEN environment variable (a Nomad task env or a
# Modal secret); the server re-execs itself without it so no /proc/*/environ shows it. The data
# directory holds the slots' workspaces and the shared /cache (read-only to slots). As PID 1
# the server forks and reaps orphaned children itself; util-linux gives setpriv and prlimit
# (each slot's uid and limits). /health reports what is enforced.
CMD ["python", "-m", "sandbox_server", "--host", "0.0.0.0", "--port", "8080", "--slots", "8", "--data-dir", "/var/lib/hermes-sandbox"]
