//! Choosing the device, port and GID: automatic, or by `FMX_VERBS_DEVICE`,
//! `FMX_VERBS_PORT` and `FMX_VERBS_GID_INDEX`.

use std::sync::Arc;

use fmx_transport::TransportError;

use crate::sys::{device_names, ffi, Context};

/// The device, port and addressing this process uses.
pub struct Chosen {
    pub(crate) ctx: Arc<Context>,
    pub(crate) attr: ffi::ibv_device_attr,
    pub(crate) port: u8,
    pub(crate) port_attr: ffi::ibv_port_attr,
    pub(crate) gid_index: u8,
    pub(crate) gid: [u8; 16],
    /// RoCE: addressed by GID (global route header); InfiniBand: by LID.
    pub(crate) global: bool,
}

impl Chosen {
    /// The device name.
    pub fn device(&self) -> &str {
        &self.ctx.name
    }

    /// The port number.
    pub fn port(&self) -> u8 {
        self.port
    }

    /// "Ethernet" (RoCE) or "InfiniBand".
    pub fn link_layer(&self) -> &'static str {
        if self.port_attr.link_layer == ffi::IBV_LINK_LAYER_ETHERNET as u8 {
            "Ethernet"
        } else {
            "InfiniBand"
        }
    }

    /// The GID index used (meaningful on RoCE).
    pub fn gid_index(&self) -> u8 {
        self.gid_index
    }
}

fn setup_err(what: String) -> TransportError {
    TransportError::Setup { what, source: std::io::Error::from(std::io::ErrorKind::NotFound) }
}

fn io_err(e: std::io::Error) -> TransportError {
    TransportError::Setup { what: "verbs device".into(), source: e }
}

fn env_num<T: std::str::FromStr>(var: &str) -> Result<Option<T>, TransportError> {
    match fmx_transport::settings::var(var) {
        None => Ok(None),
        Some(v) => v.trim().parse().map(Some).map_err(|_| TransportError::Setup {
            what: format!("{var}={v:?} is not a number"),
            source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        }),
    }
}

/// The device named for `rank` by `FMX_VERBS_DEVICE` (a comma-separated list:
/// rank r takes entry r mod length, so ranks can alternate between devices).
pub fn device_for_rank(rank: u32) -> Option<String> {
    let v = fmx_transport::settings::var("FMX_VERBS_DEVICE")?;
    let list: Vec<&str> = v.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    (!list.is_empty()).then(|| list[rank as usize % list.len()].to_owned())
}

fn active_port(ctx: &Context, ports: u8) -> Option<(u8, ffi::ibv_port_attr)> {
    (1..=ports).find_map(|p| ctx.query_port(p).ok().filter(|a| a.state == ffi::ibv_port_state::IBV_PORT_ACTIVE).map(|a| (p, a)))
}

/// The GID type the kernel reports for an index ("RoCE v2", "IB/RoCE v1").
pub(crate) fn gid_type(dev: &str, port: u8, index: i32) -> Option<String> {
    std::fs::read_to_string(format!("/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/types/{index}")).ok().map(|s| s.trim().to_owned())
}

/// On RoCE: the first RoCE v2 GID, preferring an IPv4-mapped one (routable
/// like the interface's address) over a link-local one.
fn pick_gid(ctx: &Context, port: u8, len: i32) -> Option<(u8, [u8; 16])> {
    let mut best: Option<(u8, [u8; 16], u8)> = None;
    for i in 0..len.min(256) {
        let Ok(gid) = ctx.query_gid(port, i) else { continue };
        if gid == [0; 16] {
            continue;
        }
        let rank = match gid_type(&ctx.name, port, i).as_deref() {
            Some("RoCE v2") if gid[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] => 0,
            Some("RoCE v2") => 1,
            None => 2, // no sysfs: take what the device lists
            Some(_) => 3,
        };
        if best.is_none_or(|b| rank < b.2) {
            best = Some((i as u8, gid, rank));
        }
    }
    best.map(|(i, g, _)| (i, g))
}

/// Opens the device for `rank`.
pub fn choose(rank: u32) -> Result<Chosen, TransportError> {
    // ENOSYS: the kernel has no uverbs at all; the help says what to load.
    let names = device_names().map_err(|e| setup_err(format!("ibv_get_device_list: {e}; {}", crate::info::no_device_help())))?;
    if names.is_empty() {
        return Err(setup_err(crate::info::no_device_help()));
    }
    let port_env: Option<u8> = env_num("FMX_VERBS_PORT")?;
    let (ctx, port, port_attr) = match device_for_rank(rank) {
        Some(name) => {
            if !names.contains(&name) {
                return Err(setup_err(format!("FMX_VERBS_DEVICE names {name:?}, but the devices are {}", names.join(", "))));
            }
            let ctx = Context::open(&name).map_err(io_err)?;
            let ports = ctx.query_device().map_err(io_err)?.phys_port_cnt;
            let (port, attr) = match port_env {
                Some(p) => (p, ctx.query_port(p).map_err(io_err)?),
                None => active_port(&ctx, ports).ok_or_else(|| setup_err(format!("device {name} has no active port")))?,
            };
            (ctx, port, attr)
        }
        None => {
            let mut found = None;
            for name in &names {
                let Ok(ctx) = Context::open(name) else { continue };
                let Ok(dev) = ctx.query_device() else { continue };
                let hit = match port_env {
                    Some(p) => ctx.query_port(p).ok().filter(|a| a.state == ffi::ibv_port_state::IBV_PORT_ACTIVE).map(|a| (p, a)),
                    None => active_port(&ctx, dev.phys_port_cnt),
                };
                if let Some((p, a)) = hit {
                    found = Some((ctx, p, a));
                    break;
                }
            }
            found.ok_or_else(|| setup_err(format!("no RDMA device with an active port among {}", names.join(", "))))?
        }
    };
    let attr = ctx.query_device().map_err(io_err)?;
    let ethernet = port_attr.link_layer == ffi::IBV_LINK_LAYER_ETHERNET as u8;
    let (gid_index, gid) = match env_num::<u8>("FMX_VERBS_GID_INDEX")? {
        Some(i) => (i, ctx.query_gid(port, i32::from(i)).map_err(io_err)?),
        None if ethernet => pick_gid(&ctx, port, port_attr.gid_tbl_len)
            .ok_or_else(|| setup_err(format!("device {} port {port} has no usable RoCE GID (is the interface up?)", ctx.name)))?,
        None => (0, ctx.query_gid(port, 0).unwrap_or([0; 16])),
    };
    // RoCE needs the GRH; on InfiniBand the LID routes within the subnet.
    let global = ethernet || port_attr.lid == 0;
    Ok(Chosen { ctx, attr, port, port_attr, gid_index, gid, global })
}
