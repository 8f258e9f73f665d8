#!/bin/bash
set -e
awk '!seen[$0]++' /home/user/hosts.txt > /home/user/.hosts.tmp
mv /home/user/.hosts.tmp /home/user/hosts.txt
