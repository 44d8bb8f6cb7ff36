//! Only `init` and `finalize`: what `fmxrun` start-up time is measured with.

fn main() -> Result<(), fmx::Error> {
    fmx::init()?.finalize()
}
