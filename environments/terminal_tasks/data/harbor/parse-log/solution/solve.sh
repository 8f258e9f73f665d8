#!/bin/bash
set -e
cd /app
awk '$4 >= 500 && $4 < 600 {n[$3]++} END {for (p in n) print p, n[p]}' access.log | sort -k2,2nr -k1,1 > errors.txt
