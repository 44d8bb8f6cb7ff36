//! `Fmx::spawn_world` under a PMI process manager (Hydra): a world of this
//! program started by PMI's spawn, and for a connected world the bridge
//! between the two, whose rendezvous no fmxrun serves here: the spawning
//! world's rank 0 serves it (`hub`) on `FMX_BRIDGE_ADDR`. What the new world
//! needs (its generation, the old world's size, the values, the bridge's
//! address and job id) travels in the spawn's values, which it reads with
//! PMI's get (`Lineage` in `spawn.rs`).

use super::super::hub;
use super::{wire, Client, SpawnRequest};
use crate::error::{Error, Result};
use crate::spawn::Lineage;

/// The spawn value (a PMI key) that says what the new world descends from:
/// generation, the old world's size, the values, the bridge's address and
/// job id. One key, and every PMI spawn fmx makes carries it (`-` where the
/// new world is no world of fmx's): Hydra 4.0's PMI-2 server fails the whole
/// job on a get of a key a spawned world does not have.
pub(crate) const KEY_LINEAGE: &str = "fmx-lineage";

/// How long finalize waits for a rendezvous this rank serves to end.
/// (Longer than the rendezvous's own grace before it aborts.)
const HUB_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// `lineage` as one PMI value: `generation,parent_size,xHEX(values),bridge,job`
/// (`-` for no bridge); only characters a PMI value may hold.
pub(crate) fn encode_lineage(l: &Lineage) -> String {
    let (bridge, job) = l.bridge.as_ref().map_or(("-", "-"), |(a, j)| (a.as_str(), j.as_str()));
    format!("{},{},x{},{bridge},{job}", l.count, l.parent_size.map_or("-".into(), |n| n.to_string()), wire::hex(l.values.as_bytes()))
}

/// What [`encode_lineage`] wrote; `-` alone (a plain `Fmx::spawn`) is a first world's.
pub(crate) fn decode_lineage(v: &str) -> Option<Lineage> {
    if v == "-" {
        return Some(Lineage::default());
    }
    let f: Vec<&str> = v.split(',').collect();
    let [count, parent, values, bridge, job] = f[..] else { return None };
    let values = String::from_utf8(wire::unhex(values.strip_prefix('x')?)?).ok()?;
    let parent_size = if parent == "-" { None } else { Some(parent.parse().ok()?) };
    let bridge = match (bridge, job) {
        ("-", "-") => None,
        ("-", _) | (_, "-") => return None,
        (a, j) => Some((a.to_string(), j.to_string())),
    };
    Some(Lineage { count: count.parse().ok()?, parent_size, values, bridge })
}

/// Where rank 0 serves a bridge: `FMX_BRIDGE_ADDR` is an IP address, or
/// `hostname`: the address this host's name resolves to (a non-loopback one
/// first), whichever node Hydra put this world's rank 0 on.
fn bridge_address(setting: &str) -> Result<std::net::IpAddr> {
    if let Ok(ip) = setting.parse() {
        return Ok(ip);
    }
    if setting != "hostname" {
        return Err(Error::Launch(format!("FMX_BRIDGE_ADDR={setting:?} is neither an IP address of rank 0's host nor `hostname`")));
    }
    let name = rustix::system::uname().nodename().to_string_lossy().into_owned();
    let found: Vec<std::net::IpAddr> = std::net::ToSocketAddrs::to_socket_addrs(&(name.as_str(), 0))
        .map_err(|e| Error::Launch(format!("FMX_BRIDGE_ADDR=hostname: this host's name {name:?} does not resolve: {e}")))?
        .map(|a| a.ip())
        .collect();
    found
        .iter()
        .find(|ip| !ip.is_loopback())
        .or_else(|| found.first())
        .copied()
        .ok_or_else(|| Error::Launch(format!("FMX_BRIDGE_ADDR=hostname: this host's name {name:?} resolves to no address")))
}

impl Client {
    /// Collective over this world: once every rank has called (as under
    /// fmxrun, whose round starts the world only then: in checkpoint-restart
    /// mode each old rank's file is in place before a new rank looks for it),
    /// rank 0 starts `np` processes of this program (and, with `bridge`,
    /// serves the bridge's rendezvous); every rank learns the bridge's
    /// address, or rank 0's error, through the key-value space, so that no
    /// rank waits for a bridge that will never be.
    pub(crate) fn spawn_world(&mut self, np: u32, bridge: bool, values: &str, generation: u32) -> Result<Option<(String, String)>> {
        let job = super::super::launcher::job_id_from("pmibridge", &format!("{}_{}", self.job, generation + 1));
        self.fence()?;
        let outcome = if self.rank == 0 {
            self.start_world(np, bridge, values, generation, &job).map_err(|e| match e {
                Error::Launch(why) => why,
                e => e.to_string(),
            })
        } else {
            Ok(String::new())
        };
        self.rounds += 1;
        let prefix = format!("fmx-spawned-{}", self.rounds);
        if self.rank == 0 {
            let said = match &outcome {
                Ok(addr) => format!("+{addr}"),
                Err(why) => format!("-{why}"),
            };
            self.put_blob(&prefix, said.as_bytes())?;
        }
        self.fence()?;
        let said = String::from_utf8_lossy(&self.get_blob(0, &prefix)?).into_owned();
        match said.split_at_checked(1) {
            Some(("+", addr)) => Ok(bridge.then(|| (addr.to_string(), job))),
            Some(("-", why)) if self.rank == 0 => Err(Error::Launch(format!("spawn_world: {why}"))),
            Some(("-", why)) => Err(Error::Launch(format!("spawn_world: rank 0 could not start the new world: {why}"))),
            _ => Err(Error::Bootstrap(format!("spawn_world: rank 0's answer in the key-value space is malformed ({said:?})"))),
        }
    }

    /// Before this rank finalizes: a bridge's rendezvous it serves ends with
    /// the bridge (or, when a member failed, after it asked Hydra to end the
    /// job). Waits for that a little, so that the process does not exit
    /// while its rendezvous still has a failure to report.
    pub(crate) fn let_hubs_end(&mut self) {
        let deadline = std::time::Instant::now() + HUB_GRACE;
        while self.hubs.iter().any(|h| !h.is_finished()) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        self.hubs.retain(|h| !h.is_finished());
    }

    /// Rank 0's part: the rendezvous, then PMI's spawn. Returns the
    /// rendezvous's address (empty without a bridge).
    fn start_world(&mut self, np: u32, bridge: bool, values: &str, generation: u32, job: &str) -> Result<String> {
        self.refuse_spawn_under_slurm()?;
        let addr = if bridge {
            let bind = fmx_transport::settings::var("FMX_BRIDGE_ADDR").unwrap_or_else(|| "127.0.0.1".into());
            let ip = bridge_address(&bind)?;
            let group = hub::Group { old: self.size, new: np, generation };
            let abort = self.aborter().map_err(|e| Error::Launch(format!("a second handle on the PMI connection: {e}")))?;
            let (addr, hub) = hub::serve(ip, group, super::super::fmxrun::boot_timeout()?, Box::new(abort))
                .map_err(|e| Error::Launch(format!("serving the bridge's rendezvous on {ip} (FMX_BRIDGE_ADDR): {e}")))?;
            self.hubs.push(hub);
            addr
        } else {
            String::new()
        };
        let program = std::env::current_exe().map_err(|e| Error::Launch(format!("this program's path: {e}")))?;
        let lineage = Lineage {
            count: generation + 1,
            parent_size: Some(self.size),
            values: values.to_string(),
            bridge: bridge.then(|| (addr.clone(), job.to_string())),
        };
        let v = vec![(KEY_LINEAGE.to_string(), encode_lineage(&lineage))];
        let req = SpawnRequest {
            program: program.to_string_lossy().into_owned(),
            args: std::env::args().skip(1).collect(),
            nprocs: np,
            values: v,
        };
        self.spawn(&req)?;
        Ok(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bridge_address_is_an_ip_or_this_hosts_name() {
        assert_eq!(bridge_address("127.0.0.1").unwrap(), std::net::IpAddr::from([127, 0, 0, 1]));
        let e = bridge_address("eth0").unwrap_err().to_string();
        assert!(e.contains("FMX_BRIDGE_ADDR=\"eth0\" is neither"), "{e}");
    }

    #[test]
    fn a_lineage_travels_as_one_pmi_value_and_comes_back() {
        let worlds = [
            Lineage {
                count: 3,
                parent_size: Some(4),
                values: "mode=intercomm a b;c\nd".into(),
                bridge: Some(("169.254.0.1:4000".into(), "pmibridge_kvs_1_2".into())),
            },
            Lineage { count: 1, parent_size: Some(2), values: String::new(), bridge: None },
        ];
        for l in worlds {
            let v = encode_lineage(&l);
            assert!(!v.is_empty() && !v.contains([' ', ';', '\n', '=']), "{v}");
            let back = decode_lineage(&v).expect("decodes");
            assert_eq!((back.count, back.parent_size, &back.values, &back.bridge), (l.count, l.parent_size, &l.values, &l.bridge));
        }
        assert_eq!(decode_lineage("-").map(|l| l.count), Some(0));
        for bad in ["", "1,2,x00", "1,2,zz,-,-", "1,2,x,a,-", "x,2,x,-,-"] {
            assert!(decode_lineage(bad).is_none(), "{bad:?}");
        }
    }
}
