//! Placeholder replaced below.
pub fn main(_args: &[String]) -> Result<(), String> {
    Err("not yet".into())
}
