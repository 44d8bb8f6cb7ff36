//! The perf library behind `fmx-perf` (kept apart from the CLI, like UCX's
//! libperf): parameters, the OSU-methodology measurement loops, results and
//! their OSU-column / JSON rendering, and the side-by-side comparisons with
//! MPI peers and fi_pingpong.

pub mod all;
pub mod check_cost;
pub mod cli;
pub mod compare;
pub mod compare_json;
pub mod compare_rate;
pub mod limits;
pub mod meta;
pub mod neighbor;
pub mod neighbor_compare;
pub mod ofi_compare;
pub mod osu;
pub mod pair;
pub mod params;
pub mod peers;
pub mod plot;
pub mod progress;
pub mod redistribute;
pub mod report;
pub mod scale_model;
pub mod set_up;
pub mod stats;
