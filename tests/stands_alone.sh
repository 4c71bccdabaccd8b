#!/usr/bin/env bash
# The repository stands alone: no tracked file (build, test, script or doc) refers to
# a directory beside the checkout, and the test data it needs is inside it.
set -euo pipefail
cd "$(dirname "$0")/.."
# Written in two pieces so that this script does not match itself.
pattern='\.\./'"shared"
list_files() {
  if git rev-parse --git-dir > /dev/null 2>&1; then git ls-files -z; else find . -type f -not -path './build*' -print0; fi
}
if list_files | xargs -0 grep -nI -e "$pattern" -- 2>/dev/null; then
  echo "FAIL: the lines above refer to a directory outside the repository" >&2
  exit 1
fi
for dir in tests/testdata/tf/*/; do
  [ -f "$dir/expected.json" ] || { echo "FAIL: $dir has no expected.json" >&2; exit 1; }
done
echo "stands alone: $(list_files | tr -cd '\0' | wc -c) files, none refers outside; $(ls -d tests/testdata/tf/*/ | wc -l) TF checkpoints in tests/testdata/tf"
