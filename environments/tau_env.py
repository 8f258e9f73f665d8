"""Entry module: `python -m environments.tau_env process|serve|evaluate`; the task lives in environments/tau/.

It imports the env class only once the command line is parsed and checked (environments/env_entry.py).
"""

from environments.cli import main
from environments.tau.config import ENTRY, TauEnvConfig

__all__ = ["ENTRY", "TauEnvConfig"]

if __name__ == "__main__":
    raise SystemExit(main(ENTRY))
