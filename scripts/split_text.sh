#!/usr/bin/env bash
# Splits one plain-text file into train.txt, valid.txt and test.txt (the
# "plain" layout `cqk data encode` reads), deterministically, by lines.
#
#   scripts/split_text.sh ../shared/data/brown.txt data/brown
#   scripts/split_text.sh --block 100 --parts 20 corpus.txt data/corpus
#
# The file is cut into consecutive blocks of --block lines (default 100). Of
# every --parts blocks (default 20), the second-to-last goes to valid.txt, the
# last to test.txt and the rest to train.txt: with the defaults 90% / 5% / 5%.
# Whole blocks keep neighbouring lines (often one document) in one split, and
# taking blocks from the whole file keeps every part of a corpus ordered by
# genre or source (as Brown is) in all three splits.
set -euo pipefail

usage() { echo "usage: scripts/split_text.sh [--block LINES] [--parts N] INPUT.txt OUT_DIR" >&2; exit 2; }
help() { sed -n '2,/^[^#]/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0; }  # the comment above
die() { echo "split_text: $*" >&2; exit 2; }

block=100
parts=20
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --block) [[ $# -ge 2 ]] || usage; block="$2"; shift 2 ;;
    --parts) [[ $# -ge 2 ]] || usage; parts="$2"; shift 2 ;;
    -h|--help) help ;;
    -*) die "unknown option $1" ;;
    *) args+=("$1"); shift ;;
  esac
done
[[ ${#args[@]} -eq 2 ]] || usage
input="${args[0]}" out="${args[1]}"
[[ "$block" =~ ^[1-9][0-9]*$ ]] || die "--block '$block': expected a positive number of lines"
[[ "$parts" =~ ^[0-9]+$ && "$parts" -ge 3 ]] || die "--parts '$parts': expected 3 or more"
[[ -f "$input" && -r "$input" ]] || die "$input: no such readable file"
mkdir -p "$out" || die "$out: cannot create the folder"

# Written to temporaries and renamed, so an interrupted split leaves no partial split behind.
awk -v block="$block" -v parts="$parts" -v out="$out" '
  BEGIN { split("train valid test", names, " ") }
  {
    slot = int((NR - 1) / block) % parts
    name = slot == parts - 2 ? "valid" : slot == parts - 1 ? "test" : "train"
    print > (out "/" name ".txt.tmp")
    lines[name]++
  }
  END {
    for (i = 1; i <= 3; i++) {
      if (!(names[i] in lines)) { printf "split_text: %s would be empty; the input has only %d lines\n", names[i], NR > "/dev/stderr"; exit 2 }
    }
    for (i = 1; i <= 3; i++) printf "%s.txt: %d lines\n", names[i], lines[names[i]]
  }' "$input" || { rm -f "$out"/{train,valid,test}.txt.tmp; exit 2; }
for name in train valid test; do mv "$out/$name.txt.tmp" "$out/$name.txt"; done
