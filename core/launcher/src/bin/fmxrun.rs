//! `fmxrun -n N [--transport NAME] [--bind ADDR] [-l|--label] [--kill-grace SECS] [--timeout SECS] [--keep-going] PROGRAM ARGS...`
//!
//! Starts N ranks of PROGRAM on this host; see `fmx_launcher`.

use std::ffi::OsString;
use std::time::Duration;

const USAGE: &str =
    "usage: fmxrun -n N [--transport auto|shm|verbs|ofi] [--bind ADDR] [-l|--label] [--kill-grace SECS] [--timeout SECS] [--keep-going] PROGRAM [ARGS...]";

fn parse(mut args: impl Iterator<Item = OsString>) -> Result<fmx_launcher::Launch, String> {
    let mut np = None;
    let mut transport = None;
    let mut label = false;
    let mut grace = Duration::from_secs(2);
    let mut timeout = None;
    let mut bind = None;
    let mut keep_going = false;
    let secs = |v: Option<OsString>, what: &str| -> Result<Duration, String> {
        let v = v.ok_or_else(|| format!("{what} needs a value"))?;
        let s = v.to_string_lossy();
        let max = fmx_launcher::MAX_SECONDS;
        s.parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x >= 0.0 && *x <= max)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| format!("{what}: {s:?} is not a number of seconds from 0 to {max}"))
    };
    while let Some(a) = args.next() {
        match a.to_str() {
            Some("-n" | "-np") => {
                let v = args.next().ok_or("-n needs a number")?;
                let max = fmx_launcher::MAX_RANKS;
                let n = v
                    .to_string_lossy()
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=max).contains(n))
                    .ok_or_else(|| format!("-n: {v:?} is not a number of ranks from 1 to {max}"))?;
                np = Some(n);
            }
            Some("--transport") => transport = Some(args.next().ok_or("--transport needs a name")?.to_string_lossy().into_owned()),
            Some("--bind") => {
                let v = args.next().ok_or("--bind needs an address")?;
                bind = Some(v.to_string_lossy().parse().map_err(|_| format!("--bind: {v:?} is not an IP address"))?);
            }
            Some("-l" | "--label") => label = true,
            Some("--keep-going") => keep_going = true,
            Some("--kill-grace") => grace = secs(args.next(), "--kill-grace")?,
            Some("--timeout") => timeout = Some(secs(args.next(), "--timeout")?),
            Some("-h" | "--help") => return Err(USAGE.into()),
            Some(s) if s.starts_with('-') => return Err(format!("unknown option {s}\n{USAGE}")),
            _ => {
                let np = np.ok_or_else(|| format!("-n N is required\n{USAGE}"))?;
                let mut l = fmx_launcher::Launch::new(np, a);
                l.args = args.collect();
                l.transport = transport;
                l.label = label;
                l.kill_grace = grace;
                l.timeout = timeout;
                l.keep_going = keep_going;
                if let Some(b) = bind {
                    l.bind = b;
                }
                return Ok(l);
            }
        }
    }
    Err(format!("no program given\n{USAGE}"))
}

fn main() {
    let launch = match parse(std::env::args_os().skip(1)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("fmxrun: {e}");
            std::process::exit(2);
        }
    };
    match launch.run() {
        Ok(o) => std::process::exit(o.code),
        Err(e) => {
            eprintln!("fmxrun: {e}");
            std::process::exit(1);
        }
    }
}
