"""GSM8k with a python tool: env (`env.py`) and offline problem generator (`data.py`)."""
