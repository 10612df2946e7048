//! The papers' models as presets of the layer stack, one file per family: each builds an
//! [`XlConfig`](crate::XlConfig) (`stack()`) from the paper's parameters. Transformer-XL's own
//! presets are [`XlConfig::small`](crate::XlConfig::small),
//! [`enwik8_base`](crate::XlConfig::enwik8_base) and [`wt103_base`](crate::XlConfig::wt103_base).

pub mod block_recurrent;
pub mod memorizing;
pub mod reformer;
