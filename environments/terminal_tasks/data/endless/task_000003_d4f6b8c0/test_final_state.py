import os

PHOTOS = "/home/user/photos"


def test_names():
    assert sorted(os.listdir(PHOTOS)) == ["beach.jpg", "city.jpg", "notes.txt", "sunset.jpg"]


def test_contents_kept():
    for name, content in {
        "beach.jpg": "beach\n",
        "city.jpg": "city\n",
        "sunset.jpg": "sunset\n",
        "notes.txt": "notes\n",
    }.items():
        with open(os.path.join(PHOTOS, name)) as f:
            assert f.read() == content
