"""Entry module: `python -m environments.video_qa_env process|serve|evaluate`; the task lives in environments/video_qa/.

It imports the env class only once the command line is parsed and checked (environments/env_entry.py).
"""

from environments.cli import main
from environments.video_qa.config import ENTRY, VideoQAEnvConfig

__all__ = ["ENTRY", "VideoQAEnvConfig"]

if __name__ == "__main__":
    raise SystemExit(main(ENTRY))
