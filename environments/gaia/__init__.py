"""GAIA: questions with attachments and web search (`env.py`), task data (`data.py`)."""
