/// Errors of the Reformer crate.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum ReformerError {
    /// A configuration value is invalid; the message names it.
    #[error("invalid Reformer config: {0}")]
    Config(String),
    /// An input does not fit the model; the message names the shapes.
    #[error("bad input to Reformer: {0}")]
    Input(String),
}
