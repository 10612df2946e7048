#!/usr/bin/env bash
# The GPU check (issue 27, item 3): trains Transformer-XL's enwik8 base and the Memorizing
# Transformer of Wu et al. 2022 for a few hundred steps each with a prebuilt memzoo, and prints
# tokens/s, peak GPU memory and the loss of each; then the XL peer, HF TransfoXL, with the same
# model, batch and corpus on the same GPU (xtask/gpu/peer_tfxl.py), for the ratio.
#
# Made for a lent GPU machine with no network and no Rust toolchain: `xtask/gpu/prepare.sh`
# builds the binary, a text corpus and the Vulkan/EGL loader packages into .gpu/ beforehand,
# and the device call carries that folder (docs/backends.md, "On a GPU"). The same script runs
# on the CPU through Mesa's llvmpipe (`--device wgpu-gl`, a `wgpu-plain` build, tiny sizes
# through --set) to test it without a GPU.
#
#   bash xtask/gpu/run.sh                       # on the GPU: wgpu on Vulkan, 300 steps each
#   bash xtask/gpu/run.sh --dir /tmp/gpu-plain --device wgpu-gl --steps 4 --log-every 2 \
#        --set model.n_layers=2 --set model.d_model=64 ...   # the CPU test (see docs/backends.md)
#   bash xtask/gpu/run.sh --self-test           # checks the summary arithmetic; needs no binary
#
# With $OUT set (the device tool's output folder) the whole log and the summary are written
# there too. Exit status: 0 when every run finished, 1 when one failed or timed out.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: xtask/gpu/run.sh [OPTIONS]
  --dir DIR           what prepare.sh built: memzoo.gz, corpus.txt.gz, gl/*.deb, MANIFEST
                      (default .gpu)
  --device DEV        memzoo device string (default wgpu-vulkan)
  --presets "A B"     presets to run, in order (default "xl-enwik8-base memorizing-paper");
                      PRESET@VARIANT runs a variant of a preset with a kNN layer, to split its
                      time: @hnsw (the kNN search on the host, in usearch's HNSW) or, for
                      memorizing-paper, @no-knn (a T5 layer in place of the kNN one), e.g.
                      --presets "memorizing-paper memorizing-paper@hnsw memorizing-paper@no-knn"
  --steps N           optimizer steps per run (default 300)
  --max-seconds S     training time cap per run, memzoo's train.max_seconds (default 120)
  --grace S           after the cap, seconds left for the final evaluation and checkpoint
                      before the run is interrupted (default 45)
  --log-every N       steps per logged window (default 10)
  --eval-segments N   validation segments at the end of each run (default 4)
  --set K=V           extra memzoo config override for every run (repeatable);
                      --set PRESET:K=V for that preset's run only
  --tiny              shrink the presets to 2 layers of 64 on batches of 2 x 16 (kNN memory
                      256, vocabulary 256; reformer-enwik8 too, which runs only when named):
                      the CPU test on llvmpipe or lavapipe, which run ~0.6 GFLOP/s
  --work DIR          scratch folder for the run directories (default /tmp/memzoo-gpu-check)
  --keep              keep the run directories (default: removed after the summary)
  --peer-seconds S    training time cap of the XL peer, HF TransfoXL (xtask/gpu/peer_tfxl.py),
                      run after xl-enwik8-base when prepare.sh brought its wheels (default 60)
  --no-peer           skip the peer
  --no-products       skip the matrix-product rates (`memzoo devices --measure DEVICE`: a
                      4096-square product and xl-enwik8-base's, timed before the runs); --tiny
                      skips them too, as llvmpipe takes minutes per large product, unless
  --products          asks for them
  --profile-steps N   after the runs, train each preset (not its @variants) N more steps with
                      CubeCL's kernel profiler on (each kernel timed, so apart from the timed
                      runs) and print where the time goes, kernel by kernel and by kind
                      (default 6; --tiny skips it unless given; the whole logs go to $OUT
                      gzipped); --presets memorizing-paper --profile-steps 4 profiles the
                      Memorizing Transformer alone
  --no-profile        skip the kernel profiles
  --self-test         check the summary arithmetic on a made-up metrics file, then exit
EOF
}

die() { echo "run.sh: $*" >&2; exit 2; }
say() { echo "gpu-check: $*"; }

# A positive whole number, or an error naming the option and the bad value.
positive() {
  [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive whole number, got '$2'"
}

# ------------------------------------------------------------------------------------------
# The summary of one run from its metrics.jsonl (one JSON object a line, written by memzoo:
# {"step":N,"split":"train"|"valid","metric":NAME,"value":X}). Prints, tab-separated:
#   last_step  steady_tokens_per_s  first_window_tokens_per_s  last_train_loss  valid_loss
# steady tokens/s leaves out the first logged window (kernel compilation, CubeCL's autotune)
# and weighs each later window by its steps: total tokens over total time, the windows being
# `log_every` steps of equal size. A missing value is "-".
summarize_metrics() {
  awk '
    function field(name,   m) {
      # the value of "name": a number or a quoted string
      if (match($0, "\"" name "\":(\"[^\"]*\"|[-+0-9.eE]+|null)")) {
        m = substr($0, RSTART + length(name) + 3, RLENGTH - length(name) - 3)
        gsub(/"/, "", m)
        return m
      }
      return ""
    }
    {
      step = field("step") + 0; split_ = field("split"); metric = field("metric")
      value = field("value")
      if (split_ == "train" && metric == "tokens_per_s" && value != "null") {
        n++
        if (n == 1) { first = value }
        else if (value + 0 > 0) { steps += step - prev; secs += (step - prev) / value }
        prev = step
      }
      if (split_ == "train" && metric == "loss") { train_loss = value; last = step }
      if (split_ == "valid" && metric == "loss") { valid_loss = value }
      if (split_ == "train" && metric == "device_mib_reserved_peak" && value + 0 > alloc) { alloc = value + 0 }
    }
    END {
      printf "%s\t%s\t%s\t%s\t%s\t%s\n",
        (last == "" ? "-" : last),
        (secs > 0 ? sprintf("%.1f", steps / secs) : "-"),
        (first == "" ? "-" : sprintf("%.1f", first)),
        (train_loss == "" ? "-" : sprintf("%.4f", train_loss)),
        (valid_loss == "" ? "-" : sprintf("%.4f", valid_loss)),
        (alloc > 0 ? sprintf("%.0f", alloc) : "-")
    }' "$1"
}

# The largest number in a file of nvidia-smi samples (MiB a line), or "-".
peak_of() {
  awk '$1 ~ /^[0-9]+$/ && $1 + 0 > max { max = $1 + 0; seen = 1 }
       END { if (seen) print max; else print "-" }' "$1" 2>/dev/null || echo "-"
}

# Where the time of CubeCL's profiled kernels went. Reads profile lines, one a kernel launch,
# "| 1.25ms | NAME | PART | ... _<hash>" (the duration in ns, µs/us, ms or s), and prints the
# total, then the TOP most costly kernels (their name without the per-shape hash; a matmul's
# with its algorithm family), then the time by kind: matmul, reduce, fused elementwise, other
# elementwise, copy and gather, random, other. Every other line of the file is skipped.
summarize_profile() {
  awk -v top="$2" '
    /^\| *[0-9.]+ *(ns|µs|us|ms|s) *\|/ {
      n = split($0, f, "|")
      d = f[2]; gsub(/ /, "", d)
      v = d; sub(/[^0-9.].*$/, "", v); u = d; sub(/^[0-9.]+/, "", u)
      ms = v * (u == "ns" ? 1e-6 : (u == "ms" ? 1 : (u == "s" ? 1000 : 1e-3)))
      name = f[3]; gsub(/^ +| +$/, "", name)
      if (name ~ /^Matmul/) {
        for (i = 4; i <= n; i++) if (f[i] ~ /Family/ && f[i] ~ /Matmul/) {
          fam = f[i]; gsub(/^ +| +$/, "", fam); name = name " " fam; break
        }
      }
      sub(/_[0-9a-f]+$/, "", name)
      kind = "other"
      if (name ~ /Matmul|matmul/) kind = "matmul"
      else if (name ~ /Reduce|reduce/) kind = "reduce"
      else if (name ~ /Elemwise|elemwise/) kind = "fused elementwise"
      else if (name ~ /Binop|Unary|Scalar|Full|MaskFill|Cmp|Cast/) kind = "elementwise"
      else if (name ~ /Copy|Slice|Gather|Scatter|Select|Cat|copy/) kind = "copy and gather"
      else if (name ~ /Prng|Random/) kind = "random"
      t[name] += ms; c[name]++; k[kind] += ms; total += ms; launches++
    }
    END {
      if (launches == 0) { print "no profiled kernels"; exit }
      printf "kernels: %d launches, %.1f ms of kernel time\n", launches, total
      for (i = 1; i <= top; i++) {
        best = ""; bt = -1
        for (x in t) if (t[x] > bt) { bt = t[x]; best = x }
        if (best == "") break
        printf "  %6.1f%% %10.1f ms %7d x  %s\n", 100 * bt / total, bt, c[best], best
        delete t[best]
      }
      line = "by kind:"
      split("matmul,reduce,fused elementwise,elementwise,copy and gather,random,other", kinds, ",")
      for (i = 1; i <= 7; i++) if (k[kinds[i]] > 0) line = line sprintf(" %s %.1f%%;", kinds[i], 100 * k[kinds[i]] / total)
      sub(/;$/, "", line)
      print line
    }' "$1"
}

# After a run: stops the memory sampler ($sampler, if any) and sets wall (seconds since $t0),
# peak (of the samples in $samples) and result (from the exit $status; failed=1 unless 0).
finish_run() {
  wall=$(( $(date +%s) - t0 ))
  if [ -n "$sampler" ]; then kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true; fi
  peak=$(peak_of "$samples")
  result=ok
  case "$status" in
    0) ;;
    124|137) result="timed out after ${wall}s"; failed=1 ;;
    *) result="failed (exit $status)"; failed=1 ;;
  esac
}

# CubeCL's autotune results (its "environment" database under $XDG_CACHE_HOME/cubecl, where
# a run outside a Cargo project keeps them): restored from $dir/cubecl-cache.tar.gz before the
# runs, so a second device call (a fresh machine) does not autotune again, and saved to
# $OUT/cubecl-cache.tar.gz after them (docs/backends.md, "On a GPU").
cache_home() { echo "${XDG_CACHE_HOME:-$HOME/.cache}"; }

restore_autotune_cache() {
  local archive="$1/cubecl-cache.tar.gz" home
  home=$(cache_home)
  if [ -s "$archive" ]; then
    mkdir -p "$home"
    if tar -xzf "$archive" -C "$home" cubecl 2>/dev/null; then
      say "autotune cache restored from $archive ($(du -sk "$home/cubecl" | cut -f1) KiB)"
    else
      say "warning: could not unpack $archive; the runs autotune from scratch"
    fi
  else
    say "no autotune cache in $1 (cubecl-cache.tar.gz): the first steps of each run autotune"
  fi
}

save_autotune_cache() {
  local out="$1" home
  home=$(cache_home)
  [ -d "$home/cubecl" ] || return 0
  if tar -czf "$out/cubecl-cache.tar.gz.part" -C "$home" cubecl 2>/dev/null; then
    mv "$out/cubecl-cache.tar.gz.part" "$out/cubecl-cache.tar.gz"
  else
    rm -f "$out/cubecl-cache.tar.gz.part"
  fi
}

self_test() {
  local tmp got
  tmp=$(mktemp -d)
  # Windows of 10 steps: the first (compilation) at 100 tokens/s is left out; the next two at
  # 1000 and 4000 tokens/s take 0.01 and 0.0025 s per token, so 20 steps' tokens over
  # 0.0125 s of tokens: 1600 tokens/s; the last, 5-step window at 2000 tokens/s adds 5 steps
  # in 0.0025: 25 / 0.015 = 1666.7.
  cat >"$tmp/metrics.jsonl" <<'EOF'
{"step":10,"split":"train","metric":"loss","value":5.5}
{"step":10,"split":"train","metric":"tokens_per_s","value":100.0}
{"step":20,"split":"train","metric":"loss","value":4.0}
{"step":20,"split":"train","metric":"tokens_per_s","value":1000}
{"step":30,"split":"train","metric":"loss","value":3.5}
{"step":30,"split":"train","metric":"tokens_per_s","value":4.0e3}
{"step":35,"split":"train","metric":"loss","value":3.25}
{"step":35,"split":"train","metric":"tokens_per_s","value":2000.0}
{"step":35,"split":"valid","metric":"loss","value":3.125}
{"step":35,"split":"valid","metric":"bpc","value":4.5}
{"step":20,"split":"train","metric":"device_mib_reserved_peak","value":2113.0}
{"step":35,"split":"train","metric":"device_mib_reserved_peak","value":2344.4}
{"step":35,"split":"train","metric":"device_mib_reserved","value":2264.3}
EOF
  got=$(summarize_metrics "$tmp/metrics.jsonl")
  local want=$'35\t1666.7\t100.0\t3.2500\t3.1250\t2344'
  printf '%s\n' 250 1200 81000 abc 900 >"$tmp/smi"
  local peak empty
  peak=$(peak_of "$tmp/smi")
  : >"$tmp/empty"
  empty=$(summarize_metrics "$tmp/empty")
  rm -rf "$tmp"
  if [ "$got" != "$want" ]; then
    echo "self-test FAILED: summary '$got', expected '$want'" >&2
    exit 1
  fi
  if [ "$peak" != 81000 ]; then
    echo "self-test FAILED: peak '$peak', expected 81000" >&2
    exit 1
  fi
  if [ "$empty" != $'-\t-\t-\t-\t-\t-' ]; then
    echo "self-test FAILED: an empty metrics file gave '$empty'" >&2
    exit 1
  fi
  # The kernel profile: 6 + 2 ms of one matmul (two shapes, one name), 1.5 ms of a fused
  # kernel in µs, 0.5 ms of a reduce in ns, 0.5 ms of an unfused binary op; a compilation line
  # between them is skipped.
  tmp=$(mktemp -d)
  cat >"$tmp/profile.log" <<'EOF'
| 6ms        | MatmulEntry | TensorArgs | SimpleMatmulFamily | UnitPartitioner | RowMajor_9c249f6e
let v1 = 2;
| 2.0ms      | MatmulEntry | TensorArgs | SimpleMatmulFamily | UnitPartitioner | RowMajor_f2e10182
| 1500µs     | ElemwiseFuse_0366e1b2
| 500000ns   | ReduceKernel_12ab
| 0.5ms      | KernelBinop_77
EOF
  local prof want_prof
  prof=$(summarize_profile "$tmp/profile.log" 2)
  want_prof=$'kernels: 5 launches, 10.5 ms of kernel time\n    76.2%        8.0 ms       2 x  MatmulEntry SimpleMatmulFamily\n    14.3%        1.5 ms       1 x  ElemwiseFuse\nby kind: matmul 76.2%; reduce 4.8%; fused elementwise 14.3%; elementwise 4.8%'
  rm -rf "$tmp"
  if [ "$prof" != "$want_prof" ]; then
    printf 'self-test FAILED: the profile summary is\n%s\nexpected\n%s\n' "$prof" "$want_prof" >&2
    exit 1
  fi
  # The autotune cache: saved from one cache folder, restored into another.
  tmp=$(mktemp -d)
  mkdir -p "$tmp/a/cubecl/env" "$tmp/out" "$tmp/b"
  echo tuned >"$tmp/a/cubecl/env/db"
  (XDG_CACHE_HOME="$tmp/a" save_autotune_cache "$tmp/out")
  mkdir -p "$tmp/dir" && cp "$tmp/out/cubecl-cache.tar.gz" "$tmp/dir/" 2>/dev/null || true
  (XDG_CACHE_HOME="$tmp/b" restore_autotune_cache "$tmp/dir" >/dev/null)
  local restored
  restored=$(cat "$tmp/b/cubecl/env/db" 2>/dev/null || echo missing)
  rm -rf "$tmp"
  if [ "$restored" != tuned ]; then
    echo "self-test FAILED: the autotune cache came back as '$restored'" >&2
    exit 1
  fi
  echo "self-test passed"
}

# ------------------------------------------------------------------------------------------
dir=.gpu
here=$(cd "$(dirname "$0")" && pwd)
device=wgpu-vulkan
presets="xl-enwik8-base memorizing-paper"
steps=300
max_seconds=120
peer_seconds=60
peer=1
products=1
profile_steps=6
profile=1
grace=45
log_every=10
eval_segments=4
work=/tmp/memzoo-gpu-check
keep=0
extra=()        # --set arguments, each "PRESET:K=V" or ":K=V" (every preset)
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir=${2:?--dir needs a folder}; shift 2 ;;
    --device) device=${2:?--device needs a device string}; shift 2 ;;
    --presets) presets=${2:?--presets needs names}; shift 2 ;;
    --steps) steps=${2:-}; positive --steps "$steps"; shift 2 ;;
    --max-seconds) max_seconds=${2:-}; positive --max-seconds "$max_seconds"; shift 2 ;;
    --grace) grace=${2:-}; positive --grace "$grace"; shift 2 ;;
    --log-every) log_every=${2:-}; positive --log-every "$log_every"; shift 2 ;;
    --eval-segments) eval_segments=${2:-}; positive --eval-segments "$eval_segments"; shift 2 ;;
    --set)
      arg=${2:-}
      if [[ "$arg" =~ ^([a-z0-9-]+):([a-z_][a-z0-9_.]*=.*)$ ]]; then
        extra+=("${BASH_REMATCH[1]}:${BASH_REMATCH[2]}")
      elif [[ "$arg" =~ ^[a-z_][a-z0-9_.]*=.*$ ]]; then
        extra+=(":$arg")
      else
        die "--set takes SECTION.FIELD=VALUE or PRESET:SECTION.FIELD=VALUE, got '$arg'"
      fi
      shift 2 ;;
    --work) work=${2:?--work needs a folder}; shift 2 ;;
    --keep) keep=1; shift ;;
    --peer-seconds) peer_seconds=${2:-}; positive --peer-seconds "$peer_seconds"; shift 2 ;;
    --no-peer) peer=0; shift ;;
    --no-products) products=0; shift ;;
    --products) products=forced; shift ;;
    --profile-steps) profile_steps=${2:-}; positive --profile-steps "$profile_steps"; profile=forced; shift 2 ;;
    --no-profile) profile=0; shift ;;
    --tiny)
      tiny_mode=1
      # The presets' layer kinds and schedules stay; only sizes shrink. Put before the
      # caller's own --set (memzoo applies them in order), so those win wherever given.
      tiny=(model.n_layers=2 model.d_model=64 model.n_heads=4 model.d_head=16 model.d_inner=128
            model.mem_len=16 train.batch=2 train.tgt_len=16)
      sets=()
      for t in "${tiny[@]}"; do sets+=(":$t"); done
      # After the common sizes, so that a preset's own win: memorizing-paper with its kNN
      # layer second of two; reformer-enwik8 (not a default preset) with one local and one LSH
      # layer, axial positions as wide as the model, chunks and buckets of the tiny segment
      # and no memory (axial positions index one segment).
      sets+=('memorizing-paper:model.layers=["t5","knn"]' 'memorizing-paper:model.knn.max_memories=256'
             'memorizing-paper:model.vocab_size=256'
             'reformer-enwik8:model.layers=["local","lsh"]' 'reformer-enwik8:model.axial.dims=[32,32]'
             'reformer-enwik8:model.lsh.chunk_len=8' 'reformer-enwik8:model.lsh.local_chunk_len=8'
             'reformer-enwik8:model.lsh.n_buckets=4' 'reformer-enwik8:model.mem_len=0')
      extra=("${sets[@]}" ${extra[@]+"${extra[@]}"})
      shift ;;
    --self-test) self_test; exit 0 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown option '$1'" ;;
  esac
done

if [ "${tiny_mode:-0}" = 1 ] && [ "$products" != forced ]; then products=0; fi
if [ "${tiny_mode:-0}" = 1 ] && [ "$profile" != forced ]; then profile=0; fi

for run in $presets; do
  case "$run" in
    *@*@*) die "--presets: '$run' has more than one variant" ;;
    memorizing-*@hnsw|memorizing-paper@no-knn) ;;
    *@*) die "--presets: '$run': the variants are PRESET@hnsw (a memorizing preset) and memorizing-paper@no-knn" ;;
  esac
done

# Sets `sets` to the --set arguments of `extra` that apply to preset $1 (":K=V" for every
# preset, "PRESET:K=V" for that one), in order.
preset_sets() {
  sets=()
  local e
  for e in ${extra[@]+"${extra[@]}"}; do
    case "$e" in
      ":"*) sets+=(--set "${e#:}") ;;
      "$1:"*) sets+=(--set "${e#"$1":}") ;;
    esac
  done
}

# memorizing-paper's layers with its kNN layer (the 9th of 12; --tiny: the 2nd of 2) a T5 one.
no_knn_layers() {
  local n=12 list="" i
  [ "${tiny_mode:-0}" = 1 ] && n=2
  for ((i = 0; i < n; i++)); do list+="${list:+,}\"t5\""; done
  echo "[$list]"
}

[ -d "$dir" ] || die "no folder '$dir': run xtask/gpu/prepare.sh first (here, with cargo), and carry it"
dir=$(cd "$dir" && pwd)
corpus="$dir/corpus.txt.gz"
[ -s "$dir/memzoo.gz" ] || die "no '$dir/memzoo.gz': run xtask/gpu/prepare.sh first"
[ -s "$corpus" ] || die "no corpus '$corpus': run xtask/gpu/prepare.sh first"

mkdir -p "$work"
work=$(cd "$work" && pwd)
# The binary travels gzipped (stripped it is ~80 MB); unpacked once per copy of it: again
# whenever the archive's checksum differs from the one it was unpacked from (another --dir's
# build, an older one with a newer date).
bin="$work/memzoo"
sum=$(cksum <"$dir/memzoo.gz")
if [ ! -x "$bin" ] || [ "$(cat "$bin.cksum" 2>/dev/null)" != "$sum" ]; then
  gzip -dc "$dir/memzoo.gz" >"$bin.part" && chmod +x "$bin.part" && mv "$bin.part" "$bin"
  echo "$sum" >"$bin.cksum"
fi
log="$work/gpu-check.log"
summary_file="$work/gpu-check-summary.txt"
rm -f "$summary_file"


# The check itself; its output goes to the terminal and the log (below).
check() {
  started=$(date +%s)
  say "$(date -u +%FT%TZ) on $(uname -n), device $device, $steps steps and at most ${max_seconds}s of training per run"
  [ -f "$dir/MANIFEST" ] && sed 's/^/  built: /' "$dir/MANIFEST"

  # What the binary was built with: autotune and fusion (`wgpu`) are for a real GPU; llvmpipe
  # needs `wgpu-plain` (docs/backends.md).
  features=$(sed -n 's/^features=//p' "$dir/MANIFEST" 2>/dev/null || true)
  case "$device:$features" in
    wgpu-gl*:wgpu) say "warning: a '--features wgpu' build on GL: on llvmpipe CubeCL's autotune can deadlock wgpu's GL backend; build with --features wgpu-plain for the CPU" ;;
    wgpu-vulkan*:wgpu-plain) say "warning: a '--features wgpu-plain' build: no autotune or fusion, so the GPU numbers understate what 'wgpu' gives" ;;
  esac

  # ------------------------------------------------------------------------------------------
  # The loaders and the driver. wgpu opens libvulkan.so.1 (Vulkan) or libEGL.so.1 (GL) at run
  # time; an image without them gets the Debian packages prepare.sh downloaded, unpacked into /
  # (root only; README of the workplace's device notes).
  needed_lib=libvulkan.so.1
  case "$device" in wgpu-gl*) needed_lib=libEGL.so.1 ;; esac
  # (grep without -q reads all of ldconfig's output: -q would stop early and, under pipefail,
  # ldconfig's SIGPIPE on a long listing would read as "not found".)
  has_lib() { ldconfig -p 2>/dev/null | grep -F "$1 " >/dev/null; }
  if ! has_lib "$needed_lib"; then
    debs=("$dir"/gl/*.deb)
    if [ -e "${debs[0]}" ] && [ "$(id -u)" = 0 ]; then
      say "$needed_lib not found: unpacking ${#debs[@]} loader packages from $dir/gl into /"
      for f in "${debs[@]}"; do dpkg -x "$f" /; done
      ldconfig
    elif [ -e "${debs[0]}" ]; then
      say "warning: $needed_lib not found, and unpacking $dir/gl/*.deb into / needs root"
    else
      say "warning: $needed_lib not found and no loader packages in $dir/gl (prepare.sh downloads them)"
    fi
  fi
  if has_lib "$needed_lib"; then
    say "$needed_lib: $(ldconfig -p | grep -F "$needed_lib " | sed -n '1s/.*=> //p')"
  fi

  # NVIDIA's Vulkan and EGL driver manifests: where the loaders look first, else the driver's
  # own folder (a read-only mount on these machines).
  smi=0
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    smi=1
    say "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
    case "$device" in
      wgpu-vulkan*|wgpu|wgpu:*)
        icd=""
        for d in /etc/vulkan/icd.d /usr/share/vulkan/icd.d /usr/local/share/vulkan/icd.d; do
          for f in "$d"/nvidia*.json; do [ -f "$f" ] && icd=$f && break 2; done
        done
        if [ -n "${VK_DRIVER_FILES:-}${VK_ICD_FILENAMES:-}" ]; then
          say "Vulkan driver manifest from the environment: ${VK_DRIVER_FILES:-$VK_ICD_FILENAMES}"
        elif [ -n "$icd" ]; then
          say "Vulkan driver manifest: $icd"
        elif [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
          export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
          egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
          [ -f "$egl" ] && export __EGL_VENDOR_LIBRARY_FILENAMES=$egl
          say "Vulkan driver manifest: $VK_DRIVER_FILES (the driver's folder)"
        else
          say "warning: no NVIDIA Vulkan driver manifest (nvidia*_icd.json) found; wgpu may find no GPU"
        fi ;;
    esac
  else
    say "no nvidia-smi (or no GPU): peak GPU memory is not measured"
  fi

  # wgpu wants a private runtime folder. (The runs start in $work, which has no Cargo.toml
  # above it, so CubeCL keeps its autotune cache in ~/.cache/cubecl, not under the checkout.)
  if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "${XDG_RUNTIME_DIR}" ]; then
    export XDG_RUNTIME_DIR="$work/xdg-runtime"
  fi
  mkdir -p "$XDG_RUNTIME_DIR" && chmod 0700 "$XDG_RUNTIME_DIR"
  restore_autotune_cache "$dir"

  # ------------------------------------------------------------------------------------------
  # The device's own float32 products at the shapes xl-enwik8-base trains with, to set the
  # runs' tokens/s against (a step is mostly these products; docs/backends.md).
  product_lines=""
  if [ "$products" != 0 ]; then
    say "---- matrix products on $device (memzoo devices --measure)"
    status=0
    product_lines=$(cd "$work" && timeout -k 10 120 "$bin" devices --measure "$device" --repeats 5) \
      || status=$?
    echo "$product_lines"
    [ "$status" = 0 ] || say "warning: the product timings failed or timed out (status $status)"
  fi

  # ------------------------------------------------------------------------------------------
  # Large-shape operations against the host (`memzoo devices --verify`: sums, top-k, index
  # ranges past 65,535 elements, the kNN device search, the Reformer's device sort). Reported,
  # not fatal: on Mesa's software drivers some of Burn's reductions are wrong there
  # (docs/backends.md), and this says whether this device's are.
  verify_lines=""
  say "---- large-shape operations on $device (memzoo devices --verify)"
  status=0
  verify_lines=$(cd "$work" && timeout -k 10 120 "$bin" devices --verify "$device" 2>&1) \
    || status=$?
  echo "$verify_lines"
  [ "$status" = 0 ] || say "warning: an operation memzoo's models use was wrong (status $status)"

  # ------------------------------------------------------------------------------------------
  rows=()
  failed=0
  for run in $presets; do
    preset=${run%%@*}
    run_dir="$work/runs/$run"
    samples="$work/$run.smi"
    : >"$samples"
    say "---- $run: $steps steps on $device (cap ${max_seconds}s of training, then ${grace}s for the end)"
    sampler=""
    if [ "$smi" = 1 ]; then
      nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$samples" 2>/dev/null &
      sampler=$!
    fi
    preset_sets "$preset"
    # A variant's settings come last, so they win over the preset's and --tiny's.
    case "$run" in
      *@hnsw) sets+=(--set model.knn.index=hnsw) ;;
      *@no-knn) sets+=(--set "model.layers=$(no_knn_layers)") ;;
    esac
    t0=$(date +%s)
    status=0
    # SIGINT first: memzoo then saves a checkpoint and stops cleanly; SIGKILL 30 s later.
    (cd "$work" && timeout -s INT -k 30 $((max_seconds + grace)) "$bin" train \
        --device "$device" --preset "$preset" --data "$corpus" \
        --steps "$steps" --run-dir "$run_dir" --overwrite \
        --set train.max_seconds="$max_seconds" --set train.log_every="$log_every" \
        --set train.eval_every=0 --set train.eval_segments="$eval_segments" \
        --set train.checkpoint_every=0 --set train.keep_checkpoints=1 \
        ${sets[@]+"${sets[@]}"}) || status=$?
    finish_run
    metrics="$run_dir/metrics.jsonl"
    if [ -f "$metrics" ]; then
      IFS=$'\t' read -r last tps first loss vloss alloc < <(summarize_metrics "$metrics")
    else
      last=- tps=- first=- loss=- vloss=- alloc=-
    fi
    rows+=("$(printf '%-24s %6s %12s %12s %9s %9s %8s %8s %6s  %s' \
      "$run" "$last" "$tps" "$first" "$peak" "$alloc" "$loss" "$vloss" "$wall" "$result")")
  done

  # The XL peer on the same machine: HF TransfoXL with the same model, batch and corpus
  # (xtask/gpu/peer_tfxl.py), on this machine's python3 and torch with the wheels prepare.sh
  # brought (transformers 4.37.2, the last with TransfoXL). Its peak is measured the same way.
  if [ "$peer" = 1 ] && [[ " $presets " == *" xl-enwik8-base "* ]]; then
    peer_device=cuda
    [ "${tiny_mode:-0}" = 1 ] && peer_device=cpu
    row=""
    if ! ls "$dir"/whl/transformers-*.whl >/dev/null 2>&1; then
      say "no peer wheels in $dir/whl (prepare.sh downloads them): the peer is skipped"
    elif ! python3 -c "import torch, sys; sys.exit(0 if '$peer_device' == 'cpu' or torch.cuda.is_available() else 1)" 2>/dev/null; then
      say "python3 has no torch with $peer_device: the peer is skipped"
    else
      say "---- hf-transfoxl (the peer): xl-enwik8-base's model and batch on $peer_device, ${peer_seconds}s of training"
      # A python3 that has TransfoXL already (a peers' venv first on PATH) keeps its own.
      if ! python3 -c "from transformers import TransfoXLLMHeadModel" >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
          --target "$work/site" "$dir"/whl/*.whl >/dev/null \
          || say "warning: installing the peer's wheels failed; the peer will fail to import"
      fi
      samples="$work/peer.smi"
      : >"$samples"
      sampler=""
      if [ "$smi" = 1 ]; then
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$samples" 2>/dev/null &
        sampler=$!
      fi
      peer_args=(--device "$peer_device" --steps "$steps" --max-seconds "$peer_seconds" --log-every "$log_every")
      [ "${tiny_mode:-0}" = 1 ] && peer_args+=(--tiny)
      t0=$(date +%s)
      status=0
      PYTHONPATH="$work/site" PYTHONUNBUFFERED=1 timeout -k 10 $((peer_seconds + grace)) \
        python3 "$here/peer_tfxl.py" "$corpus" "${peer_args[@]}" >"$work/peer.out" 2>&1 || status=$?
      cat "$work/peer.out"
      finish_run
      json=$(grep '^{"peer"' "$work/peer.out" | tail -1 || true)
      field() { sed -n "s/.*\"$1\": \([^,}]*\).*/\1/p" <<<"$json" | tr -d '"'; }
      last=$(field steps); tps=$(field tokens_per_s); first=$(field first_window_tokens_per_s)
      loss=$(field loss)
      rows+=("$(printf '%-24s %6s %12s %12s %9s %9s %8s %8s %6s  %s' \
        "hf-transfoxl" "${last:--}" "${tps:--}" "${first:--}" "$peak" "-" "${loss:--}" "-" "$wall" "$result")")
    fi
  fi

  # ------------------------------------------------------------------------------------------
  # Where each preset's time goes on this device: every preset of the check again (not the
  # @variants) for $profile_steps steps with CubeCL's kernel profiler on (a cubecl.toml in the
  # run's folder: CubeCL reads it from the working folder up). Each kernel is timed on its own,
  # so these runs are apart from the timed ones; their autotune choices are the cached ones of
  # the runs above. At most 70 s each.
  profile_lines=""
  if [ "$profile" != 0 ]; then
    for preset in $(printf '%s\n' $presets | sed 's/@.*//' | awk '!seen[$0]++'); do
      pdir="$work/profile-$preset"
      rm -rf "$pdir" && mkdir -p "$pdir"
      printf '[profiling.logger]\nfile = "%s"\nlevel = "basic"\n' "$pdir/kernels.log" >"$pdir/cubecl.toml"
      say "---- kernel profile: $preset, $profile_steps steps on $device"
      preset_sets "$preset"
      t0=$(date +%s)
      status=0
      (cd "$pdir" && timeout -s INT -k 10 60 "$bin" train \
          --device "$device" --preset "$preset" --data "$corpus" \
          --steps "$profile_steps" --run-dir "$pdir/run" --overwrite \
          --set train.log_every="$profile_steps" --set train.eval_every=0 \
          --set train.eval_segments=1 --set train.checkpoint_every=0 \
          --set train.keep_checkpoints=1 ${sets[@]+"${sets[@]}"}) || status=$?
      if [ -s "$pdir/kernels.log" ]; then
        lines=$(
          echo "kernel profile of $preset ($profile_steps steps and 1 validation segment, $(( $(date +%s) - t0 )) s, exit $status):"
          summarize_profile "$pdir/kernels.log" 15
        )
        if [ -n "${OUT:-}" ] && [ -d "${OUT}" ]; then
          gzip -c "$pdir/kernels.log" >"$OUT/cubecl-kernels-$preset.log.gz"
        fi
      else
        lines="kernel profile of $preset: CubeCL wrote none (exit $status)"
      fi
      echo "$lines"
      profile_lines+="${profile_lines:+$'\n'}$lines"
      [ "$keep" = 1 ] || rm -rf "$pdir"
    done
  fi

  summary=$(
    echo "memzoo GPU check on $device ($(sed -n 's/^commit=//p' "$dir/MANIFEST" 2>/dev/null || echo '?'), features ${features:-?}):"
    printf '%-24s %6s %12s %12s %9s %9s %8s %8s %6s  %s\n' \
      preset steps "tokens/s" "1st window" "peak MiB" "alloc MiB" "loss" "valid" "wall s" result
    printf '%s\n' "${rows[@]}"
    echo "tokens/s: over the logged windows after the first; 1st window: its tokens/s (compilation,"
    echo "autotune); peak MiB: nvidia-smi's memory.used, the whole GPU, sampled every 200 ms ('-': not"
    echo "measured); alloc MiB: the most memzoo's device allocator held, each pool's peak summed"
    echo "(device_mib_reserved_peak; the rest of peak MiB is the driver's context and other"
    echo "processes); loss: the last window's training loss (nats); valid: $eval_segments validation"
    echo "segments at the end."
    [ -z "$product_lines" ] || echo "$product_lines"
    [ -z "$verify_lines" ] || echo "$verify_lines"
    [ -z "$profile_lines" ] || echo "$profile_lines"
  )
  echo
  echo "$summary"
  say "total $(( $(date +%s) - started ))s; log: $log"

  echo "$summary" >"$summary_file"
  [ "$keep" = 1 ] || rm -rf "$work/runs"
  return "$failed"
}

# (Not `check | tee || rc=$?`: under `||` bash ignores `set -e` inside the function.)
set +e
(set -e; check) 2>&1 | tee "$log"
rc=$?
set -e
# The device tool brings back what is under $OUT.
if [ -n "${OUT:-}" ] && [ -d "${OUT}" ]; then
  cp "$log" "$OUT/gpu-check.log"
  [ -f "$summary_file" ] && cp "$summary_file" "$OUT/gpu-check-summary.txt"
  save_autotune_cache "$OUT"
fi
exit "$rc"
