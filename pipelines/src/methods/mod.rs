//! One file per method: its paper's math behind the [`crate::Method`] trait.
//! A method file imports only the leaf modules (the trait, losses, batch
//! statistics, scoring passes, networks, configuration types, seed streams),
//! never the runner or the registry; the [`crate::registry`] lists them.

pub mod crcl;
pub mod esc;
pub mod gsc;
pub mod recon;
pub mod vanilla;
