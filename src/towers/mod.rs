//! The frozen towers that turn images and captions into features: which
//! towers a run uses and loading them ([`encoders`]), which pretrained towers
//! are installed on this machine ([`installed`]), and the on-disk cache of
//! their features ([`features`]).

pub mod encoders;
pub mod features;
pub mod installed;
