#!/bin/bash
# client/ (ckptctl, the client library, the export code) may include from daemon/ only
# the public headers of the checkpoint-format library (daemon/CMakeLists.txt writes
# their list at configure time) and the shared command line.
# Usage: client_includes_format_only.sh <source dir> <list of allowed headers>
set -eu
cd "$1"
allowed=$2
bad=$(grep -rhoE '#include "daemon/[^"]+"' client | sed 's/#include "\(.*\)"/\1/' | sort -u | grep -vxF -f "$allowed" || true)
if [ -n "$bad" ]; then
  echo "client/ includes daemon internals outside the format library's public headers:"
  echo "$bad"
  grep -rn -F -f <(echo "$bad") client
  exit 1
fi
echo "client/ includes $(grep -rhoE '#include "daemon/[^"]+"' client | sort -u | wc -l) daemon headers, all public"
