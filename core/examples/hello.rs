//! Every rank says hello, then the ranks sum their ranks: `fmxrun -n 4 target/release/examples/hello`.

fn main() -> Result<(), fmx::Error> {
    let fmx = fmx::init()?;
    let world = fmx.world();
    let mut sum = [0u64];
    world.allreduce(&[u64::from(world.rank())], &mut sum, fmx::Op::Sum)?;
    println!("hello from rank {} of {} over {}; sum of ranks = {}", world.rank(), world.size(), world.transport_name(), sum[0]);
    fmx.finalize()
}
