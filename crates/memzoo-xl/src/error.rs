use memzoo_relative::RelativeError;

/// Errors of the Transformer-XL crate.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum XlError {
    /// A configuration value is invalid; the message names it.
    #[error("invalid Transformer-XL config: {0}")]
    Config(String),
    /// An input does not fit the model; the message names the shapes.
    #[error("bad input to Transformer-XL: {0}")]
    Input(String),
}

impl From<RelativeError> for XlError {
    fn from(e: RelativeError) -> Self {
        match e {
            RelativeError::Config(m) => XlError::Config(m),
        }
    }
}
