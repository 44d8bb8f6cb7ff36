//! `fmxrun -n N [OPTIONS] PROGRAM [ARGS...]`: starts N ranks of PROGRAM on
//! this host; see `fmxrun --help` and `fmx_launcher`.

use std::ffi::OsString;
use std::net::IpAddr;
use std::time::Duration;

use clap::Parser;

/// fmxrun's command line.
#[derive(Parser, Debug)]
#[command(
    name = "fmxrun",
    version,
    about = "Starts N ranks of an fmx program on this host and waits for them",
    after_help = "Options go before PROGRAM; everything after it is the program's. The exit code is the first \
        failing rank's (or 128 + its signal); 2 is a bad command line."
)]
struct Cli {
    /// Ranks to start (-np is read as -n, as mpiexec users write it)
    #[arg(short = 'n', value_name = "N", value_parser = ranks)]
    np: u32,
    /// The transport the ranks use: auto, shm, verbs, ofi, shm+verbs or shm+ofi
    #[arg(long, value_name = "NAME")]
    transport: Option<String>,
    /// The address fmxrun's bootstrap server listens on (default 127.0.0.1)
    #[arg(long, value_name = "ADDR")]
    bind: Option<IpAddr>,
    /// Prefix every output line with the rank that printed it
    #[arg(short = 'l', long)]
    label: bool,
    /// Seconds the other ranks get to exit after one fails, before they are killed
    #[arg(long, value_name = "SECS", default_value = "2", value_parser = seconds, allow_negative_numbers = true)]
    kill_grace: Duration,
    /// Kill the job after SECS
    #[arg(long, value_name = "SECS", value_parser = seconds, allow_negative_numbers = true)]
    timeout: Option<Duration>,
    /// Keep the other ranks running when one fails (for programs that handle failures)
    #[arg(long)]
    keep_going: bool,
    /// The program and its arguments
    #[arg(value_name = "PROGRAM [ARGS]", required = true, num_args = 1.., trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<OsString>,
}

fn ranks(v: &str) -> Result<u32, String> {
    let max = fmx_launcher::MAX_RANKS;
    v.parse::<u32>().ok().filter(|n| (1..=max).contains(n)).ok_or_else(|| format!("{v:?} is not a number of ranks from 1 to {max}"))
}

fn seconds(v: &str) -> Result<Duration, String> {
    let max = fmx_launcher::MAX_SECONDS;
    v.parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x >= 0.0 && *x <= max)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{v:?} is not a number of seconds from 0 to {max}"))
}

fn main() {
    // mpiexec's `-np N` is `-n N` here.
    let args = std::env::args_os().map(|a| if a == "-np" { OsString::from("-n") } else { a });
    let cli = Cli::parse_from(args);
    let (program, args) = cli.command.split_first().expect("clap requires PROGRAM");
    if program.to_string_lossy().starts_with('-') {
        // With hyphen values allowed for the program's own arguments, an
        // unknown fmxrun option lands here: say so, as clap would.
        eprintln!(
            "error: unexpected argument '{}' found (fmxrun's options go before PROGRAM)\n\nFor more information, try '--help'.",
            program.to_string_lossy()
        );
        std::process::exit(2);
    }
    let mut l = fmx_launcher::Launch::new(cli.np, program);
    l.args = args.to_vec();
    l.transport = cli.transport;
    l.label = cli.label;
    l.kill_grace = cli.kill_grace;
    l.timeout = cli.timeout;
    l.keep_going = cli.keep_going;
    if let Some(b) = cli.bind {
        l.bind = b;
    }
    match l.run() {
        Ok(o) => std::process::exit(o.code),
        Err(e) => {
            eprintln!("fmxrun: {e}");
            std::process::exit(1);
        }
    }
}
