"""Entry module: `python -m environments.video_qa_env process|serve|evaluate`; the task lives in environments/video_qa/."""

from environments.video_qa.env import VideoQAEnv, VideoQAEnvConfig

__all__ = ["VideoQAEnv", "VideoQAEnvConfig"]

if __name__ == "__main__":
    VideoQAEnv.cli()
