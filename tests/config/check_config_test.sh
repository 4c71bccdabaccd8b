#!/bin/bash
# ckptd's command line without MPI: `--check-config` validates and prints a config that
# reads back to itself, and every flag that overrides a config key, fed values it
# cannot take, exits 2 naming the flag; never a signal, never a start.
# Usage: check_config_test.sh <source dir> <ckptd binary>
set -u
SRC=$1
CKPTD=$2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# The example config is valid; its effective configuration reads back to itself.
"$CKPTD" --check-config "$SRC/config/ckptd.yaml" >"$WORK/first.yaml" 2>"$WORK/err" || fail "example config: $(cat "$WORK/err")"
grep -q '^  memory_limit: 16GiB$' "$WORK/first.yaml" || fail "no staging.memory_limit in: $(cat "$WORK/first.yaml")"
"$CKPTD" --check-config "$WORK/first.yaml" >"$WORK/second.yaml" 2>"$WORK/err" || fail "effective config: $(cat "$WORK/err")"
diff <(tail -n +2 "$WORK/first.yaml") <(tail -n +2 "$WORK/second.yaml") >/dev/null || fail "effective config does not read back to itself"

# Flags override the file, with the same checks.
"$CKPTD" --check-config "$SRC/config/ckptd.yaml" --storage local --keep-last 4 >"$WORK/out" 2>&1 || fail "overrides: $(cat "$WORK/out")"
grep -q '^storage: local$' "$WORK/out" && grep -q '^  keep_last: 4$' "$WORK/out" || fail "overrides not applied: $(cat "$WORK/out")"

# A bad file, a missing file: exit 2 with the key or the path named.
printf 'staging:\n  memory_limit: lots\n' >"$WORK/bad.yaml"
"$CKPTD" --check-config "$WORK/bad.yaml" >"$WORK/out" 2>&1
rc=$?
[ "$rc" = 2 ] && grep -q "staging.memory_limit must be a size" "$WORK/out" || fail "bad value: rc $rc: $(cat "$WORK/out")"
"$CKPTD" --check-config "$WORK/missing.yaml" >"$WORK/out" 2>&1
rc=$?
[ "$rc" = 2 ] && grep -q "missing.yaml" "$WORK/out" || fail "missing file: rc $rc: $(cat "$WORK/out")"

# A config through a pipe has no size to read up to: refused by name, never taken
# as an empty file (all defaults).
printf 'retention:\n  keep_lats: 3\n' | "$CKPTD" --check-config /dev/stdin >"$WORK/out" 2>&1
rc=$?
[ "$rc" = 2 ] && grep -q "/dev/stdin is not a regular file" "$WORK/out" || fail "a pipe: rc $rc: $(cat "$WORK/out")"
printf 'retention:\n  keep_lats: 3\n' >"$WORK/typo.yaml"
"$CKPTD" --check-config "$WORK/typo.yaml" >"$WORK/out" 2>&1
rc=$?
[ "$rc" = 2 ] && grep -q "did you mean 'retention.keep_last'" "$WORK/out" || fail "typo: rc $rc: $(cat "$WORK/out")"

# Every flag of the reference, with values no key takes (or some keys take): exit 0 or
# 2, and 2 names the flag
# (or, for a check of several keys together, the key it sets). Nothing starts: --check-config answers first.
: >"$WORK/empty.yaml"
flags=$("$CKPTD" --config-reference | grep -o '| `--[a-z-]*` |' | grep -o -- '--[a-z-]*')
[ "$(echo "$flags" | wc -w)" -ge 10 ] || fail "too few flags in the reference: $flags"
for flag in $flags; do
  refused=0
  for value in abc -1 99999999999999999999999 1e400 "" "127.0.0.1:abc" "127.0.0.1:99999" "1GiB/s" "{rank}"; do
    "$CKPTD" --check-config "$WORK/empty.yaml" "$flag" "$value" >"$WORK/out" 2>&1
    rc=$?
    case $rc in
      0) ;;
      2) refused=$((refused + 1))
         # A combination check (drain_to with {rank}) names the key the flag sets.
         key=${flag#--}
         grep -q -e "$flag" -e "${key//-/_}" "$WORK/out" || fail "$flag '$value': exit 2 without naming the flag: $(cat "$WORK/out")" ;;
      *) fail "$flag '$value': exit $rc: $(tail -3 "$WORK/out")" ;;
    esac
  done
  [ "$refused" -ge 1 ] || fail "$flag refused none of the bad values"
done

[ "$failures" = 0 ] && echo "check_config_test: all passed"
exit $((failures > 0))
