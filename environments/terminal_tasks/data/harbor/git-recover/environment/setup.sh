#!/bin/bash
set -e
export GIT_AUTHOR_NAME=dev GIT_AUTHOR_EMAIL=dev@example.com GIT_COMMITTER_NAME=dev GIT_COMMITTER_EMAIL=dev@example.com
git init -q -b main project
cd project
echo "# project" > README.md
git add README.md && git commit -q -m "Initial commit"
echo "hello, world" > greeting.txt
git add greeting.txt && git commit -q -m "Add greeting feature"
git reset -q --hard HEAD~1
echo "MIT" > LICENSE
git add LICENSE && git commit -q -m "Add license"
