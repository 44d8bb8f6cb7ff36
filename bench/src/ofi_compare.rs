//! `fmx-perf ofi-compare`: fmx over libfabric beside `fi_pingpong` (from
//! Debian's libfabric-bin) on the same provider and domain, same sizes, one run.
//!
//! fi_pingpong is a ping-pong: its `usec/xfer` is the one-way time and its
//! `MB/sec` is `size / usec/xfer`; its clock includes connecting, which two
//! runs of different lengths cancel (see `pingpong`). fmx's figures are measured the same way
//! (fmx-perf latency: OSU one-way latency over registered buffers), so both
//! columns of a row mean the same thing; fmx's streaming bandwidth (fmx-perf
//! bw, a window of 16 messages) is printed as an extra row. Both sides are
//! pinned: fmx-perf pins its ranks, fi_pingpong runs under `taskset`.
//! With `--update-readme FILE` the table replaces the block between
//! `<!-- ofi-table:begin -->` and `<!-- ofi-table:end -->`.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::report::parse_osu;

/// Options of `fmx-perf ofi-compare`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The libfabric provider, for both sides
    #[arg(long, default_value = "tcp;ofi_rxm")]
    provider: String,
    /// The libfabric domain (an interface for tcp, a device for verbs); empty: the provider's choice
    #[arg(long, default_value = "lo")]
    domain: String,
    /// Where the fi_pingpong client finds its server (an address on the server's domain)
    #[arg(long, default_value = "127.0.0.1")]
    server: String,
    /// The sizes in the table (bytes; K and M suffixes)
    #[arg(long, value_name = "LIST", default_value = "8,1048576", value_parser = crate::cli::size_list)]
    sizes: std::vec::Vec<usize>,
    /// Latency iterations up to 8 KiB (a tenth above; bw a twentieth)
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(10..))]
    iters: u64,
    /// Interleaved runs of each side; the table shows medians
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    reps: u64,
    /// Replace the table between <!-- ofi-table:begin --> and <!-- ofi-table:end --> in FILE
    #[arg(long, value_name = "FILE")]
    update_readme: Option<std::path::PathBuf>,
}

impl Args {
    fn domain(&self) -> Option<&str> {
        Some(self.domain.as_str()).filter(|d| !d.is_empty())
    }
}

/// fmx-perf's OSU figure for one size over the ofi transport.
fn fmx(o: &Args, test: &str, size: usize) -> Result<f64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // bw a twentieth of the latency count; a tenth of that above 8 KiB (OSU's large sizes).
    let iters = if test == "latency" { o.iters as usize } else { o.iters as usize / 20 };
    let iters = if size > crate::params::LARGE_THRESHOLD { iters / 10 } else { iters }.max(10);
    let mut cmd = Command::new(exe);
    cmd.args([test, "--transport", "ofi", "--min-size", &size.to_string(), "--max-size", &size.to_string()])
        .args(if test == "bw" { &["--window", "16"][..] } else { &[] })
        .args(["--iters", &iters.to_string(), "--warmup", &(iters / 10).max(10).to_string()])
        .env("FMX_OFI_PROVIDER", &o.provider);
    match o.domain() {
        Some(d) => cmd.env("FMX_OFI_DOMAIN", d),
        None => cmd.env_remove("FMX_OFI_DOMAIN"),
    };
    let out = crate::peers::run(&mut cmd)?;
    parse_osu(&out).iter().find(|r| r.0 == size).map(|r| r.1).ok_or_else(|| format!("fmx-perf {test} printed no {size} B row:\n{out}"))
}

/// The domain of rank (or fi_pingpong side) `i`: `--domain a,b` gives rank 0 `a` and rank 1 `b`.
fn domain_of(o: &Args, i: usize) -> Option<&str> {
    let d = o.domain()?;
    let parts: Vec<&str> = d.split(',').collect();
    Some(parts[i % parts.len()])
}

/// fi_pingpong's steady-state (usec/xfer, MB/sec) for one size. Its clock
/// includes connecting (rxm connects on the first message: 100 iterations of
/// 8 B over tcp report 108 us/xfer, 10,000 report 5.4), so it runs twice, with
/// `iters` and `iters / 5`, and the fixed cost cancels in the difference.
fn pingpong(o: &Args, size: usize) -> Result<(f64, f64), String> {
    let (n2, n1) = (o.iters as usize, (o.iters as usize / 5).max(2));
    let u2 = pingpong_once(o, size, n2)?;
    let u1 = pingpong_once(o, size, n1)?;
    let lat = (u2 * n2 as f64 - u1 * n1 as f64) / (n2 - n1) as f64;
    // A negative or absurd difference (noise) falls back to the long run's figure.
    let lat = if lat > 0.0 && lat <= u2 { lat } else { u2 };
    Ok((lat, size as f64 / lat))
}

/// One fi_pingpong run of `iters` round trips: its usec/xfer. The server (like
/// fmx's rank 1) on core 1 and the second domain, the client on core 0 and the first.
fn pingpong_once(o: &Args, size: usize, iters: usize) -> Result<f64, String> {
    let side = |i: usize| {
        let mut c = Command::new("taskset");
        c.args(["-c", &i.to_string(), "fi_pingpong", "-p", &o.provider, "-e", "rdm", "-I", &iters.to_string(), "-S", &size.to_string()]);
        if let Some(d) = domain_of(o, i) {
            c.args(["-d", d]).env("FI_TCP_IFACE", d);
        }
        // What fmx sets for itself (rxm sizes its CQs by the universe; rxe refuses 256).
        if std::env::var_os("FI_UNIVERSE_SIZE").is_none() {
            c.env("FI_UNIVERSE_SIZE", "2");
        }
        c
    };
    let mut server = side(1).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().map_err(|e| format!("fi_pingpong server: {e}"))?;
    std::thread::sleep(Duration::from_secs(1));
    let client = crate::peers::run(side(0).arg(&o.server));
    let _ = server.kill();
    let server_err = server.wait_with_output().map(|o| String::from_utf8_lossy(&o.stderr).into_owned()).unwrap_or_default();
    let client = client.map_err(|e| format!("{e}\nfi_pingpong server said: {server_err}"))?;
    // bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
    client
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 7 && fabtests_size(f[0])? == size).then(|| f[6].parse().ok())?
        })
        .ok_or_else(|| format!("fi_pingpong printed no {size} B row:\n{client}"))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// "fi_info: 1.17.0\nlibfabric: 1.17.0\n..." -> "1.17.0".
fn libfabric_version() -> String {
    let out = crate::peers::run(Command::new("fi_info").arg("--version")).unwrap_or_default();
    out.lines().find_map(|l| l.strip_prefix("libfabric:")).unwrap_or("?").trim().to_owned()
}

/// A size as fabtests prints it: `8`, `4k`, `1m`, `2g` (powers of 1024).
fn fabtests_size(s: &str) -> Option<usize> {
    let (num, shift) = match s.as_bytes().last()? {
        b'k' => (&s[..s.len() - 1], 10),
        b'm' => (&s[..s.len() - 1], 20),
        b'g' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    num.parse::<usize>().ok().map(|n| n << shift)
}

/// Entry point of `fmx-perf ofi-compare`.
pub fn main(o: &Args) -> Result<(), String> {
    let mut rows = String::new();
    for &size in &o.sizes {
        // Interleaved runs, medians: a 2-core host drifts by 20% between back-to-back runs.
        let (mut lats, mut pps) = (Vec::new(), Vec::new());
        for _ in 0..o.reps {
            lats.push(fmx(o, "latency", size)?);
            pps.push(pingpong(o, size)?);
        }
        let lat = median(&mut lats);
        let pp_lat = median(&mut pps.iter().map(|p| p.0).collect::<Vec<_>>());
        let pp_bw = median(&mut pps.iter().map(|p| p.1).collect::<Vec<_>>());
        // Ratios above 1: fmx is better (peer time / fmx time; fmx rate / peer rate).
        rows.push_str(&format!("| one-way latency (us) | {size} B | {lat:.2} | {pp_lat:.2} | {:.2}x |\n", pp_lat / lat));
        if size >= 4096 {
            let fmx_pp_bw = size as f64 / lat;
            rows.push_str(&format!(
                "| ping-pong bandwidth (MB/s) | {size} B | {fmx_pp_bw:.1} | {pp_bw:.1} | {:.2}x |\n",
                fmx_pp_bw / pp_bw
            ));
            let bw = median(&mut (0..o.reps).map(|_| fmx(o, "bw", size)).collect::<Result<Vec<_>, _>>()?);
            rows.push_str(&format!("| streaming bandwidth (MB/s), fmx-perf bw | {size} B | {bw:.1} | {pp_bw:.1} | {:.2}x |\n", bw / pp_bw));
        }
    }
    let dom = o.domain().map_or(String::new(), |d| format!(", domain {d}"));
    let text = format!(
        "Provider {}{dom}, libfabric {}; medians of {} interleaved runs per side.\n\n| test | size | fmx (ofi) | fi_pingpong | fmx vs fi_pingpong |\n|---|---:|---:|---:|---:|\n{rows}\n\
         Ratios above 1 mean fmx is better.\n",
        o.provider,
        libfabric_version(),
        o.reps
    );
    print!("{text}");
    if let Some(path) = &o.update_readme {
        crate::report::update_readme(&path, "ofi-table", &text)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn fabtests_sizes_parse() {
        assert_eq!(super::fabtests_size("8"), Some(8));
        assert_eq!(super::fabtests_size("1m"), Some(1 << 20));
        assert_eq!(super::fabtests_size("64k"), Some(64 << 10));
        assert_eq!(super::fabtests_size("x"), None);
    }
}
