//! Attention alone, forward + backward, batch 1, 8 heads x 64, causal: full attention with an
//! explicit QK^T against LSH (bucket 64, 4 rounds), across sequence lengths. Each point runs in
//! its own process so that its peak memory is its own.

use burn::tensor::Device;
use memzoo_reformer::bench::{BenchAttention, attention_fwd_bwd};

use crate::BenchArgs;
use crate::measure::Measurement;

/// The lengths of the suite.
pub fn lengths(quick: bool) -> Vec<usize> {
    if quick {
        vec![1024, 2048]
    } else {
        vec![1024, 2048, 4096, 8192, 16384]
    }
}

/// One point, in this process: `attention-full-1024`, `attention-lsh-4096`, ...
pub fn one(target: &str, args: &BenchArgs, device: &Device) -> Result<Measurement, String> {
    let mut parts = target.split('-').skip(1);
    let kind = parts.next().unwrap_or_default();
    let len: usize = parts
        .next()
        .and_then(|l| l.parse().ok())
        .ok_or_else(|| format!("bad attention target `{target}`"))?;
    let attention = match kind {
        "full" => BenchAttention::Full,
        "lsh" => BenchAttention::Lsh {
            bucket_size: 64,
            n_rounds: 4,
        },
        other => return Err(format!("unknown attention `{other}`: expected full or lsh")),
    };
    let reps = args.steps.unwrap_or(if args.quick { 1 } else { 3 });
    let t = attention_fwd_bwd(attention, len, 8, 64, reps, &device.clone().autodiff());
    Ok(Measurement {
        name: format!("attention-{kind}-{len}"),
        implementation: "memzoo".into(),
        backend: args.device.clone(),
        threads: args.threads,
        config: serde_json::json!({"attention": kind, "len": len, "batch": 1, "heads": 8,
            "d_head": 64, "causal": true, "bucket_size": 64, "n_rounds": 4}),
        steps: reps,
        step_s_median: t.seconds,
        step_s_min: t.seconds,
        step_s_max: t.seconds,
        tokens_per_s: len as f64 / t.seconds,
        params: 0,
        peak_rss_mb: t.peak_rss_kib as f64 / 1024.0,
    })
}

/// The suite: every (kind, length) in a child process; a kind stops at the first length
/// that takes more than 120 s or fails (out of memory).
pub fn suite(args: &BenchArgs) -> Result<Vec<Measurement>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for kind in ["full", "lsh"] {
        for len in lengths(args.quick) {
            let mut cmd = std::process::Command::new(&exe);
            cmd.args([
                "bench",
                &format!("attention-{kind}-{len}"),
                "--device",
                &args.device,
            ])
            .args(["--threads", &args.threads.to_string()]);
            if args.quick {
                cmd.arg("--quick");
            }
            let output = cmd.output().map_err(|e| e.to_string())?;
            let line = String::from_utf8_lossy(&output.stdout)
                .lines()
                .find(|l| l.starts_with('{'))
                .map(str::to_string);
            match line.and_then(|l| serde_json::from_str::<Measurement>(&l).ok()) {
                Some(m) if output.status.success() => {
                    let slow = m.step_s_median > 120.0;
                    out.push(m);
                    if slow {
                        break;
                    }
                }
                _ => {
                    eprintln!("attention-{kind}-{len}: failed (out of memory?), series stopped");
                    break;
                }
            }
        }
    }
    Ok(out)
}
