//! Settings from the environment (`FMX_POOL_SLOTS` and the like): every
//! variable is declared once in [`registry`], read through [`var`] (which
//! also takes its old names, with a one-time warning), and numbers come
//! with errors that name the variable and its value.

pub mod registry;

use std::collections::BTreeSet;
use std::sync::Mutex;

use crate::TransportError;

pub use registry::{Kind, Scope, Setting, SETTINGS};

/// Where a setting's value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// Unset: the default holds.
    Default,
    /// The environment, under its name.
    Env,
    /// The environment, under this old name.
    OldName(&'static str),
}

/// The value of declared setting `name` and where it came from. Empty
/// values count as unset, as every reader has always taken them.
pub fn lookup(name: &str) -> (Option<String>, Source) {
    let Some(s) = registry::find(name) else {
        debug_assert!(false, "{name} is read but not declared in fmx_transport::settings::registry");
        return (std::env::var(name).ok().filter(|v| !v.is_empty()), Source::Env);
    };
    if let Some(v) = std::env::var(s.name).ok().filter(|v| !v.is_empty()) {
        return (Some(v), Source::Env);
    }
    for &old in s.old_names {
        if let Some(v) = std::env::var(old).ok().filter(|v| !v.is_empty()) {
            return (Some(v), Source::OldName(old));
        }
    }
    (None, Source::Default)
}

/// The value of declared setting `name` (an old name still works, and says
/// so once per process on stderr).
pub fn var(name: &str) -> Option<String> {
    let (v, src) = lookup(name);
    if let Source::OldName(old) = src {
        static WARNED: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
        if WARNED.lock().map(|mut w| w.insert(old)).unwrap_or(false) {
            eprintln!("fmx: {old} is the old name of {name}; it still works, but set {name} instead");
        }
    }
    v
}

/// Whether declared setting `name` is set (to anything but the empty string).
pub fn is_set(name: &str) -> bool {
    var(name).is_some()
}

fn invalid(var: &str, value: &str, why: &str) -> TransportError {
    TransportError::Setup { what: format!("{var}={value:?} {why}"), source: std::io::Error::from(std::io::ErrorKind::InvalidInput) }
}

/// The value of `var` as a number; `None` when unset.
pub fn env_number(name: &str) -> Result<Option<usize>, TransportError> {
    match var(name) {
        None => Ok(None),
        Some(v) => v.trim().parse::<usize>().map(Some).map_err(|_| invalid(name, &v, "is not a non-negative integer")),
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

/// When a network transport connects to its peers (`FMX_CONNECT`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConnectMode {
    /// At the first message between two ranks (either way): queue pairs,
    /// connections and credits grow with the peers a process talks to (the default).
    #[default]
    Lazy,
    /// To every peer during init.
    Eager,
}

impl ConnectMode {
    /// `FMX_CONNECT`; `None` when unset (each transport has its default).
    pub fn from_env() -> Result<Option<Self>, TransportError> {
        match var("FMX_CONNECT").as_deref().map(str::trim) {
            None => Ok(None),
            Some("lazy") => Ok(Some(Self::Lazy)),
            Some("eager") => Ok(Some(Self::Eager)),
            Some(other) => Err(invalid("FMX_CONNECT", other, "is not a connection mode: use lazy or eager")),
        }
    }

    /// How `FMX_CONNECT` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Lazy => "lazy",
            Self::Eager => "eager",
        }
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
    /// `FMX_CONNECTION_SLOTS`: eager slots granted a connection made on demand.
    pub const CONNECTION_SLOTS: (usize, usize) = (1, 1 << 16);
    /// `FMX_SPIN_POLLS`: empty polls before a wait yields the core.
    pub const SPIN_POLLS: (usize, usize) = (1, 1 << 30);
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

    // One test touches the environment, so that no other test sees it half-set.
    #[test]
    fn errors_name_the_variable_and_old_names_still_work() {
        std::env::set_var("FMX_SHM_DIR", "not a number");
        let e = env_number("FMX_SHM_DIR").unwrap_err().to_string();
        assert!(e.starts_with("FMX_SHM_DIR=") && e.contains("not a non-negative integer"), "{e}");
        std::env::remove_var("FMX_SHM_DIR");
        assert_eq!(env_number("FMX_SHM_DIR").unwrap(), None);
        std::env::set_var("FMX_OFI_CTRL_SLOTS", "4294967360");
        let e = env_limited("FMX_OFI_CTRL_SLOTS", limits::POOL_SLOTS).unwrap_err().to_string();
        assert!(e.contains("FMX_OFI_CTRL_SLOTS=\"4294967360\" is out of range: allowed 1 to 1048576"), "{e}");
        std::env::set_var("FMX_OFI_CTRL_SLOTS", u64::MAX.to_string());
        let e = env_limited("FMX_OFI_CTRL_SLOTS", limits::SLOT_BYTES).unwrap_err().to_string();
        assert!(e.contains("out of range") && e.contains("67108864"), "{e}");
        std::env::remove_var("FMX_OFI_CTRL_SLOTS");
        // An old name is read (and the new one wins when both are set).
        std::env::set_var("FMX_VERBS_TIMEOUT", "17");
        assert_eq!(lookup("FMX_VERBS_ACK_TIMEOUT_EXP"), (Some("17".into()), Source::OldName("FMX_VERBS_TIMEOUT")));
        assert_eq!(env_number("FMX_VERBS_ACK_TIMEOUT_EXP").unwrap(), Some(17));
        std::env::set_var("FMX_VERBS_ACK_TIMEOUT_EXP", "18");
        assert_eq!(lookup("FMX_VERBS_ACK_TIMEOUT_EXP"), (Some("18".into()), Source::Env));
        std::env::remove_var("FMX_VERBS_TIMEOUT");
        std::env::remove_var("FMX_VERBS_ACK_TIMEOUT_EXP");
        assert_eq!(lookup("FMX_VERBS_ACK_TIMEOUT_EXP"), (None, Source::Default));
    }

    #[test]
    fn every_setting_is_declared_once_under_the_naming_scheme() {
        let mut names: Vec<&str> = SETTINGS.iter().flat_map(|s| std::iter::once(s.name).chain(s.old_names.iter().copied())).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a name is declared twice");
        for s in SETTINGS {
            assert!(
                s.name.starts_with("FMX_") && s.name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'),
                "{}",
                s.name
            );
            let prefix = match s.scope {
                Scope::Shm => Some("FMX_SHM_"),
                Scope::Verbs => Some("FMX_VERBS_"),
                Scope::Ofi => Some("FMX_OFI_"),
                _ => None,
            };
            assert!(prefix.is_none_or(|p| s.name.starts_with(p)), "{} is a {:?} setting without its prefix", s.name, s.scope);
            if s.kind == Kind::Bytes {
                assert!(s.name.ends_with("_BYTES"), "{} counts bytes but does not end in _BYTES", s.name);
            }
            if s.kind == Kind::Seconds {
                assert!(s.name.ends_with("_TIMEOUT"), "{} is in seconds but does not end in _TIMEOUT", s.name);
            }
        }
    }
}
