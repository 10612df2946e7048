#!/usr/bin/env bash
# Builds, on a machine with cargo and network, what `xtask/gpu/run.sh` needs on a lent GPU
# machine that has neither (docs/backends.md, "On a GPU"), into one ignored folder (.gpu/):
#
#   memzoo.gz    the CLI built with `--features wgpu` (wgpu with CubeCL's autotune and fusion;
#                Vulkan is the GPU path that builds offline), stripped and gzipped: stripped
#                it is still ~80 MB (CubeCL's kernels), over what the device call carries
#   corpus.txt.gz  the text the runs train on: this checkout's tracked .rs, .md and .toml
#                files concatenated (about 3 MB; read as one stream, not as documents)
#   gl/*.deb     the Vulkan and EGL loaders (Debian amd64 packages), unpacked there only when the
#                image lacks libvulkan.so.1
#   whl/*.whl    the XL peer's Python packages for the GPU machine's own python3 (which has torch):
#                transformers 4.37.2, its last release with TransfoXL, and the tokenizers and
#                huggingface_hub it accepts (run.sh runs xtask/gpu/peer_tfxl.py with them)
#   MANIFEST     commit, features, profile, build time and sizes (run.sh prints it)
#
#   bash xtask/gpu/prepare.sh                                   # for the GPU
#   bash xtask/gpu/prepare.sh --features wgpu-plain --out /tmp/gpu-plain --no-loaders
#                                                               # for the CPU test (llvmpipe)
#
# The dev profile is the default: it optimises every dependency (Burn, CubeCL, wgpu) as a
# release build does, reuses the usual build folder and takes minutes, where a release build of
# the wgpu stack takes over half an hour on 2 cores. CARGO_TARGET_DIR is honoured.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() {
  cat <<'EOF'
usage: xtask/gpu/prepare.sh [OPTIONS]
  --features F     memzoo's backend feature: wgpu (default, for a GPU) or wgpu-plain (llvmpipe)
  --release        build the release profile instead of dev
  --out DIR        where to gather the files (default .gpu, ignored by git)
  --no-loaders     skip downloading the Vulkan/EGL loader packages
  --no-peer        skip downloading the XL peer's wheels (HF TransfoXL)
EOF
}
die() { echo "prepare.sh: $*" >&2; exit 2; }

features=wgpu
profile=dev
out=.gpu
loaders=1
peer=1
while [ $# -gt 0 ]; do
  case "$1" in
    --features) features=${2:-}; shift 2
      case "$features" in wgpu|wgpu-plain) ;; *) die "--features must be wgpu or wgpu-plain, got '$features'" ;; esac ;;
    --release) profile=release; shift ;;
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    --no-loaders) loaders=0; shift ;;
    --no-peer) peer=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown option '$1'" ;;
  esac
done
command -v cargo >/dev/null 2>&1 || die "cargo not found: prepare.sh builds here, run.sh runs there"
mkdir -p "$out"

# 1. The binary.
target=${CARGO_TARGET_DIR:-target}
flags=(-p memzoo --features "$features")
[ "$profile" = release ] && flags+=(--release)
subdir=debug
[ "$profile" = release ] && subdir=release
start=$(date +%s)
cargo build "${flags[@]}"
build_s=$(( $(date +%s) - start ))
"$target/$subdir/memzoo" devices | grep '^wgpu-vulkan .*compiled in' >/dev/null \
  || die "the built binary has no wgpu backend ('$target/$subdir/memzoo devices')"
strip -o "$out/memzoo" "$target/$subdir/memzoo"
stripped=$(wc -c <"$out/memzoo")
gzip -9 -f "$out/memzoo"
echo "prepare: built memzoo (--features $features, $profile) in ${build_s}s;" \
  "stripped $((stripped / 1048576)) MiB, gzipped $(( $(wc -c <"$out/memzoo.gz") / 1048576 )) MiB"

# 2. The corpus: real text that every checkout has, in a fixed order.
git ls-files -z -- '*.rs' '*.md' '*.toml' | xargs -0 cat | gzip -9 >"$out/corpus.txt.gz"
echo "prepare: corpus.txt.gz, $(gzip -dc "$out/corpus.txt.gz" | wc -c) bytes of text"

# 3. The loaders, as the workplace's device notes say: Debian's amd64 packages, downloaded with
#    a package list of their own (the system's lists are left alone).
if [ "$loaders" = 1 ]; then
  mkdir -p "$out/gl" /tmp/memzoo-apt-amd64/partial
  if ls "$out"/gl/libvulkan1_*.deb >/dev/null 2>&1; then
    echo "prepare: loader packages already in $out/gl"
  else
    o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/memzoo-apt-amd64)
    apt-get "${o[@]}" update -qq
    (cd "$out/gl" && apt-get "${o[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
  fi
  echo "prepare: loaders: $(cd "$out/gl" && echo *.deb)"
fi

# 4. The XL peer's wheels, for the GPU machine's python3 (3.12, x86-64; its torch and numpy
#    stay): transformers 4.37.2 insists on tokenizers < 0.19 and huggingface_hub < 1.0 at import.
if [ "$peer" = 1 ]; then
  mkdir -p "$out/whl"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$out/whl" \
    transformers==4.37.2 tokenizers==0.15.2 huggingface_hub==0.20.3
  echo "prepare: peer wheels: $(cd "$out/whl" && echo *.whl)"
fi

# 5. What was built, for run.sh's log.
{
  echo "commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates Cargo.toml Cargo.lock || echo '+changes')"
  echo "features=$features"
  echo "profile=$profile"
  echo "built=$(date -u +%FT%TZ) in ${build_s}s"
  echo "binary_bytes=$stripped (stripped, before gzip)"
} >"$out/MANIFEST"

# The device tool carries at most 64 MiB with the working tree.
total_kib=$(du -sk "$out" | cut -f1)
echo "prepare: $out holds $((total_kib / 1024)) MiB (the device call carries it with the tree: 64 MiB in all)"
[ "$total_kib" -lt $((56 * 1024)) ] || echo "prepare: warning: $out is over 56 MiB; the tree and it may not fit the device call" >&2
