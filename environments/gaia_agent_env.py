"""Entry module: `python -m environments.gaia_agent_env process|serve|evaluate`; the task lives in environments/gaia/."""

from environments.gaia.env import GaiaAgentEnv, GaiaAgentEnvConfig

__all__ = ["GaiaAgentEnv", "GaiaAgentEnvConfig"]

if __name__ == "__main__":
    GaiaAgentEnv.cli()
