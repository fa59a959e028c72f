//! Errors of the pipelines, typed by who must act: a configuration the user
//! fixes, a checkpoint state that does not fit, or a failure while running.

/// What went wrong in a pipeline.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration cannot run (an invalid parameter, an unknown
    /// method, a schedule that does not add up). The message names the key;
    /// the user fixes a flag or a config file.
    #[error("{0}")]
    Config(String),
    /// A checkpoint's saved method state does not fit this pipeline (missing
    /// or malformed mixture, wrong number of networks).
    #[error("{0}")]
    State(String),
    /// Training produced a non-finite loss: the model diverged. The message
    /// names the epoch and the likely cause.
    #[error("{0}")]
    Diverged(String),
    /// The observer asked to stop (a signal); nothing was half-done: the
    /// epoch or pass in progress is dropped.
    #[error("interrupted")]
    Interrupted,
    /// A tensor operation failed while training or scoring.
    #[error(transparent)]
    Runtime(#[from] candle_core::Error),
}

/// Result with the pipelines' [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The error of scoring before any division was fitted.
pub fn not_fitted() -> Error {
    Error::State("this pipeline has no fitted division; run fit first".into())
}
