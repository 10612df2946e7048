//! memzoo's integration tests, in one binary so that Burn is linked once.

mod backend;
mod relative;
mod train;
mod xl;
