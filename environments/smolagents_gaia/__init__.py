"""GAIA answered by smolagents' CodeAgent, its code actions confined in sandbox slots (docs/code_actions.md)."""
