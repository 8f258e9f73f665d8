def test_total():
    with open("/home/user/data/total.txt") as f:
        assert f.read() == "1223.41\n"
