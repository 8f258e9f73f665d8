"""Entry module: `python -m environments.swe_smith_oracle_env process|serve|evaluate`; the task lives in environments/swe_smith/.

It imports the env class only once the command line is parsed and checked (environments/env_entry.py).
"""

from environments.cli import main
from environments.swe_smith.config import ENTRY, SweSmithOracleEnvConfig

__all__ = ["ENTRY", "SweSmithOracleEnvConfig"]

if __name__ == "__main__":
    raise SystemExit(main(ENTRY))
