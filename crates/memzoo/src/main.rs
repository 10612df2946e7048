//! The `memzoo` command line.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "memzoo", version, about = "Transformers that remember beyond their context window")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the device strings and which are compiled into this binary.
    Devices,
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Devices => {
            for (name, feature) in memzoo::backend::DEVICE_NAMES {
                let spec: memzoo::backend::DeviceSpec = name.parse().expect("known name");
                let state = if spec.is_compiled() { "compiled in" } else { "not compiled" };
                println!("{name:12} feature `{feature}`: {state}");
            }
        }
    }
}
