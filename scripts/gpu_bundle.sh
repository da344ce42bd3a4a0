#!/usr/bin/env bash
# Fills one git-ignored folder with everything the GPU machine lacks, so that
# nothing is downloaded or prepared there (it has no network):
#   wheels/           the runtime dependencies of attention_jax that the GPU
#                     image does not have (scripts/gpu_image_packages.txt),
#                     for its Python (3.12, manylinux x86-64), pinned to the
#                     versions installed here
#   cache/data/       the prepared Bible corpus (TFDS array_record) and the
#                     SentencePiece models of the quick and gpu presets
#   SHA256SUMS        checked by scripts/gpu_run.sh before anything runs
# Runs on a CPU machine with the package registries, after `make ablation` or
# `make data` set-up (.venv and the SWORD modules).
#
# Usage: scripts/gpu_bundle.sh [BUNDLE_DIR]          (default: gpu_bundle)
#   GPU_PYTHON_VERSION   target Python of the wheels (default 3.12)
#   VOCAB_SIZES          tokenizers to prepare (default "2000 8000": quick, gpu)
# Built in BUNDLE_DIR.partial and swapped in at the end: a failed or killed
# run leaves the previous bundle as it was.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
bundle="$(realpath -m "${1:-$repo/gpu_bundle}")"
py="${PYTHON:-$repo/.venv/bin/python}"
pyver="${GPU_PYTHON_VERSION:-3.12}"
vocab_sizes="${VOCAB_SIZES:-2000 8000}"
# A device call carries at most 64 MiB: the working tree that travels (tracked
# and untracked-not-ignored files) plus every carried path, this bundle and
# runs/gpu_state included. STATE_RESERVE_MIB is kept for runs/gpu_state (the
# benchmark rows, calibration and finished sweep cells brought back; a few MiB).
call_limit_mib=64
state_reserve_mib="${STATE_RESERVE_MIB:-8}"

die() { echo "error: $*" >&2; exit 1; }
[ -x "$py" ] || die "no Python at $py: run 'make .venv/.installed-stamp' first (or set PYTHON)."
[[ "$pyver" =~ ^3\.[0-9]+$ ]] || die "GPU_PYTHON_VERSION must look like 3.12, got '$pyver'."
[[ "$state_reserve_mib" =~ ^[0-9]+$ ]] || die "STATE_RESERVE_MIB must be a whole number, got '$state_reserve_mib'."
# Bytes of the files a device call sends besides the carried paths (links count
# as links: what they point to stays behind).
tree_bytes=$(cd "$repo" && git ls-files -z -c -o --exclude-standard \
  | xargs -0 -r stat -c '%s' -- 2>/dev/null | awk '{s += $1} END {print s + 0}') \
  || die "cannot measure the working tree (is $repo a git checkout?)."
tree_mib=$(( (tree_bytes + 1048575) / 1048576 ))
limit_mib=$(( call_limit_mib - tree_mib - state_reserve_mib ))
[ "$limit_mib" -gt 0 ] || die "the working tree alone is $tree_mib MiB: no room for a bundle in a $call_limit_mib MiB call."
for v in $vocab_sizes; do
  [[ "$v" =~ ^[0-9]+$ ]] || die "VOCAB_SIZES must be whole numbers, got '$v'."
done
mkdir -p "$(dirname "$bundle")" 2>/dev/null || die "cannot create the parent of $bundle."
[ -w "$(dirname "$bundle")" ] || die "the parent of $bundle is not writable."
abi="cp${pyver/./}"

work="$bundle.partial"
rm -rf "$work"
mkdir -p "$work/wheels" "$work/cache/data"

echo "[1/3] wheels for Python $pyver the GPU image lacks"
reqs="$("$py" "$repo/scripts/gpu_requirements.py" "$repo/scripts/gpu_image_packages.txt" "$pyver")"
for req in $reqs; do
  # A binary for the GPU machine's Python and platform; if the project ships
  # only a source archive (e.g. promise), build it here: it must come out pure
  # Python (py3-none-any), or it would not run there.
  if ! "$py" -m pip download -q --no-deps --only-binary=:all: --dest "$work/wheels" \
      --python-version "$pyver" --implementation cp --abi "$abi" --abi abi3 --abi none \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform any "$req" 2>/dev/null; then
    "$py" -m pip wheel -q --no-deps --wheel-dir "$work/wheels" "$req"
  fi
done
for whl in "$work"/wheels/*.whl; do
  case "$whl" in
    *-none-any.whl|*-"$abi"-*manylinux*x86_64*.whl|*-abi3-*manylinux*x86_64*.whl) ;;
    *) die "$(basename "$whl") does not run on CPython $pyver x86-64." ;;
  esac
done
echo "$reqs" > "$work/requirements.txt"

echo "[2/3] prepared data and tokenizers (vocab $vocab_sizes)"
data_dir="$("$py" -c 'from attention_jax.data import input_pipeline as p; print(p.default_data_dir())')"
for v in $vocab_sizes; do
  (cd "$repo" && "$py" -m experiments.prepare_data --datasets=bible_en_es,bible_es_en \
      --vocab_size="$v")
done
# The corpus, both directions, and only the tokenizers asked for; no lock files.
(cd "$data_dir" && find bible_translate -type f ! -name '*.lock' ! -path '*/tokenizers/*' \
    -print0 | xargs -0 cp --parents -t "$work/cache/data")
mkdir -p "$work/cache/data/bible_translate/tokenizers"
for v in $vocab_sizes; do
  cp "$data_dir"/bible_translate/tokenizers/*-bpe"$v".* "$work/cache/data/bible_translate/tokenizers/"
done

# The device gets the working tree without .git: the rows it writes name the
# commit of the tree this bundle was built from (rebuild after committing).
(cd "$repo" && printf '%s%s\n' "$(git rev-parse HEAD)" \
   "$(git diff --quiet HEAD -- . 2>/dev/null || echo -dirty)") > "$work/COMMIT"

echo "[3/3] checksums"
(cd "$work" && find . -type f ! -name SHA256SUMS -print0 | sort -z | xargs -0 sha256sum \
    > SHA256SUMS)
size_mib=$(( ($(du -sb "$work" | cut -f1) + 1048575) / 1048576 ))
[ "$size_mib" -le "$limit_mib" ] || die "bundle is $size_mib MiB, over its $limit_mib MiB ($call_limit_mib MiB per call - $tree_mib MiB working tree - $state_reserve_mib MiB for runs/gpu_state; left in $work)."

rm -rf "$bundle.old"
[ -e "$bundle" ] && mv "$bundle" "$bundle.old"
mv "$work" "$bundle"
rm -rf "$bundle.old"
echo "working tree $tree_mib MiB + bundle $size_mib MiB + state reserve $state_reserve_mib MiB <= $call_limit_mib MiB per device call"
echo "bundle: $bundle, $size_mib MiB ($(ls "$bundle/wheels" | wc -l) wheels)"
