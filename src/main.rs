//! The `ncclean` binary: parse, run, map errors to exit codes.

use clap::Parser;

fn main() {
    let cli = ncclean::cli::Cli::parse();
    if let Err(e) = ncclean::cli::run(cli) {
        eprintln!("error: {e}");
        if let ncclean::Error::Other(inner) = &e {
            for cause in inner.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
        }
        std::process::exit(e.exit_code());
    }
}
