#!/bin/bash
set -e
sed -i 's/wc -l < "\$1"/wc -w < "$1" | tr -d " "/' /app/wordcount.sh
