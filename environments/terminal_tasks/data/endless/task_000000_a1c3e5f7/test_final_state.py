import tarfile

ARCHIVE = "/home/user/manifests_backup.tar.gz"
EXPECTED = {
    "k8s/manifests/deployment.yaml": "kind: Deployment\nmetadata:\n  name: web\n",
    "k8s/manifests/service.yaml": "kind: Service\nmetadata:\n  name: web\n",
    "k8s/manifests/configmap.yaml": "kind: ConfigMap\nmetadata:\n  name: web-config\n",
}


def test_archive_members_and_contents():
    with tarfile.open(ARCHIVE, "r:gz") as tar:
        files = {m.name.removeprefix("./"): m for m in tar.getmembers() if m.isfile()}
        assert set(files) == set(EXPECTED)
        for name, content in EXPECTED.items():
            assert tar.extractfile(files[name]).read().decode() == content


def test_log_line():
    with open("/home/user/backup.log") as f:
        assert f.read() == ARCHIVE + "\n"
