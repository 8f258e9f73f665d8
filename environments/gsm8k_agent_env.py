"""Entry module: `python -m environments.gsm8k_agent_env process|serve|evaluate`; the task lives in environments/gsm8k/.

It imports the env class only once the command line is parsed and checked (environments/env_entry.py).
"""

from environments.cli import main
from environments.gsm8k.config import ENTRY, GSM8kAgentEnvConfig

__all__ = ["ENTRY", "GSM8kAgentEnvConfig"]

if __name__ == "__main__":
    raise SystemExit(main(ENTRY))
