def test_hosts_have_duplicates():
    lines = open("/home/user/hosts.txt").read().split()
    assert len(lines) > len(set(lines))
