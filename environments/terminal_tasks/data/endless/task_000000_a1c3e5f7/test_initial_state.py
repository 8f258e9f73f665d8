import os

MANIFESTS = "/home/user/k8s/manifests"


def test_manifests_exist():
    assert sorted(os.listdir(MANIFESTS)) == ["configmap.yaml", "deployment.yaml", "service.yaml"]


def test_no_archive_yet():
    assert not os.path.exists("/home/user/manifests_backup.tar.gz")
