//! Synthetic data with known answers: the demo dataset (drawn shapes and the
//! captions that describe them) and noise injection with ground truth.

pub mod corrupt;
pub mod demo;
pub mod demo_files;
