//! Tests of the harness's pure parts: plot scales and SVG content, and the targets' parsing.

use crate::measure::Measurement;
use crate::plot::{Series, line_chart, write_plots};

fn m(name: &str, s: f64, rss: f64, tps: f64) -> Measurement {
    Measurement {
        name: name.into(),
        backend: "flex".into(),
        threads: 2,
        step_s_median: s,
        peak_rss_mb: rss,
        tokens_per_s: tps,
        ..Default::default()
    }
}

/// The `(x, y)` pixel pairs of every `<polyline>` in `svg`.
fn polylines(svg: &str) -> Vec<Vec<(f64, f64)>> {
    svg.lines()
        .filter_map(|l| l.split("points=\"").nth(1))
        .map(|rest| {
            rest.split('"')
                .next()
                .unwrap()
                .split_whitespace()
                .map(|p| {
                    let (x, y) = p.split_once(',').unwrap();
                    (x.parse().unwrap(), y.parse().unwrap())
                })
                .collect()
        })
        .collect()
}

#[test]
fn log_axes_place_doublings_at_equal_steps() {
    // y doubles whenever x doubles: on log-log axes the points are evenly spaced on a line.
    let series = vec![Series {
        name: "a".into(),
        points: vec![(1024.0, 0.5), (2048.0, 1.0), (4096.0, 2.0), (8192.0, 4.0)],
    }];
    let svg = line_chart("t", "x", "y", &series);
    let lines = polylines(&svg);
    assert_eq!(lines.len(), 1);
    let p = &lines[0];
    assert_eq!(p.len(), 4);
    for w in p.windows(3) {
        let (dx1, dy1) = (w[1].0 - w[0].0, w[1].1 - w[0].1);
        let (dx2, dy2) = (w[2].0 - w[1].0, w[2].1 - w[1].1);
        assert!((dx1 - dx2).abs() < 0.2 && (dy1 - dy2).abs() < 0.2, "{p:?}");
        assert!(dx1 > 0.0 && dy1 < 0.0, "x grows right, y grows up: {p:?}");
    }
    // Ticks: the data's x values, and 1-2-5 values spanning y.
    for label in [">1K<", ">2K<", ">4K<", ">8K<", ">0.5<", ">1<", ">2<", ">5<"] {
        assert!(svg.contains(label), "missing tick {label}");
    }
}

#[test]
fn plots_are_written_per_suite_with_one_line_per_kind() {
    let results = vec![
        m("attention-full-1024", 0.5, 190.0, 2048.0),
        m("attention-full-2048", 1.9, 640.0, 1078.0),
        m("attention-lsh-1024", 0.6, 170.0, 1700.0),
        m("attention-lsh-2048", 1.5, 350.0, 1365.0),
        m("generate-cached-128", 0.015, 40.0, 66.0),
        m("generate-recompute-128", 0.1, 40.0, 10.0),
        m("xl-small", 1.0, 400.0, 900.0),
    ];
    let dir = std::env::temp_dir().join(format!("xtask-plot-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let files = write_plots(&results, &dir).unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        ["attention-time.svg", "attention-memory.svg", "generate.svg"]
    );
    let time = std::fs::read_to_string(dir.join("attention-time.svg")).unwrap();
    assert_eq!(polylines(&time).len(), 2);
    assert!(time.contains(">full<") && time.contains(">lsh<"));
    // full's second point is above (smaller pixel y) lsh's: 1.9 s against 1.5 s.
    let lines = polylines(&time);
    assert!(lines[0][1].1 < lines[1][1].1);
    let generate = std::fs::read_to_string(dir.join("generate.svg")).unwrap();
    assert!(generate.contains("XL memory (cached)") && generate.contains("recompute context"));
    assert!(
        write_plots(&results[6..], &dir).unwrap().is_empty(),
        "no suite, no plot"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn small_rates_keep_their_digits_in_the_table() {
    assert_eq!(crate::measure::rate(893.4), "893");
    assert_eq!(crate::measure::rate(12.44), "12.4");
    assert_eq!(crate::measure::rate(0.2773), "0.28");
    let table = crate::measure::markdown(&[m("generate-recompute-1024", 3.606, 231.0, 0.2773)]);
    assert!(table.contains("| 0.28 |"), "{table}");
}

mod quality {
    use crate::plot::{Axes, Series, chart};
    use crate::quality::{
        FamilyModel, QualityPoint, eval_points, family, markdown, parse_peer_output, train_log,
    };

    fn point(implementation: &str, step: usize, bpc: f64, wall_s: f64) -> QualityPoint {
        QualityPoint {
            kind: "quality".into(),
            family: "xl".into(),
            implementation: implementation.into(),
            step,
            valid_bpc: bpc,
            train_loss: 2.0,
            wall_s,
        }
    }

    #[test]
    fn peer_output_keeps_quality_lines_and_names_bad_ones() {
        let text = "Some warning from a library\n\
            {\"kind\": \"quality-peer\", \"family\": \"xl\", \"params\": 5}\n\
            {\"kind\": \"quality\", \"family\": \"xl\", \"impl\": \"HF TransfoXL 4.37.2\", \"step\": 50, \"valid_bpc\": 3.5, \"train_loss\": 2.6, \"wall_s\": 30.5, \"valid_tokens\": 55296}\n\
            \n\
            {\"kind\": \"quality\", \"family\": \"xl\", \"impl\": \"HF TransfoXL 4.37.2\", \"step\": 100, \"valid_bpc\": 3.1, \"train_loss\": 2.2, \"wall_s\": 61.0}\n";
        let points = parse_peer_output(text, "xl").unwrap();
        assert_eq!(points.len(), 2);
        assert_eq!(points[0].implementation, "HF TransfoXL 4.37.2");
        assert_eq!((points[0].step, points[0].valid_bpc), (50, 3.5));
        assert_eq!((points[1].step, points[1].wall_s), (100, 61.0));

        let missing = "{\"kind\": \"quality\", \"family\": \"xl\", \"impl\": \"p\", \"step\": 50, \"train_loss\": 2.6, \"wall_s\": 1}";
        let e = parse_peer_output(missing, "xl").unwrap_err();
        assert!(e.contains("valid_bpc") && e.contains("line 1"), "{e}");
        let other = "{\"kind\": \"quality\", \"family\": \"reformer\", \"impl\": \"p\", \"step\": 5, \"valid_bpc\": 7, \"train_loss\": 5, \"wall_s\": 1}";
        let e = parse_peer_output(other, "xl").unwrap_err();
        assert!(e.contains("`reformer`"), "{e}");
        let nan = "{\"kind\": \"quality\", \"family\": \"xl\", \"impl\": \"p\", \"step\": 5, \"valid_bpc\": NaN, \"train_loss\": 5, \"wall_s\": 1}";
        // Not JSON at all (Python prints NaN): ignored like any other non-JSON line.
        assert!(parse_peer_output(nan, "xl").unwrap().is_empty());
    }

    #[test]
    fn table_pairs_the_curves_by_step() {
        let points = vec![
            point("memzoo", 50, 3.25, 20.4),
            point("memzoo", 100, 2.9, 41.0),
            point("HF TransfoXL 4.37.2", 50, 3.0, 30.0),
        ];
        let t = markdown(&points);
        let rows: Vec<&str> = t.lines().collect();
        assert_eq!(rows.len(), 4, "{t}");
        assert!(rows[0].starts_with("| family | step | memzoo valid bpc | peer valid bpc |"));
        assert_eq!(
            rows[2],
            "| xl | 50 | 3.250 | 3.000 | +0.250 | 20 | 30 | HF TransfoXL 4.37.2 |"
        );
        // No peer point at step 100 (skipped or failed): dashes.
        assert_eq!(rows[3], "| xl | 100 | 2.900 | – | – | 41 | – | – |");
    }

    #[test]
    fn eval_points_default_to_the_run_and_name_a_bad_step() {
        assert_eq!(eval_points(400, None).unwrap(), [50, 100, 200, 300, 400]);
        assert_eq!(eval_points(150, None).unwrap(), [50, 100, 150]);
        assert_eq!(eval_points(20, None).unwrap(), [20]);
        assert_eq!(eval_points(20, Some(&[20, 10, 10])).unwrap(), [10, 20]);
        let e = eval_points(400, Some(&[50, 500])).unwrap_err();
        assert!(e.contains("500") && e.contains("400"), "{e}");
        assert!(
            eval_points(400, Some(&[0]))
                .unwrap_err()
                .contains("--eval-at 0")
        );
    }

    #[test]
    fn train_log_sums_the_windows_seconds() {
        // Two windows of 10 steps of 1,024 tokens: 10,240 tokens at 1,024/s, then at 2,048/s.
        let metrics = [
            r#"{"step":10,"split":"train","metric":"loss","value":3.0}"#,
            r#"{"step":10,"split":"train","metric":"tokens_per_s","value":1024.0}"#,
            r#"{"step":10,"split":"valid","metric":"loss","value":9.0}"#,
            r#"{"step":20,"split":"train","metric":"loss","value":2.5}"#,
            "not json",
            r#"{"step":20,"split":"train","metric":"tokens_per_s","value":2048.0}"#,
        ]
        .join("\n");
        let log = train_log(&metrics, 1024);
        assert_eq!(log.at(10), Some((3.0, 10.0)));
        assert_eq!(log.at(20), Some((2.5, 15.0)));
        assert_eq!(log.at(15), None);
    }

    #[test]
    fn families_validate_and_give_the_peer_the_same_numbers() {
        let e = family("lstm").map(|_| ()).unwrap_err();
        assert!(e.contains("`lstm`") && e.contains("--families"), "{e}");
        for name in crate::quality::FAMILIES {
            let f = family(name).unwrap();
            let m = &f.peer_model;
            match &f.model {
                FamilyModel::Xl(c) if f.name == "compressive" => {
                    c.validate().unwrap();
                    let cc = c.compressive.as_ref().expect("a compressive stack");
                    assert_eq!(m["depth"], c.n_layers);
                    assert_eq!(m["dim"], c.d_model);
                    assert_eq!(m["heads"], c.n_heads);
                    assert_eq!(m["mem_len"], c.mem_len);
                    assert_eq!(m["cmem_len"], cc.cmem_len);
                    assert_eq!(m["cmem_ratio"], cc.ratio);
                    assert_eq!(m["seq_len"], f.tgt_len, "the peer's window is one segment");
                }
                FamilyModel::Xl(c) if f.name == "rmt" => {
                    c.validate().unwrap();
                    let r = c.rmt.as_ref().expect("an RMT stack");
                    assert_eq!(m["depth"], c.n_layers);
                    assert_eq!(m["dim"], c.d_model);
                    assert_eq!(m["heads"], c.n_heads);
                    assert_eq!(m["num_memory_tokens"], r.mem_tokens);
                    assert_eq!(m["truncate_at_step"], r.bptt_segments);
                    assert_eq!(m["segments_per_step"], r.bptt_segments);
                    assert_eq!(m["seq_len"], f.tgt_len, "the peer's window is one segment");
                    assert_eq!(c.dropout, m["ff_dropout"].as_f64().unwrap());
                }
                FamilyModel::Xl(c) if f.name == "block-recurrent" => {
                    c.validate().unwrap();
                    let r = c.block_recurrent.as_ref().expect("a Block-Recurrent stack");
                    assert_eq!(m["depth"], c.n_layers);
                    assert_eq!(m["dim"], c.d_model);
                    assert_eq!(m["num_state_vectors"], r.state_len);
                    assert_eq!(m["recurrent_layers"][0], r.layer + 1, "1-based in the peer");
                    assert_eq!(m["block_width"], f.tgt_len, "a segment is one block");
                    assert_eq!(m["segments_per_step"], r.bptt_segments);
                    assert_eq!(m["max_seq_len"], m["block_width"].as_u64().unwrap() * 2);
                    assert_eq!(c.dropout, 0.0, "the peer has no dropout");
                    assert_eq!(f.peer_format, Some("lucidrains-block-recurrent"));
                }
                FamilyModel::Xl(c) => {
                    c.validate().unwrap();
                    assert_eq!(m["n_layer"], c.n_layers);
                    assert_eq!(m["d_head"], c.head_width());
                    assert_eq!(m["untie_r"], c.untie_rel_bias);
                    assert_eq!(m["clamp_len"], 1000);
                }
                FamilyModel::Reformer(c) => {
                    c.validate().unwrap();
                    assert_eq!(m["ff_mult"].as_u64().unwrap() as usize * c.d_model, c.d_ff);
                    assert_eq!(m["tgt_len"], c.max_seq_len, "each window read whole");
                    // The peer needs the length to be a multiple of two buckets.
                    assert_eq!(c.max_seq_len % (2 * c.lsh.chunk_len), 0);
                }
                FamilyModel::Memorizing(c) => {
                    c.validate().unwrap();
                    assert_eq!(m["knn_layer"], c.knn_layers[0] + 1, "1-based in the peer");
                    assert_eq!(c.knn_layers.len(), 1);
                    assert_eq!(
                        m["ff_mult"].as_u64().unwrap() as usize * c.xl.d_model,
                        c.xl.d_inner
                    );
                    assert_eq!(m["xl_max_memories"], c.xl.mem_len);
                }
            }
            assert_eq!(m["batch"], f.batch);
            assert_eq!(m["tgt_len"], f.tgt_len);
        }
    }

    #[test]
    fn linear_chart_puts_a_lower_bpc_lower() {
        let series = vec![Series {
            name: "memzoo".into(),
            points: vec![(50.0, 3.9), (100.0, 3.3), (400.0, 2.85)],
        }];
        let svg = chart("t", "step", "bpc", &series, Axes::Linear);
        let lines = super::polylines(&svg);
        let p = &lines[0];
        // Linear x: 50 -> 100 is a seventh of 50 -> 400.
        let (d1, d2) = (p[1].0 - p[0].0, p[2].0 - p[0].0);
        assert!((d2 / d1 - 7.0).abs() < 0.05, "{p:?}");
        assert!(
            p[0].1 < p[1].1 && p[1].1 < p[2].1,
            "lower bpc, larger pixel y: {p:?}"
        );
        assert!(svg.contains(">400<") && svg.contains(">3.5<"), "{svg}");
    }
}

mod study {
    use crate::study::{StudyArgs, TABLES, run_tables};

    /// `cargo xtask study --quick`: every table runs end to end on real crates of the
    /// rust-code corpus (tiny models, a few steps) and writes its JSON lines, its chart and its
    /// section of the report. The numbers are not checked: a smoke run means nothing.
    #[test]
    fn quick_study_writes_every_table() {
        let out = std::env::temp_dir().join(format!("memzoo-study-quick-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let args = StudyArgs {
            table: Some(TABLES.iter().map(|t| t.to_string()).collect()),
            quick: true,
            out: Some(out.clone()),
            runs: None,
            device: "flex".into(),
            threads: 2,
            seed: 0,
            set: vec![],
            copy_runs: vec![],
            books: None,
            report_only: false,
        };
        run_tables(&args).unwrap();
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(out.join("study.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let report = std::fs::read_to_string(out.join("study.md")).unwrap();
        assert!(report.contains("Quick (smoke) run"), "{report}");
        assert!(
            report.contains("the default `cargo xtask study`") && report.contains("T6B"),
            "the report states each table's time: {report}"
        );
        for t in TABLES {
            let rows: Vec<_> = lines.iter().filter(|l| l["table"] == t).collect();
            assert!(
                rows.iter().any(|l| l["kind"] == "meta"),
                "{t}: no meta line"
            );
            assert!(rows.len() > 1, "{t}: no results");
            if t == "t6b" {
                // T6B's rows are T6's table: the models trained on pieces read twice.
                assert!(rows.iter().skip(1).all(|l| l["trained_to_copy"] == true));
                assert!(report.contains("trained to copy"), "{report}");
                continue;
            }
            let svg = std::fs::read_to_string(out.join(format!("{t}.svg"))).unwrap();
            assert!(svg.contains("<polyline"), "{t}.svg has no line");
            let heading = format!("## {}", t.to_uppercase());
            assert!(report.contains(&heading), "the report has no {heading}");
        }
        // T1 holds each evaluation memory of the XL; T2 a RECL per model and ratio.
        let t1 = lines
            .iter()
            .filter(|l| l["table"] == "t1" && l["model"] == "xl")
            .count();
        assert_eq!(
            t1, 11,
            "XL rows: memory 0, then five memories with and without same_length"
        );
        let recl = lines
            .iter()
            .filter(|l| l["table"] == "t2" && l["kind"] == "recl")
            .count();
        assert_eq!(recl, 12, "4 models x 3 ratios");
        // A second run of one table reuses its trained models and replaces only its lines.
        let args = StudyArgs {
            table: Some(vec!["t4".into()]),
            ..args
        };
        run_tables(&args).unwrap();
        let again = std::fs::read_to_string(out.join("study.jsonl")).unwrap();
        assert_eq!(again.lines().count(), lines.len());
        // --report-only writes the same report from the lines, running nothing.
        let report = std::fs::read_to_string(out.join("study.md")).unwrap();
        std::fs::remove_file(out.join("study.md")).unwrap();
        let args = StudyArgs {
            report_only: true,
            ..args
        };
        run_tables(&args).unwrap();
        assert_eq!(
            std::fs::read_to_string(out.join("study.md")).unwrap(),
            report
        );
        assert_eq!(
            std::fs::read_to_string(out.join("study.jsonl")).unwrap(),
            again
        );
        let _ = std::fs::remove_dir_all(&out);
    }
}

/// The hand counts' sizes: `d_model`, heads, head width, `d_inner`, vocabulary, top-k.
const HAND: (usize, usize, usize, usize, usize, usize) = (8, 2, 4, 16, 10, 2);

/// The hand counts' two-layer stack (an XL layer, a kNN layer with one key/value head) with an
/// XL memory of `mem_len`.
fn hand_count_stack(mem_len: usize) -> memzoo_stack::XlConfig {
    use memzoo_stack::{KnnLayerConfig, LayerKind, XlConfig};
    let (d, h, e, f, v, k) = HAND;
    XlConfig::new()
        .with_n_layers(2)
        .with_d_model(d)
        .with_n_heads(h)
        .with_d_head(Some(e))
        .with_d_inner(f)
        .with_vocab_size(v)
        .with_mem_len(mem_len)
        .with_kv_heads(Some(1))
        .with_layers(vec![LayerKind::Xl, LayerKind::Knn])
        .with_knn(KnnLayerConfig::new().with_top_k(k))
}

/// `flops::train_flops_per_token` against a count of every matrix product of one training
/// segment of a tiny two-layer stack (one XL layer, one kNN layer with one key/value head),
/// written out product by product: `(m, k, n)` costs `2 m k n`, batched products times their
/// batch, the backward twice the forward.
#[test]
fn flops_per_token_match_a_hand_count() {
    use memzoo_stack::XlConfig;
    let (b, t, m) = (2usize, 4usize, 3usize); // rows, segment, memory
    let (d, h, e, f, v, k) = HAND;
    let config = hand_count_stack(m);
    let l = t + m; // keys: memory + segment
    let mm = |m: usize, k: usize, n: usize| 2 * m * k * n;
    let g = 1; // key/value heads
    // Layer 0 (XL): Q of the segment, K and V of memory + segment, W_R of the L relative
    // positions (once for all rows), per (row, head) q·k, (q + v)·r and p·v, the output.
    let xl = mm(b * t, d, h * e)
        + mm(b * l, d, 2 * g * e)
        + mm(l, d, h * e)
        + b * h * (mm(t, e, l) + mm(t, e, l) + mm(t, l, e))
        + mm(b * t, h * e, d)
        + mm(b * t, d, f)
        + mm(b * t, f, d);
    // Layer 1 (kNN): the same without positions (T5 is a bias), and per (row, token, head)
    // the k retrieved keys' scores and values.
    let knn = mm(b * t, d, h * e)
        + mm(b * l, d, 2 * g * e)
        + b * h * (mm(t, e, l) + mm(t, l, e))
        + b * t * h * (mm(1, e, k) + mm(1, k, e))
        + mm(b * t, h * e, d)
        + mm(b * t, d, f)
        + mm(b * t, f, d);
    let head = mm(b * t, d, v);
    let hand = 3.0 * (xl + knn + head) as f64 / (b * t) as f64;
    let counted = crate::flops::train_flops_per_token(&config, t, b);
    assert!(
        (counted - hand).abs() < 1e-9 * hand,
        "counted {counted}, by hand {hand}"
    );
    // XL-small: about 42 MFLOP per trained token (issue 27).
    let small =
        crate::flops::train_flops_per_token(&XlConfig::small().with_untie_rel_bias(true), 128, 8);
    assert!((40e6..43e6).contains(&small), "{small}");
}

/// `flops::generation_flops_per_token` against a hand count of one generated token of the
/// same two-layer stack, one token per segment over a memory of `c` positions: the token's own
/// projections (its key and value enter the cache), its scores and values over the `c` cached
/// keys and itself, XL's position term over those `c + 1` distances read from the table (no
/// `W_R` product), the kNN layer's retrieved pairs, the feed-forward and the head; and a token
/// inside a segment, which reads the segment's earlier tokens too.
#[test]
fn generation_flops_match_a_hand_count() {
    use memzoo_stack::XlConfig;
    let c = 7usize;
    let (d, h, e, f, v, k) = HAND;
    let config = hand_count_stack(c);
    let mm = |m: usize, k: usize, n: usize| 2 * m * k * n;
    let keys = c + 1;
    let own = mm(1, d, h * e) + mm(1, d, 2 * e) + mm(1, h * e, d) + mm(1, d, f) + mm(1, f, d);
    let xl = own + h * (mm(1, e, keys) + mm(1, e, keys) + mm(1, keys, e));
    let knn = own + h * (mm(1, e, keys) + mm(1, keys, e)) + h * (mm(1, e, k) + mm(1, k, e));
    let hand = (xl + knn + mm(1, d, v)) as f64;
    let counted = crate::flops::generation_flops_per_token(&config, c, 1, 5);
    assert!(
        (counted - hand).abs() < 1e-9 * hand,
        "counted {counted}, by hand {hand}"
    );
    // In segments of 4 after a context of 9: the new token is the second of its segment, one
    // query over the memory's c keys, the segment's first token and itself.
    let keys = c + 1 + 1;
    let xl = own + h * (mm(1, e, keys) + mm(1, e, keys) + mm(1, keys, e));
    let knn = own + h * (mm(1, e, keys) + mm(1, keys, e)) + h * (mm(1, e, k) + mm(1, k, e));
    let hand = (xl + knn + mm(1, d, v)) as f64;
    let counted = crate::flops::generation_flops_per_token(&config, 9, 4, 1);
    assert!(
        (counted - hand).abs() < 1e-9 * hand,
        "in a segment: counted {counted}, by hand {hand}"
    );
    // A stack without state reads its whole window again: the forward pass of the window.
    let window = XlConfig::small().with_mem_len(0);
    let once = crate::flops::forward_flops_per_token(&window, 64, 1) * 64.0;
    let counted = crate::flops::generation_flops_per_token(&window, 1000, 64, 3);
    assert!((counted - once).abs() < 1e-9 * once);
    // After a context of 2 segments and 2 tokens, the two new tokens are the 3rd and 4th of
    // their segment. A compressive stack's generator caches the keys and values of its
    // memories (m positions, the compressed memory's included) and of the segment's earlier
    // tokens: each token projects only itself, then one query over m + 2 and m + 3 cached
    // keys and itself, scores, values and the learned position term, 6 h e FLOPs per key in
    // each layer. An RMT keeps the inputs of its 16 read tokens and of the segment's earlier
    // tokens: one query over 16 + 2 and over 16 + 3 positions, their keys and values projected
    // again; the segment's first token also reads the 16 read tokens (no head), and its last
    // reads the segment with the read and write tokens.
    let recipe = |family: crate::quality::Family| match family.model {
        crate::quality::FamilyModel::Xl(c) => c,
        _ => panic!("the recipe is a layer stack"),
    };
    let flops = crate::flops::forward_flops_per_token;
    let comp = recipe(crate::quality::compressive_small());
    let m = comp.mem_len + comp.compressive.as_ref().expect("compressive").cmem_len;
    assert!(m > comp.mem_len && comp.mem_len > 0);
    assert!(
        comp.layer_kinds()
            .iter()
            .all(|k| *k == memzoo_stack::LayerKind::Learned)
    );
    let own = flops(&comp.clone().with_mem_len(0), 1, 1);
    let (h, e, layers) = (comp.n_heads, comp.head_width(), comp.n_layers);
    let query = |keys: usize| own + (layers * 6 * h * e * keys) as f64;
    let hand = (query(m + 2) + query(m + 3)) / 2.0;
    let counted = crate::flops::generation_flops_per_token(&comp, 2 * 128 + 2, 128, 2);
    assert!(
        (counted - hand).abs() < 1e-9 * hand,
        "compressive: counted {counted}, by hand {hand}"
    );
    let rmt = recipe(crate::quality::rmt_small());
    assert_eq!(rmt.rmt.as_ref().expect("rmt").mem_tokens, 16);
    assert_eq!(rmt.mem_len, 0);
    let query = |keys: usize| flops(&rmt.clone().with_mem_len(keys), 1, 1);
    let hand = (query(16 + 2) + query(16 + 3)) / 2.0;
    let counted = crate::flops::generation_flops_per_token(&rmt, 2 * 128 + 2, 128, 2);
    assert!(
        (counted - hand).abs() < 1e-9 * hand,
        "rmt: counted {counted}, by hand {hand}"
    );
    let head = (2 * rmt.d_model * rmt.vocab_size) as f64;
    let read = 16.0 * (flops(&rmt, 16, 1) - head);
    let last = (128 + 32) as f64 * flops(&rmt, 128 + 32, 1);
    let hand = (query(16) + read + last) / 2.0;
    let counted = crate::flops::generation_flops_per_token(&rmt, 2 * 128 - 1, 128, 2);
    assert!(
        (counted - hand).abs() < 1e-9 * hand,
        "rmt across a boundary: counted {counted}, by hand {hand}"
    );
    // The Block-Recurrent recipe keeps the block's earlier tokens after a key/value memory of
    // one block (64): the 3rd token of a block projects only itself and reads 64 + 2 cached
    // keys and itself, scores and values, 4 h e FLOPs per key in each of its rotary layers.
    let brt = recipe(crate::quality::block_recurrent_small());
    assert!(brt.compat.memory_keys_values && brt.mem_len == 64);
    let (h, e, layers) = (brt.n_heads, brt.head_width(), brt.n_layers);
    let own = flops(&brt.clone().with_mem_len(0), 1, 1);
    let hand = own + (layers * 4 * h * e * (64 + 2)) as f64;
    let counted = crate::flops::generation_flops_per_token(&brt, 2 * 64 + 2, 64, 1);
    assert!(
        (counted - hand).abs() < 1e-9 * hand,
        "block-recurrent: counted {counted}, by hand {hand}"
    );
}

/// `bench scale`'s table pairs each point with the peer's at the same x and states the growth
/// between the first and the last point; its charts are one per curve.
#[test]
fn scale_table_pairs_points_with_the_peer() {
    let line = |imp: &str, x: usize, tps: f64, step: f64| Measurement {
        name: format!("scale-xl-train-{x}"),
        implementation: imp.into(),
        config: serde_json::json!({"curve": "xl-train", "x": x}),
        tokens_per_s: tps,
        step_s_median: step,
        flops_per_token: (imp == "memzoo").then_some(1e6 * x as f64),
        ..Default::default()
    };
    let results = vec![
        line("memzoo", 128, 1000.0, 1.0),
        line("HF TransfoXL", 128, 400.0, 2.5),
        line("memzoo", 512, 500.0, 2.0),
    ];
    let table = crate::scale::markdown(&results);
    assert!(table.contains("| 128 | 1000 |"), "{table}");
    assert!(
        table.contains("| 400 |") && table.contains("| 2.50x |"),
        "{table}"
    );
    // No peer at 512: dashes.
    assert!(table.contains("| - | - | - |"), "{table}");
    // Step time x2 over 4x the memory: slope 0.5; FLOPs per step x4.
    assert!(
        table.contains("step time x2.00 (log-log slope 0.50), FLOPs per step x4.00"),
        "{table}"
    );
    let dir = std::env::temp_dir().join(format!("memzoo-scale-plot-{}", std::process::id()));
    let files = crate::scale::write_plots(&results, &dir).unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["scale-xl.svg", "scale-xl-memory.svg"]);
    let svg = std::fs::read_to_string(&files[0]).unwrap();
    assert!(
        svg.contains("memzoo train") && svg.contains("HF TransfoXL train"),
        "{svg}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A run's recipe written before a config field existed (the field missing from its JSON) is
/// still the recipe of today's config with that field at its default; a changed value is not.
#[test]
fn a_recipe_written_before_a_new_field_is_the_same_recipe() {
    use crate::study::same_recipe;
    use memzoo_stack::{RmtConfig, XlConfig};
    use memzoo_train::TrainConfig;
    let config = XlConfig::new().with_rmt(Some(RmtConfig::new()));
    let train = TrainConfig::sized(10, 2, 8);
    let recipe = serde_json::json!({"model": config, "train": train}).to_string();
    // The same recipe as an older build wrote it: without `memory_replay`.
    let mut old: serde_json::Value = serde_json::from_str(&recipe).unwrap();
    let removed = old["model"]["rmt"]
        .as_object_mut()
        .unwrap()
        .remove("memory_replay");
    assert_eq!(removed, Some(serde_json::Value::Bool(false)));
    assert!(same_recipe(&old.to_string(), &recipe));
    // Another value is another recipe.
    let other = XlConfig::new().with_rmt(Some(RmtConfig::new().with_mem_tokens(4)));
    let other = serde_json::json!({"model": other, "train": train}).to_string();
    assert!(!same_recipe(&other, &recipe));
    assert!(!same_recipe("not json", &recipe));
    // A field the old recipe lacks, set away from its default now: not the same recipe.
    let replay = XlConfig::new().with_rmt(Some(RmtConfig::new().with_memory_replay(true)));
    let replay = serde_json::json!({"model": replay, "train": train}).to_string();
    assert!(!same_recipe(&old.to_string(), &replay));
}

#[test]
fn scale_index_names_parse_to_their_settings() {
    use crate::scale::IndexChoice;
    use memzoo_memory::IndexKind;
    let exact = IndexChoice::parse("exact").unwrap();
    assert_eq!(exact.kind, IndexKind::Exact);
    for (name, scoring) in [
        ("exactf32", memzoo_memory::HostScoring::F32),
        ("exactint8avx2", memzoo_memory::HostScoring::Int8Avx2),
        ("exactint8avxvnni", memzoo_memory::HostScoring::Int8AvxVnni),
    ] {
        let c = IndexChoice::parse(name).unwrap();
        assert_eq!((c.kind, c.scoring), (IndexKind::Exact, scoring), "{name}");
    }
    let by_size = IndexChoice::parse("hnsw").unwrap();
    assert_eq!(
        (by_size.kind, by_size.expansion_search, by_size.connectivity),
        (IndexKind::Hnsw, None, None)
    );
    let fixed = IndexChoice::parse("hnsw64").unwrap();
    assert_eq!(
        (
            fixed.expansion_search,
            fixed.connectivity,
            fixed.expansion_add
        ),
        (Some(64), None, None)
    );
    let peer = IndexChoice::parse("hnsw32m15a40").unwrap();
    assert_eq!(
        (peer.expansion_search, peer.connectivity, peer.expansion_add),
        (Some(32), Some(15), Some(40))
    );
    assert_eq!(
        IndexChoice::parse("hnsw32a40").unwrap().expansion_add,
        Some(40)
    );
    for bad in [
        "hnsw0",
        "hnswm15",
        "hnsw32m",
        "hnsw32x",
        "hnsw32a0",
        "flat",
        "hnsw32m15a",
    ] {
        assert!(IndexChoice::parse(bad).is_none(), "{bad} parses");
    }
}
