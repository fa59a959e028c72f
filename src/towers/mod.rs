//! The frozen towers that turn images and captions into features: which
//! towers a run uses (`choice`, the flags or the installed pretrained ones
//! for photos) and loading them ([`encoders`]), which pretrained towers
//! are installed on this machine ([`installed`]), and the on-disk cache of
//! their features (`features`, private to the crate).

pub(crate) mod choice;
pub mod encoders;
pub(crate) mod features;
pub mod installed;
