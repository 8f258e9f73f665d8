#!/bin/bash
set -e
cd /home/user
tar -czf /home/user/manifests_backup.tar.gz k8s/manifests
echo /home/user/manifests_backup.tar.gz >> /home/user/backup.log
