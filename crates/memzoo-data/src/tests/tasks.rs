//! The generated tasks: each batch against the task's definition, written out here.

use crate::tasks::recall::Target;
use crate::{
    Batch, CopyTask, CopyText, Duplication, RecallStream, RecallTask, Task, TaskPosition,
    TaskStream, copy_text,
};

/// Every sequence is `0 w 0 w` with symbols of `1..vocab`; targets are the next symbols; the
/// loss counts, and evaluation selects, exactly the targets in the second `w`.
#[test]
fn duplication_sequences_repeat_their_first_half() {
    let mut task = Duplication::new(3, 10, 7, 5).unwrap();
    assert_eq!(task.seg_len(), 10);
    for _ in 0..4 {
        let b = task.draw();
        assert_eq!(b.shape(), [3, 10]);
        assert_eq!(b.reset, vec![true; 3]);
        for s in 0..3 {
            let t = &b.inputs[s * 10..(s + 1) * 10];
            assert_eq!(t[0], 0);
            assert_eq!(t[5], 0);
            assert_eq!(t[..5], t[5..]);
            assert!(t[1..5].iter().all(|&x| (1..7).contains(&x)));
            assert_eq!(&b.targets[s * 10..s * 10 + 9], &t[1..]);
            // targets 6..9 are the second copy of w: predicted at positions 5..8
            let want = [
                false, false, false, false, false, true, true, true, true, false,
            ];
            assert_eq!(&b.counted.as_ref().unwrap()[s * 10..(s + 1) * 10], &want);
            assert_eq!(
                &b.target_mask.as_ref().unwrap()[s * 10..(s + 1) * 10],
                &want
            );
            assert_eq!(&b.loss_mask()[s * 10..(s + 1) * 10], &want);
        }
    }
    for (len, vocab) in [(7, 5), (2, 5), (8, 1)] {
        let err = Duplication::new(1, len, vocab, 0).unwrap_err().to_string();
        assert!(
            err.contains(&format!("{}", if vocab < 2 { vocab } else { len })),
            "{err}"
        );
    }
}

#[test]
fn copy_text_repeats_every_passage_at_the_stated_distance() {
    let (passage, gap, repeats) = (6, 1, 6);
    let (text, copy) = copy_text(500, passage, gap, repeats, 3);
    assert_eq!(text.len(), copy.len());
    assert!(text.len() >= 500);
    let doc = passage + repeats * (gap + passage) + 1;
    assert_eq!(text.len() % doc, 0, "whole documents only");
    let d = passage + gap;
    for (i, &flag) in copy.iter().enumerate() {
        if flag {
            assert!(text[i].is_ascii_lowercase());
            assert_eq!(text[i], text[i - d], "byte {i} is not a copy from {d} back");
        }
    }
    // Per document: the first passage is not flagged, the repeats are.
    let flagged = copy[..doc].iter().filter(|&&f| f).count();
    assert_eq!(flagged, repeats * passage);
    assert!(copy[..passage].iter().all(|&f| !f));
    assert_eq!(text[doc - 1], b'\n');
    assert_eq!(&text[passage..passage + gap], &b"."[..]);
}

/// The rows of [`CopyText`], read back as streams: targets continue the inputs, selected
/// targets are letters copied from `distance` back, resets sit where documents start, and row
/// `r` starts `r` segments into its first document.
#[test]
fn copy_text_rows_are_streams_of_whole_documents() {
    let task = CopyTask {
        seg_len: 5,
        batch: 4,
        ..CopyTask::default()
    };
    let (doc, d, l) = (task.doc_len(), task.distance(), task.seg_len);
    let mut text = CopyText::new(task, 11).unwrap();
    let mut rows: Vec<Vec<i64>> = vec![Vec::new(); 4];
    let mut flags: Vec<Vec<bool>> = vec![Vec::new(); 4];
    let mut resets: Vec<Vec<bool>> = vec![Vec::new(); 4];
    let mut last_target: Vec<Option<i64>> = vec![None; 4];
    for _ in 0..300 {
        let b = text.draw();
        assert_eq!(b.shape(), [4, l]);
        for r in 0..4 {
            let x = &b.inputs[r * l..(r + 1) * l];
            let y = &b.targets[r * l..(r + 1) * l];
            assert_eq!(&x[1..], &y[..l - 1], "targets are the next inputs");
            if let Some(prev) = last_target[r] {
                assert_eq!(
                    x[0], prev,
                    "the previous segment's last target is this one's first input"
                );
            }
            last_target[r] = Some(y[l - 1]);
            rows[r].extend_from_slice(x);
            flags[r].extend_from_slice(&b.target_mask.as_ref().unwrap()[r * l..(r + 1) * l]);
            resets[r].push(b.reset[r]);
        }
    }
    for r in 0..4 {
        let (s, f) = (&rows[r], &flags[r]);
        let first = (r * l) % doc;
        // Target of input i is s[i + 1].
        for i in 0..s.len() - 1 {
            let p = first + i + 1; // position of the target in the row's documents
            let in_doc = p % doc;
            let copied = in_doc >= task.passage + task.gap
                && in_doc < doc - 1
                && (in_doc - task.passage) % (task.gap + task.passage) >= task.gap;
            assert_eq!(f[i], copied, "row {r}, target {i}");
            if copied && i + 1 >= d {
                assert_eq!(s[i + 1], s[i + 1 - d]);
            }
        }
        for (k, &reset) in resets[r].iter().enumerate() {
            assert_eq!(reset, (first + k * l) % doc == 0, "row {r}, segment {k}");
        }
    }
    assert!(CopyText::new(CopyTask { batch: 0, ..task }, 0).is_err());
}

/// A limited stream yields its batches, then `None`; a new epoch yields the same batches; a
/// restored position continues exactly where a stream that drew that far would.
#[test]
fn task_streams_replay_and_restore() {
    let task = Duplication::new(2, 8, 5, 3).unwrap();
    let mut fresh = TaskStream::endless(task.clone());
    let all: Vec<Batch> = (0..6).map(|_| fresh.next_batch().unwrap()).collect();
    assert_eq!(all[4].step, 4);
    assert_ne!(all[0].inputs, all[1].inputs);

    let mut limited = TaskStream::limited(task.clone(), 3).unwrap();
    let first: Vec<Batch> = std::iter::from_fn(|| limited.next_batch()).collect();
    assert_eq!(first.len(), 3);
    assert_eq!(first[2].inputs, all[2].inputs);
    limited.start_next_epoch();
    let again = limited.next_batch().unwrap();
    assert_eq!(
        (again.inputs.clone(), again.epoch),
        (all[0].inputs.clone(), 1)
    );

    let mut resumed = TaskStream::endless(task.clone());
    resumed
        .restore(TaskPosition { drawn: 4, epoch: 0 })
        .unwrap();
    assert_eq!(resumed.next_batch().unwrap(), all[4]);
    assert_eq!(resumed.position(), TaskPosition { drawn: 5, epoch: 0 });
    let mut limited = TaskStream::limited(task, 3).unwrap();
    assert!(
        limited
            .restore(TaskPosition { drawn: 4, epoch: 0 })
            .is_err()
    );
}

/// `rows` cuts every per-target field; `loss_mask` combines `pad` and `counted`.
#[test]
fn batch_rows_and_loss_mask() {
    let b = Batch::new(3, 2, vec![1, 2, 3, 4, 5, 6], vec![2, 0, 4, 5, 0, 7])
        .unwrap()
        .with_reset(vec![true, false, true])
        .unwrap()
        .with_pad(Some(0))
        .with_counted(vec![true, true, false, true, true, true])
        .unwrap()
        .with_target_mask(vec![false, true, false, false, true, true])
        .unwrap();
    assert_eq!(b.loss_mask(), vec![true, false, false, true, false, true]);
    assert_eq!(b.counted_targets(), 3);
    assert!(!b.counts_every_target());
    let r = b.rows(1..3).unwrap();
    assert_eq!(r.shape(), [2, 2]);
    assert_eq!(r.inputs, vec![3, 4, 5, 6]);
    assert_eq!(r.targets, vec![4, 5, 0, 7]);
    assert_eq!(r.reset, vec![false, true]);
    assert_eq!(r.counted, Some(vec![false, true, true, true]));
    assert_eq!(r.target_mask, Some(vec![false, false, true, true]));
    assert_eq!(r.loss_mask(), vec![false, true, false, true]);
    assert!(b.rows(2..4).is_err());
    assert!(Batch::new(2, 2, vec![1, 2, 3], vec![1, 2, 3, 4]).is_err());
    assert!(
        Batch::new(1, 2, vec![1, 2], vec![1, 2])
            .unwrap()
            .with_reset(vec![])
            .is_err()
    );
}

/// The recall task's documents: the repeat copies the passage, recall flags mark exactly the
/// repeat's positions after its first, gaps fall in their ranges, segments align.
#[test]
fn recall_task_documents() {
    let task = RecallTask {
        n_values: 20,
        passage: 6,
        n_filler: 4,
        short_gap: (0, 3),
        long_gap: (40, 50),
        long_fraction: 0.5,
        repeats: 2,
        seg_len: 8,
    };
    let mut rng = 3;
    let (mut longs, mut shorts) = (0, 0);
    for _ in 0..200 {
        let (toks, targets) = task.document(&mut rng);
        assert_eq!(toks.len() % 8, 0);
        let markers: Vec<usize> = (0..toks.len()).filter(|&i| toks[i] == 24).collect();
        assert_eq!(markers.len(), 2);
        let (q, q2) = (markers[0], markers[1]);
        let passage = &toks[..6];
        let mut distinct = passage.to_vec();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 6, "{passage:?}");
        assert!(passage.iter().all(|&t| t < 20));
        // Two repeats, each after a marker, the second after a short gap of filler.
        assert_eq!(&toks[q + 1..q + 7], passage);
        assert!((q + 7..=q + 10).contains(&q2), "{q} {q2}");
        assert!(toks[q + 7..q2].iter().all(|&t| (20..24).contains(&t)));
        assert_eq!(&toks[q2 + 1..q2 + 7], passage);
        let gap = q - 6;
        let long = gap >= 40;
        if long {
            longs += 1;
            assert!(gap <= 50, "{gap}");
        } else {
            shorts += 1;
            assert!(gap <= 3, "{gap}");
        }
        // Filler cycles through 20..24.
        for w in toks[6..q].windows(2).chain(toks[q + 7..q2].windows(2)) {
            assert_eq!(w[1] - 20, (w[0] - 20 + 1) % 4);
        }
        let of = |kind| -> Vec<usize> { (0..toks.len()).filter(|&i| targets[i] == kind).collect() };
        let first: Vec<usize> = (q + 1..q + 6).collect();
        let second: Vec<usize> = (q2 + 1..q2 + 6).collect();
        if long {
            assert_eq!(of(Target::Long), first);
            assert_eq!(of(Target::Short), second);
        } else {
            assert!(of(Target::Long).is_empty());
            assert_eq!(of(Target::Short), [first, second].concat());
        }
    }
    assert!(longs > 60 && shorts > 60, "{longs} long, {shorts} short");
    // The stream: long-gap recall targets (the target mask) are passage tokens predicted
    // from passage tokens; resets mark the segments where a row's document starts.
    let mut stream = RecallStream::new(task.clone(), 3, 1).unwrap();
    let mut selected = 0;
    for _ in 0..200 {
        let seg = stream.draw();
        assert_eq!(seg.shape(), [3, 8]);
        assert!(seg.counted.is_none(), "every position is trained");
        let mask = seg.target_mask.as_ref().unwrap();
        for ((&m, &x), &y) in mask.iter().zip(&seg.inputs).zip(&seg.targets) {
            if m {
                selected += 1;
                assert!(y < 20 && x < 20);
            }
        }
        for r in 0..3 {
            // A document starts with its passage: tokens of 0..20, never filler or marker.
            if seg.reset[r] {
                assert!(
                    seg.inputs[r * 8] < 20,
                    "{:?}",
                    &seg.inputs[r * 8..r * 8 + 8]
                );
            }
        }
    }
    assert!(selected > 0);
    let bad = RecallTask {
        passage: 21,
        ..task
    };
    assert!(
        RecallStream::new(bad, 1, 0)
            .unwrap_err()
            .to_string()
            .contains("passage")
    );
}
