use crate::{Batch, BatcherState, DataError, DocBatcher, OrderedBatcher, Token};

fn stream(n: usize) -> Vec<Token> {
    // distinct values so that every position is identifiable (n < 65536)
    (0..n).map(|i| i as Token).collect()
}

/// Naive reference: row r, offset pos, length len.
fn expected(tokens: &[Token], batch: usize, pos: usize, len: usize) -> (Vec<i64>, Vec<i64>) {
    let row_len = tokens.len() / batch;
    let mut x = vec![];
    let mut y = vec![];
    for r in 0..batch {
        for t in 0..len {
            x.push(tokens[r * row_len + pos + t] as i64);
            y.push(tokens[r * row_len + pos + t + 1] as i64);
        }
    }
    (x, y)
}

#[test]
fn rows_continue_where_they_stopped() {
    let (n, batch, len) = (1003, 4, 16);
    let tokens = stream(n);
    let row_len = n / batch; // 250, 3 tokens dropped
    let mut it = OrderedBatcher::new(tokens.clone(), batch, len).unwrap();
    assert_eq!(it.row_len(), row_len);
    let batches: Vec<Batch> = it.by_ref().collect();
    // 249 targets per row: 15 steps of 16 and one of 9
    assert_eq!(batches.len(), 16);
    assert_eq!(batches.last().unwrap().len, 249 - 15 * 16);
    let mut pos = 0;
    let mut seen = vec![0u32; n];
    for (k, b) in batches.iter().enumerate() {
        assert_eq!(b.shape(), [batch, b.len]);
        assert_eq!(b.step, k as u64);
        let (x, y) = expected(&tokens, batch, pos, b.len);
        assert_eq!(b.inputs, x);
        assert_eq!(b.targets, y);
        assert_eq!(b.reset, vec![k == 0; batch]);
        assert_eq!(b.pad, None);
        for r in 0..batch {
            // targets = inputs shifted by one
            for t in 0..b.len - 1 {
                assert_eq!(b.targets[r * b.len + t], b.inputs[r * b.len + t + 1]);
            }
            // the first input of this step is the last target of the previous step
            if k > 0 {
                let prev = &batches[k - 1];
                assert_eq!(
                    b.inputs[r * b.len],
                    prev.targets[r * prev.len + prev.len - 1]
                );
            }
            for t in 0..b.len {
                seen[b.targets[r * b.len + t] as usize] += 1;
            }
        }
        pos += b.len;
    }
    // every target position of every row exactly once; row starts and the dropped tail never
    for (i, &c) in seen.iter().enumerate() {
        let want = if i >= batch * row_len || i % row_len == 0 {
            0
        } else {
            1
        };
        assert_eq!(c, want, "position {i}");
    }
    assert!(it.next_batch().is_none());
    assert_eq!(it.steps_per_epoch(len), 16);
    assert_eq!(it.targets_per_epoch(len), batch * (row_len - 1));
}

#[test]
fn segment_length_can_change_per_call() {
    let tokens = stream(600);
    let mut it = OrderedBatcher::new(tokens.clone(), 3, 8).unwrap();
    let mut pos = 0;
    for len in [8, 5, 13, 1, 40, 8] {
        let b = it.next_batch_len(len).unwrap().unwrap();
        assert_eq!(b.len, len);
        let (x, y) = expected(&tokens, 3, pos, len);
        assert_eq!((b.inputs, b.targets), (x, y));
        pos += len;
    }
    assert_eq!(it.state().pos, pos as u64);
    let err = it.next_batch_len(0).unwrap_err();
    assert!(err.to_string().contains("seq_len = 0"), "{err}");
}

#[test]
fn restore_resumes_exactly() {
    let tokens = stream(5000);
    let mut a = OrderedBatcher::new(tokens.clone(), 5, 32).unwrap();
    for _ in 0..7 {
        a.next_batch().unwrap();
    }
    let saved = serde_json::to_string(&a.state()).unwrap();
    let rest_a: Vec<Batch> = (0..40).map(|_| a.next_batch_wrapping()).collect();

    let mut b = OrderedBatcher::new(tokens.clone(), 5, 32).unwrap();
    let state: BatcherState = serde_json::from_str(&saved).unwrap();
    b.restore(state).unwrap();
    let rest_b: Vec<Batch> = (0..40).map(|_| b.next_batch_wrapping()).collect();
    assert_eq!(rest_a, rest_b);
    // the 40 steps crossed into epoch 1, whose first step resets every row
    let first_of_1 = rest_a.iter().find(|b| b.epoch == 1).unwrap();
    assert_eq!(
        (first_of_1.step, first_of_1.reset.clone()),
        (0, vec![true; 5])
    );
    assert_eq!(first_of_1.inputs, expected(&tokens, 5, 0, 32).0);

    // a state from other data or another batch size is refused, naming the field
    let mut other = OrderedBatcher::new(tokens.clone(), 4, 32).unwrap();
    let err = other.restore(state).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::StateMismatch {
                field: "batch",
                saved: 5,
                actual: 4
            }
        ),
        "{err}"
    );
    let mut other = OrderedBatcher::new(stream(4000), 5, 32).unwrap();
    assert!(other.restore(state).is_err());
}

#[test]
fn drop_last_and_wrapping_keep_shapes_constant() {
    let tokens = stream(1000); // row_len 250 with 4 rows: 249 targets = 7 * 32 + 25
    let mut it = OrderedBatcher::new(tokens, 4, 32).unwrap().drop_last(true);
    assert_eq!(it.steps_per_epoch(32), 7);
    let mut epochs = vec![];
    for _ in 0..20 {
        let b = it.next_batch_wrapping();
        assert_eq!(b.len, 32);
        epochs.push((b.epoch, b.step));
    }
    assert_eq!(epochs[6], (0, 6));
    assert_eq!(epochs[7], (1, 0));
    assert_eq!(epochs[14], (2, 0));
}

#[test]
fn too_short_stream_says_how_short() {
    let err = OrderedBatcher::named("valid split", stream(100), 8, 16).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("valid split") && msg.contains("100 tokens") && msg.contains("136"),
        "{msg}"
    );
    assert!(matches!(
        err,
        DataError::TooShort {
            tokens: 100,
            needed: 136,
            ..
        }
    ));
    // exactly one batch is enough
    let mut it = OrderedBatcher::new(stream(136), 8, 16).unwrap();
    assert_eq!(it.next_batch().unwrap().len, 16);
    assert!(it.next_batch().is_none());
    assert!(
        OrderedBatcher::new(stream(100), 0, 16)
            .unwrap_err()
            .to_string()
            .contains("batch = 0")
    );
}

#[test]
fn target_mask_follows_target_positions() {
    let tokens = stream(700);
    let mask: Vec<bool> = (0..700).map(|i| i % 3 == 0).collect();
    let mut it = OrderedBatcher::new(tokens, 2, 10)
        .unwrap()
        .with_target_mask(mask)
        .unwrap();
    for b in it.by_ref() {
        let m = b.target_mask.as_ref().unwrap();
        for (i, &t) in b.targets.iter().enumerate() {
            // the token value is its stream position
            assert_eq!(m[i], t % 3 == 0);
        }
    }
    let err = OrderedBatcher::new(stream(700), 2, 10)
        .unwrap()
        .with_target_mask(vec![true; 5])
        .unwrap_err();
    assert!(err.to_string().contains("700"), "{err}");
}

const PAD: Token = 999;

fn docs() -> Vec<Vec<Token>> {
    // lengths chosen to hit: shorter than a segment, exactly one, several, an empty one
    let lens = [5usize, 8, 23, 1, 0, 17, 8, 40, 3, 11, 9];
    let mut next = 1000;
    lens.iter()
        .map(|&l| {
            (0..l)
                .map(|_| {
                    next += 1;
                    next
                })
                .collect()
        })
        .collect()
}

#[test]
fn documents_start_at_segment_boundaries_with_reset() {
    let (batch, seg) = (3, 8);
    let documents = docs();
    let mut it = DocBatcher::new(&documents, batch, seg, PAD).unwrap();
    assert_eq!(it.documents(), 10);
    let batches: Vec<Batch> = it.by_ref().collect();
    assert_eq!(batches.len(), it.steps_per_epoch());

    // Rebuild each row from its steps and cut it into documents at the reset flags.
    let mut found: Vec<Vec<Token>> = vec![];
    let mut counted = 0;
    for r in 0..batch {
        let mut current: Option<Vec<Token>> = None;
        for b in &batches {
            assert_eq!(b.pad, Some(PAD as i64));
            let x = &b.inputs[r * seg..(r + 1) * seg];
            let y = &b.targets[r * seg..(r + 1) * seg];
            if b.reset[r] {
                // a new document starts right at the boundary
                assert_ne!(x[0], PAD as i64);
                if let Some(d) = current.take() {
                    found.push(d);
                }
                current = Some(vec![]);
            }
            for t in 0..seg {
                if x[t] != PAD as i64 {
                    current
                        .as_mut()
                        .expect("a document token before any reset")
                        .push(x[t] as Token);
                }
                // a counted target is the next token of the same document
                if y[t] != PAD as i64 {
                    counted += 1;
                    let next = if t + 1 < seg { x[t + 1] } else { -1 };
                    if next >= 0 {
                        assert_eq!(y[t], next);
                    }
                    assert_eq!(y[t], x[t] + 1, "documents hold consecutive ids");
                }
            }
        }
        if let Some(d) = current.take() {
            found.push(d);
        }
    }
    let mut want: Vec<Vec<Token>> = documents
        .iter()
        .filter(|d| !d.is_empty())
        .cloned()
        .collect();
    want.sort();
    found.sort();
    assert_eq!(found, want);
    // every token but the last of each document is a counted target
    assert_eq!(counted, want.iter().map(|d| d.len() - 1).sum::<usize>());
    assert_eq!(
        batches.iter().map(Batch::counted_targets).sum::<usize>(),
        counted
    );
    assert!(it.pad_fraction() > 0.0 && it.pad_fraction() < 1.0);
}

#[test]
fn document_batcher_restores_and_checks_input() {
    let documents = docs();
    let mut a = DocBatcher::new(&documents, 2, 4, PAD).unwrap();
    a.next_batch().unwrap();
    a.next_batch().unwrap();
    let state = a.state();
    let rest_a: Vec<Batch> = (0..30).map(|_| a.next_batch_wrapping()).collect();
    let mut b = DocBatcher::new(&documents, 2, 4, PAD).unwrap();
    b.restore(state).unwrap();
    let rest_b: Vec<Batch> = (0..30).map(|_| b.next_batch_wrapping()).collect();
    assert_eq!(rest_a, rest_b);
    assert!(rest_a.iter().any(|b| b.epoch == 1));

    // another segment length is another layout
    let mut c = DocBatcher::new(&documents, 2, 8, PAD).unwrap();
    assert!(c.restore(state).is_err());

    let mut bad = documents.clone();
    bad[3].push(PAD);
    let err = DocBatcher::new(&bad, 2, 4, PAD).unwrap_err();
    assert!(
        err.to_string().contains("document 3") && err.to_string().contains("999"),
        "{err}"
    );

    let err = DocBatcher::named("tiny", &documents, 64, 16, PAD).unwrap_err();
    assert!(
        err.to_string().contains("tiny has 125 tokens") && err.to_string().contains("1088"),
        "{err}"
    );
}

/// Each target's mask is the mask of the document token it is: token ids encode (document,
/// position), so the expected mask is recomputed from the id alone.
#[test]
fn document_target_masks_follow_their_tokens() {
    const PAD: Token = 0;
    // Lengths 8 (a whole number of segments: the next document follows without padding), 5,
    // 0 (skipped), 11, 3.
    let lens = [8usize, 5, 0, 11, 3];
    let id = |d: usize, p: usize| (1 + d * 100 + p) as Token;
    let selected = |d: usize, p: usize| (d + p).is_multiple_of(3);
    let documents: Vec<Vec<Token>> = lens
        .iter()
        .enumerate()
        .map(|(d, &n)| (0..n).map(|p| id(d, p)).collect())
        .collect();
    let masks: Vec<Vec<bool>> = lens
        .iter()
        .enumerate()
        .map(|(d, &n)| (0..n).map(|p| selected(d, p)).collect())
        .collect();
    let batcher = DocBatcher::new(&documents, 2, 4, PAD)
        .unwrap()
        .with_target_masks(&masks)
        .unwrap();
    let (mut checked, mut selected_seen) = (0, 0);
    for batch in batcher {
        let mask = batch.target_mask.as_ref().expect("a target mask");
        for (i, &t) in batch.targets.iter().enumerate() {
            if t == PAD as i64 {
                assert!(!mask[i], "padding target {i} is not selected");
                continue;
            }
            let (d, p) = ((t as usize - 1) / 100, (t as usize - 1) % 100);
            assert_eq!(
                mask[i],
                selected(d, p),
                "target {i}: document {d} token {p}"
            );
            checked += 1;
            selected_seen += usize::from(mask[i]);
        }
    }
    // Every token but each document's first is a target once.
    assert_eq!(checked, 8 + 5 + 11 + 3 - 4);
    assert!(selected_seen > 0);
    // One mask per document, each as long as its document.
    let err = DocBatcher::new(&documents, 2, 4, PAD)
        .unwrap()
        .with_target_masks(&masks[..2])
        .unwrap_err()
        .to_string();
    assert!(err.contains("one per document"), "{err}");
    let mut short = masks.clone();
    short[3].pop();
    let err = DocBatcher::new(&documents, 2, 4, PAD)
        .unwrap()
        .with_target_masks(&short)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("document 3") && err.contains("10 entries"),
        "{err}"
    );
}
