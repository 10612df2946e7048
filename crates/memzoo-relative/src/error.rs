/// Errors of the attention crate; messages name the bad value.
#[derive(Debug, thiserror::Error)]
pub enum RelativeError {
    /// A configuration value is invalid; the message names it.
    #[error("invalid attention config: {0}")]
    Config(String),
    /// An input (tensor, context, memory) does not fit the layer; the message names the shapes.
    #[error("bad input to an attention layer: {0}")]
    Input(String),
}
