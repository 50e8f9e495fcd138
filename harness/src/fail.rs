//! Failures of the run itself: bad input, bad arguments, setup. They all
//! exit 3 (DESIGN.md) with one line saying what and where.

/// Exit code of a run that failed before it could reach a verdict.
pub const EXIT_FAILED: i32 = 3;

#[derive(Debug)]
pub struct Failure {
    pub code: i32,
    pub message: String,
}

impl Failure {
    pub fn new(message: impl Into<String>) -> Failure {
        Failure {
            code: EXIT_FAILED,
            message: message.into(),
        }
    }

    /// A subcommand that is not built yet.
    pub fn unbuilt(command: &str) -> Failure {
        Failure::new(format!("`drift {command}`: not implemented yet"))
    }
}

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure::new(e.to_string())
    }
}
