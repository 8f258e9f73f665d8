"""Entry module: `python -m environments.tau_env process|serve|evaluate`; the task lives in environments/tau/."""

from environments.tau.env import TauEnv, TauEnvConfig

__all__ = ["TauEnv", "TauEnvConfig"]

if __name__ == "__main__":
    TauEnv.cli()
