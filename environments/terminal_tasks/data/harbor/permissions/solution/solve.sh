#!/bin/bash
set -e
cd /app/deploy
chmod 750 deploy.sh
chmod 600 secrets.env
mkdir -p logs
chmod 700 logs
