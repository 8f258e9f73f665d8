"""τ²-bench (tau2-bench) domains as an env; see environments/tau/env.py."""
