//! The segment-recurrence trainer of memzoo.
//!
//! [`train`] runs truncated back-propagation through time over ordered segments: every batch
//! row is a contiguous stream, the model's state (memories) is carried from one step to the
//! next and detached, and reset where a row's document ends when the model asks for it.
//! AdamW, linear warm-up then cosine decay, global gradient-norm clipping, gradient
//! accumulation; burn-train's dashboard on a terminal, plain lines otherwise, every metric in
//! `<run-dir>/metrics.jsonl`; atomic checkpoints with `--resume`; [`evaluate`] scores a whole
//! split in order with memory carried (optionally with a longer memory), with the loss and
//! accuracy on the targets the data selects. [`tasks`] trains the generated tasks
//! (duplication, long-range recall) with it.

#![warn(missing_docs)]

pub mod checkpoint;
pub mod data;
/// The errors of training, checkpoints and generation.
pub mod error;
pub mod generate;
pub mod grads;
pub mod lock;
pub mod metrics;
pub mod model;
pub mod parallel;
pub mod recl;
pub mod replace;
pub mod schedule;
pub mod segment;
pub mod signals;
pub mod tasks;
pub mod trainer;
pub mod unroll;

pub use checkpoint::TrainerState;
pub use error::TrainError;
pub use generate::{
    GenerateConfig, GenerateError, Generation, Generator, SampleConfig, Sampler, generate,
    generate_recompute,
};
pub use memzoo_stack::{Step, TargetScores};
pub use model::{RecurrentModel, SegmentModel};
pub use schedule::ScheduleConfig;
pub use segment::{Segment, SegmentSource};
pub use trainer::{
    AdamConfig, EvalResult, RunOptions, TrainConfig, TrainOutcome, evaluate, evaluate_sharded,
    train, train_on_devices,
};
