#!/bin/bash
# Writes reward.json: "reward" is the share of expected lines present, in order, with nothing extra.
mkdir -p /logs/verifier
python3 /tests/grade.py /app/errors.txt /tests/expected.txt > /logs/verifier/reward.json
