"""Entry module: `python -m environments.mhqa_env process|serve|evaluate`; the task lives in environments/mhqa/.

It imports the env class only once the command line is parsed and checked (environments/env_entry.py).
"""

from environments.cli import main
from environments.mhqa.config import ENTRY, MHQAEnvConfig

__all__ = ["ENTRY", "MHQAEnvConfig"]

if __name__ == "__main__":
    raise SystemExit(main(ENTRY))
