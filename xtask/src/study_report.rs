//! The study's report: one SVG chart per table and `docs/study.md`, each table beside the
//! paper's numbers and the study's targets, met or missed, computed from the JSON lines.

use std::fmt::Write as _;

use serde_json::Value;

use crate::plot::{Axes, Series, chart};

const LN2: f64 = std::f64::consts::LN_2;

fn rows<'a>(lines: &'a [Value], table: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|l| l["table"] == table && l["kind"] != "meta")
        .collect()
}

fn meta<'a>(lines: &'a [Value], table: &str) -> Option<&'a Value> {
    lines
        .iter()
        .rev()
        .find(|l| l["table"] == table && l["kind"] == "meta")
}

fn f(v: &Value) -> Option<f64> {
    v.as_f64()
}

fn u(v: &Value) -> usize {
    v.as_u64().unwrap_or(0) as usize
}

fn fmt3(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.3}"))
}

fn verdict(ok: bool) -> &'static str {
    if ok { "**met**" } else { "**missed**" }
}

/// T1's (or T1b's: `table`) bpc of `model` at `(eval_mem, same_length)`.
fn t1_bpc(lines: &[Value], table: &str, model: &str, mem: usize, same: bool) -> Option<f64> {
    rows(lines, table)
        .into_iter()
        .find(|r| r["model"] == model && u(&r["eval_mem"]) == mem && r["same_length"] == same)
        .and_then(|r| f(&r["test_bpc"]))
}

/// The charts the lines allow: `(file name, SVG)`.
pub fn charts(lines: &[Value]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (table, data) in [
        ("t1", "rust-code test"),
        ("t1v", "rust-code test"),
        ("t1b", "book test"),
    ] {
        let t1 = rows(lines, table);
        if !t1.is_empty() {
            let mut series = Vec::new();
            for (model, label) in [
                ("xl", "XL"),
                ("xl-no-recurrence", "XL, no recurrence"),
                ("xl-varied-memory", "XL trained with varied memory"),
            ] {
                for (same, how) in [(false, "memory m"), (true, "same_length, clamp_len")] {
                    let mut points: Vec<(f64, f64)> = t1
                        .iter()
                        .filter(|r| {
                            r["model"] == model
                                && (r["same_length"] == same || u(&r["eval_mem"]) == 0)
                        })
                        .filter_map(|r| Some((u(&r["eval_mem"]) as f64, f(&r["test_bpc"])?)))
                        .collect();
                    points.sort_by(|a, b| a.0.total_cmp(&b.0));
                    if !points.is_empty() {
                        series.push(Series {
                            name: format!("{label} ({how})"),
                            points,
                        });
                    }
                }
            }
            let xs: Vec<f64> = series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.0))
                .collect();
            if let Some(v) = t1_bpc(lines, table, "vanilla", 0, false) {
                let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = xs.iter().copied().fold(0.0, f64::max);
                if lo.is_finite() {
                    series.push(Series {
                        name: "vanilla (absolute positions)".into(),
                        points: vec![(lo, v), (hi, v)],
                    });
                }
            }
            out.push((
                format!("{table}.svg"),
                chart(
                    &format!(
                        "{}: Transformer-XL, memory at evaluation ({data})",
                        table.to_uppercase()
                    ),
                    "evaluation memory (tokens)",
                    "test bpc",
                    &series,
                    Axes::Linear,
                ),
            ));
        }
    }
    for (table, title) in [
        ("t2", "T2: bpc of the scored blocks against context"),
        (
            "t7",
            "T7: every memory, bpc of the scored blocks against context",
        ),
    ] {
        if let Some(svg) = context_chart(lines, table, title) {
            out.push((format!("{table}.svg"), svg));
        }
    }
    let t3 = rows(lines, "t3");
    if !t3.is_empty() {
        let mut series = Vec::new();
        for (model, label) in [
            ("memorizing-xl-cache", "kNN + XL cache"),
            ("memorizing-no-cache", "kNN, no XL cache"),
        ] {
            let points: Vec<(f64, f64)> = t3
                .iter()
                .filter(|r| r["model"] == model)
                .filter_map(|r| Some((u(&r["knn_eval"]) as f64, f(&r["test_bpc"])?)))
                .collect();
            if !points.is_empty() {
                series.push(Series {
                    name: label.into(),
                    points,
                });
            }
        }
        let xs: Vec<f64> = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .collect();
        let (lo, hi) = (
            xs.iter().copied().fold(f64::INFINITY, f64::min),
            xs.iter().copied().fold(0.0, f64::max),
        );
        for (model, label) in [
            ("t5-xl-cache", "no kNN, XL cache"),
            ("t5-no-memory", "no kNN, no XL cache"),
        ] {
            if let Some(b) = t3
                .iter()
                .find(|r| r["model"] == model)
                .and_then(|r| f(&r["test_bpc"]))
                && lo.is_finite()
            {
                series.push(Series {
                    name: label.into(),
                    points: vec![(lo, b), (hi, b)],
                });
            }
        }
        out.push((
            "t3.svg".into(),
            chart(
                "T3: Memorizing Transformer, kNN memory at evaluation",
                "kNN memory per row and head (tokens)",
                "test bpc",
                &series,
                Axes::Log,
            ),
        ));
    }
    let t4 = rows(lines, "t4");
    if !t4.is_empty() {
        let mut series = Vec::new();
        for train in ["full", "lsh-1", "lsh-2", "lsh-4"] {
            let points: Vec<(f64, f64)> = t4
                .iter()
                .filter(|r| r["train"] == train && r["eval"] != "full")
                .filter_map(|r| {
                    let rounds: f64 = r["eval"].as_str()?.strip_prefix("lsh-")?.parse().ok()?;
                    Some((rounds, 100.0 * f(&r["accuracy"])?))
                })
                .collect();
            if !points.is_empty() {
                series.push(Series {
                    name: format!("trained with {train}"),
                    points,
                });
            }
        }
        out.push((
            "t4.svg".into(),
            chart(
                "T4: duplication accuracy against evaluation hash rounds",
                "hash rounds at evaluation",
                "second copy predicted (%)",
                &series,
                Axes::Linear,
            ),
        ));
    }
    let t5: Vec<&Value> = rows(lines, "t5")
        .into_iter()
        .filter(|r| r["kind"] == "time")
        .collect();
    if !t5.is_empty() {
        let series: Vec<Series> = ["full", "lsh-4"]
            .iter()
            .map(|a| Series {
                name: format!("{a} attention"),
                points: t5
                    .iter()
                    .filter(|r| r["attention"] == *a)
                    .filter_map(|r| Some((u(&r["len"]) as f64, f(&r["step_seconds"])?)))
                    .collect(),
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        out.push((
            "t5.svg".into(),
            chart(
                "T5: a Reformer training step against sequence length",
                "sequence length (tokens)",
                "seconds per step (batch 1)",
                &series,
                Axes::Log,
            ),
        ));
    }
    let t6 = t6_rows(lines);
    if !t6.is_empty() {
        let series: Vec<Series> = T6_MODELS
            .iter()
            .map(|(model, label)| Series {
                name: (*label).into(),
                points: t6
                    .iter()
                    .filter(|r| r["model"] == *model)
                    .filter_map(|r| {
                        Some((
                            u(&r["distance"]) as f64,
                            f(&r["first_bpc"])? - f(&r["second_bpc"])?,
                        ))
                    })
                    .collect(),
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        out.push((
            "t6.svg".into(),
            chart(
                "T6: what a second reading gains, against the distance of the first",
                "distance of the first reading (tokens)",
                "bpc first reading - bpc second",
                &series,
                Axes::Linear,
            ),
        ));
    }
    out
}

/// `docs/study.md` from the lines; `dir` is the charts' folder as seen from the report.
pub fn markdown(lines: &[Value], dir: &str) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# The papers' claims on real long documents\n\n\
         Written by `cargo xtask study` from `{dir}/study.jsonl`; rerun it to measure again\n\
         (`--table t1,...` for some tables, `--quick` for a smoke run that checks the pipeline,\n\
         not the numbers). The documents are the `rust-code` corpus: the sources of the crates\n\
         pinned in memzoo's `Cargo.lock`, one crate a document, split by crate\n\
         (`datasets/rust-code.toml`, `memzoo data prepare rust-code`). `cargo xtask study` runs\n\
         T1-T6; two extras run when named (`--table t1b,t6b`): T1B repeats T1 on a book (tiny\n\
         Shakespeare, `--books FILE` for another), T6B trains the models of T6's mechanism\n\
         check. Every model reads whole\n\
         documents, its memories reset where one starts. The scale is reduced (see each table's\n\
         recipe) but the tables are the papers'. The analysis of what the numbers mean and what\n\
         was tried is in [study-notes.md](study-notes.md).\n"
    );
    if let Some(m) = TABLE_NAMES.iter().find_map(|t| meta(lines, t)) {
        let _ = writeln!(
            md,
            "Machine: {}. Date: {}.{}\n",
            m["machine"].as_str().unwrap_or("?"),
            m["date"].as_str().unwrap_or("?"),
            if m["quick"] == true {
                " **Quick (smoke) run: these numbers mean nothing.**"
            } else {
                ""
            }
        );
    }
    if let Some(t) = time_summary(lines) {
        let _ = writeln!(md, "{t}\n");
    }
    t1_section(&mut md, lines, dir, "t1");
    t1_section(&mut md, lines, dir, "t1v");
    t1_section(&mut md, lines, dir, "t1b");
    t2_section(&mut md, lines, dir);
    t3_section(&mut md, lines, dir);
    t4_section(&mut md, lines, dir);
    t5_section(&mut md, lines, dir);
    t6_section(&mut md, lines, dir);
    t7_section(&mut md, lines, dir);
    md
}

/// What each of T7's models carries from one segment to the next, and how far back that
/// reaches in one layer.
fn t7_memory(model: &str, m: usize, segment: usize) -> String {
    match model {
        "xl-no-recurrence" => "none (its segment)".into(),
        "xl" => format!("XL memory {m}: {} tokens", m + segment),
        "compressive" => format!(
            "XL memory {m} + compressed {m} at rate 4: {} tokens",
            m + 4 * m + segment
        ),
        "compressive-most-used" => format!(
            "XL memory {m} + the {m} most attended of {} leaving: {} tokens",
            4 * m,
            m + 4 * m + segment
        ),
        "rmt" => "16 memory tokens, written every segment: unbounded".into(),
        "rmt-xl" => format!("XL memory {m} + 16 memory tokens: unbounded"),
        "block-recurrent" => format!("XL memory {m} + a state of {m} vectors: unbounded"),
        other => other.into(),
    }
}

fn t7_section(md: &mut String, lines: &[Value], dir: &str) {
    let t7 = rows(lines, "t7");
    if t7.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## T7: every memory on the same documents\n\n\
         **Papers**: each of these memories is proposed as reaching further than \
         Transformer-XL's for a similar cost: the Compressive Transformer (Rae et al. 2019) \
         keeps what leaves the XL memory, compressed; the Recurrent Memory Transformer \
         (Bulatov et al. 2022) carries memory tokens written by each segment; the \
         Block-Recurrent Transformer (Hutchins et al. 2022) carries a state updated by a \
         recurrent layer with gates. Their numbers are on enwik8, WikiText-103, PG-19 and \
         arXiv at full scale; only the direction (a longer reach than XL's, a lower loss) is \
         the question here.\n\n\
         **Here**: T1's recipe and documents for each memory of memzoo's stack, beside the XL \
         without recurrence; test bpc and far bpc (as T1) as each was trained; RECL (as T2) \
         across this group. `cargo xtask study --table t7` (an extra).\n"
    );
    scale_line(md, lines, "t7");
    let s = meta(lines, "t7").map(|m| &m["scale"]);
    let (m, segment) = s.map_or((0, 0), |s| (u(&s["mem_len"]), u(&s["tgt_len"])));
    let recl = |model: &str, r: f64| {
        t7.iter()
            .find(|x| x["kind"] == "recl" && x["model"] == model && f(&x["r"]) == Some(r))
            .map_or("-".to_string(), |x| {
                let at_least = if x["at_least"] == true { "≥ " } else { "" };
                format!("{at_least}{}", u(&x["recl"]))
            })
    };
    let _ = writeln!(
        md,
        "| model | carried memory: reach in one layer | params | train min | test bpc | far bpc (tokens) | RECL r = 0.1 | r = 1.0 |\n\
         |---|---|---:|---:|---:|---:|---:|---:|"
    );
    for r in t7.iter().filter(|r| r["kind"] == "score") {
        let model = r["model"].as_str().unwrap_or("?");
        let _ = writeln!(
            md,
            "| {model} | {} | {:.2} M | {:.1} | {:.3} | {:.3} ({}) | {} | {} |",
            t7_memory(model, m, segment),
            u(&r["params"]) as f64 / 1e6,
            f(&r["train_seconds"]).unwrap_or(f64::NAN) / 60.0,
            f(&r["test_bpc"]).unwrap_or(f64::NAN),
            f(&r["far_bpc"]).unwrap_or(f64::NAN),
            u(&r["far_tokens"]),
            recl(model, 0.1),
            recl(model, 1.0),
        );
    }
    let _ = writeln!(md, "\n| model | bpc at each context |\n|---|---|");
    context_rows(md, &t7);
    let _ = writeln!(md, "\n![T7]({dir}/t7.svg)\n");
}

const TABLE_NAMES: [&str; 10] = [
    "t1", "t1b", "t1v", "t2", "t3", "t4", "t5", "t6", "t6b", "t7",
];

/// What each table took on the machine of its meta line, from scratch: its wall time plus the
/// training of the models it reused from an earlier run of the study (not for T2 and T6, which
/// read the models T1 and T3 train). A line "T1 26 min, ...; the default tables N min".
fn time_summary(lines: &[Value]) -> Option<String> {
    let minutes = |t: &str| -> Option<f64> {
        let m = meta(lines, t)?;
        let reused = if m["reads_other_tables_models"] == true {
            0.0
        } else {
            f(&m["reused_train_seconds"]).unwrap_or(0.0)
        };
        // A user's `--copy-run` runs read in T6 are not the study's own time.
        let copy_runs = f(&m["copy_run_seconds"]).unwrap_or(0.0);
        Some((f(&m["seconds"])? + reused - copy_runs) / 60.0)
    };
    let part = |tables: &[&str]| -> (Vec<String>, f64) {
        let mut names = Vec::new();
        let mut total = 0.0;
        for t in tables {
            if let Some(m) = minutes(t) {
                // A T6 measured before the study kept the `--copy-run` time apart includes it.
                let with_copy_runs = meta(lines, t)
                    .is_some_and(|m| m["copy_run_seconds"].is_null())
                    && rows(lines, t).iter().any(|r| r["external"] == true);
                let note = if with_copy_runs {
                    " (with the `--copy-run` evaluations)"
                } else {
                    ""
                };
                names.push(format!("{} {m:.0}{note}", t.to_uppercase()));
                total += m;
            }
        }
        (names, total)
    };
    let (default, total) = part(&["t1", "t2", "t3", "t4", "t5", "t6"]);
    if default.is_empty() {
        return None;
    }
    let (extra, extra_total) = part(&["t1b", "t6b", "t1v", "t7"]);
    let mut text = format!(
        "Time, training included (minutes): {}; the default `cargo xtask study` {total:.0}.",
        default.join(", ")
    );
    if !extra.is_empty() {
        text.push_str(&format!(
            " The extras (`--table t1b,t6b,t1v,t7`): {}; {extra_total:.0} together.",
            extra.join(", ")
        ));
    }
    Some(text)
}

fn scale_line(md: &mut String, lines: &[Value], table: &str) {
    if let Some(m) = meta(lines, table) {
        let s = &m["scale"];
        let steps = if table == "t1b" {
            format!("{} steps", s["steps_books"])
        } else {
            format!(
                "{} steps (T3's memorizing stacks {})",
                s["steps"], s["steps_memorizing"]
            )
        };
        let test = m["test_crates"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let data = if table == "t1b" {
            let parts = m["test_crates"].as_array().map_or(0, Vec::len);
            let book = m["test_crates"][0]
                .as_str()
                .and_then(|n| n.split(' ').next())
                .unwrap_or("?")
                .to_string();
            format!(
                "{book}: {} train parts, {parts} test parts",
                m["train_crates"]
            )
        } else {
            format!("{} train crates, test crates {test}", m["train_crates"])
        };
        let memory = match table {
            "t1v" => format!(
                "XL memory {} kept and 0 .. {} of it read per training step",
                8 * u(&s["mem_len"]),
                8 * u(&s["mem_len"])
            ),
            _ => format!("XL memory {} in training", s["mem_len"]),
        };
        let _ = writeln!(
            md,
            "Recipe: {} layers, d_model {}, {} heads, d_inner {}, segments of {}, {memory}, \
             batch {}, {steps}; AdamW, lr {}, warm-up then cosine, clip 0.25, no dropout; \
             bytes; {data}. The table took {:.0} s.\n",
            s["n_layers"],
            s["d_model"],
            s["n_heads"],
            s["d_inner"],
            s["tgt_len"],
            s["batch"],
            s["lr"],
            m["seconds"].as_f64().unwrap_or(0.0)
        );
    }
}

/// The smallest relative fall of bpc that counts as a gain in a target.
const FALL: f64 = 0.001;

fn t1_section(md: &mut String, lines: &[Value], dir: &str, table: &str) {
    let t1 = rows(lines, table);
    if t1.is_empty() {
        return;
    }
    let (heading, paper) = if table == "t1" {
        (
            "## T1: Transformer-XL, memory at evaluation".to_string(),
            format!("**Paper** (Dai et al. 2019): {PAPER_T1}"),
        )
    } else if table == "t1v" {
        (
            "## T1V: an XL trained with varied memory lengths, memory at evaluation".to_string(),
            "**Paper**: as T1. **The change**: T1's XL reads M = 64 in every training step, so \
             it never sees keys further back than M + the segment; this one keeps 8M and each \
             training step reads the most recent 0, M/2, M, 2M, 4M or 8M of it (drawn per step, \
             `XlConfig::train_memory_lengths`), the same steps and data as T1's XL. Its rows \
             below are read as T1's (`same_length` clamps at its training span, 8M + the \
             segment). Compare with T1's `xl` rows."
                .to_string(),
        )
    } else {
        (
            "## T1B: Transformer-XL on a book, memory at evaluation".to_string(),
            "**Paper**: as T1 (the XL paper's Table 6 directions), on a book: the books of \
             PG-19 are the setting of the Compressive and Memorizing Transformers; tiny \
             Shakespeare is the book every machine building memzoo has (`pg19-sample` needs a \
             network). The book's splits are `memzoo train --data FILE`'s (the last 5% \
             validation, the 5% before it test), each cut into one contiguous part per batch row \
             (a document: memory carried through it, reset at the next); the models are T1's, \
             trained for fewer steps (the book is 1 MB)."
                .to_string(),
        )
    };
    let here = if table == "t1v" {
        "**Here**: memory m as in T1 (query i of a segment sees m + i earlier tokens; \
         `same_length`: every query sees exactly m keys). *far bpc*: as T1, the bytes whose \
         8-byte string last occurred further back than the segment plus M.\n"
    } else {
        "**Here**: an XL trained with memory M, evaluated with memory 0 .. 8M (`memory m`: \
         query i of a segment sees m + i earlier tokens; `same_length`: every query sees \
         exactly m keys, distances clamped at the training span, as the paper evaluates); the \
         same model trained without recurrence; a vanilla Transformer (absolute sinusoidal \
         positions, no memory). *far bpc*: the bytes whose 8-byte string last occurred further \
         back than the segment plus M, the ones only a longer memory can copy.\n"
    };
    let _ = writeln!(md, "{heading}\n\n{paper}\n\n{here}");
    scale_line(md, lines, table);
    let _ = writeln!(
        md,
        "| model | eval memory | same_length | test bpc | far bpc (tokens) |\n|---|---:|---|---:|---:|"
    );
    for r in &t1 {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} ({}) |",
            r["model"].as_str().unwrap_or("?"),
            u(&r["eval_mem"]),
            r["same_length"],
            fmt3(f(&r["test_bpc"])),
            fmt3(f(&r["far_bpc"])),
            u(&r["far_tokens"])
        );
    }
    let _ = writeln!(md, "\n![{}]({dir}/{table}.svg)\n", table.to_uppercase());
    let m = meta(lines, table).map_or(0, |m| u(&m["scale"]["mem_len"]));
    if m > 0 {
        let steps = [m / 2, m, 2 * m, 4 * m];
        let xl_model = if table == "t1v" {
            "xl-varied-memory"
        } else {
            "xl"
        };
        let falls = |same: bool| {
            let b: Vec<Option<f64>> = steps
                .iter()
                .map(|&s| t1_bpc(lines, table, xl_model, s, same))
                .collect();
            b.windows(2)
                // A fall smaller than 0.1% (0.002 bpc at 2 bpc) is noise, not a gain.
                .all(|w| matches!((w[0], w[1]), (Some(a), Some(c)) if c < a * (1.0 - FALL)))
        };
        let best = |model: &str| {
            rows(lines, table)
                .iter()
                .filter(|r| r["model"] == model)
                .filter_map(|r| f(&r["test_bpc"]))
                .fold(f64::INFINITY, f64::min)
        };
        if table == "t1v" {
            let _ = writeln!(
                md,
                "Target (T1's, for this model): bpc falls (by at least 0.1%) with every step of \
                 the evaluation memory from M/2 to 4M — with `same_length` {}, with memory m {}. \
                 Best: {:.3} (T1's XL: {:.3}).\n",
                verdict(falls(true)),
                verdict(falls(false)),
                best(xl_model),
                rows(lines, "t1")
                    .iter()
                    .filter(|r| r["model"] == "xl")
                    .filter_map(|r| f(&r["test_bpc"]))
                    .fold(f64::INFINITY, f64::min)
            );
            return;
        }
        let (xl, norec, van) = (best("xl"), best("xl-no-recurrence"), best("vanilla"));
        let _ = writeln!(
            md,
            "Targets: bpc falls (by at least 0.1%) with every step of the evaluation memory from \
             M/2 to 4M — with \
             `same_length` {}, with memory m {}; XL < no recurrence < vanilla (best of each: \
             {xl:.3} / {norec:.3} / {van:.3}) {}.\n",
            verdict(falls(true)),
            verdict(falls(false)),
            verdict(xl < norec && norec < van)
        );
    }
}

fn t2_section(md: &mut String, lines: &[Value], dir: &str) {
    let t2 = rows(lines, "t2");
    if t2.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## T2: relative effective context length\n\n\
         **Paper** (Dai et al. 2019, Table 8): {PAPER_T2}\n\n\
         **Here**: `memzoo_train::recl` (also `memzoo recl --run-dir A --run-dir B ...`) on \
         blocks of one segment scored after c tokens of their document (c = 0, one segment, \
         ...), read from a fresh state in segments with each model's memories carried; the \
         group's baseline is the best model at c, the gain threshold 0.01 as the paper. The \
         XL models read with the XL memory that served each best in T1 (distances clamped at \
         the training span; what lies further back reaches them through the recurrence), the \
         vanilla model its segment, the Memorizing model as trained (its kNN memory holds the \
         whole window). A RECL marked ≥ was still gaining at the largest context.\n"
    );
    let _ = writeln!(
        md,
        "| model | RECL r = 0.1 | r = 0.5 | r = 1.0 |\n|---|---:|---:|---:|"
    );
    let recl = |model: &str, r: f64| {
        t2.iter()
            .find(|x| x["kind"] == "recl" && x["model"] == model && f(&x["r"]) == Some(r))
            .map(|x| (u(&x["recl"]), x["at_least"] == true))
    };
    let show = |v: Option<(usize, bool)>| match v {
        Some((c, true)) => format!("≥ {c}"),
        Some((c, false)) => c.to_string(),
        None => "-".into(),
    };
    let models = ["xl", "xl-no-recurrence", "vanilla", "memorizing-xl-cache"];
    for m in models {
        let _ = writeln!(
            md,
            "| {m} | {} | {} | {} |",
            show(recl(m, 0.1)),
            show(recl(m, 0.5)),
            show(recl(m, 1.0))
        );
    }
    let _ = writeln!(md, "\n| model | bpc at each context |\n|---|---|");
    context_rows(md, &t2);
    let _ = writeln!(md, "\n![T2]({dir}/t2.svg)\n");
    let order = |r: f64| {
        let v: Vec<Option<usize>> = ["xl", "xl-no-recurrence", "vanilla"]
            .iter()
            .map(|m| recl(m, r).map(|x| x.0))
            .collect();
        matches!((v[0], v[1], v[2]), (Some(a), Some(b), Some(c)) if a > b && b > c)
    };
    let _ = writeln!(
        md,
        "Targets: RECL(XL) > RECL(no recurrence) > RECL(vanilla) at r = 0.1 {}, at r = 1.0 {}.\n",
        verdict(order(0.1)),
        verdict(order(1.0))
    );
}

fn t3_section(md: &mut String, lines: &[Value], dir: &str) {
    let t3 = rows(lines, "t3");
    if t3.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## T3: Memorizing Transformer, memory size\n\n\
         **Paper** (Wu et al. 2022): {PAPER_T3}\n\n\
         **Here**: the memorizing stack (T5 relative positions, pre-LN) with one kNN layer in the \
         middle (top-32, exact search, memory cleared at each document start), trained with the \
         kNN memory in the Recipe, evaluated with each memory size without retraining; with and \
         without the XL cache; beside it the same stacks without a kNN layer. *far bpc* as T1.\n"
    );
    scale_line(md, lines, "t3");
    let _ = writeln!(
        md,
        "| model | XL cache | kNN memory (train → eval) | test bpc | far bpc (tokens) |\n|---|---|---|---:|---:|"
    );
    for r in &t3 {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} ({}) |",
            r["model"].as_str().unwrap_or("?"),
            r["xl_cache"],
            match r["knn_train"].as_u64() {
                Some(t) => format!("{t} → {}", u(&r["knn_eval"])),
                None => "none".into(),
            },
            fmt3(f(&r["test_bpc"])),
            fmt3(f(&r["far_bpc"])),
            u(&r["far_tokens"])
        );
    }
    let _ = writeln!(md, "\n![T3]({dir}/t3.svg)\n");
    let series = |model: &str, base: &str| -> (Vec<(usize, f64)>, Option<f64>) {
        let mut s: Vec<(usize, f64)> = t3
            .iter()
            .filter(|r| r["model"] == model)
            .filter_map(|r| Some((u(&r["knn_eval"]), f(&r["test_bpc"])?)))
            .collect();
        s.sort_by_key(|p| p.0);
        let b = t3
            .iter()
            .find(|r| r["model"] == base)
            .and_then(|r| f(&r["test_bpc"]));
        (s, b)
    };
    for (model, base, label) in [
        ("memorizing-xl-cache", "t5-xl-cache", "with the XL cache"),
        ("memorizing-no-cache", "t5-no-memory", "without it"),
    ] {
        let (s, b) = series(model, base);
        let mut all: Vec<f64> = b.into_iter().collect();
        all.extend(s.iter().map(|p| p.1));
        let falls = all.len() > 1 && all.windows(2).all(|w| w[1] < w[0] * (1.0 - FALL));
        let trained = meta(lines, "t3").map_or(0, |m| u(&m["scale"]["knn_train"]));
        let at = |n: usize| s.iter().find(|p| p.0 == n).map(|p| p.1);
        let larger = s
            .iter()
            .filter(|p| p.0 > trained)
            .any(|p| at(trained).is_some_and(|t| p.1 < t * (1.0 - FALL)));
        let _ = writeln!(
            md,
            "Targets {label}: bpc falls (by at least 0.1%) with every memory-size step (no kNN, \
             then each size) {}; \
             the model trained with {trained} gains from a larger memory at evaluation {}.\n",
            verdict(falls),
            verdict(larger)
        );
    }
}

fn t4_section(md: &mut String, lines: &[Value], dir: &str) {
    let t4 = rows(lines, "t4");
    if t4.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## T4: Reformer, the duplication task\n\n\
         **Paper** (Kitaev et al. 2020, Table 2): {PAPER_T4}\n\n\
         **Here**: `0 w 0 w` with w of {} symbols from 15, a one-layer shared-QK Reformer \
         (buckets of 4, axial positions), trained with full attention (one chunk over the sequence) or LSH with \
         1/2/4 rounds for {} steps, each evaluated with full attention and LSH-1/2/4/8: the \
         share of the second copy predicted right, over {} test sequences; an LSH evaluation is \
         the mean over {} draws of the rotations.\n",
        t4.first().map_or(0, |r| u(&r["len"]) / 2 - 1),
        t4.first().map_or(0, |r| u(&r["steps"])),
        t4.first().map_or(0, |r| u(&r["sequences"])),
        t4.iter()
            .filter_map(|r| r["accuracy_per_seed"].as_array().map(Vec::len))
            .max()
            .unwrap_or(1)
    );
    let evals = ["full", "lsh-8", "lsh-4", "lsh-2", "lsh-1"];
    let _ = writeln!(
        md,
        "| trained with | {} |\n|---|{}",
        evals.join(" | "),
        "---:|".repeat(evals.len())
    );
    let acc = |t: &str, e: &str| {
        t4.iter()
            .find(|r| r["train"] == t && r["eval"] == e)
            .and_then(|r| f(&r["accuracy"]))
    };
    let trains = ["full", "lsh-4", "lsh-2", "lsh-1"];
    for t in trains {
        let cells: Vec<String> = evals
            .iter()
            .map(|e| acc(t, e).map_or("-".into(), |a| format!("{:.1}%", 100.0 * a)))
            .collect();
        let _ = writeln!(md, "| {t} | {} |", cells.join(" | "));
    }
    let _ = writeln!(md, "\n![T4]({dir}/t4.svg)\n");
    let rounds = |s: &str| s.strip_prefix("lsh-").and_then(|r| r.parse::<usize>().ok());
    let lsh_ok = trains
        .iter()
        .filter_map(|t| Some((t, rounds(t)?)))
        .all(|(t, r)| {
            evals
                .iter()
                .filter_map(|e| Some((e, rounds(e)?)))
                .filter(|(_, er)| *er >= r)
                .all(|(e, _)| acc(t, e).is_some_and(|a| a >= 0.9))
        });
    let full_low = acc("full", "lsh-1").is_some_and(|a| a < 0.8);
    let _ = writeln!(
        md,
        "Targets: every LSH-trained model >= 90% at evaluation rounds >= its training rounds {}; \
         the full-attention model well below that with LSH-1 (< 80%) {}.\n",
        verdict(lsh_ok),
        verdict(full_low)
    );
}

fn t5_section(md: &mut String, lines: &[Value], dir: &str) {
    let t5 = rows(lines, "t5");
    if t5.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## T5: LSH against full attention on real text\n\n\
         **Paper** (Kitaev et al. 2020, Figures 4-5): {PAPER_T5}\n\n\
         **Here**: a 2-layer reversible Reformer (the code models' width; buckets of 32, one \
         chunk back) on the rust-code documents, trained for equal steps with full attention \
         and LSH-1/2/4/8; then the time of one training step (batch 1) against sequence length, \
         full attention against LSH-4.\n"
    );
    let _ = writeln!(
        md,
        "| attention | steps | length | test bpc |\n|---|---:|---:|---:|"
    );
    let quality: Vec<&&Value> = t5.iter().filter(|r| r["kind"] == "quality").collect();
    for r in &quality {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            r["attention"].as_str().unwrap_or("?"),
            u(&r["steps"]),
            u(&r["len"]),
            fmt3(f(&r["test_bpc"]))
        );
    }
    let _ = writeln!(
        md,
        "\n| length | full s/step | LSH-4 s/step |\n|---:|---:|---:|"
    );
    let time = |a: &str, len: usize| {
        t5.iter()
            .find(|r| r["kind"] == "time" && r["attention"] == a && u(&r["len"]) == len)
            .and_then(|r| f(&r["step_seconds"]))
    };
    let mut lens: Vec<usize> = t5
        .iter()
        .filter(|r| r["kind"] == "time")
        .map(|r| u(&r["len"]))
        .collect();
    lens.sort();
    lens.dedup();
    for &l in &lens {
        let _ = writeln!(
            md,
            "| {l} | {} | {} |",
            fmt3(time("full", l)),
            fmt3(time("lsh-4", l))
        );
    }
    let _ = writeln!(md, "\n![T5]({dir}/t5.svg)\n");
    let bpc = |a: &str| {
        quality
            .iter()
            .find(|r| r["attention"] == a)
            .and_then(|r| f(&r["test_bpc"]))
    };
    let close = matches!((bpc("lsh-8"), bpc("full")), (Some(l), Some(fl)) if l - fl <= 0.05);
    let crossover = lens
        .iter()
        .copied()
        .find(|&l| matches!((time("lsh-4", l), time("full", l)), (Some(a), Some(b)) if a < b));
    let _ = writeln!(
        md,
        "Targets: LSH-8 within 0.05 bpc of full attention at equal steps ({} against {}) {}; \
         LSH faster than full attention from some length on {}{}.\n",
        fmt3(bpc("lsh-8")),
        fmt3(bpc("full")),
        verdict(close),
        verdict(crossover.is_some()),
        crossover.map_or(String::new(), |l| format!(" (from {l} tokens)"))
    );
    let _ = LN2;
}

/// What the XL paper reports for T1 (Dai et al. 2019, Table 6; Table 2 for enwik8).
const PAPER_T1: &str = "Table 6 (WikiText-103 ablation, 128M parameters, trained with \
attention length 128+mem): with recurrence and XL's encoding, PPL 27.02 at the training \
attention length and 26.77 at the best evaluation length (500); without recurrence (XL's \
encoding) 29.59 / 29.02 (best at 260); the vanilla Transformer of Al-Rfou et al. (absolute \
positions) 31.16 / 31.16 (120: no gain from a longer evaluation). \"Increasing the attention \
length during evaluation improves performance only when our positional encoding is used\"; \
XL-151M: 23.43 at the training length, 23.09 at 640. On enwik8 the 24-layer XL reaches 0.99 \
bpc evaluated with memory 3,800 after training with 784 (Table 2).";
/// What the XL paper reports for T2 (Dai et al. 2019, Table 8).
const PAPER_T2: &str = "RECL at r = 0.1 / 0.5 / 1.0, WikiText-103, one group: Transformer-XL \
128M 700 / 600 / 500; with Shaw et al.'s encoding 400 / 400 / 300; without recurrence 300 / \
300 / 300; the vanilla Transformer 128 / 128 / 128 (another group: XL-151M 900 / 800 / 700, \
QRNN 500 / 400 / 300, LSTM 400 / 300 / 200). In words: XL's context is 80% longer than \
RNNs' and 450% longer than vanilla Transformers'.";
/// What the Memorizing Transformer paper reports for T3 (Wu et al. 2022, Tables 4 and 5).
const PAPER_T3: &str = "Tables 4 and 5 (perplexity on arXiv math, GitHub, Isabelle, C4(4K+) \
and PG-19 with a 32K sentencepiece vocabulary): adding a kNN memory lowers perplexity on \
every data set, and more memory (1.5K to 8K to 32K to 65K tokens) lowers it further, with or \
without the XL cache; a model trained with a small memory improves when given a larger one \
at evaluation without retraining. The exact numbers were not verified here (no copy of the \
paper's tables could be read in this workplace), so only the directions are the targets.";
/// What the Reformer paper reports for T4 (Kitaev et al. 2020, Table 2).
const PAPER_T4: &str = "`0w0w`, w of 511 symbols from 127 (length 1024), a 1-layer model, \
d_model = d_ff = 256, 4 heads, 150K steps; accuracy when evaluated with full attention / \
LSH-8 / LSH-4 / LSH-2 / LSH-1 — trained with full attention: 100 / 94.8 / 92.5 / 76.9 / \
52.5%; LSH-4: 0.8 / 100 / 99.9 / 99.4 / 91.9%; LSH-2: 0.8 / 100 / 99.9 / 98.1 / 86.8%; \
LSH-1: 0.8 / 99.9 / 99.6 / 94.8 / 77.9%.";
/// What the Reformer paper reports for T5 (Kitaev et al. 2020, Figures 4-5).
const PAPER_T5: &str = "Figure 4 (imagenet64, 3 layers): LSH attention becomes more accurate \
as the hash rounds increase, and at 8 rounds it almost matches full attention. Figure 5 \
(right): with the total tokens fixed, full attention slows down as the sequence grows while \
LSH attention's time per token stays flat.";

/// T6's models and their labels, in the table's order.
const T6_MODELS: [(&str, &str); 9] = [
    ("xl", "XL, memory M"),
    ("xl-no-recurrence", "XL, no recurrence"),
    ("vanilla", "vanilla"),
    ("t5-xl-cache", "T5 stack, XL cache"),
    ("memorizing-xl-cache", "kNN + XL cache"),
    ("memorizing-no-cache", "kNN, no XL cache"),
    ("xl-copy", "XL, memory M, trained to copy"),
    (
        "memorizing-xl-cache-copy",
        "kNN + XL cache, trained to copy",
    ),
    ("knn-among-xl-copy", "kNN among XL layers, trained to copy"),
];

/// T6's rows: T6 (the models of T1 and T3, and `--copy-run` runs) and T6B (the models trained
/// on pieces read twice), one table.
fn t6_rows(lines: &[Value]) -> Vec<&Value> {
    let mut t6 = rows(lines, "t6");
    t6.extend(rows(lines, "t6b"));
    t6
}

fn t6_section(md: &mut String, lines: &[Value], dir: &str) {
    let t6 = t6_rows(lines);
    if t6.is_empty() {
        return;
    }
    let mut distances: Vec<usize> = t6.iter().map(|r| u(&r["distance"])).collect();
    distances.sort_unstable();
    distances.dedup();
    let _ = writeln!(
        md,
        "## T6: copying at a distance (a diagnostic)\n\n\
         No paper table: a direct test of how far each model looks back. Pieces of the test \
         documents of d bytes are each read twice in a row; the table gives the bpc of the \
         first reading and of the second. A model that can copy from d bytes back reads the \
         second almost for free; one that cannot reads both alike. Each model reads with the \
         memory it trained with (XL cache M, kNN memory as in T3's training). The models of T1 \
         and T3 learnt from the documents as they are; the rows trained to copy (T6B, \
         `--table t6b`) are the XL and the Memorizing stack (with T5 positions as in T3, and a kNN layer among XL layers) \
         trained instead on train pieces read twice at the same distances, which rewards \
         copying: a check that each memory can carry a copy as far as it reaches. Rows marked \
         `--copy-run` are runs of `memzoo train` given to the study (see the notes).\n"
    );
    let head: Vec<String> = distances.iter().map(|d| format!("d = {d}")).collect();
    let _ = writeln!(
        md,
        "| model (first → second bpc) | {} |\n|---|{}",
        head.join(" | "),
        "---:|".repeat(distances.len())
    );
    // The study's models, then any run read with `--copy-run`, under its own name.
    let mut named: Vec<(String, String)> = T6_MODELS
        .iter()
        .map(|(m, l)| (m.to_string(), l.to_string()))
        .collect();
    for r in &t6 {
        if let Some(m) = r["model"].as_str()
            && !named.iter().any(|(n, _)| n == m)
        {
            let label = if r["external"] == true {
                format!("`{m}` (`--copy-run`)")
            } else {
                m.to_string()
            };
            named.push((m.to_string(), label));
        }
    }
    for (model, label) in &named {
        let model = model.as_str();
        let cells: Vec<String> = distances
            .iter()
            .map(|&d| {
                t6.iter()
                    .find(|r| r["model"] == model && u(&r["distance"]) == d)
                    .map(|r| {
                        format!(
                            "{} → {}",
                            fmt3(f(&r["first_bpc"])),
                            fmt3(f(&r["second_bpc"]))
                        )
                    })
                    .unwrap_or_else(|| "-".into())
            })
            .collect();
        if cells.iter().any(|c| c != "-") {
            let _ = writeln!(md, "| {label} | {} |", cells.join(" | "));
        }
    }
    // The `--copy-run` runs on the test documents as they are, by kNN memory.
    let mut scored: Vec<(&str, String, f64)> = Vec::new();
    for r in t6.iter().filter(|r| r["external"] == true) {
        if let (Some(run), Some(b)) = (r["run"].as_str(), f(&r["test_bpc"])) {
            let mem = r["knn_memory"]
                .as_u64()
                .map_or("-".to_string(), |m| m.to_string());
            if !scored.iter().any(|(n, m, _)| *n == run && *m == mem) {
                scored.push((run, mem, b));
            }
        }
    }
    // By run, then by memory size.
    scored.sort_by_key(|(run, mem, _)| (*run, mem.parse::<u64>().unwrap_or(0)));
    if !scored.is_empty() {
        let _ = writeln!(
            md,
            "\nThe `--copy-run` runs on the test documents as they are (the same weights, \
             kNN memory per row and head as trained, cut, and larger):\n\n\
             | run | kNN memory | test bpc |\n|---|---:|---:|"
        );
        for (run, mem, b) in scored {
            let _ = writeln!(md, "| `{run}` | {mem} | {b:.3} |");
        }
    }
    let _ = writeln!(md, "\n![T6]({dir}/t6.svg)\n");
}

/// The bpc of a RECL group's scored blocks against the context (`table`'s curve lines).
fn context_chart(lines: &[Value], table: &str, title: &str) -> Option<String> {
    let curves: Vec<&Value> = rows(lines, table)
        .into_iter()
        .filter(|r| r["kind"] == "curve")
        .collect();
    if curves.is_empty() {
        return None;
    }
    let series: Vec<Series> = curves
        .iter()
        .map(|r| Series {
            name: r["model"].as_str().unwrap_or("?").into(),
            points: r["contexts"]
                .as_array()
                .into_iter()
                .flatten()
                .zip(r["bpc"].as_array().into_iter().flatten())
                .filter_map(|(c, b)| Some((c.as_f64()?, b.as_f64()?)))
                .collect(),
        })
        .collect();
    Some(chart(
        title,
        "context before the block (tokens)",
        "bpc",
        &series,
        Axes::Linear,
    ))
}

/// One markdown row per curve line of a RECL group: the bpc at each context.
fn context_rows(md: &mut String, lines: &[&Value]) {
    for r in lines.iter().filter(|x| x["kind"] == "curve") {
        let pairs: Vec<String> = r["contexts"]
            .as_array()
            .into_iter()
            .flatten()
            .zip(r["bpc"].as_array().into_iter().flatten())
            .map(|(c, b)| format!("{}: {:.3}", c, b.as_f64().unwrap_or(f64::NAN)))
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} |",
            r["model"].as_str().unwrap_or("?"),
            pairs.join(", ")
        );
    }
}
