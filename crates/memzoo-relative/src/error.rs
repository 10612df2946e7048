/// Errors of the relative attention crate.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum RelativeError {
    /// A configuration value is invalid; the message names it.
    #[error("invalid relative attention config: {0}")]
    Config(String),
}
