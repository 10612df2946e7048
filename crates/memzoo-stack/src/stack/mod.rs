//! The layer stack: Transformer-XL (Dai et al. 2019) with any attention kind per layer.
//!
//! One embedding, a list of layers — each one attention kind ([`LayerKind`]: XL-relative,
//! learned-relative, T5, kNN) inside one residual block ([`XlBlock`]) — and one output.
//! Transformer-XL is the stack of `xl` layers; the Memorizing Transformer
//! ([`crate::MemorizingConfig`]) is the same stack with `knn` layers at chosen depths; the
//! Reformer ([`crate::reformer::ReformerConfig`]) is the stack of `lsh` / `local` layers with
//! reversible residuals ([`Residual`]), axial positions ([`AxialConfig`]), a chunked GELU
//! feed-forward and seeded, replayable randomness ([`Randomness`]).
//!
//! | file | holds |
//! |---|---|
//! | `kinds.rs` | [`LayerKind`], residual / activation / randomness / head options, the LSH and kNN layer settings |
//! | `config.rs` | [`XlConfig`] and the presets of the papers |
//! | `validate.rs` | [`XlConfig::validate`] |
//! | `random.rs` | seeded randomness: tags, masks, [`StepCounter`] |
//! | `block.rs` | the residual block [`XlBlock`] |
//! | `hyper.rs` | hyper-connections: several residual streams ([`HyperConnection`]) |
//! | `norm.rs` | LayerNorm or RMSNorm ([`Norm`], [`NormKind`]) |
//! | `layer.rs` | one layer [`XlLayer`] and what it reads ([`LayerContext`]) |
//! | `forward.rs` | the stack [`TransformerXl`] and its forward pass |
//! | `loss.rs` | the one loss path ([`Step`], [`TargetScores`]) and the evaluation step |
//! | `train.rs` | the training step and the reversible driver |
//! | `trace.rs` | a traced pass ([`Trace`]): what each layer's attention did (`memzoo inspect`) |

mod block;
mod compat;
mod config;
mod forward;
mod hyper;
mod kinds;
mod layer;
mod loss;
mod norm;
mod random;
mod trace;
mod train;
mod validate;
pub(crate) use validate::positive;

pub use block::*;
pub use compat::*;
pub use config::*;
pub use forward::*;
pub use hyper::*;
pub use kinds::*;
pub use layer::*;
pub use loss::*;
pub use norm::*;
pub use random::*;
pub use trace::*;
pub(crate) use train::*;
