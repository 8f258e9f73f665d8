"""What a sandbox_server container is given, each piece shown necessary, and its seccomp profile's refusals.

Each case runs the sandbox runtime's own bubblewrap (or a root shell) in a container of the test image on
the real engine, with one grant taken away: SYS_ADMIN and NET_ADMIN for bubblewrap's namespaces and a
command's loopback, SYS_PTRACE for the slot watchdog's look at other uids' /proc/<pid>/ns, and
backends/container_seccomp.py's profile for pivot_root, which the engine's default profile refuses.
"""

from __future__ import annotations

import pytest

from backends.container_seccomp import SECURITY_OPT
from backends.runtime import RUNTIME_MOUNT
from tests.support.docker_engine import TEST_LABEL

pytestmark = pytest.mark.timeout(300)

CAPS = ["SYS_ADMIN", "NET_ADMIN", "SYS_PTRACE"]  # what backends/docker.py and backends/nomad.py add
# A slot's namespaces as sandbox_server/isolation.py makes them, the network one included.
BWRAP = [
    f"{RUNTIME_MOUNT}/bwrap",
    "--unshare-ipc",
    "--unshare-pid",
    "--unshare-uts",
    "--unshare-net",
    "--hostname",
    "sandbox",
    "--ro-bind",
    "/",
    "/",
    "--proc",
    "/proc",
    "true",
]
# The watchdog's look: root reads the namespace of a process of another uid (once it runs as that uid).
WATCHDOG = [
    "sh",
    "-c",
    "setpriv --reuid 4242 --regid 4242 --clear-groups sleep 600 & pid=$!; "
    'until [ "$(stat -c %u /proc/$pid)" = 4242 ]; do :; done; readlink /proc/$pid/ns/pid; rc=$?; kill $pid; exit $rc',
]
# The container's root asks for a kernel key.
KEYRING = [
    "python3",
    "-c",
    "import ctypes, platform; libc = ctypes.CDLL(None, use_errno=True); "
    "nr = {'x86_64': 248, 'aarch64': 217}[platform.machine()]; "
    "r = libc.syscall(ctypes.c_long(nr), b'user', b'hermes-probe', b'x', ctypes.c_long(1), ctypes.c_long(-4)); "
    "print('add_key', r, ctypes.get_errno())",
]


def _run(engine: str, image, test_id: str, argv: list[str], caps: list[str], security_opt: list[str] | None):
    import docker

    client = docker.DockerClient(base_url=engine, version="auto", timeout=120)
    try:
        c = client.containers.create(
            image.image,
            argv,
            user="0:0",
            cap_add=caps,
            security_opt=security_opt,
            network_mode="none",
            volumes={str(image.runtime_dir.resolve()): {"bind": RUNTIME_MOUNT, "mode": "ro"}},
            labels={TEST_LABEL: test_id},
        )
        try:
            c.start()
            code = c.wait(timeout=120)["StatusCode"]
            return code, c.logs().decode(errors="replace")
        finally:
            c.remove(force=True)
    finally:
        client.close()


@pytest.mark.parametrize(
    ("caps", "profile", "ok", "why"),
    [
        (CAPS, True, True, ""),
        ([c for c in CAPS if c != "NET_ADMIN"], True, False, "loopback"),
        ([c for c in CAPS if c != "SYS_ADMIN"], True, False, ""),
        (CAPS, False, False, "pivot_root"),  # the engine's own default profile
    ],
    ids=["all", "no-net-admin", "no-sys-admin", "engine-default-profile"],
)
def test_bubblewrap_needs_sys_admin_net_admin_and_the_profiles_pivot_root(
    docker_engine, docker_sandbox_image, docker_test_id, caps, profile, ok, why
):
    code, out = _run(
        docker_engine, docker_sandbox_image, docker_test_id, BWRAP, caps, SECURITY_OPT if profile else None
    )
    assert (code == 0) == ok, out
    assert why in out


@pytest.mark.parametrize("ptrace", [True, False], ids=["sys-ptrace", "no-sys-ptrace"])
def test_the_slot_watchdog_needs_sys_ptrace_to_see_other_uids_namespaces(
    docker_engine, docker_sandbox_image, docker_test_id, ptrace
):
    caps = CAPS if ptrace else [c for c in CAPS if c != "SYS_PTRACE"]
    code, out = _run(docker_engine, docker_sandbox_image, docker_test_id, WATCHDOG, caps, SECURITY_OPT)
    assert (code == 0) == ptrace, out
    assert ("pid:[" in out) == ptrace, out


def test_the_containers_own_root_gets_no_kernel_keyring(docker_engine, docker_sandbox_image, docker_test_id):
    code, out = _run(docker_engine, docker_sandbox_image, docker_test_id, KEYRING, CAPS, SECURITY_OPT)
    assert code == 0 and out.split() == ["add_key", "-1", "1"], out  # EPERM
