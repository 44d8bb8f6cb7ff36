//! What `fmx-info` shows of verbs: each device, its ports and GIDs; where
//! there is none, which kernel modules are missing and how to get a
//! Soft-RoCE device.

use crate::sys::{device_names, ffi, Context};

/// Provider modules of the RDMA devices fmx has met or expects.
const PROVIDERS: &[&str] = &["mlx5_ib", "mlx4_ib", "rdma_rxe", "siw", "irdma", "efa", "bnxt_re", "hfi1", "qedr", "erdma"];

fn loaded(module: &str) -> bool {
    std::path::Path::new("/sys/module").join(module).exists()
}

/// Why libibverbs lists no device, and what to do: the modules loaded and
/// the commands that make a Soft-RoCE device.
pub fn no_device_help() -> String {
    let uverbs = if loaded("ib_uverbs") { "ib_uverbs is loaded" } else { "ib_uverbs is not loaded (modprobe ib_uverbs)" };
    let providers: Vec<&str> = PROVIDERS.iter().copied().filter(|m| loaded(m)).collect();
    let providers = if providers.is_empty() {
        format!("no provider module is loaded ({})", PROVIDERS.join(", "))
    } else {
        format!("provider modules loaded: {}, but they expose no device", providers.join(", "))
    };
    format!(
        "no RDMA device: libibverbs lists none. {uverbs}; {providers}. Without RDMA hardware, Soft-RoCE makes one on an \
         Ethernet interface: modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0 (iproute2's rdma)"
    )
}

fn port_state(s: ffi::ibv_port_state::Type) -> &'static str {
    match s {
        ffi::ibv_port_state::IBV_PORT_ACTIVE => "ACTIVE",
        ffi::ibv_port_state::IBV_PORT_DOWN => "DOWN",
        ffi::ibv_port_state::IBV_PORT_INIT => "INIT",
        ffi::ibv_port_state::IBV_PORT_ARMED => "ARMED",
        _ => "other",
    }
}

fn gid_text(g: &[u8; 16]) -> String {
    std::net::Ipv6Addr::from(*g).to_string()
}

/// One line per device and port, then one per valid GID; or the help above.
pub fn describe() -> Result<Vec<String>, String> {
    let names = device_names().map_err(|e| format!("ibv_get_device_list: {e}; {}", no_device_help()))?;
    if names.is_empty() {
        return Err(no_device_help());
    }
    let mut out = Vec::new();
    for name in names {
        let ctx = match Context::open(&name) {
            Ok(c) => c,
            Err(e) => {
                out.push(format!("{name}: cannot open: {e}"));
                continue;
            }
        };
        let Ok(dev) = ctx.query_device() else {
            out.push(format!("{name}: ibv_query_device failed"));
            continue;
        };
        for port in 1..=dev.phys_port_cnt {
            let Ok(a) = ctx.query_port(port) else { continue };
            let link = if a.link_layer == ffi::IBV_LINK_LAYER_ETHERNET as u8 { "Ethernet (RoCE)" } else { "InfiniBand" };
            out.push(format!(
                "{name} port {port}: {}, {link}, active MTU {}, LID {}, max QPs {}, max MR size {} B",
                port_state(a.state),
                128u32 << a.active_mtu,
                a.lid,
                dev.max_qp,
                dev.max_mr_size
            ));
            for i in 0..a.gid_tbl_len.min(256) {
                let Ok(g) = ctx.query_gid(port, i) else { continue };
                if g == [0; 16] {
                    continue;
                }
                let kind = crate::device::gid_type(&name, port, i).unwrap_or_else(|| "type unknown".into());
                out.push(format!("  GID {i}: {} ({kind})", gid_text(&g)));
            }
        }
    }
    Ok(out)
}
