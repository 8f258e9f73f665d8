"""SWE-smith: fix a repository, scored by its tests in a sandbox slot (`env.py`)."""
