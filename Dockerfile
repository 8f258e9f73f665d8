# The sandbox image the Nomad and Modal backends run: a base image with the self-contained sandbox
# runtime (backends/runtime.py) copied to /opt/hermes. Nothing is installed into the base: the
# runtime brings sandbox_server with its own Python, loader and libraries, bubblewrap and
# hermes-spawn, and slots see the base's own toolchain only (pick a BASE that has what your
# tasks need: git, python3, a compiler...). The build context is only build/hermes-runtime
# (.dockerignore).
#
#   bash scripts/build_sandbox_runtime.sh        # build/hermes-runtime (scripts/setup.sh does)
#   docker build -t hermes-rl-sandbox:<tag> [--build-arg BASE=ubuntu:22.04] .
#   python -c "import json, backends.container_seccomp as p; print(json.dumps(p.profile()))" > hermes-seccomp.json
#   docker run --rm --cap-add SYS_ADMIN --cap-add NET_ADMIN --cap-add SYS_PTRACE --security-opt seccomp=hermes-seccomp.json \
#     -p 127.0.0.1:8080:8080 -e SANDBOX_SERVER_TOKEN=secret hermes-rl-sandbox:<tag>
#
# bubblewrap needs to create namespaces inside the container: SYS_ADMIN with a seccomp profile that
# allows them and pivot_root (backends/container_seccomp.py; Docker 20.10's default refuses pivot_root),
# and NET_ADMIN to bring up loopback in a command's own network namespace;
# SYS_PTRACE lets the slot watchdog read slot processes' /proc/<pid> (docs/containers.md). Or
# privileged: Nomad docker driver `privileged = true`, which the client must allow.
# Without that the server still starts, reports isolation unavailable in /health, and
# refuses commands; the slot pool then refuses the sandbox.
ARG BASE=debian:bookworm
FROM ${BASE}
COPY build/hermes-runtime /opt/hermes
EXPOSE 8080

# The token comes from the SANDBOX_SERVER_TOKEN environment variable (a Nomad task env or a
# Modal secret); the server re-execs itself without it so no /proc/*/environ shows it. The data
# directory holds the slots' workspaces and the shared /cache (read-only to slots). As PID 1
# the server forks and reaps orphaned children itself; each command's uid and limits are set by
# hermes-spawn. /health reports what is enforced.
CMD ["/opt/hermes/sandbox-server", "--host", "0.0.0.0", "--port", "8080", "--slots", "8", "--data-dir", "/var/lib/hermes-sandbox", "--bwrap", "/opt/hermes/bwrap"]
