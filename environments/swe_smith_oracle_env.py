"""Entry module: `python -m environments.swe_smith_oracle_env process|serve|evaluate`; the task lives in environments/swe_smith/."""

from environments.swe_smith.env import SweSmithOracleEnv, SweSmithOracleEnvConfig

__all__ = ["SweSmithOracleEnv", "SweSmithOracleEnvConfig"]

if __name__ == "__main__":
    SweSmithOracleEnv.cli()
