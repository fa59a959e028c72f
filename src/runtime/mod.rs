//! The process around the work: which device runs, how many threads, progress
//! and logs on stderr, SIGINT/SIGTERM, what identifies this build, where the
//! CUDA libraries are, the GPU machine check, and small leaf helpers used by
//! every folder: temporary names for atomic outputs (and the sweep of those
//! dead processes left), size-limited reading of small files, hex digests,
//! an order-preserving parallel map, parsers of command-line values, man pages.

pub(crate) mod build_info;
pub(crate) mod cuda_libs;
pub(crate) mod device;
pub mod gpu_check;
pub(crate) mod hex;
pub mod interrupt;
pub(crate) mod man_page;
pub(crate) mod parallel;
pub(crate) mod parse;
pub mod progress;
pub mod small_file;
pub mod temp;
pub mod threads;
