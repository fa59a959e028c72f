//! `ncclean completions SHELL`: generated from the clap definitions, so every
//! subcommand is completed, and bash accepts the script.

mod common;

use std::process::Command;

use clap::CommandFactory;
use common::{ncclean, ok};

/// The subcommands a user sees in `ncclean --help`.
fn subcommands() -> Vec<String> {
    ncclean::cli::Cli::command()
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| s.get_name().to_string())
        .collect()
}

/// What bash's completion offers for `ncclean WORD<TAB>` with the script
/// loaded, one candidate a line.
fn bash_offers(script: &std::path::Path, word: &str) -> String {
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source '{}' || exit 9; COMP_WORDS=(ncclean '{word}'); COMP_CWORD=1; \
             COMP_LINE='ncclean {word}'; COMP_POINT=${{#COMP_LINE}}; \
             _ncclean ncclean '{word}' ncclean; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bash could not load or run the script: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn bash_completion_names_every_subcommand() {
    let script = ok(&["completions", "bash"]);
    let names = subcommands();
    assert!(names.len() >= 10, "{names:?}");
    assert!(
        script.contains("complete -F _ncclean"),
        "not a bash completion script"
    );
    if Command::new("bash").arg("--version").output().is_err() {
        eprintln!("skipped running the script: bash not on PATH");
        for name in &names {
            assert!(
                script.contains(name.as_str()),
                "bash completion lacks {name}"
            );
        }
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("ncclean.bash");
    std::fs::write(&file, &script).unwrap();
    // `ncclean <TAB>` offers every subcommand...
    let offered = bash_offers(&file, "");
    for name in &names {
        assert!(
            offered.lines().any(|l| l == name),
            "`ncclean <TAB>` does not offer {name}: {offered:?}"
        );
    }
    // ... and `ncclean f<TAB>` just those starting with f.
    let offered = bash_offers(&file, "f");
    let mut got: Vec<&str> = offered.lines().collect();
    got.sort_unstable();
    assert_eq!(got, ["filter", "fit"], "`ncclean f<TAB>`");
}

#[test]
fn every_shell_gets_a_script_naming_the_subcommands() {
    for shell in ["zsh", "fish", "powershell", "elvish"] {
        let script = ok(&["completions", shell]);
        for name in subcommands() {
            assert!(script.contains(&name), "{shell} completion lacks {name}");
        }
    }
    let out = ncclean(&["completions", "tcsh"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}
