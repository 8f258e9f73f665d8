import os
import stat

BASE = "/app/deploy"


def mode(name):
    return stat.S_IMODE(os.stat(os.path.join(BASE, name)).st_mode)


def test_script_mode():
    assert mode("deploy.sh") == 0o750


def test_secrets_mode():
    assert mode("secrets.env") == 0o600


def test_logs_dir():
    assert os.path.isdir(os.path.join(BASE, "logs")) and mode("logs") == 0o700
