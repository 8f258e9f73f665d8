"""Per-slot limits travel as one typed object from each backend's config to sandbox_server's options."""

from __future__ import annotations

from backends.nomad import NomadBackendConfig, build_job_spec
from sandbox_server.__main__ import _parse
from sandbox_server.isolation import SlotLimits

MiB = 1024 * 1024


def test_limits_round_trip_through_the_server_options():
    limits = SlotLimits(slot_memory_bytes=300 * MiB, workspace_bytes=50 * MiB, watchdog_interval_s=0.25, uid_base=5000)
    _, config = _parse(["--data-dir", "d", *limits.cli_args()])
    assert config.limits == limits
    _, default = _parse(["--data-dir", "d"])
    assert default.limits == SlotLimits()


def test_nomad_jobs_carry_the_configured_limits():
    config = NomadBackendConfig(
        image="reg/img:1", limits=SlotLimits(slot_memory_bytes=300 * MiB, workspace_bytes=50 * MiB)
    )
    task = build_job_spec(config, job_id="p-0", token="t", meta={})["TaskGroups"][0]["Tasks"][0]["Config"]
    assert task["command"] == "/opt/hermes/sandbox-server"  # the runtime's frozen server: the same CLI
    _, server = _parse([a.replace("${NOMAD_PORT_http}", "1") for a in task["args"]])
    assert server.limits.model_copy(update={"uid_base": None}) == config.limits
    # Each server its own slot uids: a uid's process count is machine-wide (backends/runtime.py).
    other = build_job_spec(config, job_id="p-1", token="t", meta={})["TaskGroups"][0]["Tasks"][0]["Config"]
    _, second = _parse([a.replace("${NOMAD_PORT_http}", "1") for a in other["args"]])
    assert None is not server.limits.uid_base != second.limits.uid_base


def test_container_backends_servers_take_the_workspace_mount_and_root_verifiers_raw_exec_never():
    """Nomad (docker driver) and Modal servers start as the docker backend's do: the pool's workspace mount and
    --allow-root-commands (root is the container's); Nomad's raw_exec runs on the node, so never the latter."""
    from backends.modal import ModalBackendConfig, ModalSandboxProvider

    nomad = NomadBackendConfig(image="reg/img:1", workspace_mount="/testbed")
    task = build_job_spec(nomad, job_id="p-0", token="t", meta={})["TaskGroups"][0]["Tasks"][0]["Config"]
    _, server = _parse([a.replace("${NOMAD_PORT_http}", "1") for a in task["args"]])
    assert (server.workspace_mount, server.allow_root_commands, nomad.in_containers) == ("/testbed", True, True)

    modal = ModalSandboxProvider(ModalBackendConfig(workspace_mount="/app"), api=None)  # type: ignore[arg-type]
    _, server = _parse(list(modal.spec("s-0").args[1:]))
    assert (server.workspace_mount, server.allow_root_commands) == ("/app", True)

    raw = NomadBackendConfig(driver="raw_exec", workspace_mount="/app")
    task = build_job_spec(raw, job_id="p-0", token="t", meta={})["TaskGroups"][0]["Tasks"][0]["Config"]
    _, server = _parse([a.replace("${NOMAD_PORT_http}", "1") for a in task["args"][2:]])
    assert (server.workspace_mount, server.allow_root_commands, raw.in_containers) == ("/app", False, False)
