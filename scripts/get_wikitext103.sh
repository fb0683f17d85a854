#!/usr/bin/env bash
# Downloads the raw WikiText-103 archive (wikitext-103-raw-v1.zip, Merity et al.
# 2016, CC BY-SA), verifies its SHA-256 and unpacks wiki.{train,valid,test}.raw
# into ${CQK_DATA:-data}/wikitext-103/.
#
#   scripts/get_wikitext103.sh                     download, verify, unpack
#   scripts/get_wikitext103.sh --from-archive FILE verify and unpack a local copy
#   options: --dest DIR (default ${CQK_DATA:-data}/wikitext-103)
#            --sha256 HEX (default $CQK_WIKITEXT_SHA256 or the pinned value below)
#            --url URL (default $CQK_WIKITEXT_URL or the mirrors below)
#            --keep-archive, --force (replace an existing unpacked copy)
#
# The verification always runs: an archive whose digest differs is rejected and
# nothing is unpacked. The archive may be a zip or a tar(.gz) holding the three
# files of either layout (wiki.*.raw or wiki.*.tokens), at its top level or in
# one folder. Sourcing the script defines the functions without running main.
set -euo pipefail

# The digest of wikitext-103-raw-v1.zip (191,984,949 bytes) as published by
# Salesforce; the same value is pinned by several independent dataset loaders.
WIKITEXT103_RAW_SHA256="91c00ae287f0d699e18605c84afc9e45c192bc6b7797ff8837e5474655a33794"
WIKITEXT103_URLS=(
  "https://wikitext.smerity.com/wikitext-103-raw-v1.zip"
  "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-raw-v1.zip"
)
CLEANUP_DIR=""  # a temporary folder main's exit trap removes
WIKITEXT_LAYOUTS=("wiki.train.raw wiki.valid.raw wiki.test.raw" "wiki.train.tokens wiki.valid.tokens wiki.test.tokens")

die() {
  echo "get_wikitext103: $*" >&2
  exit 1
}

sha256_of() {
  if command -v sha256sum >/dev/null; then
    sha256sum "$1" | cut -d' ' -f1
  elif command -v shasum >/dev/null; then
    shasum -a 256 "$1" | cut -d' ' -f1
  else
    die "neither sha256sum nor shasum is installed"
  fi
}

# verify_archive FILE EXPECTED_SHA256
verify_archive() {
  local file="$1" expected="${2,,}"
  [[ -f "$file" ]] || die "archive $file does not exist"
  [[ "$expected" =~ ^[0-9a-f]{64}$ ]] || die "expected SHA-256 '$2' is not 64 hex digits"
  local actual
  actual="$(sha256_of "$file")"
  [[ "$actual" == "$expected" ]] || die "checksum mismatch for $file: expected sha256 $expected, got $actual"
}

# extract_archive FILE DIR: zip (unzip, bsdtar or python3) or tar(.gz|.bz2|.xz).
extract_archive() {
  local file="$1" dir="$2"
  mkdir -p "$dir"
  if [[ "$(head -c 2 "$file")" == "PK" ]]; then
    if command -v unzip >/dev/null; then
      unzip -q -o "$file" -d "$dir"
    elif command -v bsdtar >/dev/null; then
      bsdtar -xf "$file" -C "$dir"
    elif command -v python3 >/dev/null; then
      python3 -m zipfile -e "$file" "$dir"
    else
      die "cannot extract $file: install unzip"
    fi
  else
    tar -xf "$file" -C "$dir" || die "cannot extract $file (not a zip or tar archive)"
  fi
}

# find_layout DIR: prints the folder (DIR or one subfolder) holding one complete layout.
find_layout() {
  local dir="$1" candidate layout name complete
  for candidate in "$dir" "$dir"/*/; do
    candidate="${candidate%/}"
    [[ -d "$candidate" ]] || continue
    for layout in "${WIKITEXT_LAYOUTS[@]}"; do
      complete=1
      for name in $layout; do [[ -f "$candidate/$name" ]] || complete=0; done
      if ((complete)); then
        echo "$candidate"
        return 0
      fi
    done
  done
  return 1
}

# unpack_archive FILE DEST: extracts to a temporary folder next to DEST, checks
# the layout and moves the three split files into DEST.
unpack_archive() {
  local file="$1" dest="$2" tmp found layout name moved=0
  mkdir -p "$(dirname "$dest")"
  tmp="$(mktemp -d "$(dirname "$dest")/.wikitext-unpack.XXXXXX")"
  CLEANUP_DIR="$tmp"
  extract_archive "$file" "$tmp"
  found="$(find_layout "$tmp")" ||
    die "archive $file holds none of the expected file sets: ${WIKITEXT_LAYOUTS[0]}; or ${WIKITEXT_LAYOUTS[1]}"
  mkdir -p "$dest"
  for layout in "${WIKITEXT_LAYOUTS[@]}"; do
    for name in $layout; do
      if [[ -f "$found/$name" ]]; then
        mv -f "$found/$name" "$dest/$name"
        moved=$((moved + 1))
      fi
    done
  done
  rm -rf "$tmp"
  CLEANUP_DIR=""
  echo "get_wikitext103: unpacked $moved files into $dest"
}

download() {
  local out="$1"
  shift
  local url
  for url in "$@"; do
    echo "get_wikitext103: downloading $url" >&2
    if command -v curl >/dev/null; then
      curl -fL --retry 3 -o "$out.part" "$url" && mv -f "$out.part" "$out" && return 0
    elif command -v wget >/dev/null; then
      wget -q --tries=3 -O "$out.part" "$url" && mv -f "$out.part" "$out" && return 0
    else
      die "neither curl nor wget is installed"
    fi
    echo "get_wikitext103: $url failed" >&2
  done
  rm -f "$out.part"
  die "download failed from: $*"
}

main() {
  trap 'if [[ -n "$CLEANUP_DIR" ]]; then rm -rf "$CLEANUP_DIR"; fi' EXIT
  local archive="" dest="${CQK_DATA:-data}/wikitext-103" sha="${CQK_WIKITEXT_SHA256:-$WIKITEXT103_RAW_SHA256}"
  local keep=0 force=0
  local urls=("${WIKITEXT103_URLS[@]}")
  [[ -n "${CQK_WIKITEXT_URL:-}" ]] && urls=("$CQK_WIKITEXT_URL")
  while (($#)); do
    case "$1" in
      --from-archive) archive="${2:?--from-archive needs a file}"; shift 2 ;;
      --dest) dest="${2:?--dest needs a folder}"; shift 2 ;;
      --sha256) sha="${2:?--sha256 needs a digest}"; shift 2 ;;
      --url) urls=("${2:?--url needs a URL}"); shift 2 ;;
      --keep-archive) keep=1; shift ;;
      --force) force=1; shift ;;
      -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; return 0 ;;
      *) die "unknown argument $1 (see --help)" ;;
    esac
  done
  if find_layout "$dest" >/dev/null && ((!force)); then
    echo "get_wikitext103: $dest already holds WikiText-103 (use --force to replace it)"
    return 0
  fi
  if [[ -z "$archive" ]]; then
    mkdir -p "$(dirname "$dest")"
    archive="$(dirname "$dest")/wikitext-103-raw-v1.zip"
    [[ -f "$archive" ]] || download "$archive" "${urls[@]}"
    verify_archive "$archive" "$sha"
    unpack_archive "$archive" "$dest"
    ((keep)) || rm -f "$archive"
  else
    verify_archive "$archive" "$sha"
    unpack_archive "$archive" "$dest"
  fi
  echo "get_wikitext103: next: cqk data tokenizer --input $dest --vocab-size 32000 --out $dest/bpe32k.model"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
