//! The `ncclean` binary: parse, run, map errors to exit codes.

fn main() {
    // candle attaches a captured backtrace to its errors' Display whenever
    // RUST_BACKTRACE is set in the environment, and it would reach users as
    // 40-odd lines of frames. Errors here are messages: drop the variables
    // before any thread starts (developers keep them with NCCLEAN_BACKTRACE=1).
    if std::env::var_os("NCCLEAN_BACKTRACE").is_none() {
        std::env::remove_var("RUST_BACKTRACE");
        std::env::remove_var("RUST_LIB_BACKTRACE");
    }
    ncclean::runtime::threads::configure();
    let cli = ncclean::cli::Cli::parse_args();
    ncclean::runtime::interrupt::install();
    if let Err(e) = ncclean::cli::run(cli) {
        ncclean::runtime::progress::report_error(&e);
        std::process::exit(e.exit_code());
    }
}
