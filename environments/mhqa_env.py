"""Entry module: `python -m environments.mhqa_env process|serve|evaluate`; the task lives in environments/mhqa/."""

from environments.mhqa.env import MHQAEnv, MHQAEnvConfig

__all__ = ["MHQAEnv", "MHQAEnvConfig"]

if __name__ == "__main__":
    MHQAEnv.cli()
