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
