//! Errors and the exit codes they map to.
//!
//! One place decides the exit code of every failure: 0 ok, 2 usage,
//! 3 invalid input, 4 partial failure, 130 interrupted, 1 anything else.

/// Every error ncclean reports to a user.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The user's data is not usable as given (missing column, wrong type,
    /// empty file...). The message names the file, the column and what was
    /// expected. Exit code 3.
    #[error("{0}")]
    InvalidInput(String),
    /// The command line asks for something impossible (e.g. `--device cuda`
    /// on a CPU-only build). Exit code 2.
    #[error("{0}")]
    Usage(String),
    /// The work finished, but some of it failed. Exit code 4.
    #[error("{0}")]
    Partial(String),
    /// Stopped by the user. Exit code 130.
    #[error("interrupted")]
    Interrupted,
    /// Anything else (I/O failure, internal error). Exit code 1.
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl Error {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::InvalidInput(_) => 3,
            Error::Usage(_) => 2,
            Error::Partial(_) => 4,
            Error::Interrupted => 130,
            Error::Other(_) => 1,
        }
    }
}

/// The pipelines' typed errors keep their meaning: a configuration the
/// method rejects is a usage error (2) whether it came from `fit`'s flags or
/// from a checkpoint `score` loads, a checkpoint state that does not fit is
/// invalid input (3), a failure while running is anything else (1).
impl From<ncclean_pipelines::Error> for Error {
    fn from(e: ncclean_pipelines::Error) -> Error {
        match e {
            ncclean_pipelines::Error::Config(m) => Error::Usage(m),
            ncclean_pipelines::Error::State(m) => Error::InvalidInput(m),
            ncclean_pipelines::Error::Diverged(m) => Error::Other(anyhow::anyhow!(m)),
            ncclean_pipelines::Error::Runtime(e) => Error::Other(anyhow::Error::new(e)),
        }
    }
}

/// A pipeline error about `place` (a checkpoint directory): the message is
/// prefixed, the exit code kept.
pub fn pipeline_at(place: &std::path::Path, e: ncclean_pipelines::Error) -> Error {
    match Error::from(e) {
        Error::Usage(m) => Error::Usage(format!("{}: {m}", place.display())),
        Error::InvalidInput(m) => Error::InvalidInput(format!("{}: {m}", place.display())),
        other => other,
    }
}

/// Shorthand for an [`Error::InvalidInput`].
pub fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidInput(msg.into())
}

/// Result with ncclean's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_convention() {
        assert_eq!(invalid("x").exit_code(), 3);
        assert_eq!(Error::Usage("x".into()).exit_code(), 2);
        assert_eq!(Error::Partial("x".into()).exit_code(), 4);
        assert_eq!(Error::Interrupted.exit_code(), 130);
        assert_eq!(Error::Other(anyhow::anyhow!("x")).exit_code(), 1);
    }

    #[test]
    fn pipeline_errors_keep_their_exit_code_wherever_they_surface() {
        use ncclean_pipelines::Error as P;
        let place = std::path::Path::new("run/checkpoint");
        assert_eq!(Error::from(P::Config("bad".into())).exit_code(), 2);
        assert_eq!(pipeline_at(place, P::Config("bad".into())).exit_code(), 2);
        assert_eq!(Error::from(P::State("old".into())).exit_code(), 3);
        let e = pipeline_at(place, P::State("old".into()));
        assert_eq!(
            (e.exit_code(), e.to_string()),
            (3, "run/checkpoint: old".into())
        );
        let rt = P::Runtime(candle_core::Error::Msg("nan".into()));
        assert_eq!(Error::from(rt).exit_code(), 1);
    }
}
