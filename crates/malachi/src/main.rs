//! `malachi`: the broker and its command-line tools in one binary.
//!
//! Each subcommand lives in its own module; this file only parses arguments and dispatches.

mod bench;
mod cli;
mod cluster_boot;
mod health;
mod identity;
mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "malachi", version, about = "A replicated, append-only log broker.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a broker (single node, data on local disk; no configuration needed).
    Serve(serve::ServeArgs),
    /// Ask a broker's /ready: exits 0 when it can serve (for container health checks).
    Health(health::HealthArgs),
    /// Measure Malachi against a baseline measured in the same run.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    #[command(flatten)]
    Client(cli::ClientCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Health(args) => health::run(args),
        Command::Bench(command) => bench::run(command),
        Command::Client(command) => {
            restore_default_sigpipe();
            cli::run(command)
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("malachi: {message}");
            ExitCode::FAILURE
        }
    }
}

/// A client command writing into a closed pipe (`malachi consume orders | head`) ends quietly, as
/// Unix tools do, instead of panicking on the failed write: Rust ignores SIGPIPE by default,
/// which the broker needs (a peer closing its socket must not kill it), a filter does not.
fn restore_default_sigpipe() {
    // SAFETY: setting a signal's disposition to the default, before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
