//! The client side of fmxrun's out-of-band exchange (TCP on 127.0.0.1).

use std::io::BufReader;
use std::net::TcpStream;
use std::time::Duration;

use super::wire::{self, OP_ALLGATHER, OP_BARRIER, OP_FINALIZE, OP_HELLO, OP_SPAWN};
use crate::error::{Error, Result};

/// `host:port` of fmxrun's rendezvous server.
pub const ENV_RENDEZVOUS: &str = "FMX_RENDEZVOUS";

/// How long a bootstrap round may take before we give up (a rank that never
/// arrives must not hang the others forever).
const ROUND_TIMEOUT: Duration = Duration::from_secs(120);

pub(crate) struct Client {
    pub(crate) rank: u32,
    pub(crate) size: u32,
    pub(crate) job: String,
    stream: BufReader<TcpStream>,
}

fn env_u32(name: &str) -> Result<u32> {
    let v = std::env::var(name).map_err(|_| Error::Bootstrap(format!("{name} is not set (fmxrun sets it)")))?;
    v.parse().map_err(|_| Error::Bootstrap(format!("{name}={v:?} is not a number")))
}

impl Client {
    pub(crate) fn connect_from_env() -> Result<Self> {
        let addr = std::env::var(ENV_RENDEZVOUS).unwrap_or_default();
        let rank = env_u32("FMX_RANK")?;
        let size = env_u32("FMX_SIZE")?;
        if size == 0 || rank >= size {
            return Err(Error::Bootstrap(format!("FMX_RANK={rank} is not below FMX_SIZE={size}")));
        }
        let job = std::env::var("FMX_JOB").map_err(|_| Error::Bootstrap("FMX_JOB is not set (fmxrun sets it)".into()))?;
        Self::connect(&addr, rank, size, job)
    }

    /// Joins the group served at `addr` as `rank` of `size`.
    pub(crate) fn connect(addr: &str, rank: u32, size: u32, job: String) -> Result<Self> {
        let io = |what: String| move |source| Error::BootstrapIo { what, source };
        let stream = TcpStream::connect(addr).map_err(io(format!("connecting to fmxrun at {addr}")))?;
        stream.set_nodelay(true).map_err(io("TCP_NODELAY".into()))?;
        stream.set_read_timeout(Some(ROUND_TIMEOUT)).map_err(io("read timeout".into()))?;
        let mut c = Self { rank, size, job, stream: BufReader::new(stream) };
        let mut hello = Vec::new();
        for v in [rank, size, std::process::id()] {
            hello.extend_from_slice(&v.to_le_bytes());
        }
        c.round(OP_HELLO, &hello, "hello")?;
        Ok(c)
    }

    fn round(&mut self, op: u8, body: &[u8], what: &str) -> Result<Vec<u8>> {
        let err =
            |source: std::io::Error| Error::BootstrapIo { what: format!("{what} round with fmxrun (another rank may have died)"), source };
        wire::write_frame(self.stream.get_mut(), op, body).map_err(err)?;
        let (rop, reply) = wire::read_frame(&mut self.stream).map_err(err)?;
        if rop != op {
            return Err(Error::Bootstrap(format!("fmxrun answered op {rop:?} to {what}")));
        }
        Ok(reply)
    }

    pub(crate) fn allgather(&mut self, blob: &[u8]) -> Result<Vec<Vec<u8>>> {
        let reply = self.round(OP_ALLGATHER, blob, "allgather")?;
        let blobs = wire::decode_blobs(&reply).ok_or_else(|| Error::Bootstrap("malformed allgather reply".into()))?;
        if blobs.len() != self.size as usize {
            return Err(Error::Bootstrap(format!("allgather returned {} blobs for {} ranks", blobs.len(), self.size)));
        }
        Ok(blobs)
    }

    pub(crate) fn barrier(&mut self) -> Result<()> {
        self.round(OP_BARRIER, &[], "barrier").map(drop)
    }

    pub(crate) fn finalize(&mut self) -> Result<()> {
        self.round(OP_FINALIZE, &[], "finalize").map(drop)
    }

    /// Asks fmxrun (with every rank of the world) to start a world of `np`
    /// ranks; with `bridge`, the answer is the bridge's address and job id.
    pub(crate) fn spawn_world(&mut self, np: u32, bridge: bool, values: &str) -> Result<Option<(String, String)>> {
        let mut body = np.to_le_bytes().to_vec();
        body.push(u8::from(bridge));
        body.extend_from_slice(values.as_bytes());
        let reply = self.round(OP_SPAWN, &body, "spawn")?;
        match reply.split_first() {
            Some((0, rest)) if !bridge => rest.is_empty().then_some(None).ok_or_else(|| Error::Bootstrap("malformed spawn reply".into())),
            Some((0, rest)) => match wire::decode_blobs(rest).as_deref() {
                Some([addr, job]) => Ok(Some((String::from_utf8_lossy(addr).into_owned(), String::from_utf8_lossy(job).into_owned()))),
                _ => Err(Error::Bootstrap("malformed spawn reply".into())),
            },
            Some((_, msg)) => Err(Error::Launch(String::from_utf8_lossy(msg).into_owned())),
            None => Err(Error::Bootstrap("empty spawn reply".into())),
        }
    }
}
