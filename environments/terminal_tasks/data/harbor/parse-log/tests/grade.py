import json
import sys

expected = open(sys.argv[2]).read().split("\n")
expected = [line for line in expected if line]
try:
    got = [line.rstrip() for line in open(sys.argv[1]).read().split("\n") if line.strip()]
except OSError:
    got = []
exact = got == expected
correct_lines = sum(1 for g, e in zip(got, expected) if g == e)
reward = 1.0 if exact else (0.0 if len(got) != len(expected) else correct_lines / len(expected))
print(json.dumps({"reward": reward, "lines_expected": len(expected), "lines_correct": correct_lines}))
