//! memzoo's integration tests, in one binary so that Burn is linked once.

mod backend;
mod generate;
mod learning;
mod parity;
mod relative;
mod reliability;
mod train;
mod xl;
