#!/bin/bash
set -e
awk -F, 'NR > 1 {s += $2 * $3} END {printf "%.2f\n", s}' /home/user/data/sales.csv > /home/user/data/total.txt
