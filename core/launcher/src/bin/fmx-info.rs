//! `fmx-info`: what this build of fmx has and finds here, in the spirit of
//! `ucx_info` and `fi_info`: the transports and what each finds (RDMA
//! devices, ports and GIDs; libfabric providers), the launcher fmx would
//! use, and every `FMX_*` setting in force with where its value came from.

use std::fmt::Write as _;
use std::io::Write as _;

use clap::Parser;
use fmx::diagnostics::{launcher, settings, transport_report};
use settings::{Scope, Source};

/// fmx-info's command line.
#[derive(Parser, Debug)]
#[command(name = "fmx-info", version, about = "What this build of fmx has, what it finds on this host, and the settings in force")]
struct Cli {
    /// Only the settings (ucx_info -c)
    #[arg(short = 'c', long)]
    settings: bool,
    /// Also the variables fmxrun sets for its ranks
    #[arg(short = 'a', long)]
    all: bool,
}

fn main() {
    let cli = Cli::parse();
    let mut out = String::new();
    report(&cli, &mut out).expect("formatting into a String");
    // A closed pipe (fmx-info | head) ends the output quietly.
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
}

fn report(cli: &Cli, o: &mut String) -> std::fmt::Result {
    if !cli.settings {
        writeln!(o, "# fmx {}", env!("CARGO_PKG_VERSION"))?;
        writeln!(o, "#\n# Transports")?;
        for t in transport_report() {
            if !t.built {
                writeln!(o, "{:<6} not in this build: add {}", t.name, t.how_to_build)?;
                continue;
            }
            match &t.found {
                Some(Ok(lines)) if !lines.is_empty() => {
                    writeln!(o, "{:<6} built; found:", t.name)?;
                    for l in lines {
                        writeln!(o, "         {l}")?;
                    }
                }
                Some(Ok(_)) => writeln!(o, "{:<6} built; found nothing to use", t.name)?,
                Some(Err(e)) => writeln!(o, "{:<6} built; not usable here: {e}", t.name)?,
                None => writeln!(o, "{:<6} built", t.name)?,
            }
        }
        writeln!(o, "#\n# Launcher\n{}", launcher())?;
        writeln!(o, "#\n# Settings (FMX_*: value, and where it came from)")?;
    }
    for s in settings::SETTINGS.iter().filter(|s| cli.all || s.scope != Scope::Launcher) {
        let (value, source) = settings::lookup(s.name);
        let (value, from) = match (value, source) {
            (Some(v), Source::OldName(old)) => (v, format!("environment, under the old name {old}")),
            (Some(v), _) => (v, "environment".to_owned()),
            (None, _) => (s.default.to_owned(), "default".to_owned()),
        };
        writeln!(o, "{:<26} = {value:<28} # {} ({}): {}", s.name, from, s.scope.name(), s.doc)?;
    }
    Ok(())
}
