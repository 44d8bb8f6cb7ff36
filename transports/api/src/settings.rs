//! Numeric settings from the environment (`FMX_POOL_SLOTS` and the like),
//! with errors that name the variable and its value.

use crate::TransportError;

fn invalid(var: &str, value: &str, why: &str) -> TransportError {
    TransportError::Setup { what: format!("{var}={value:?} {why}"), source: std::io::Error::from(std::io::ErrorKind::InvalidInput) }
}

/// The value of `var` as a number; `None` when unset.
pub fn env_number(var: &str) -> Result<Option<usize>, TransportError> {
    match std::env::var(var) {
        Err(_) => Ok(None),
        Ok(v) => v.trim().parse::<usize>().map(Some).map_err(|_| invalid(var, &v, "is not a non-negative integer")),
    }
}

/// Like [`env_number`], within `min..=max` (an error names the variable, its
/// value and the range: a value that would wrap a 32-bit field, or ask for
/// more memory than any host has, never goes through).
pub fn env_in(var: &str, min: usize, max: usize) -> Result<Option<usize>, TransportError> {
    match env_number(var)? {
        Some(v) if v < min || v > max => Err(invalid(var, &v.to_string(), &format!("is out of range: allowed {min} to {max}"))),
        v => Ok(v),
    }
}

/// The eager and credit settings every transport reads, with their ranges.
pub mod limits {
    /// `FMX_POOL_SLOTS` (and `FMX_SHM_POOL_SLOTS`): eager slots per process.
    pub const POOL_SLOTS: (usize, usize) = (1, 1 << 20);
    /// `FMX_SLOT_BYTES` (and `FMX_SHM_SLOT_BYTES`): bytes per slot, header included.
    pub const SLOT_BYTES: (usize, usize) = (crate::HEADER_BYTES + 8, 64 << 20);
    /// `FMX_NEWCOMER_CREDITS`.
    pub const NEWCOMER_CREDITS: (usize, usize) = (1, 1 << 16);
    /// `FMX_CREDIT_THRESHOLD`.
    pub const CREDIT_THRESHOLD: (usize, usize) = (1, 1 << 20);
}

/// [`env_in`] with one of the [`limits`].
pub fn env_limited(var: &str, (min, max): (usize, usize)) -> Result<Option<usize>, TransportError> {
    env_in(var, min, max)
}

/// Like [`env_number`], and 0 is refused.
pub fn env_positive(var: &str) -> Result<Option<usize>, TransportError> {
    match env_number(var)? {
        Some(0) => Err(invalid(var, "0", "must be positive")),
        v => Ok(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_variable() {
        let e = env_number("PATH").unwrap_err().to_string();
        assert!(e.starts_with("PATH=") && e.contains("not a non-negative integer"), "{e}");
        assert_eq!(env_number("FMX_SURELY_UNSET_VARIABLE").unwrap(), None);
        std::env::set_var("FMX_TEST_RANGE_4294967360", "4294967360");
        let e = env_limited("FMX_TEST_RANGE_4294967360", limits::POOL_SLOTS).unwrap_err().to_string();
        assert!(e.contains("FMX_TEST_RANGE_4294967360=\"4294967360\" is out of range: allowed 1 to 1048576"), "{e}");
        std::env::set_var("FMX_TEST_RANGE_MAX", u64::MAX.to_string());
        let e = env_limited("FMX_TEST_RANGE_MAX", limits::SLOT_BYTES).unwrap_err().to_string();
        assert!(e.contains("out of range") && e.contains("67108864"), "{e}");
    }
}
