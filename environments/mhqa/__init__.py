"""Multi-hop QA (HotpotQA, MuSiQue) over an item's paragraphs; see environments/mhqa/env.py."""
