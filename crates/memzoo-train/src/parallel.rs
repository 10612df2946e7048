//! Data-parallel training steps: replicas on one CPU device, or on several devices.
//!
//! Burn's `flex` backend runs its matrix products on every thread (rayon), but its element-wise
//! kernels — softmax, masks, additions, copies, the zeroing of every new buffer — on the thread
//! that calls them. A Transformer-XL step on a 2-core machine kept only ~1.2 cores busy: about
//! half of the step waits on single-threaded element-wise work. Splitting the batch's rows into
//! `R` shards, one model replica per shard, all running at once on rayon's pool, keeps every
//! core busy (XL-small on 2 cores: 1,035 -> 1,788 tokens/s, see the README).
//!
//! The step computes the same loss and gradients as one pass over the whole batch. Every memzoo
//! model treats batch rows independently (one memory per row), so with `n_r` counted targets in
//! shard `r` (those of its [`Segment::loss_mask`]: not padding, selected by `counted`) and
//! `N = Σ_r n_r`:
//!
//! ```text
//! L = (1/N) Σ_tokens ℓ = Σ_r (n_r / N) L_r        ∇L = Σ_r (n_r / N) ∇L_r
//! ```
//!
//! where `L_r` is shard `r`'s own mean loss (a shard of padding alone, `n_r = 0`, still runs
//! for its memory but adds nothing). Each replica is a [`fork`](burn::module::Module::fork) of
//! the model: the same parameter values (shared, not copied) as fresh autodiff leaves, so the
//! replicas build independent graphs; their gradients are keyed by parameter id and summed.
//!
//! Each shard keeps its own carried state (memories) for its rows, across steps.
//!
//! # Several devices
//!
//! The same step runs with each shard on a device of its own ([`train_step_placed`]: `cuda:0,
//! cuda:1`, one shard per device), with Burn's own multi-device machinery, the path of
//! burn-train's `ExecutionStrategy::MultiDevice` with `MultiDeviceOptim::OptimMainDevice`:
//! each replica is a [`fork`](burn::module::Module::fork) of the model onto its device, its
//! gradients come back with [`GradientsParams::to_device`] to the main device (the model's),
//! where [`GradientsAccumulator`] sums them, and the optimizer updates the one model there. A
//! shard's memories live on its device from step to step. burn-train's own step
//! (`MultiDevicesTrainStep`) is not used as such: it runs a stateless `TrainStep` whose
//! failures are panics, where a memzoo step carries its rows' memories and returns typed
//! errors. Burn's collective all-reduce (`burn::tensor::distributed::all_reduce`, under the
//! `DistributedDataParallel` strategy) runs in Burn 0.22.1 on CUDA (NCCL) and `remote`
//! devices alone: on `flex`, LibTorch and wgpu it panics ("Distributed operations are not
//! supported", burn-dispatch; the test `burn_all_reduce_is_not_supported_on_flex` reproduces
//! it), so it is not used either. Nor does it reach past one machine of CPUs: over two Burn
//! `remote` servers it panics in burn-remote's client ("cross-peer all_reduce is not supported
//! yet"), and a `flex` server cannot run one itself (`unimplemented!()`), while this module's
//! path (`fork`, `to_device`, [`GradientsAccumulator`]) gave the same gradients over two remote
//! servers as one local pass ("Past one machine" in docs/runs.md).
//!
//! Random draws (dropout masks, the Reformer's rotations) come from the backend's global
//! generator in whatever order the replicas reach it: with dropout and `R > 1` a run is not
//! bit-reproducible from its seed. `replicas = 1` is.
//!
//! Evaluation ([`eval_step_sharded`]) splits the rows the same way, without gradients: each
//! shard returns the sums of its rows' losses and counts ([`EvalSums`]), which add up to the
//! whole batch's, so the split's mean loss is the same (up to float rounding) for any `R`.

use std::ops::{Add, Range};

use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::Device;
use rayon::prelude::*;

use crate::error::TrainError;
use crate::grads::scale;
use crate::model::SegmentModel;
use crate::segment::{Segment, loss_weights, mask_tensor, tensors};

/// `batch` rows split into `replicas` contiguous ranges whose sizes differ by at most one (the
/// first ones get the extra rows). Empty when `replicas` is 0.
///
/// ```
/// # use memzoo_train::parallel::shard_rows;
/// assert_eq!(shard_rows(8, 2), vec![0..4, 4..8]);
/// assert_eq!(shard_rows(5, 3), vec![0..2, 2..4, 4..5]);
/// ```
pub fn shard_rows(batch: usize, replicas: usize) -> Vec<Range<usize>> {
    let mut start = 0;
    (0..replicas)
        .map(|r| {
            let rows = batch / replicas + usize::from(r < batch % replicas);
            let range = start..start + rows;
            start += rows;
            range
        })
        .collect()
}

/// How many replicas to train with when the configuration leaves it open: on `flex`, one per
/// thread of rayon's pool (`RAYON_NUM_THREADS`, else the CPU count), at most one per row; on
/// every other backend 1 (GPUs and LibTorch parallelise inside each kernel).
pub fn auto_replicas(device: &Device, batch: usize) -> usize {
    if memzoo_backend::is_flex(device) {
        rayon::current_num_threads().clamp(1, batch.max(1))
    } else {
        1
    }
}

/// Checks a replica count against the batch, naming the bad value.
pub fn check_replicas(replicas: usize, batch: usize) -> Result<(), TrainError> {
    if replicas == 0 || replicas > batch {
        return Err(TrainError::Config(format!(
            "train.replicas must be between 1 and train.batch ({batch}), got {replicas}"
        )));
    }
    Ok(())
}

/// One training step of `model` over `segment`, its rows split over `states.len()` replicas
/// (see the module docs): returns the batch's mean loss over its counted targets and its
/// gradients.
///
/// `states[r]` is the carried state of shard `r` (rows [`shard_rows`]`(batch, R)[r]`); with
/// one state this is exactly [`crate::RecurrentModel::train_step`].
pub fn train_step_sharded<M: SegmentModel>(
    model: &M,
    device: &Device,
    segment: &Segment,
    states: &mut [M::State],
) -> Result<(f64, GradientsParams), TrainError> {
    let placement = vec![device.clone(); states.len()];
    train_step_placed(model, device, &placement, segment, states)
}

/// [`train_step_sharded`] with shard `r` on `placement[r]` (one entry per state): its replica is
/// forked onto that device, reads its rows there with its state (which stays there), and its
/// gradients come back to `main`, the device of `model`, where they are summed (see "Several
/// devices" in the module docs). Devices are autodiff devices.
pub fn train_step_placed<M: SegmentModel>(
    model: &M,
    main: &Device,
    placement: &[Device],
    segment: &Segment,
    states: &mut [M::State],
) -> Result<(f64, GradientsParams), TrainError> {
    train_step_streamed(model, main, placement, segment, states, None)
}

/// The random stream replica `r` of `replicas` draws from in the step of stream `stream`:
/// `stream · replicas + r` (one replica: the stream itself).
pub fn replica_stream(stream: u64, r: usize, replicas: usize) -> u64 {
    stream.wrapping_mul(replicas as u64).wrapping_add(r as u64)
}

/// Seeds the backend's generator of every device in `placement` (each once) from `seed` and
/// `stream`: the trainer calls it before each training step, so that what the step draws from
/// it (Burn's dropout masks) is a function of (`train.seed`, step) and nothing before it, and a
/// resumed run draws what the straight one did. Device `i` (in order of first appearance) gets
/// `mix(mix(seed, stream), i)`.
///
/// Replicas on one device share its generator (`flex` has one per process), and their threads
/// draw from it in whatever order they run: with several replicas on one device, what they
/// draw from it is not repeatable. The trainer's models do not draw from it in training: the
/// layer stack draws its dropout masks from its stream
/// ([`crate::RecurrentModel::with_train_stream`]).
pub fn seed_devices(placement: &[Device], seed: u64, stream: u64) {
    let mut seeded: Vec<&Device> = Vec::new();
    for device in placement {
        if !seeded.contains(&device) {
            let i = seeded.len() as u64;
            device.seed(memzoo_reformer::rng::mix(
                memzoo_reformer::rng::mix(seed, stream),
                i,
            ));
            seeded.push(device);
        }
    }
}

/// What a training step's own randomness is drawn from: `train.seed` and the step's stream
/// (one per step and micro-step).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrainStream {
    /// `train.seed`.
    pub seed: u64,
    /// The step's stream: `step · grad_accum + micro-step`.
    pub stream: u64,
}

/// [`train_step_placed`] drawing from `stream` (`None`: from wherever the model's own
/// generator stands): replica `r` draws its seeded randomness from
/// [`replica_stream`]`(stream, r, R)` ([`crate::RecurrentModel::with_train_stream`]), so the
/// step is one function of its stream whatever order the replicas' threads run in.
pub fn train_step_streamed<M: SegmentModel>(
    model: &M,
    main: &Device,
    placement: &[Device],
    segment: &Segment,
    states: &mut [M::State],
    stream: Option<TrainStream>,
) -> Result<(f64, GradientsParams), TrainError> {
    let replicas = states.len();
    check_replicas(replicas, segment.batch)?;
    if placement.len() != replicas {
        return Err(TrainError::Config(format!(
            "{} devices for {replicas} replicas: each replica needs one",
            placement.len()
        )));
    }
    if replicas == 1 && placement[0] == *main {
        let (x, y) = tensors(segment, main);
        let w = loss_weights(segment, main);
        return Ok(match stream {
            Some(s) => model
                .clone()
                .with_train_stream(s.seed, s.stream)
                .train_step(x, y, &mut states[0], &segment.reset, w)?,
            None => model.train_step(x, y, &mut states[0], &segment.reset, w)?,
        });
    }
    let shards: Vec<Segment> = shard_rows(segment.batch, replicas)
        .into_iter()
        .map(|rows| segment.rows(rows))
        .collect::<Result<_, _>>()?;
    let counted: Vec<usize> = shards.iter().map(Segment::counted_targets).collect();
    let rows: Vec<usize> = shards.iter().map(|s| s.batch).collect();
    let weights = shard_weights(&counted, &rows, segment.batch);
    run_replicas(
        model,
        main,
        placement,
        &shards,
        &weights,
        states,
        stream,
        |replica, shard, device, state| {
            let (x, y) = tensors(shard, device);
            let w = loss_weights(shard, device);
            Ok(replica.train_step(x, y, state, &shard.reset, w)?)
        },
    )
}

/// Each shard's weight in a step's mean loss: its share `n_r / N` of the counted targets, or,
/// when no target counts at all, its share of the `batch` rows.
pub(crate) fn shard_weights(counted: &[usize], rows: &[usize], batch: usize) -> Vec<f64> {
    let total: usize = counted.iter().sum();
    counted
        .iter()
        .zip(rows)
        .map(|(&n, &r)| match total {
            0 => r as f64 / batch as f64,
            _ => n as f64 / total as f64,
        })
        .collect()
}

/// Runs `step` for every replica at once: `model` on each device of `placement` (itself where
/// one replica runs on `main`; each drawing from its own [`replica_stream`]), replica `r` on
/// `shards[r]` with `states[r]`. Returns `Σ_r w_r L_r` and `Σ_r w_r ∇_r`, the gradients summed
/// on `main` (OptimMainDevice); a shard of weight 0 (padding only: its mean is 0/0) ran for
/// its memory and counts for nothing.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_replicas<M: SegmentModel, S: Sync>(
    model: &M,
    main: &Device,
    placement: &[Device],
    shards: &[S],
    weights: &[f64],
    states: &mut [M::State],
    stream: Option<TrainStream>,
    step: impl Fn(&M, &S, &Device, &mut M::State) -> Result<(f64, GradientsParams), TrainError> + Sync,
) -> Result<(f64, GradientsParams), TrainError> {
    let replicas = states.len();
    let models: Vec<M> = placement
        .iter()
        .enumerate()
        .map(|(r, device)| {
            let replica = match replicas == 1 && device == main {
                true => model.clone(),
                false => model.clone().fork(device),
            };
            match stream {
                Some(s) => replica.with_train_stream(s.seed, replica_stream(s.stream, r, replicas)),
                None => replica,
            }
        })
        .collect();
    let results: Vec<Result<(f64, GradientsParams), TrainError>> = models
        .into_par_iter()
        .zip(placement.par_iter())
        .zip(shards.par_iter())
        .zip(states.par_iter_mut())
        .map(|(((replica, device), shard), state)| {
            let (loss, grads) = step(&replica, shard, device, state)?;
            let grads = match device == main {
                true => grads,
                false => grads.to_device(main, &replica),
            };
            Ok((loss, grads))
        })
        .collect();
    // Equal weights (the usual case): sum, then scale once.
    let uniform = weights.iter().all(|&w| w == weights[0]);
    let mut acc = GradientsAccumulator::<M>::new();
    let mut loss = 0.0;
    for (result, &w) in results.into_iter().zip(weights) {
        let (shard_loss, grads) = result?;
        if w == 0.0 {
            continue;
        }
        loss += w * shard_loss;
        let grads = if uniform {
            grads
        } else {
            scale(model, grads, w)
        };
        acc.accumulate(model, grads);
    }
    let grads = acc.grads();
    let grads = if uniform {
        scale(model, grads, weights[0])
    } else {
        grads
    };
    Ok((loss, grads))
}

/// Sums over the evaluated targets of some rows: what [`crate::evaluate`] adds up over a split.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EvalSums {
    /// `Σ -log p(y)` (nats) over the counted targets (not padding, selected by `counted`).
    pub nats: f64,
    /// Counted targets.
    pub tokens: u64,
    /// `Σ -log p(y)` over the counted targets the data's target mask selects.
    pub selected_nats: f64,
    /// Of those, how many are the model's most likely token (argmax).
    pub selected_hits: f64,
    /// Counted targets the target mask selects.
    pub selected_tokens: u64,
}

impl Add for EvalSums {
    type Output = EvalSums;

    fn add(self, o: EvalSums) -> EvalSums {
        EvalSums {
            nats: self.nats + o.nats,
            tokens: self.tokens + o.tokens,
            selected_nats: self.selected_nats + o.selected_nats,
            selected_hits: self.selected_hits + o.selected_hits,
            selected_tokens: self.selected_tokens + o.selected_tokens,
        }
    }
}

/// Reads `segment` with `model` (no autodiff) on top of `state`, moving the state on, and
/// returns its [`EvalSums`].
///
/// # Shapes
/// - `segment`: `[batch, len]` inputs and targets
pub fn eval_segment<M: SegmentModel>(
    model: &M,
    device: &Device,
    segment: &Segment,
    state: &mut M::State,
) -> Result<EvalSums, TrainError> {
    let (x, y) = tensors(segment, device);
    let shape = segment.shape();
    // ℓ_i = -log p(y_i), and the hits only where the data selects targets to score.
    let scores = model.segment_nll(x, y, state, &segment.reset, segment.target_mask.is_some())?;
    let nll = scores.nll;
    // Weights: 1 for counted targets (not padding, selected by `counted`).
    let keep = segment.loss_mask();
    let mut sums = EvalSums {
        tokens: keep.iter().filter(|&&k| k).count() as u64,
        ..EvalSums::default()
    };
    let w = mask_tensor(&keep, shape, device);
    sums.nats = (nll.clone() * w).sum().into_scalar::<f64>();
    if let (Some(mask), Some(hits)) = (&segment.target_mask, scores.hits) {
        let sel: Vec<bool> = mask.iter().zip(&keep).map(|(&m, &k)| m && k).collect();
        sums.selected_tokens = sel.iter().filter(|&&k| k).count() as u64;
        let w = mask_tensor(&sel, shape, device);
        sums.selected_nats = (nll * w.clone()).sum().into_scalar::<f64>();
        sums.selected_hits = (hits * w).sum().into_scalar::<f64>();
    }
    Ok(sums)
}

/// Evaluates one segment of `model` (no autodiff) with its rows split over `states.len()`
/// replicas, as [`train_step_sharded`] splits a training step: `states[r]` carries the
/// memories of the rows [`shard_rows`]`(batch, R)[r]` from one segment to the next. The
/// shards' [`EvalSums`] add up to the whole segment's.
pub fn eval_step_sharded<M: SegmentModel>(
    model: &M,
    device: &Device,
    segment: &Segment,
    states: &mut [M::State],
) -> Result<EvalSums, TrainError> {
    let replicas = states.len();
    check_replicas(replicas, segment.batch)?;
    if replicas == 1 {
        return eval_segment(model, device, segment, &mut states[0]);
    }
    let shards: Vec<Segment> = shard_rows(segment.batch, replicas)
        .into_iter()
        .map(|rows| segment.rows(rows))
        .collect::<Result<_, _>>()?;
    // Clones share the parameters' storage: one model, one handle per thread.
    let replicas: Vec<M> = (0..replicas).map(|_| model.clone()).collect();
    replicas
        .into_par_iter()
        .zip(shards.par_iter())
        .zip(states.par_iter_mut())
        .map(|((replica, shard), state)| eval_segment(&replica, device, shard, state))
        .collect::<Result<Vec<_>, _>>()
        .map(|sums| sums.into_iter().fold(EvalSums::default(), Add::add))
}
