//! The CLI's commands, as library functions (the binary only parses arguments).
//!
//! One file per command family:
//! - `train`: `memzoo train` ([`train()`]: new, resumed or replacing run) and
//!   [`recall_summary`];
//! - `eval`: `memzoo eval` ([`eval()`]);
//! - `generate`: `memzoo generate` ([`generate()`], [`GenerateOptions`]);
//! - `tasks`: the papers' generated tasks, `memzoo duplication` ([`duplication`]) and
//!   `memzoo recall` ([`recall`]);
//! - `data`: `memzoo data list | fetch | prepare | stats` ([`data_list`], [`data_fetch`],
//!   [`data_prepare`], [`data_stats`]);
//! - `devices`: `memzoo devices --measure DEVICE`, a device's matrix-product rate at the
//!   presets' shapes ([`devices_measure`], [`measure_products`]); large-shape operations
//!   against the host ([`devices_verify`]);
//! - `inspect`: `memzoo inspect` ([`inspect()`], [`InspectArgs`]; the page is built in
//!   [`crate::inspect`]);
//! - `loading`: shared helpers reading a run directory: its model with a checkpoint
//!   ([`load_xl`]) and its data as segments;
//! - `checks`: shared refusals made before a run starts (flags against the run's family, token
//!   ids against the vocabulary, the model's memory against this machine's).
//!
//! `memzoo import` and `memzoo export` live in [`crate::import`] (the peers' formats in
//! `memzoo-import`), and `memzoo recl` in [`crate::recl`].

use burn::tensor::Device;

use crate::error::CliError;

mod checks;
mod data;
mod devices;
mod eval;
mod generate;
mod inspect;
mod loading;
mod tasks;
mod train;
mod verify;

pub(crate) use checks::check_import_memory;
pub use data::{data_fetch, data_list, data_prepare, data_stats};
pub use devices::{ProductRate, ProductShape, devices_measure, measure_products, product_shapes};
pub use eval::{EvalArgs, eval, eval_with};
pub use generate::{GenerateOptions, generate};
pub use inspect::{InspectArgs, inspect};
pub(crate) use loading::load_checkpoint;
pub use loading::load_xl;
pub use tasks::{duplication, recall};
pub use train::{recall_summary, train};
pub use verify::{Role, Verdict, devices_verify, verify};

pub(crate) fn device(name: &str) -> Result<Device, CliError> {
    Ok(memzoo_backend::parse_device(name)?)
}

/// Bytes in GiB, for messages.
fn gib(bytes: f64) -> f64 {
    bytes / (1u64 << 30) as f64
}
