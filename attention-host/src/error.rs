//! Errors a caller can act on: no device, bad input (refused before any launch), CUDA failures.

use cudarc::driver::DriverError;
use cudarc::driver::sys::CUresult;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum AttentionError {
    /// No CUDA device answered (no `libcuda` to load, no GPU, or the driver found none).
    #[error("no CUDA device answered: {0}")]
    NoDevice(String),
    /// The inputs cannot be run as given; nothing was launched.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// Loading the PTX module or finding a kernel in it failed.
    #[error("loading kernel module: {0}")]
    Module(String),
    /// A kernel launch or its completion reported an error.
    #[error("kernel {kernel} failed: {source}")]
    Launch {
        kernel: String,
        #[source]
        source: DriverError,
    },
    /// Any other CUDA driver call failed (allocation, copy, context).
    #[error("CUDA {what}: {source}")]
    Cuda {
        what: &'static str,
        #[source]
        source: DriverError,
    },
}

/// Checks a raw driver status (the calls made through `cudarc::driver::sys`: the stream-ordered
/// pool, memsets).
pub(crate) fn driver(status: CUresult, what: &'static str) -> Result<()> {
    status.result().cuda(what)
}

pub type Result<T> = std::result::Result<T, AttentionError>;

/// Shorthand for refusing an input with a formatted message.
macro_rules! invalid {
    ($($arg:tt)*) => { $crate::error::AttentionError::InvalidInput(format!($($arg)*)) };
}
pub(crate) use invalid;

/// Attaches what was being done to a driver error.
pub(crate) trait CudaContext<T> {
    fn cuda(self, what: &'static str) -> Result<T>;
}

impl<T> CudaContext<T> for std::result::Result<T, DriverError> {
    fn cuda(self, what: &'static str) -> Result<T> {
        self.map_err(|source| AttentionError::Cuda { what, source })
    }
}
