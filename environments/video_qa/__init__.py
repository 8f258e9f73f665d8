"""Multiple-choice video QA over caption files; see environments/video_qa/env.py."""
