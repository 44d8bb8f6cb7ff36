//! Prints what the RDMA device can do, measured (see `fmx_verbs::probe`), as
//! a Markdown table framed by FMX-CAPS markers (the VM harness extracts it).
//! Exit status 1 when the device cannot be opened or connected to itself.

fn main() {
    match fmx_verbs::probe::run() {
        Ok((title, rows)) => {
            println!("FMX-CAPS-BEGIN");
            println!("Measured on {title}.\n");
            println!("| Capability | Result | What fmx uses |");
            println!("|---|---|---|");
            for r in rows {
                println!("| {} | {} | {} |", r.what, r.result, r.fmx);
            }
            println!("FMX-CAPS-END");
        }
        Err(e) => {
            eprintln!("fmx-verbs-probe: {e}");
            std::process::exit(1);
        }
    }
}
