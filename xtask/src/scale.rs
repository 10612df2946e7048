//! `cargo xtask bench scale`: how memzoo's cost grows with the dimension each family grows, side
//! by side with the PyTorch peer where it runs (issue 27).
//!
//! ```text
//! cargo xtask bench scale [--families xl,memorizing,reformer,generate] [--quick] [--lengths ...]
//!     [--steps N] [--warmup N] [--no-peers] [--out FILE.jsonl] [--plot DIR]
//! ```
//!
//! Curves (`--families`; default `xl,memorizing`; `--lengths` overrides the x values of each;
//! `generate-<family>` is that family's generation curve alone):
//!
//! - **`xl`**: XL-small (`bench xl-small`'s config: batch 8, segments of 128) against its
//!   memory length, 128 -> 4,096 (quick: 128, 512). Training (forward + backward + AdamW) and
//!   evaluation (forward) tokens/s and peak RSS, the memory filled (random hidden states of
//!   the full length) before the first step. HF TransfoXL 4.37.2 beside it at the same points
//!   with the same filled memory (`xtask/peers/scale.py`, run with
//!   `~/.cache/memzoo-peers/venv-tfxl`; `bench_peers.py` has no memory-length option).
//!   Expected growth: **linear** in the memory length (keys, values and scores over
//!   `mem + 128` keys, the memory's keys and values recomputed each segment): the table
//!   compares the step time's growth with the FLOP count's ([`crate::flops`]).
//! - **`xl-recompute`**: the `xl` curve's training with `recompute_attention` (the fused
//!   attention keeps no probabilities for the backward pass and computes them again there),
//!   HF TransfoXL's training beside it: what the probabilities cost in memory, and their
//!   second computation in time.
//! - **`memorizing`**: Memorizing-small (`bench memorizing-small`'s config: batch 2, seq 512,
//!   kNN layer 4, top-32, multi-query) against the kNN store size per row, 8K -> 262K (quick:
//!   8K, 32K), exact and HNSW (the preset's connectivity; the search expansion of a store of
//!   that size, `HnswConfig::expansion_search_for`). The stores are filled with **the model's
//!   own keys**: the kNN layer's normalised keys of the untrained Memorizing-small (seed 0)
//!   reading tiny Shakespeare (8 rows of ~33K bytes, row by row; the generated corpus where
//!   `../shared` is missing; kept in the temporary directory, see [`keys_file`]). Each point
//!   also times one search of the next 512 keys of the text (real queries are not stored;
//!   queries and keys share the unit sphere) against row 0's store, and each HNSW point its
//!   recall@32 against an exact search over the same keys. Expected growth: search **linear**
//!   in the store size with exact search, **sublinear** (about logarithmic) with HNSW at a
//!   fixed expansion. A third kind, `hnsw64`, searches HNSW at a fixed expansion of 64 (a
//!   recall/speed setting of the kind the peer's faiss index uses, its recall measured);
//!   `exactf32`, `exactint8`, `exactint8avx2` and `exactint8avxvnni` (the AVX2 or AVX-VNNI
//!   kernel even where the CPU has AVX-512 VNNI) choose exact search's scoring on the host
//!   (`exact` takes the
//!   default, int8 where the CPU has AVX-512 VNNI).
//!   memorizing-transformers-pytorch beside it (`xtask/peers/scale.py
//!   memorizing train N`: `bench_peers.py`'s `memorizing-small`, faiss HNSW with M 15, each
//!   row's memory prefilled with N random unit keys) until a point fails.
//! - **`reformer`**: Reformer-small (reversible, LSH bucket 64, 4 rounds, batch 1) against the
//!   sequence length, 4K -> 64K (quick: 4K, 8K), one training step per point after a warm-up
//!   step on a short sequence; reformer-pytorch beside it (`xtask/peers/scale.py`, the peers'
//!   `venv`) until a point fails: out of its 12 GiB address space or past [`PEER_LIMIT_S`].
//!   Expected growth: **n log n** (chunked attention is linear, the sort n log n; the
//!   hashing's `n / 64` buckets per round make a small quadratic term, see [`crate::flops`]).
//! - **`generate`**: six curves, `generate-xl`, `generate-memorizing`, `generate-reformer`,
//!   `generate-compressive`, `generate-rmt` and `generate-block-recurrent`: each family's
//!   small model generating 16 tokens (quick 8; `--steps`; the last three a whole segment)
//!   greedily, batch 1, after a prompt of random tokens, the prompt's reading not timed
//!   ([`generate_point`]). XL-small one token per segment over an XL memory covering the
//!   context (128 -> 4,096; quick 128, 512), with the generator's key/value and position
//!   caches: HF TransfoXL beside it, one token per forward with `mems` (what its `generate`
//!   does after the prompt). Memorizing-small in its 512-token training segments, its kNN
//!   memory (exact search) holding the context (512 -> 32K; quick 512, 2K): no peer
//!   (memorizing-transformers-pytorch has no generation). Reformer-small reading the window of
//!   the last `context` tokens again per token (512 -> 4,096; quick 512, 1K):
//!   reformer-pytorch beside it, the same window per token. Expected growth per token: XL
//!   **linear** in the context with a small slope (scores and values over the cached keys;
//!   before the caches, the keys', values' and positions' projections too); Memorizing
//!   **flat** but for the exact search, linear in the store; the Reformer **n log n** in the
//!   window (a whole forward pass per token). The compressive, RMT and Block-Recurrent models
//!   of `bench quality`'s recipes generate 128 tokens after contexts of 512 -> 8K (quick 512,
//!   2K) in their training segments, beside their lucidrains peers' own generate loops
//!   (`xtask/peers/scale.py`); their state is of a fixed size, so a token's cost is **flat** in
//!   the context and grows with its position in the unfinished segment, which both sides read
//!   again for every token.
//!
//! Every point runs in its own process (its own peak RSS). Every line is a [`Measurement`]
//! named `scale-<curve>-<x>`, its `implementation` memzoo or the peer, its `config` holding
//! `curve` and `x`, printed and appended to `--out` as it comes; the suite then prints one table
//! per curve and writes two SVGs per curve beside `--out` ([`write_plots`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use burn::module::Module;
use burn::tensor::{Device, Distribution, Tensor};
use memzoo_memory::keys::{fill, recall, retrieved_ids, segment_tensors};
use memzoo_memory::{HostScoring, IndexKind, KnnMemoryConfig};
use memzoo_stack::{MemorizingConfig, ReformerConfig, XlMemory, XlState};
use memzoo_train::Segment;
use memzoo_train::TrainConfig;
use memzoo_train::parallel::{eval_step_sharded, shard_rows, train_step_sharded};
use rand::{Rng, SeedableRng, rngs::StdRng};

use crate::BenchArgs;
use crate::measure::{Measurement, time_steps};
use crate::plot::{Series, line_chart};

/// The x values of a curve: `--lengths`, else the defaults.
fn points(curve: &str, args: &BenchArgs) -> Vec<usize> {
    if let Some(l) = &args.lengths {
        return l.clone();
    }
    match (curve, args.quick) {
        ("xl" | "xl-recompute", true) => vec![128, 512],
        ("xl" | "xl-recompute", false) => vec![128, 256, 512, 1024, 2048, 4096],
        ("memorizing", true) => vec![8_192, 32_768],
        ("memorizing", false) => vec![8_192, 16_384, 32_768, 65_536, 131_072, 262_144],
        ("reformer", true) => vec![4_096, 8_192],
        ("generate-xl", true) => vec![128, 512],
        ("generate-xl", false) => vec![128, 512, 1_024, 2_048, 4_096],
        ("generate-memorizing", true) => vec![512, 2_048],
        ("generate-memorizing", false) => vec![512, 2_048, 8_192, 32_768],
        ("generate-reformer", true) => vec![512, 1_024],
        ("generate-reformer", false) => vec![512, 1_024, 2_048, 4_096],
        (c, true)
            if RECURRENT_GENERATORS
                .iter()
                .any(|f| c == format!("generate-{f}")) =>
        {
            vec![512, 2_048]
        }
        (c, false)
            if RECURRENT_GENERATORS
                .iter()
                .any(|f| c == format!("generate-{f}")) =>
        {
            vec![512, 2_048, 8_192]
        }
        _ => vec![4_096, 8_192, 16_384, 32_768, 65_536],
    }
}

/// Warm-up and timed steps of a point: `--warmup` / `--steps`, else 1 and 3 (quick: 1 and 2).
fn steps(args: &BenchArgs) -> (usize, usize) {
    (
        args.warmup.unwrap_or(1),
        args.steps.unwrap_or(if args.quick { 2 } else { 3 }),
    )
}

/// The suite: every curve of `--families`, every point in a child process, the peer's beside.
pub fn suite(args: &BenchArgs, device: &Device) -> Result<Vec<Measurement>, String> {
    let curves = args
        .families
        .clone()
        .unwrap_or_else(|| vec!["xl".into(), "memorizing".into()]);
    let mut out = Vec::new();
    for curve in &curves {
        let xs = points(curve, args);
        match curve.as_str() {
            "xl" => {
                for &mem in &xs {
                    for mode in ["train", "eval"] {
                        let target = format!("scale-xl-{mode}-{mem}");
                        keep(&mut out, args, child(&target, args, &[])?)?;
                        if !args.no_peers {
                            keep(&mut out, args, peer(&["xl", mode, &mem.to_string()], args)?)?;
                        }
                    }
                }
            }
            // XL-small's training with `recompute_attention`, HF's training beside it.
            "xl-recompute" => {
                for &mem in &xs {
                    let target = format!("scale-xl-recompute-{mem}");
                    keep(&mut out, args, child(&target, args, &[])?)?;
                    if !args.no_peers {
                        keep(
                            &mut out,
                            args,
                            peer(&["xl", "train", &mem.to_string()], args)?,
                        )?;
                    }
                }
            }
            "memorizing" => {
                let max = xs.iter().copied().max().unwrap_or(0);
                let path = keys_file(max + 512, device)?;
                let env = [("MEMZOO_SCALE_KEYS", path.display().to_string())];
                let mut peer_ok = !args.no_peers;
                // `hnsw64`: HNSW at a fixed small expansion, the kind of setting the peer's
                // faiss index searches with.
                let kinds = args
                    .index_kinds
                    .clone()
                    .unwrap_or_else(|| ["exact", "hnsw", "hnsw64"].map(String::from).to_vec());
                if let Some(k) = kinds.iter().find(|k| IndexChoice::parse(k).is_none()) {
                    return Err(format!(
                        "--index-kinds: `{k}` is not exact, exactf32, exactint8, exactint8avx2, \
                         exactint8avxvnni, hnsw or \
                         hnsw<ef>[m<M>][a<ef_add>] \
                         (each number > 0)"
                    ));
                }
                for &n in &xs {
                    for kind in &kinds {
                        let target = format!("scale-memorizing-{kind}-{n}");
                        keep(&mut out, args, child(&target, args, &env)?)?;
                    }
                    // memorizing-transformers-pytorch (faiss HNSW) until a point fails.
                    if peer_ok {
                        let p = peer(&["memorizing", "train", &n.to_string()], args)?;
                        peer_ok = !p.is_empty();
                        keep(&mut out, args, p)?;
                        if !peer_ok {
                            eprintln!("scale: the peer's Memorizing curve stops at {n}");
                        }
                    }
                }
            }
            "reformer" => {
                let mut peer_ok = !args.no_peers;
                for &len in &xs {
                    keep(
                        &mut out,
                        args,
                        child(&format!("scale-reformer-{len}"), args, &[])?,
                    )?;
                    if peer_ok {
                        let p = peer(&["reformer", "train", &len.to_string()], args)?;
                        peer_ok = !p.is_empty();
                        keep(&mut out, args, p)?;
                        if !peer_ok {
                            eprintln!("scale: the peer's Reformer curve stops at {len}");
                        }
                    }
                }
            }
            c if c == "generate" || GENERATORS.iter().any(|f| c == format!("generate-{f}")) => {
                // `generate`: every family's curve; `generate-<family>`: that one.
                let families = GENERATORS
                    .into_iter()
                    .filter(|f| c == "generate" || c == format!("generate-{f}"));
                for family in families {
                    for &context in &points(&format!("generate-{family}"), args) {
                        let target = format!("scale-generate-{family}-{context}");
                        keep(&mut out, args, child(&target, args, &[])?)?;
                        // memorizing-transformers-pytorch has no generation.
                        if !args.no_peers && family != "memorizing" {
                            let point = [family, "generate", &context.to_string()];
                            keep(&mut out, args, peer(&point, args)?)?;
                        }
                    }
                }
            }
            other => {
                return Err(format!(
                    "unknown curve `{other}`: expected xl, xl-recompute, memorizing, reformer, \
                     generate or generate-<family> (one of {})",
                    GENERATORS.join(", ")
                ));
            }
        }
    }
    println!("{}", markdown(&out));
    Ok(out)
}

/// Prints a point's lines and appends them to `--out` as they come (a run cut short keeps its
/// points), then keeps them for the tables and charts.
fn keep(
    out: &mut Vec<Measurement>,
    args: &BenchArgs,
    lines: Vec<Measurement>,
) -> Result<(), String> {
    for m in lines {
        crate::emit(&m, args.out.as_ref())?;
        out.push(m);
    }
    Ok(())
}

/// Runs `cargo xtask bench <target>` (this binary) with the suite's options; its JSON lines.
/// A point that fails (out of memory) is reported on stderr and gives no line.
fn child(
    target: &str,
    args: &BenchArgs,
    env: &[(&str, String)],
) -> Result<Vec<Measurement>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.args(["bench", target, "--device", &args.device])
        .args(["--threads", &args.threads.to_string()]);
    if args.quick {
        cmd.arg("--quick");
    }
    for (flag, v) in [
        ("--steps", args.steps),
        ("--warmup", args.warmup),
        ("--replicas", args.replicas),
    ] {
        if let Some(v) = v {
            cmd.args([flag, &v.to_string()]);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    eprintln!("scale: {target}");
    let output = cmd.output().map_err(|e| e.to_string())?;
    let lines = json_lines(&output.stdout);
    if !output.status.success() || lines.is_empty() {
        eprintln!(
            "scale: {target} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(lines)
}

fn json_lines(stdout: &[u8]) -> Vec<Measurement> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str::<Measurement>(l).ok())
        .filter(|m| m.tokens_per_s > 0.0)
        .collect()
}

/// Seconds a peer's point may take (build, warm-up and steps) before it is stopped.
const PEER_LIMIT_S: u64 = 200;

/// The peer's point (`xtask/peers/scale.py CURVE MODE X`), with 2 threads under `nice`; no line
/// when the venv is missing or the point fails (out of memory: the script's address-space
/// limit of 12 GiB; or longer than [`PEER_LIMIT_S`]), which ends the peer's Reformer curve.
fn peer(point: &[&str], args: &BenchArgs) -> Result<Vec<Measurement>, String> {
    let home = std::env::var("HOME").unwrap_or_default();
    let venv = if point[0] == "xl" {
        "venv-tfxl"
    } else {
        "venv"
    };
    let python = PathBuf::from(home).join(format!(".cache/memzoo-peers/{venv}/bin/python"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/scale.py");
    if !python.exists() {
        eprintln!(
            "scale: no {} (bash ../shared/peers/setup.sh): no peer",
            python.display()
        );
        return Ok(Vec::new());
    }
    let (warmup, steps) = match point {
        ["reformer", ..] => (1, args.steps.unwrap_or(1)),
        ["memorizing", ..] => (1, args.steps.unwrap_or(2)),
        [family, "generate", ..] => (0, generate_tokens(family, args)),
        _ => steps(args),
    };
    // The recipes' peers take their model's numbers from memzoo's side.
    let config = match point {
        [f, "generate", ..] if RECURRENT_GENERATORS.contains(f) => {
            crate::quality::family(f)?.peer_model.to_string()
        }
        _ => "{}".to_string(),
    };
    eprintln!("scale: peer {}", point.join(" "));
    // A point past PEER_LIMIT_S is killed (`timeout`): it gives no line and ends the curve.
    let mut command = Command::new("timeout");
    crate::measure::cap_peer(&mut command);
    let output = command
        .arg(PEER_LIMIT_S.to_string())
        .args(["nice", "-n", "5"])
        .arg(python)
        .arg(script)
        .args(point)
        .args([
            "--warmup",
            &warmup.to_string(),
            "--steps",
            &steps.to_string(),
            "--config",
            &config,
        ])
        .env("OMP_NUM_THREADS", args.threads.to_string())
        .env("OMP_WAIT_POLICY", "PASSIVE")
        .output()
        .map_err(|e| e.to_string())?;
    let lines = json_lines(&output.stdout);
    if lines.is_empty() {
        eprintln!(
            "scale: peer {} gave no measurement: {}",
            point.join(" "),
            String::from_utf8_lossy(&output.stdout).trim()
        );
    }
    Ok(lines)
}

/// The kNN index of a Memorizing point, by name: `exact` (the default scoring: int8 first
/// where the CPU has AVX-512 VNNI), `exactf32`, `exactint8`, `exactint8avx2` and
/// `exactint8avxvnni` (that scoring: the last two, the AVX2 or AVX-VNNI kernel even with
/// AVX-512 VNNI); `hnsw` (memzoo's defaults, the
/// search expansion chosen by size); `hnsw<ef>[m<M>][a<ef_add>]`: HNSW searched with the
/// fixed expansion `ef`, and optionally built with degree `M` and insertion expansion `ef_add`
/// (`hnsw32m15a40`: the peer's faiss settings, `IndexHNSWFlat(M = 15)` with its default
/// `efConstruction` 40, searched with `ef` = k = 32).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct IndexChoice {
    pub(crate) kind: IndexKind,
    /// Exact search's scoring (`exactf32`, `exactint8`, `exactint8avx2`, `exactint8avxvnni`;
    /// `exact`: the default, `auto`).
    pub(crate) scoring: HostScoring,
    pub(crate) name: String,
    pub(crate) expansion_search: Option<usize>,
    pub(crate) connectivity: Option<usize>,
    pub(crate) expansion_add: Option<usize>,
}

impl IndexChoice {
    /// The choice a name gives; `None` for a name that is none of the forms above.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        let mut choice = Self {
            kind: IndexKind::Hnsw,
            scoring: HostScoring::Auto,
            name: name.to_string(),
            expansion_search: None,
            connectivity: None,
            expansion_add: None,
        };
        match name {
            "exact" => choice.kind = IndexKind::Exact,
            "exactf32" | "exactint8" | "exactint8avx2" | "exactint8avxvnni" => {
                choice.kind = IndexKind::Exact;
                choice.scoring = name["exact".len()..].parse().ok()?;
            }
            "hnsw" => {}
            _ => {
                let rest = name.strip_prefix("hnsw")?;
                // A number, then optional `m<M>` and `a<ef_add>`, each positive.
                let (ef, rest) = rest.split_at(rest.find(['m', 'a']).unwrap_or(rest.len()));
                let (m, add) = match rest.split_once('a') {
                    Some((m, add)) => (m, Some(add)),
                    None => (rest, None),
                };
                let number = |s: &str| s.parse::<usize>().ok().filter(|&v| v > 0);
                choice.expansion_search = Some(number(ef)?);
                if !m.is_empty() {
                    choice.connectivity = Some(number(m.strip_prefix('m')?)?);
                }
                if let Some(add) = add {
                    choice.expansion_add = Some(number(add)?);
                }
            }
        }
        Some(choice)
    }
}

/// A child's point: `scale-xl-<train|recompute|eval>-<mem>`, `scale-memorizing-<exact|hnsw|hnsw<ef>>-<n>`,
/// `scale-reformer-<len>`.
pub fn point(target: &str, args: &BenchArgs, device: &Device) -> Result<Vec<Measurement>, String> {
    let bad = || format!("bad target `{target}`");
    let parts: Vec<&str> = target.split('-').collect();
    let x: usize = parts.last().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    match parts.get(1..parts.len() - 1) {
        Some(["xl", mode]) => {
            let (train, recompute) = match *mode {
                "train" => (true, false),
                "recompute" => (true, true),
                "eval" => (false, false),
                _ => return Err(bad()),
            };
            Ok(vec![xl_point(train, recompute, x, args, device)?])
        }
        Some(["memorizing", kind]) => {
            let index = IndexChoice::parse(kind).ok_or_else(bad)?;
            Ok(vec![memorizing_point(&index, x, args, device)?])
        }
        Some(["reformer"]) => Ok(vec![reformer_point(x, args, device)?]),
        Some(["generate", family @ ..]) if !family.is_empty() => {
            Ok(vec![generate_point(&family.join("-"), x, args, device)?])
        }
        _ => Err(bad()),
    }
}

/// A scale measurement: `curve`, `x` and the rest in `config`, FLOPs from `flops_per_token`.
#[allow(clippy::too_many_arguments)]
fn measurement(
    curve: &str,
    x: usize,
    mut config: serde_json::Value,
    times: &[f64],
    tokens: usize,
    params: usize,
    flops_per_token: f64,
    args: &BenchArgs,
    device: &Device,
) -> Measurement {
    config["curve"] = curve.into();
    config["x"] = x.into();
    crate::models::measured(
        format!("scale-{curve}-{x}"),
        args,
        config,
        times,
        tokens,
        params,
        flops_per_token,
        device,
    )
}

/// XL-small with a memory of `mem`, filled before the first step, trained or evaluated.
fn xl_point(
    train: bool,
    recompute: bool,
    mem: usize,
    args: &BenchArgs,
    device: &Device,
) -> Result<Measurement, String> {
    let (batch, tgt_len) = (8, 128);
    let recompute = train && recompute;
    let config = crate::models::bench_xl()
        .with_mem_len(mem)
        .with_recompute_attention(recompute);
    let (warmup, steps) = steps(args);
    let replicas = args
        .replicas
        .unwrap_or_else(|| memzoo_train::parallel::auto_replicas(device, batch));
    let device = if train {
        device.clone().autodiff()
    } else {
        device.clone()
    };
    let full_memory = |rows: usize| XlState {
        xl: XlMemory::from_layers(
            (0..config.n_layers)
                .map(|_| {
                    Tensor::<3>::random(
                        [rows, mem, config.d_model],
                        Distribution::Normal(0.0, 1.0),
                        &device,
                    )
                })
                .collect(),
        )
        .expect("one shape"),
        ..XlState::new()
    };
    let mut states: Vec<XlState> = shard_rows(batch, replicas)
        .into_iter()
        .map(|rows| full_memory(rows.len()))
        .collect();
    let mut model = config.init(&device).map_err(|e| e.to_string())?;
    let params = model.num_params();
    let mut rng = StdRng::seed_from_u64(0);
    let times = if train {
        let mut optim = TrainConfig::new().optimizer();
        time_steps(warmup, steps, || {
            let segment = crate::models::random_segment(batch, tgt_len, &mut rng);
            let (_, grads) =
                train_step_sharded(&model, &device, &segment, &mut states).expect("valid shapes");
            model = optim.step(2.5e-4, model.clone(), grads);
            device.sync().expect("device sync");
        })
    } else {
        time_steps(warmup, steps, || {
            let segment = crate::models::random_segment(batch, tgt_len, &mut rng);
            eval_step_sharded(&model, &device, &segment, &mut states).expect("valid shapes");
        })
    };
    let mode = match (train, recompute) {
        (true, true) => "recompute",
        (true, false) => "train",
        (false, _) => "eval",
    };
    let flops = if train {
        crate::flops::train_flops_per_token(&config, tgt_len, batch)
    } else {
        crate::flops::forward_flops_per_token(&config, tgt_len, batch)
    };
    Ok(measurement(
        &format!("xl-{mode}"),
        mem,
        serde_json::json!({"model": "xl-small", "mem_len": mem, "tgt_len": tgt_len,
            "batch": batch, "replicas": replicas, "memory": "filled before the first step",
            "recompute_attention": recompute}),
        &times,
        batch * tgt_len,
        params,
        flops,
        args,
        &device,
    ))
}

/// Memorizing-small as `bench memorizing-small` runs it (multi-query, no XL memory, no
/// dropout), its kNN memory of `kind` with room for `stored` pairs per row plus the timed
/// steps' (no eviction while timed); HNSW searched with expansion `ef`, else the one a store
/// of `stored` gets by default.
fn memorizing_config(index: &IndexChoice, stored: usize, room: usize) -> MemorizingConfig {
    let small = MemorizingConfig::small();
    let xl = small.xl.clone().with_dropout(0.0).with_kv_heads(Some(1));
    // HNSW's search expansion as a store of `stored` gets by default (by size: the room for
    // the timed steps must not move it to the next power of two).
    let defaults = &small.knn.hnsw;
    let hnsw = defaults
        .clone()
        .with_expansion_search(Some(
            index
                .expansion_search
                .unwrap_or_else(|| defaults.expansion_search_for(stored.max(1))),
        ))
        .with_connectivity(index.connectivity.unwrap_or(defaults.connectivity))
        .with_expansion_add(index.expansion_add.unwrap_or(defaults.expansion_add));
    let knn = small
        .knn
        .clone()
        .with_index(index.kind)
        .with_scoring(index.scoring)
        .with_max_memories(stored + room)
        .with_hnsw(hnsw);
    small
        .with_xl(xl)
        .with_xl_memory(false)
        .with_knn_layers(vec![3])
        .with_knn(knn)
}

/// The kNN layer's normalised keys of the untrained Memorizing-small (seed 0) reading tiny
/// Shakespeare (or the generated corpus): 8 rows of contiguous text, segments of 512, the
/// keys of row 0 first, then row 1's, ...; `n` keys of width 32.
fn model_keys(n: usize, device: &Device) -> Result<Vec<f32>, String> {
    let (rows, len) = (8usize, 512usize);
    let per_row = n.div_ceil(rows).div_ceil(len) * len;
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/tinyshakespeare.txt");
    let text: Vec<u8> = match std::fs::read(&data) {
        Ok(t) => t,
        Err(_) => {
            memzoo_data::generate_corpus(&memzoo_data::LongRangeConfig::default())
                .map_err(|e| e.to_string())?
                .train
        }
    };
    if text.len() < rows * (per_row + 1) {
        return Err(format!(
            "{} bytes of text, {} needed for {n} keys",
            text.len(),
            rows * (per_row + 1)
        ));
    }
    let stride = text.len() / rows;
    // Room for one segment: every segment's keys replace the last ones, read back each time.
    let exact = IndexChoice::parse("exact").expect("a valid name");
    let config = memorizing_config(&exact, 0, len);
    let model = config.init(device).map_err(|e| e.to_string())?;
    let mut states = vec![model.new_state(rows, device).map_err(|e| e.to_string())?];
    let d = config.memory().d_head;
    let mut by_row: Vec<Vec<f32>> = vec![Vec::new(); rows];
    let start = std::time::Instant::now();
    for s in 0..per_row / len {
        let row = |r: usize, shift: usize| {
            let at = r * stride + s * len + shift;
            text[at..at + len].iter().map(|&b| b as i64)
        };
        let inputs: Vec<i64> = (0..rows).flat_map(|r| row(r, 0)).collect();
        let targets: Vec<i64> = (0..rows).flat_map(|r| row(r, 1)).collect();
        let segment = Segment::new(rows, len, inputs, targets).map_err(|e| e.to_string())?;
        eval_step_sharded(&model, device, &segment, &mut states).map_err(|e| e.to_string())?;
        let snap = states[0].knn[0].snapshot().map_err(|e| e.to_string())?;
        // `[rows, kv_heads = 1, slots, d]`, the segment's keys in slot order.
        for (r, keys) in by_row.iter_mut().enumerate() {
            let at = r * snap.slots * d;
            keys.extend_from_slice(&snap.keys[at..at + len * d]);
        }
    }
    eprintln!(
        "scale: {} keys of the model's kNN layer in {:.1} s",
        rows * per_row,
        start.elapsed().as_secs_f64()
    );
    let mut keys: Vec<f32> = by_row.concat();
    keys.truncate(n * d);
    Ok(keys)
}

/// The file of [`model_keys`] for `n` keys (little-endian `f32`, `[n, 32]`), written into the
/// temporary directory on the first run and reused after (the keys are deterministic: seed 0,
/// the same text; delete `memzoo-scale-keys-*.f32` after changing the model's code).
fn keys_file(n: usize, device: &Device) -> Result<PathBuf, String> {
    let path = std::env::temp_dir().join(format!("memzoo-scale-keys-{n}.f32"));
    let d = MemorizingConfig::small().memory().d_head;
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == (n * d * 4) as u64) {
        eprintln!("scale: the model's keys from {}", path.display());
        return Ok(path);
    }
    let keys = model_keys(n, device)?;
    let bytes: Vec<u8> = keys.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// Memorizing-small trained with its kNN stores (`kind`) filled with `stored` of the model's
/// keys per row (`MEMZOO_SCALE_KEYS`, written by the suite); HNSW points also measure recall@32
/// of row 0's store against exact search over the same keys.
fn memorizing_point(
    index: &IndexChoice,
    stored: usize,
    args: &BenchArgs,
    device: &Device,
) -> Result<Measurement, String> {
    let (batch, len, k) = (2usize, 512usize, 32usize);
    let path = std::env::var("MEMZOO_SCALE_KEYS")
        .map_err(|_| "MEMZOO_SCALE_KEYS is not set: run `bench scale`".to_string())?;
    let bytes = std::fs::read(&path).map_err(|e| format!("{path}: {e}"))?;
    let keys: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    // One warm-up and two timed steps unless given: a step searches the whole store.
    let (warmup, steps) = (args.warmup.unwrap_or(1), args.steps.unwrap_or(2));
    let kind = index.kind;
    let config = memorizing_config(index, stored, (warmup + steps) * len);
    let d = config.memory().d_head;
    let heads = config.xl.n_heads;
    if keys.len() < (stored + len) * d {
        return Err(format!(
            "{path} holds {} keys, {} needed",
            keys.len() / d,
            stored + len
        ));
    }
    let device = device.clone().autodiff();
    let mut model = config.init(&device).map_err(|e| e.to_string())?;
    let params = model.num_params();
    let replicas = args
        .replicas
        .unwrap_or_else(|| memzoo_train::parallel::auto_replicas(&device, batch));
    let start = std::time::Instant::now();
    let mut states = Vec::new();
    for rows in shard_rows(batch, replicas) {
        let mut state = model
            .new_state(rows.len(), &device)
            .map_err(|e| e.to_string())?;
        for store in state.knn.iter_mut() {
            fill(store.as_mut(), &keys, stored, 4096, &device).map_err(|e| e.to_string())?;
        }
        states.push(state);
    }
    let fill_s = start.elapsed().as_secs_f64();
    // Recall and one search of the held-out keys: the store of row 0 against exact search.
    let pool = keys.len() / d;
    let (q, _) = segment_tensors(&keys, pool, stored, len, 1, heads, d, &device);
    let rows0 = states[0].knn[0].batch();
    let q0 = if rows0 > 1 {
        Tensor::cat(vec![q.clone(); rows0], 0)
    } else {
        q.clone()
    };
    // The held-out search, timed. Exact search runs it after the timed steps: `auto` scoring
    // adapts to the queries a store meets, and these (the text's next keys) are not the
    // training's. HNSW runs it before them, for its recall against exact search over the same
    // keys (exact search's is 1).
    let held_out = |states: &[XlState]| {
        let t = std::time::Instant::now();
        let found = states[0].knn[0]
            .search(q0.clone(), k)
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((found, t.elapsed().as_secs_f64()))
    };
    let (mut search_s, mut recall_at_k) = (0.0, 1.0);
    if kind != IndexKind::Exact {
        let (found, s) = held_out(&states)?;
        search_s = s;
        let ids = retrieved_ids(&found);
        let exact = KnnMemoryConfig::new(heads, d)
            .with_n_kv_heads(Some(1))
            .with_max_memories(stored)
            .with_kind(IndexKind::Exact);
        let mut index = exact.init(1, &device).map_err(|e| e.to_string())?;
        fill(index.as_mut(), &keys, stored, 4096, &device).map_err(|e| e.to_string())?;
        let want = retrieved_ids(&index.search(q, k).map_err(|e| e.to_string())?);
        recall_at_k = recall(&ids[..want.len()], &want, k);
    }
    let mut optim = TrainConfig::new().optimizer();
    let mut rng = StdRng::seed_from_u64(0);
    let times = time_steps(warmup, steps, || {
        let segment = crate::models::random_segment(batch, len, &mut rng);
        let (_, grads) =
            train_step_sharded(&model, &device, &segment, &mut states).expect("valid shapes");
        model = optim.step(2.5e-4, model.clone(), grads);
        device.sync().expect("device sync");
    });
    if kind == IndexKind::Exact {
        search_s = held_out(&states)?.1;
    }
    let kind_name = &index.name;
    Ok(measurement(
        &format!("memorizing-{kind_name}"),
        stored,
        serde_json::json!({"model": "memorizing-small", "stored_per_row": stored,
            "index": kind_name, "hnsw": format!("{:?}", config.knn.hnsw),
            "expansion_search": config.knn.hnsw.expansion_search, "seq": len,
            "batch": batch, "top_k": k, "replicas": replicas, "fill_s": fill_s,
            "search_s": search_s, "recall_at_k": recall_at_k,
            "keys": "the untrained model's kNN-layer keys on tiny Shakespeare"}),
        &times,
        batch * len,
        params,
        crate::flops::train_flops_per_token(&config.stack(), len, batch),
        args,
        &device,
    ))
}

/// One training step of Reformer-small (reversible) on a sequence of `len`.
fn reformer_point(len: usize, args: &BenchArgs, device: &Device) -> Result<Measurement, String> {
    let config = ReformerConfig::small().with_max_seq_len(len);
    let reps = args.steps.unwrap_or(1);
    let t = crate::models::train_step_timing(&config, 1, len, reps, &device.clone().autodiff())?;
    let flops = crate::flops::train_flops_per_token(&crate::models::stack_of(&config, len), len, 1);
    let mut m = measurement(
        "reformer",
        len,
        serde_json::json!({"model": "reformer-small", "seq": len, "reversible": true,
            "batch": 1, "rss_above_baseline_mb":
                (t.peak_rss_kib - t.rss_baseline_kib) as f64 / 1024.0}),
        &[t.seconds],
        len,
        0,
        flops,
        args,
        device,
    );
    m.steps = reps;
    Ok(m)
}

/// The families of the generation curves (`--families generate`), one curve each,
/// `generate-<family>`.
const GENERATORS: [&str; 6] = [
    "xl",
    "memorizing",
    "reformer",
    "compressive",
    "rmt",
    "block-recurrent",
];

/// The families of `bench quality`'s recipes whose state has a fixed size (compressed memory,
/// memory tokens, recurrent states): they generate in their training segments, beside their
/// lucidrains peers' generate loops, [`RECURRENT_GENERATED`] tokens per point.
const RECURRENT_GENERATORS: [&str; 3] = ["compressive", "rmt", "block-recurrent"];

/// Tokens a point of [`RECURRENT_GENERATORS`] times: a whole segment of the compressive and
/// RMT recipes (128), two of the Block-Recurrent one's (blocks of 64; its peer's generate
/// reads windows of 128): a token's cost grows through its segment on both sides.
const RECURRENT_GENERATED: usize = 128;

/// Memorizing-small's generation segments: its training segment length (`memzoo generate`'s
/// default `--segment-len`).
const MEMORIZING_SEGMENT: usize = 512;

/// Tokens a generation point times, on both sides: `--steps`, else 64 for XL (milliseconds
/// each), a whole segment for Memorizing ([`MEMORIZING_SEGMENT`]: a token inside a segment
/// costs less than the one completing it), 16 for the Reformer (a forward pass over the
/// window each, the peer's over a second at 4K); 8 with `--quick`.
fn generate_tokens(family: &str, args: &BenchArgs) -> usize {
    args.steps.unwrap_or(match (args.quick, family) {
        (true, _) => 8,
        (false, "xl") => 64,
        (false, "memorizing") => MEMORIZING_SEGMENT,
        (false, f) if RECURRENT_GENERATORS.contains(&f) => RECURRENT_GENERATED,
        (false, _) => 16,
    })
}

/// A model of `family` (no dropout) generating greedily after a prompt of `context` random
/// tokens, batch 1, through [`memzoo_train::generate::generate`]; [`generate_tokens`] tokens,
/// the prompt's reading not timed:
/// - `xl`: XL-small, one token per segment over an XL memory covering the context
///   (`memzoo generate --segment-len 1 --mem-len N`): the generator's key/value and position
///   caches ([`memzoo_stack::TransformerXl::for_generation`]);
/// - `memorizing`: Memorizing-small in its training segments of [`MEMORIZING_SEGMENT`], its
///   kNN memory (exact search) holding every completed segment of the context: each token is
///   one query over the XL memory, the segment's earlier tokens and the kNN memory, and the
///   last token of the segment reads it for good (into the kNN memory), all in the timed
///   tokens;
/// - `reformer`: Reformer-small (axial positions for `context`) reading the window of the last
///   `context` tokens again for every token (no sound cache for LSH attention);
/// - `compressive`, `rmt`, `block-recurrent`: the model of `bench quality`'s recipe
///   ([`crate::quality::family`]) without dropout, in its training segments, each token
///   reading the unfinished segment again on the committed state.
fn generate_point(
    family: &str,
    context: usize,
    args: &BenchArgs,
    device: &Device,
) -> Result<Measurement, String> {
    use memzoo_train::generate::{GenerateConfig, SampleConfig, generate};
    let tokens = generate_tokens(family, args);
    let (stack, segment_len) = match family {
        "xl" => (
            memzoo_stack::XlConfig::small()
                .with_dropout(0.0)
                .with_mem_len(context + tokens),
            1,
        ),
        "memorizing" => {
            let small = MemorizingConfig::small();
            let knn = small
                .knn
                .clone()
                .with_index(IndexKind::Exact)
                .with_max_memories(context + tokens);
            let config = small
                .clone()
                .with_xl(small.xl.clone().with_dropout(0.0))
                .with_knn(knn);
            (config.stack(), MEMORIZING_SEGMENT)
        }
        "reformer" => (
            ReformerConfig::small()
                .with_dropout(0.0)
                .with_max_seq_len(context)
                .stack(),
            context,
        ),
        f if RECURRENT_GENERATORS.contains(&f) => match crate::quality::family(f)? {
            crate::quality::Family {
                model: crate::quality::FamilyModel::Xl(c),
                tgt_len,
                ..
            } => (c.with_dropout(0.0), tgt_len),
            _ => return Err(format!("`{f}`'s recipe is not a layer stack")),
        },
        other => return Err(format!("no generation curve for `{other}`")),
    };
    let model = stack.init(device).map_err(|e| e.to_string())?;
    let params = model.num_params();
    let mut rng = StdRng::seed_from_u64(0);
    let prompt: Vec<i64> = (0..context).map(|_| rng.random_range(0..256)).collect();
    let greedy = |tokens| {
        GenerateConfig::new(tokens, segment_len)
            .with_sampler(SampleConfig::new().with_temperature(0.0))
    };
    let err = |e: memzoo_train::generate::GenerateError| e.to_string();
    generate(&model, &prompt[..context.min(64)], &greedy(2), device).map_err(err)?;
    let run = generate(&model, &prompt, &greedy(tokens), device).map_err(err)?;
    let flops = crate::flops::generation_flops_per_token(&stack, context, segment_len, tokens);
    let mut m = measurement(
        &format!("generate-{family}"),
        context,
        serde_json::json!({"model": format!("{family}-small"), "context": context,
            "tokens": tokens, "segment_len": segment_len, "mem_len": stack.mem_len,
            "greedy": true, "batch": 1, "prompt_read_excluded": true}),
        &[run.seconds_per_token],
        1,
        params,
        flops,
        args,
        device,
    );
    m.steps = tokens;
    Ok(m)
}

/// Curve name, x, implementation of a scale line.
fn key(m: &Measurement) -> Option<(String, usize)> {
    let curve = m.config.get("curve")?.as_str()?.to_string();
    let x = m.config.get("x")?.as_u64()? as usize;
    Some((curve, x))
}

/// One table per curve: per x, memzoo's tokens/s, step time and peak RSS, the peer's beside and
/// the ratio; the growth of the step time between the first and the last point against the
/// FLOP count's.
pub fn markdown(results: &[Measurement]) -> String {
    let mut curves: Vec<String> = Vec::new();
    for m in results.iter().filter(|m| m.implementation == "memzoo") {
        if let Some((c, _)) = key(m)
            && !curves.contains(&c)
        {
            curves.push(c);
        }
    }
    let mut s = String::new();
    for curve in curves {
        let ours: Vec<&Measurement> = results
            .iter()
            .filter(|m| key(m).is_some_and(|(c, _)| c == curve) && m.implementation == "memzoo")
            .collect();
        let peer_curve = peer_curve(&curve);
        let peer_of = |x: usize| {
            results.iter().find(|p| {
                p.implementation != "memzoo"
                    && key(p).is_some_and(|(c, px)| c == peer_curve && px == x)
            })
        };
        s += &format!(
            "\n{curve}\n\n| x | memzoo tokens/s | step | peak RSS | GFLOP/s (of sgemm) | extra | peer tokens/s | peer RSS | memzoo / peer |\n|---|---|---|---|---|---|---|---|---|\n"
        );
        for m in &ours {
            let (_, x) = key(m).expect("scale line");
            let extra = m
                .config
                .get("recall_at_k")
                .and_then(|r| r.as_f64())
                .map(|r| {
                    format!(
                        "recall@32 {r:.3}, search {:.3} s",
                        m.config["search_s"].as_f64().unwrap_or(0.0)
                    )
                })
                .unwrap_or_default();
            let (ptps, prss, ratio) = match peer_of(x) {
                Some(p) => (
                    format!("{:.0}", p.tokens_per_s),
                    format!("{:.0} MiB", p.peak_rss_mb),
                    format!("{:.2}x", m.tokens_per_s / p.tokens_per_s),
                ),
                None => ("-".into(), "-".into(), "-".into()),
            };
            s += &format!(
                "| {x} | {:.0} | {:.3} s | {:.0} MiB | {:.0} ({:.0}%) | {extra} | {ptps} | {prss} | {ratio} |\n",
                m.tokens_per_s,
                m.step_s_median,
                m.peak_rss_mb,
                m.gflops.unwrap_or(0.0),
                100.0 * m.of_sgemm.unwrap_or(0.0),
            );
        }
        if let (Some(a), Some(b)) = (ours.first(), ours.last())
            && ours.len() > 1
        {
            let (xa, xb) = (key(a).expect("line").1, key(b).expect("line").1);
            let time = b.step_s_median / a.step_s_median;
            let flops = b.flops_per_token.unwrap_or(0.0) / a.flops_per_token.unwrap_or(1.0)
                * (b.tokens_per_s * b.step_s_median)
                / (a.tokens_per_s * a.step_s_median);
            s += &format!(
                "\nx {xa} -> {xb} ({:.0}x): step time x{time:.2} (log-log slope {:.2}), FLOPs per step x{flops:.2}\n",
                xb as f64 / xa as f64,
                time.ln() / (xb as f64 / xa as f64).ln(),
            );
            let search = |m: &Measurement| m.config.get("search_s").and_then(|v| v.as_f64());
            if let (Some(sa), Some(sb)) = (search(a), search(b)) {
                s += &format!(
                    "search of one segment x{:.2} (log-log slope {:.2})\n",
                    sb / sa,
                    (sb / sa).ln() / (xb as f64 / xa as f64).ln()
                );
            }
        }
    }
    s
}

/// The peer's curve beside memzoo's `curve`: the same, but for the Memorizing curves, whose
/// exact and HNSW stores both stand beside the peer's one faiss HNSW store.
fn peer_curve(curve: &str) -> &str {
    match curve {
        c if c.starts_with("memorizing-") => "memorizing-faiss",
        "xl-recompute" => "xl-train",
        c => c,
    }
}

/// Two SVGs per curve (`scale-<curve>.svg`: tokens/s against x; `scale-<curve>-memory.svg`:
/// peak RSS), one line per implementation and mode (`xl`: train and eval; `memorizing`: exact
/// and HNSW).
pub fn write_plots(results: &[Measurement], dir: &Path) -> Result<Vec<PathBuf>, String> {
    type Chart = (String, Vec<Series>, Vec<Series>);
    let mut charts: Vec<Chart> = Vec::new();
    for m in results {
        let Some((curve, x)) = key(m) else { continue };
        let (chart, mode) = curve.split_once('-').unwrap_or((curve.as_str(), ""));
        let name = format!("{} {mode}", m.implementation).trim().to_string();
        let i = match charts.iter().position(|(c, _, _)| c == chart) {
            Some(i) => i,
            None => {
                charts.push((chart.to_string(), Vec::new(), Vec::new()));
                charts.len() - 1
            }
        };
        let (_, rate, memory) = &mut charts[i];
        for (series, y) in [(rate, m.tokens_per_s), (memory, m.peak_rss_mb)] {
            match series.iter_mut().find(|s| s.name == name) {
                Some(s) => s.points.push((x as f64, y)),
                None => series.push(Series {
                    name: name.clone(),
                    points: vec![(x as f64, y)],
                }),
            }
        }
    }
    if charts.is_empty() {
        return Ok(Vec::new());
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let backend = results
        .first()
        .map(|m| format!("{}, {} threads", m.backend, m.threads))
        .unwrap_or_default();
    let mut written = Vec::new();
    for (chart, rate, memory) in charts {
        let (title, x_label) = match chart.as_str() {
            "xl" => ("XL-small", "memory length (tokens)"),
            "memorizing" => (
                "Memorizing-small training",
                "kNN store size per row (pairs)",
            ),
            "reformer" => ("Reformer-small training", "sequence length (tokens)"),
            "generate" => ("Generation, batch 1", "context (tokens)"),
            _ => (chart.as_str(), "x"),
        };
        for (file, y_label, series) in [
            (format!("scale-{chart}.svg"), "tokens / s", rate),
            (
                format!("scale-{chart}-memory.svg"),
                "peak RSS (MiB)",
                memory,
            ),
        ] {
            let path = dir.join(file);
            let svg = line_chart(&format!("{title} ({backend})"), x_label, y_label, &series);
            std::fs::write(&path, svg)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            written.push(path);
        }
    }
    Ok(written)
}
