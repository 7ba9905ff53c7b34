#!/bin/sh
# Runs a program and checks both its exit status and its messages (stdout and stderr together):
#   expect_exit.sh STATUS REGEX... -- PROGRAM ARG...
# Each REGEX (grep -E) must match a line of the output. An ARG spelled @EMPTY@ is passed as an empty
# word (CTest before 3.31 drops empty arguments), so `--format ""` can be tested.
status=$1
shift
n=0
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  n=$((n + 1))
  eval "re_$n=\$1"
  shift
done
[ "$1" = "--" ] || { echo "expect_exit.sh: missing -- before the program" >&2; exit 2; }
shift
program=$1
shift
# Rebuild the arguments with @EMPTY@ replaced, keeping every other word as it is.
count=$#
i=0
while [ $i -lt $count ]; do
  a=$1
  shift
  [ "$a" = "@EMPTY@" ] && a=""
  set -- "$@" "$a"
  i=$((i + 1))
done
out=$("$program" "$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" != "$status" ]; then
  echo "expect_exit.sh: exit status $rc, expected $status" >&2
  exit 1
fi
i=1
while [ $i -le $n ]; do
  eval "re=\$re_$i"
  if ! printf '%s\n' "$out" | grep -Eq -- "$re"; then
    echo "expect_exit.sh: no line of the output matches '$re'" >&2
    exit 1
  fi
  i=$((i + 1))
done
echo "expect_exit.sh: exit status $rc and messages as expected"
