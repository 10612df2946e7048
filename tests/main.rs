//! memzoo's integration tests, in one binary so that Burn is linked once.

mod adaptive;
mod backend;
mod cli;
mod config;
mod default_run;
mod eval;
mod fused_relative;
mod generate;
mod hub;
mod import;
mod import_family;
mod import_labml;
mod import_lucidrains;
mod import_lucidrains_reformer;
mod import_reformer;
mod learning;
mod multidev;
mod parity;
mod reformer;
mod relative;
mod reliability;
mod stack;
mod tasks;
mod tokenizers;
mod train;
mod xl;
