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
    /// Stopped by a signal (SIGINT, SIGTERM) at a batch boundary; earlier
    /// outputs are intact. The message says what was interrupted and what
    /// was kept. Exit code 130.
    #[error("{0}")]
    Interrupted(String),
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
            Error::Interrupted(_) => 130,
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
            ncclean_pipelines::Error::Interrupted => crate::runtime::interrupt::error(),
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

impl Error {
    /// Say what was being done when an internal failure happened; the
    /// user-facing kinds (usage, input, partial, interrupted) pass unchanged,
    /// so their exit codes hold.
    pub fn context(self, what: impl std::fmt::Display + Send + Sync + 'static) -> Error {
        match self {
            Error::Other(e) => Error::Other(e.context(what)),
            other => other,
        }
    }
}

/// The partial-failure rule, in one place: rows that could not be used
/// (unreadable image, missing caption, ...) are labelled with their reason
/// and the run completes; when they are more than `max_skipped` of all
/// rows, the outputs are still written in full, but the exit code is 4 so
/// a pipeline can tell a partial result.
pub fn partial_if_skipped(rows: usize, skipped: usize, max_skipped: f64) -> Result<()> {
    let fraction = skipped as f64 / rows.max(1) as f64;
    if skipped > 0 && fraction > max_skipped {
        return Err(Error::Partial(format!(
            "{skipped} of {rows} rows ({:.1}%) could not be used, more than --max-skipped {max_skipped}; \
             the outputs were written and list each such row with its reason (`ncclean inspect` summarises them)",
            100.0 * fraction
        )));
    }
    Ok(())
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
        assert_eq!(Error::Interrupted("x".into()).exit_code(), 130);
        assert_eq!(Error::Other(anyhow::anyhow!("x")).exit_code(), 1);
    }

    #[test]
    fn skipped_rows_above_the_limit_are_a_partial_result() {
        assert!(partial_if_skipped(100, 0, 0.0).is_ok());
        assert!(partial_if_skipped(100, 10, 0.1).is_ok());
        let e = partial_if_skipped(100, 11, 0.1).unwrap_err();
        assert_eq!(e.exit_code(), 4);
        assert!(e.to_string().starts_with("11 of 100 rows (11.0%)"), "{e}");
        assert_eq!(partial_if_skipped(100, 1, 0.0).unwrap_err().exit_code(), 4);
        assert!(partial_if_skipped(100, 100, 1.0).is_ok());
        assert!(partial_if_skipped(0, 0, 0.0).is_ok());
    }

    #[test]
    fn context_wraps_internal_errors_only() {
        let e = Error::Other(anyhow::anyhow!("disk full")).context("writing labels");
        assert_eq!(e.to_string(), "writing labels");
        for e in [
            Error::Usage("u".into()),
            invalid("i"),
            Error::Partial("p".into()),
            Error::Interrupted("s".into()),
        ] {
            let (code, text) = (e.exit_code(), e.to_string());
            let wrapped = e.context("doing x");
            assert_eq!((wrapped.exit_code(), wrapped.to_string()), (code, text));
        }
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
