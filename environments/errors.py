"""The error every command prints as one line and exits 2 on; its own module so the CLI and the
envs both import it without importing each other."""


class HermesEnvError(RuntimeError):
    """A problem the user must fix (bad URL, unreachable server, bad config): printed without a traceback."""
