//! Training steps over `k` consecutive segments (backpropagation through time over `k`
//! segments, [`crate::RecurrentModel::bptt_segments`]): the trainer reads `k` segments of the
//! same rows per optimizer step, and each replica runs
//! [`RecurrentModel::train_unroll`](crate::RecurrentModel::train_unroll) on its rows of all
//! `k`, its carried state in the graph between them and detached after the last.
//!
//! With `k = 1` this is [`crate::parallel::train_step_streamed`]. Replicas split rows as
//! there (see [`crate::parallel`]), each weighted by its share `n_r / N` of the counted
//! targets of all `k` segments; the step's loss is `L = (1/k) Σ_τ L_τ`, the mean of the
//! segments' mean losses (the peer's segments weighted by their lengths, equal here).

use burn::optim::GradientsParams;
use burn::tensor::Device;
use memzoo_stack::UnrollSegment;

use crate::error::TrainError;
use crate::model::SegmentModel;
use crate::parallel::{
    TrainStream, check_replicas, run_replicas, shard_rows, shard_weights, train_step_streamed,
};
use crate::segment::{Segment, loss_weights, tensors};

/// The tensors of one replica's rows of `segments` on `device`.
fn unroll_segments(segments: &[Segment], device: &Device) -> Vec<UnrollSegment> {
    segments
        .iter()
        .map(|s| {
            let (inputs, targets) = tensors(s, device);
            UnrollSegment {
                inputs,
                targets,
                reset: s.reset.clone(),
                weights: loss_weights(s, device),
            }
        })
        .collect()
}

/// One optimizer step's loss and gradients over `segments` (consecutive segments of the same
/// rows), their rows split over `states.len()` replicas placed on `placement` (see
/// [`crate::parallel::train_step_streamed`]); one segment is exactly that step.
pub fn train_unroll_streamed<M: SegmentModel>(
    model: &M,
    main: &Device,
    placement: &[Device],
    segments: &[Segment],
    states: &mut [M::State],
    stream: Option<TrainStream>,
) -> Result<(f64, GradientsParams), TrainError> {
    let Some(first) = segments.first() else {
        return Err(TrainError::Data(
            "an unrolled step needs at least one segment".into(),
        ));
    };
    if segments.len() == 1 {
        return train_step_streamed(model, main, placement, first, states, stream);
    }
    if let Some(s) = segments.iter().find(|s| s.batch != first.batch) {
        return Err(TrainError::Data(format!(
            "the segments of an unrolled step have {} and {} rows",
            first.batch, s.batch
        )));
    }
    let replicas = states.len();
    check_replicas(replicas, first.batch)?;
    if placement.len() != replicas {
        return Err(TrainError::Config(format!(
            "{} devices for {replicas} replicas: each replica needs one",
            placement.len()
        )));
    }
    // shards[r]: replica r's rows of every segment.
    let mut shards: Vec<Vec<Segment>> = vec![Vec::with_capacity(segments.len()); replicas];
    for s in segments {
        for (r, rows) in shard_rows(s.batch, replicas).into_iter().enumerate() {
            shards[r].push(s.rows(rows)?);
        }
    }
    let counted: Vec<usize> = shards
        .iter()
        .map(|ss| ss.iter().map(Segment::counted_targets).sum())
        .collect();
    let rows: Vec<usize> = shards.iter().map(|ss| ss[0].batch).collect();
    let weights = shard_weights(&counted, &rows, first.batch);
    run_replicas(
        model,
        main,
        placement,
        &shards,
        &weights,
        states,
        stream,
        |replica, shard, device, state| {
            Ok(replica.train_unroll(unroll_segments(shard, device), state)?)
        },
    )
}
