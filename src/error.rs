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
}
