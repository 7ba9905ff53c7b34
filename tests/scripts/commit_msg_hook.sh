#!/usr/bin/env bash
# The commit-msg hook (scripts/hooks/commit-msg) against messages written here: subjects of 72 and
# 73 characters, a missing blank line, an empty subject, comment lines git strips.
set -u
hook=$1
fails=0
check() {  # check WANT(0|1) LABEL MESSAGE
  local want=$1 label=$2 f rc
  f=$(mktemp)
  printf '%b' "$3" >"$f"
  "$hook" "$f" 2>/dev/null
  rc=$?
  rm -f "$f"
  if { [[ $want == 0 ]] && ((rc != 0)); } || { [[ $want == 1 ]] && ((rc == 0)); }; then
    echo "FAIL: $label (exit $rc)"
    fails=$((fails + 1))
  fi
}
s72=$(printf 'a%.0s' $(seq 72))
check 0 "72-character subject" "$s72\n\nbody\n"
check 1 "73-character subject" "${s72}b\n"
check 0 "subject alone" "Fix the thing\n"
check 1 "no blank line after the subject" "Fix the thing\nbody\n"
check 1 "empty message" "\n\n# only a comment\n"
check 0 "comments before the subject" "# comment\nFix the thing\n\n# comment\n"
check 1 "long subject after comments" "# comment\n${s72}b\n"
((fails == 0)) && echo "commit_msg_hook: ok"
exit $((fails > 0))
