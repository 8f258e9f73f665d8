"""A stand-in env module for serve_ray's attack test: `python -m tests.support.loud_serve serve` writes
what a serve log holds when it quotes model-written text (a line of several MiB, terminal control
characters), then exits 0 like a serve whose trainer is done."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    sys.stderr.write("a rollout quoted the model: " + "A" * (3 << 20) + "\n")
    sys.stderr.write("\x1b]0;retitled by the model\x07\x1b[2J after the long line\n")
    sys.stderr.write("serve done\n")
    sys.stderr.flush()
