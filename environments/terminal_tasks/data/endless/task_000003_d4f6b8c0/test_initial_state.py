import os


def test_jpeg_files_present():
    assert "beach.jpeg" in os.listdir("/home/user/photos")
