#!/bin/bash
set -e
cd /home/user/photos
for f in *.jpeg; do mv -- "$f" "${f%.jpeg}.jpg"; done
