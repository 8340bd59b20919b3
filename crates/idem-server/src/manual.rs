//! `idem completions SHELL` and `idem man`: the shell completions and the
//! manual pages, made from the same definitions as `--help`, so they never
//! fall behind the binary.

use std::path::{Path, PathBuf};

use clap::{Args, CommandFactory};
use clap_complete::Shell;

use crate::run::Failure;

/// `idem completions`.
#[derive(Args, Debug)]
#[command(
    after_long_help = "Install, e.g.: idem completions bash > /etc/bash_completion.d/idem; \
    idem completions zsh > \"${fpath[1]}/_idem\"; \
    idem completions fish > ~/.config/fish/completions/idem.fish"
)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// `idem man`.
#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write `idem.1` and one page per command (`idem-serve.1`, …) into
    /// this directory [default: print `idem.1` to stdout].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Prints the completion script for `args.shell`.
pub fn completions(args: CompletionsArgs) -> Result<(), Failure> {
    let mut cmd = crate::Cli::command();
    clap_complete::generate(args.shell, &mut cmd, "idem", &mut std::io::stdout());
    Ok(())
}

/// Prints `idem.1`, or writes every page into `args.dir`.
pub fn man(args: ManArgs) -> Result<(), Failure> {
    let mut cmd = crate::Cli::command();
    // Names each subcommand's page `idem-NAME`.
    cmd.build();
    match args.dir {
        None => clap_mangen::Man::new(cmd)
            .render(&mut std::io::stdout())
            .map_err(|e| Failure::Run(format!("writing the manual page: {e}"))),
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .map_err(|e| Failure::Run(format!("cannot create {}: {e}", dir.display())))?;
            let written = pages(&cmd, &dir)?;
            println!("wrote {written} manual pages into {}", dir.display());
            Ok(())
        }
    }
}

/// Writes `cmd`'s page and its subcommands' into `dir`; answers how many.
fn pages(cmd: &clap::Command, dir: &Path) -> Result<usize, Failure> {
    let name = cmd.get_display_name().unwrap_or(cmd.get_name());
    let path = dir.join(format!("{name}.1"));
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut page)
        .and_then(|()| std::fs::write(&path, page))
        .map_err(|e| Failure::Run(format!("writing {}: {e}", path.display())))?;
    let mut written = 1;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        written += pages(sub, dir)?;
    }
    Ok(written)
}
