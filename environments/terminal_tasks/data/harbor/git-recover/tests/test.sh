#!/bin/bash
mkdir -p /logs/verifier
cd /app/project
python3 -m pytest -q /tests/test_git.py && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
