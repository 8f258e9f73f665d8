#!/bin/bash
set -e
sed -i -e 's/^port = 8000$/port = 8080/' -e 's/^debug = true$/debug = false/' /app/service.ini
