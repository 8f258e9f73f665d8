"""Entry module: `python -m environments.gsm8k_agent_env process|serve|evaluate`; the task lives in environments/gsm8k/."""

from environments.gsm8k.env import GSM8kAgentEnv, GSM8kAgentEnvConfig

__all__ = ["GSM8kAgentEnv", "GSM8kAgentEnvConfig"]

if __name__ == "__main__":
    GSM8kAgentEnv.cli()
