//! memzoo's integration tests, in one binary so that Burn is linked once.

mod backend;
mod default_run;
mod learning;
mod parity;
mod relative;
mod reliability;
mod stack;
mod train;
mod xl;
