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
//!
//! ```no_run
//! use burn::tensor::Device;
//! use memzoo_data::{Duplication, TaskStream};
//! use memzoo_stack::XlConfig;
//! use memzoo_train::{RunOptions, TrainConfig, train};
//!
//! let device = Device::flex().autodiff();
//! // A tiny Transformer-XL on the Reformer paper's duplication task (`0 w 0 w`, 16 symbols).
//! let model = XlConfig::new()
//!     .with_n_layers(1)
//!     .with_d_model(32)
//!     .with_n_heads(2)
//!     .with_d_inner(64)
//!     .with_vocab_size(16)
//!     .init(&device)
//!     .unwrap();
//! let mut data = TaskStream::endless(Duplication::new(4, 16, 16, 0).unwrap());
//! let config = TrainConfig::sized(5, 4, 16);
//! let options = RunOptions {
//!     run_dir: std::env::temp_dir().join("memzoo-train-example"),
//!     resume: false,
//!     quiet: true,
//! };
//! let outcome = train(model, &config, &mut data, None, &options).unwrap();
//! println!("{} steps, train loss {:?}", outcome.steps, outcome.train_loss);
//! ```

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
