import os


def test_csv_present():
    assert os.path.isfile("/home/user/data/sales.csv")
