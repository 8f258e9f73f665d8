#!/bin/bash
set -e
cd /app/project
lost=$(git reflog --format='%H %gs %s' | awk '/Add greeting feature/ {print $1; exit}')
git -c user.name=oracle -c user.email=oracle@example.com cherry-pick "$lost"
