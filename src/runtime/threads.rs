//! How many CPU threads candle's element-wise kernels use.
//!
//! candle 0.11 runs matrix products through `gemm` on rayon's pool
//! (`RAYON_NUM_THREADS`, default: every core) and every other CPU op
//! (element-wise maps, reductions, copies) on a separate barrier pool
//! (`CANDLE_NUM_THREADS`, default: every core) whose workers spin while they
//! wait. ncclean's work is many small ops on `[128, 128]`–`[512, 1280]`
//! tensors, where that pool spends its time in the barrier, not in the op:
//! on the 2-core reference machine, with the pool at one thread (matmuls
//! still on both cores),
//!
//! - `fit --method vanilla` on 30,000 cached Flickr8k pairs took 13.1 s
//!   instead of 77.6 s (another build sharing the cores);
//! - `score` on the same pairs ran at 86k instead of 20k pairs/s (vanilla),
//!   25k instead of 10k (ESC); MiniLM encoded 141 instead of 100 captions/s.
//!
//! The outputs are bit-identical either way (the thread count changes only
//! who computes which slice, never a summation order), so the binary
//! defaults the pool to one thread. A user who sets `CANDLE_NUM_THREADS`
//! keeps their value. Benchmarks in BENCHMARKS.md state the setting.

/// The element-wise pool size ncclean picks when the user set none.
pub const DEFAULT_CANDLE_THREADS: usize = 1;

/// Set `CANDLE_NUM_THREADS` to [`DEFAULT_CANDLE_THREADS`] unless the
/// environment already names a count, and pin `RAYON_NUM_THREADS` to the
/// matrix-product thread count candle would find (see below). Must run
/// before any candle op and before other threads start (it changes the
/// process environment), so `main` calls it first; library users choose for
/// themselves.
pub fn configure() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", DEFAULT_CANDLE_THREADS.to_string());
    }
    // Without RAYON_NUM_THREADS, candle 0.11 counts the physical cores anew
    // for every matrix product, by reading and parsing /proc/cpuinfo (a
    // file that grows with the core count). Scoring runs thousands of
    // small products: on the 2-core machine that lookup was a third of
    // ESC's scoring CPU time (issue #10). The count is the same every
    // time, so it is taken once; a user's own value is kept.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let n = candle_core::utils::get_num_threads();
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
}

/// The thread counts candle's CPU backend runs with in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ThreadSettings {
    /// Threads of matrix products (rayon's pool, `RAYON_NUM_THREADS`).
    pub matmul: usize,
    /// Threads of every other CPU op (candle's barrier pool,
    /// `CANDLE_NUM_THREADS`, which [`configure`] defaults to 1).
    pub elementwise: usize,
}

/// The settings in force, read the way candle reads them.
pub fn current() -> ThreadSettings {
    let matmul = candle_core::utils::get_num_threads();
    let elementwise = std::env::var("CANDLE_NUM_THREADS")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(matmul);
    ThreadSettings {
        matmul,
        elementwise,
    }
}
