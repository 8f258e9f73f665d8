#!/bin/bash
# Partial credit: each required change is worth half; any other change voids both.
mkdir -p /logs/verifier
python3 /tests/check_config.py /app/service.ini > /logs/verifier/reward.txt
