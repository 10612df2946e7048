//! Evaluation with its rows split over replicas ([`memzoo_train::evaluate_sharded`]) against a
//! naive reference: every row read on its own (a batch of one, its own memories), its
//! cross-entropy computed on the host in f64 from the logits. Four segments in order, memory
//! carried; on the third a row restarts its document, one row is padding alone and one half
//! padded; a target mask selects every fourth target.

use memzoo_stack::LshConfig;
use memzoo_tests::*;
use memzoo_train::{
    RecurrentModel, Segment, SegmentModel, SegmentSource, TrainError, evaluate_sharded,
};

const PAD: i64 = 0;
const ROWS: usize = 5;
const LEN: usize = 12;

/// Fixed segments, in order.
struct Fixed {
    segments: Vec<Segment>,
    next: usize,
}

impl SegmentSource for Fixed {
    fn next_segment(&mut self, _len: usize) -> Option<Segment> {
        let s = self.segments.get(self.next).cloned();
        self.next += 1;
        s
    }

    fn rewind(&mut self) {
        self.next = 0;
    }

    fn position(&self) -> serde_json::Value {
        serde_json::json!(self.next)
    }

    fn restore(&mut self, _position: &serde_json::Value) -> Result<(), TrainError> {
        Ok(())
    }
}

fn segments(vocab: i64) -> Vec<Segment> {
    let tokens: Vec<i64> = small_corpus()
        .into_iter()
        .map(|t| i64::from(t) % vocab)
        .collect();
    (0..4)
        .map(|step| {
            let (mut inputs, mut targets) = (Vec::new(), Vec::new());
            for r in 0..ROWS {
                let start = step * LEN + r * 101;
                let row = &tokens[start..start + LEN + 1];
                inputs.extend_from_slice(&row[..LEN]);
                let mut t = row[1..].to_vec();
                let padded_from = match (step, r) {
                    (2, 0) => 0,
                    (2, 1) => LEN / 2,
                    _ => LEN,
                };
                t[padded_from..].iter_mut().for_each(|x| *x = PAD);
                targets.extend(t);
            }
            let reset = (0..ROWS).map(|r| step == 2 && r == 3).collect();
            let mask = (0..ROWS * LEN).map(|i| i % 4 == 1).collect();
            Segment::new(ROWS, LEN, inputs, targets)
                .and_then(|s| s.with_reset(reset))
                .and_then(|s| s.with_target_mask(mask))
                .unwrap()
                .with_pad(Some(PAD))
        })
        .collect()
}

/// (mean loss, mean loss on the selected targets, argmax accuracy on them), each row read on
/// its own with its own state, `-log p(y) = logsumexp(z) - z_y` in f64.
fn naive<M: SegmentModel>(model: &M, segments: &[Segment]) -> (f64, f64, f64) {
    let dev = flex();
    let (mut nats, mut n, mut sel_nats, mut sel_hits, mut sel_n) = (0.0, 0, 0.0, 0, 0);
    for r in 0..ROWS {
        let mut state = M::State::default();
        for seg in segments {
            let row = seg.rows(r..r + 1).unwrap();
            let x = burn::tensor::Tensor::from_data(
                burn::tensor::TensorData::new(row.inputs.clone(), [1, LEN]),
                &dev,
            );
            let logits = host(model.segment_logits(x, &mut state, &row.reset).unwrap());
            let vocab = logits.len() / LEN;
            let keep = row.loss_mask();
            for (i, z) in logits.chunks(vocab).enumerate() {
                if !keep[i] {
                    continue;
                }
                let max = z.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
                let lse = max + z.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
                let y = row.targets[i] as usize;
                let nll = lse - z[y] as f64;
                nats += nll;
                n += 1;
                if row.target_mask.as_ref().unwrap()[i] {
                    sel_nats += nll;
                    sel_n += 1;
                    let best = (0..vocab).max_by(|&a, &b| z[a].total_cmp(&z[b])).unwrap();
                    sel_hits += usize::from(best == y);
                }
            }
        }
    }
    (
        nats / n as f64,
        sel_nats / sel_n as f64,
        sel_hits as f64 / sel_n as f64,
    )
}

/// Sharded evaluation with 1, 2, 3 and 5 replicas (even, uneven and one-row shards) gives the
/// naive reference's loss, bpc, selected loss and accuracy.
fn sharded_matches_naive<M: SegmentModel>(model: &M, vocab: i64, what: &str) {
    let segs = segments(vocab);
    let (loss, sel_loss, sel_acc) = naive(model, &segs);
    let mut source = Fixed {
        segments: segs,
        next: 0,
    };
    for replicas in [1, 2, 3, 5] {
        let r = evaluate_sharded(model, &mut source, LEN, None, Some(replicas)).unwrap();
        let what = format!("{what}, {replicas} replicas");
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * b.abs().max(1.0);
        assert!(
            close(r.loss, loss),
            "{what}: loss {} vs naive {loss}",
            r.loss
        );
        assert!(
            close(r.bpc, loss / std::f64::consts::LN_2),
            "{what}: bpc {}",
            r.bpc
        );
        let sel = r.selected_loss.expect("the target mask selects targets");
        assert!(close(sel, sel_loss), "{what}: selected {sel} vs {sel_loss}");
        assert_eq!(r.selected_accuracy, Some(sel_acc), "{what}: accuracy");
        // Padding is not counted: 4 segments x 5 rows x 12, less a row and a half.
        assert_eq!(r.tokens, (4 * ROWS * LEN - LEN - LEN / 2) as u64, "{what}");
    }
}

#[test]
fn sharded_xl_evaluation_equals_rows_read_alone() {
    let model = tiny_xl().init(&flex()).unwrap();
    sharded_matches_naive(&model, 256, "XL");
}

#[test]
fn sharded_memorizing_evaluation_equals_rows_read_alone() {
    let model = tiny_memorizing().init(&flex()).unwrap();
    assert_eq!(model.family(), "memorizing");
    sharded_matches_naive(&model, 256, "Memorizing");
}

#[test]
fn sharded_reformer_evaluation_equals_rows_read_alone() {
    use memzoo_stack::{LayerKind, ReformerConfig};
    let model = ReformerConfig::new()
        .with_n_layers(2)
        .with_d_model(16)
        .with_n_heads(2)
        .with_d_head(8)
        .with_d_ff(32)
        .with_vocab_size(64)
        .with_max_seq_len(16)
        .with_lsh(LshConfig::new().with_chunk_len(4))
        .with_dropout(0.0)
        .with_axial_positions(false)
        .with_attn_layers(vec![LayerKind::Lsh, LayerKind::Lsh])
        .init(&flex())
        .unwrap();
    sharded_matches_naive(&model, 64, "Reformer");
}

/// The Memorizing Transformer's evaluation data on the generated corpus (documents per row)
/// carries the recallable positions as its target mask: every one of them, once.
#[test]
fn generated_documents_carry_their_recallable_positions() {
    use memzoo_data::{LongRangeConfig, Split, generate_split, recallable_mask};
    let data = memzoo::config::DataConfig {
        generated: LongRangeConfig {
            documents: 20,
            valid_documents: 6,
            test_documents: 2,
            min_gap: 20,
            max_gap: 40,
            ..Default::default()
        },
        ..Default::default()
    };
    let want: usize = generate_split(&data.generated, Split::Valid)
        .unwrap()
        .iter()
        .map(|d| recallable_mask(&d.text).iter().filter(|&&m| m).count())
        .sum();
    assert!(want > 0);
    let mut batcher = memzoo::data_setup::doc_batcher(&data, Split::Valid, 3, 16)
        .unwrap()
        .expect("the generated corpus has documents");
    let mut got = 0;
    while let Some(seg) = batcher.next_segment(16) {
        let mask = seg.target_mask.as_ref().expect("a target mask");
        let keep = seg.loss_mask();
        got += mask.iter().zip(&keep).filter(|(m, k)| **m && **k).count();
        assert!(
            mask.iter().zip(&keep).all(|(m, k)| !m || *k),
            "padding selected"
        );
    }
    assert_eq!(got, want);
}

/// A prepared `rust-code` corpus of three made-up crates (train, valid, test by the manifest's
/// rule) under `data_dir/rust-code/`, built through the library's scan and prepare.
fn fake_rust_code(data_dir: &std::path::Path) {
    use memzoo_data::rust_code::{self, RustCodeManifest};
    let reg = data_dir.join("registry");
    let body = "pub fn f(x: u32) -> u32 { x.wrapping_mul(31).rotate_left(7) }\n".repeat(4);
    for (dir, files) in [
        ("alpha-0.1.0", &["src/lib.rs", "src/a/b.rs"][..]),
        ("fake-crate-13-1.0.0", &["src/lib.rs"][..]),
        ("fake-crate-62-2.0.0", &["src/main.rs"][..]),
    ] {
        for f in files {
            let path = reg.join(dir).join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, &body).unwrap();
        }
    }
    let pinned: Vec<(String, String)> = [
        ("alpha", "0.1.0"),
        ("fake-crate-13", "1.0.0"),
        ("fake-crate-62", "2.0.0"),
    ]
    .iter()
    .map(|(n, v)| (n.to_string(), v.to_string()))
    .collect();
    let m = RustCodeManifest::scan(&pinned, std::slice::from_ref(&reg), "test").unwrap();
    assert_eq!(
        m.crate_names(memzoo_data::Split::Valid),
        ["fake-crate-13-1.0.0"]
    );
    assert_eq!(
        m.crate_names(memzoo_data::Split::Test),
        ["fake-crate-62-2.0.0"]
    );
    rust_code::prepare(&m, &[reg], &data_dir.join(rust_code::NAME)).unwrap();
}

/// `[data] source = "rust-code"`: documents per row (byte 0 pads, a reset where each crate
/// starts), for every family in training and evaluation; absent, an error naming the command
/// that prepares it.
#[test]
fn rust_code_is_read_as_documents_by_every_family() {
    use memzoo::config::{Preset, RunConfig};
    use memzoo_data::Split;
    let dir = std::env::temp_dir().join(format!("memzoo-eval-{}-rust-code", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let data_dir = dir.join("data");
    let set_dir = format!("data.data_dir={}", data_dir.display());
    let sets = tiny_cli(&["data.source=rust-code", &set_dir]);
    let config = RunConfig::resolve(None, &sets).unwrap();
    let err = memzoo::data_setup::doc_batcher(&config.data, Split::Train, 2, 8).unwrap_err();
    assert!(
        err.to_string().contains("memzoo data prepare rust-code"),
        "{err}"
    );

    fake_rust_code(&data_dir);
    let mut batcher = memzoo::data_setup::doc_batcher(&config.data, Split::Train, 2, 8)
        .unwrap()
        .expect("rust-code has documents");
    let (mut resets, mut text) = (0, Vec::new());
    while let Some(seg) = batcher.next_segment(8) {
        assert_eq!(seg.pad, Some(0));
        resets += seg.reset.iter().filter(|&&r| r).count();
        // row 0 holds the one train document
        text.extend(
            seg.inputs[..8]
                .iter()
                .filter(|&&t| t != 0)
                .map(|&t| t as u8),
        );
    }
    assert_eq!(resets, 1, "one train document, one start");
    let doc =
        memzoo_data::rust_code::load_split(&data_dir.join("rust-code"), Split::Train).unwrap();
    assert_eq!(text[..], doc[0].text[..text.len()]);
    assert!(text.starts_with(b"// file: src/a/b.rs\n"));

    // Every family resets memory at document starts; XL gets `document_resets` in train and
    // eval, and a Reformer with a memory is refused on documents.
    let on = |extra: &[&str]| {
        let mut s = sets.clone();
        s.extend(extra.iter().map(|x| x.to_string()));
        RunConfig::resolve(None, &s).unwrap().on_data()
    };
    assert!(on(&[]).unwrap().model.document_resets);
    let file = dir.join("plain.txt");
    std::fs::write(&file, "a stream").unwrap();
    let stream = format!("data.source={}", file.display());
    assert!(!on(&[&stream]).unwrap().model.document_resets);
    let generated = on(&["data.source=generated"]).unwrap();
    assert!(generated.model.document_resets);
    let family = |preset: Preset, extra: &[&str]| {
        let mut s = sets.clone();
        s.extend(extra.iter().map(|x| x.to_string()));
        RunConfig::resolve_preset(Some(preset), None, &s)
            .unwrap()
            .on_data()
    };
    let msg = family(Preset::ReformerTiny, &["model.mem_len=4"])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("model.mem_len = 4"), "{msg}");
    let memorizing = family(Preset::MemorizingTiny, &[]).unwrap();
    assert_eq!(memorizing.family(), "memorizing");
    assert!(memorizing.model.document_resets);

    // train and eval end to end on it
    let run = dir.join("run");
    memzoo::commands::train(&config, "flex", &run, false, false, true, true).unwrap();
    let saved = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(saved.contains("source = \"rust-code\""), "{saved}");
    memzoo::commands::eval(&run, "flex", "valid", None, None, Some(2), true).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
