import os


def test_hosts_deduplicated_in_order():
    with open("/home/user/hosts.txt") as f:
        assert f.read() == "web01\ndb01\ncache01\nweb02\n"


def test_no_stray_files():
    visible = [n for n in os.listdir("/home/user") if not n.startswith(".")]
    assert visible == ["hosts.txt"]
