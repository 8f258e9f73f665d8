"""Entry module: `python -m environments.smolagents_gaia_env process|serve|evaluate`; the task lives in
environments/smolagents_gaia/ and needs the `codeact` extra (`pip install 'hermes-rl[codeact]'`)."""

try:
    from environments.smolagents_gaia.env import SmolagentsGaiaEnv, SmolagentsGaiaEnvConfig
except ModuleNotFoundError as exc:  # the optional extra is missing: say how to get it
    if exc.name != "smolagents":
        raise
    raise SystemExit("smolagents is not installed; install the extra: pip install 'hermes-rl[codeact]'") from exc

__all__ = ["SmolagentsGaiaEnv", "SmolagentsGaiaEnvConfig"]

if __name__ == "__main__":
    SmolagentsGaiaEnv.cli()
