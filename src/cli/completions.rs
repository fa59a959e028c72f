//! `ncclean completions SHELL`: a completion script generated from the clap
//! definitions, so it names every subcommand and flag of this build.

use clap::{Args, CommandFactory};
use clap_complete::Shell;

use crate::error::Result;
use crate::runtime::progress::Reporter;

/// Arguments of `ncclean completions`.
#[derive(Debug, Args)]
#[command(after_help = "Install, e.g.:
  bash: ncclean completions bash > ~/.local/share/bash-completion/completions/ncclean
  zsh:  ncclean completions zsh > ~/.zfunc/_ncclean   (with fpath+=~/.zfunc before compinit)
  fish: ncclean completions fish > ~/.config/fish/completions/ncclean.fish
  powershell: ncclean completions powershell >> $PROFILE")]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Print the script to stdout.
pub fn run(a: CompletionsArgs, _rep: &Reporter) -> Result<()> {
    let mut cmd = super::Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "ncclean", &mut script);
    crate::runtime::progress::write_stdout(&script)
}
