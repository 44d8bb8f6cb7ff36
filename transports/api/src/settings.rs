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
    }
}
