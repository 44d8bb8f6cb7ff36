//! When to reconfigure, and to how many ranks.

use std::path::PathBuf;

use crate::comm::Comm;
use crate::error::{Error, Result};

/// A reconfiguration policy for [`super::Malleable::check`]. Each world counts
/// its own checks; "every `k`" means at its `k`-th check (a new world starts
/// counting again from zero).
#[derive(Clone, Debug)]
pub enum Policy {
    /// Never reconfigure.
    Never,
    /// World number `i` (0 = the first) moves to `sizes[i]` at its `every`-th
    /// check; after the last size the job stays where it is.
    Schedule {
        /// The sizes, in order.
        sizes: Vec<u32>,
        /// Checks per world before it reconfigures.
        every: u64,
    },
    /// At its `every`-th check a world grows by `step` ranks until `max`,
    /// then shrinks by `step` until `min`, and so on (a world that grew from
    /// its parent keeps growing; one that shrank keeps shrinking).
    Step {
        /// Ranks added or removed at a time.
        step: u32,
        /// Smallest world.
        min: u32,
        /// Largest world.
        max: u32,
        /// Checks per world before it reconfigures.
        every: u64,
    },
    /// An external request, looked at every `every` checks: a file holding a
    /// size (`4`) or a change (`+1`, `-2`), taken (removed) when read. `None`
    /// means the file fmxrun names in `FMX_RECONFIG_REQUEST`, into which it
    /// relays `SIGUSR1` as `+1` and `SIGUSR2` as `-1`.
    External {
        /// The request file.
        file: Option<PathBuf>,
        /// Checks between looks (at least 1).
        every: u64,
    },
}

/// The facts a decision is made from.
pub(crate) struct Moment {
    /// This world's size.
    pub(crate) size: u32,
    /// The parent world's size, if this world was spawned.
    pub(crate) parent: Option<u32>,
    /// Reconfigurations before this world.
    pub(crate) generation: u32,
    /// Checks in this world so far, this one included.
    pub(crate) checks: u64,
}

impl Policy {
    /// The new size, if this check reconfigures (collective over `world`
    /// for an external request; the others need no communication).
    pub(crate) fn decide(&self, at: &Moment, world: &Comm) -> Result<Option<u32>> {
        match self {
            Self::Never => Ok(None),
            Self::Schedule { sizes, every } => Ok(sizes.get(at.generation as usize).copied().filter(|_| at.checks == (*every).max(1))),
            Self::Step { step, min, max, every } => {
                // Checked at every call, so a bad policy fails at once.
                let next = step_size(*step, *min, *max, at)?;
                Ok(next.filter(|_| at.checks == (*every).max(1)))
            }
            Self::External { file, every } => {
                if at.checks % (*every).max(1) != 0 {
                    return Ok(None);
                }
                external(file.as_ref(), at.size, world)
            }
        }
    }
}

/// The step policy's next size (`None` when `min == max`).
fn step_size(step: u32, min: u32, max: u32, at: &Moment) -> Result<Option<u32>> {
    if step == 0 || min > max || min == 0 {
        return Err(Error::Reconfig(format!("Policy::Step needs step > 0 and 0 < min <= max (step {step}, min {min}, max {max})")));
    }
    // A world that grew from its parent (or the first world) keeps growing.
    let growing = at.parent.is_none_or(|p| p <= at.size);
    let up = at.size.checked_add(step).filter(|s| *s <= max);
    let down = at.size.checked_sub(step).filter(|s| *s >= min);
    Ok(if growing { up.or(down) } else { down.or(up) })
}

/// Rank 0 takes the request and tells the others: 0 = none, u32::MAX = bad request.
fn external(file: Option<&PathBuf>, size: u32, world: &Comm) -> Result<Option<u32>> {
    let path = match file {
        Some(f) => f.clone(),
        None => match std::env::var_os(crate::ENV_RECONFIG_REQUEST) {
            Some(p) => PathBuf::from(p),
            None => return Ok(None),
        },
    };
    let mut answer = [0u32];
    let mut problem = None;
    if world.rank() == 0 {
        match take_request(&path, size) {
            Ok(v) => answer[0] = v.unwrap_or(0),
            Err(e) => {
                answer[0] = u32::MAX;
                problem = Some(e);
            }
        }
    }
    world.bcast(&mut answer, 0)?;
    match answer[0] {
        0 => Ok(None),
        u32::MAX => {
            Err(problem.unwrap_or_else(|| Error::Reconfig(format!("rank 0 rejected the reconfiguration request in {}", path.display()))))
        }
        m => Ok(Some(m)),
    }
}

/// Reads and removes the request file (a rename first, so a request written
/// meanwhile is not lost with it).
fn take_request(path: &std::path::Path, size: u32) -> Result<Option<u32>> {
    let taken = path.with_extension("taken");
    if std::fs::rename(path, &taken).is_err() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&taken).unwrap_or_default();
    let _ = std::fs::remove_file(&taken);
    let t = text.trim();
    let bad = || Error::Reconfig(format!("request {t:?} in {}: expected a size (4) or a change (+1, -2)", path.display()));
    let new = if let Some(d) = t.strip_prefix('+') {
        size.checked_add(d.parse().map_err(|_| bad())?)
    } else if let Some(d) = t.strip_prefix('-') {
        size.checked_sub(d.parse().map_err(|_| bad())?)
    } else {
        Some(t.parse().map_err(|_| bad())?)
    };
    match new {
        Some(m) if m > 0 && m < u32::MAX => Ok(Some(m)),
        _ => Err(Error::Reconfig(format!("request {t:?} in {} would leave a world of {size} with no ranks", path.display()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(size: u32, parent: Option<u32>) -> Moment {
        Moment { size, parent, generation: 0, checks: 1 }
    }

    #[test]
    fn step_grows_to_max_then_shrinks_to_min() {
        let next = |size, parent| step_size(2, 1, 5, &at(size, parent)).unwrap();
        assert_eq!(next(1, None), Some(3));
        assert_eq!(next(3, Some(1)), Some(5));
        assert_eq!(next(5, Some(3)), Some(3), "at max it turns");
        assert_eq!(next(3, Some(5)), Some(1));
        assert_eq!(next(1, Some(3)), Some(3), "at min it turns");
        assert_eq!(step_size(1, 4, 4, &at(4, None)).unwrap(), None, "min == max: nowhere to go");
        for (step, min, max) in [(0, 1, 4), (1, 0, 4), (1, 5, 4)] {
            let e = step_size(step, min, max, &at(2, None)).unwrap_err().to_string();
            assert!(e.contains(&format!("step {step}, min {min}, max {max}")), "{e}");
        }
    }

    #[test]
    fn requests_are_sizes_or_changes_and_are_taken() {
        let dir = std::env::temp_dir().join(format!("fmx-policy-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("req");
        let take = |text: &str, size| {
            std::fs::write(&f, text).unwrap();
            let r = take_request(&f, size);
            assert!(!f.exists() && !f.with_extension("taken").exists(), "the request is consumed");
            r
        };
        assert_eq!(take("4\n", 2).unwrap(), Some(4));
        assert_eq!(take("+1", 2).unwrap(), Some(3));
        assert_eq!(take("-2", 3).unwrap(), Some(1));
        assert!(take("-3", 3).unwrap_err().to_string().contains("no ranks"));
        assert!(take("0", 3).unwrap_err().to_string().contains("no ranks"));
        let e = take("four", 3).unwrap_err().to_string();
        assert!(e.contains("\"four\"") && e.contains("expected a size"), "{e}");
        assert_eq!(take_request(&f, 3).unwrap(), None, "no file, no request");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
