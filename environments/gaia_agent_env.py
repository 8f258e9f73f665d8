"""Entry module: `python -m environments.gaia_agent_env process|serve|evaluate`; the task lives in environments/gaia/.

It imports the env class only once the command line is parsed and checked (environments/env_entry.py).
"""

from environments.cli import main
from environments.gaia.config import ENTRY, GaiaAgentEnvConfig

__all__ = ["ENTRY", "GaiaAgentEnvConfig"]

if __name__ == "__main__":
    raise SystemExit(main(ENTRY))
