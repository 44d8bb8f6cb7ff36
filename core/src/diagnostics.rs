//! What `fmx-info` reports: the transports of this build and what they find
//! on this host, the launcher fmx would use, and every setting in force.

pub use crate::select::{transport_report, TransportInfo};
pub use fmx_transport::settings;

/// The launcher this process was started by, as fmx would take it.
pub fn launcher() -> String {
    crate::bootstrap::describe_launcher()
}
