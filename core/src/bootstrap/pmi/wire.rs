//! The two PMI wire formats, as MPICH's Hydra and Slurm speak them.
//!
//! - PMI-1: one line per message, `cmd=NAME key=value key=value\n`; values
//!   never contain spaces. `spawn` is the multi-line exception
//!   (`mcmd=spawn\nkey=value\n...endcmd\n`).
//! - PMI-2: a 6-character, space-padded decimal length, then
//!   `cmd=NAME;key=value;...;` (no newline). The version handshake itself
//!   (`cmd=init pmi_version=2 ...`) is a PMI-1 line.
//!
//! fmx only ever sends values made of `[0-9a-zA-Z_:/.,()-]` (blobs are hex),
//! so neither format needs escapes on the way out; replies are parsed as the
//! servers write them.

use std::io::{self, BufRead, Read, Write};

/// One parsed message: its command and attributes, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Msg {
    pub(crate) cmd: String,
    pub(crate) attrs: Vec<(String, String)>,
}

impl Msg {
    pub(crate) fn new(cmd: &str) -> Self {
        Self { cmd: cmd.into(), attrs: Vec::new() }
    }

    pub(crate) fn with(mut self, key: &str, value: impl std::fmt::Display) -> Self {
        self.attrs.push((key.into(), value.to_string()));
        self
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// PMI-1 line form.
    pub(crate) fn to_v1(&self) -> String {
        let mut s = format!("cmd={}", self.cmd);
        for (k, v) in &self.attrs {
            s.push(' ');
            s.push_str(k);
            s.push('=');
            s.push_str(v);
        }
        s.push('\n');
        s
    }

    /// PMI-1 multi-line form (only `spawn` uses it), ending in `endcmd`.
    pub(crate) fn to_v1_multiline(&self) -> String {
        let mut s = format!("mcmd={}\n", self.cmd);
        for (k, v) in &self.attrs {
            s.push_str(k);
            s.push('=');
            s.push_str(v);
            s.push('\n');
        }
        s.push_str("endcmd\n");
        s
    }

    /// PMI-2 framed form.
    pub(crate) fn to_v2(&self) -> Vec<u8> {
        let mut body = format!("cmd={};", self.cmd);
        for (k, v) in &self.attrs {
            body.push_str(k);
            body.push('=');
            // A literal ';' is doubled (PMI-2's escape); fmx never sends one.
            body.push_str(&v.replace(';', ";;"));
            body.push(';');
        }
        let mut out = format!("{:6}", body.len()).into_bytes();
        out.extend_from_slice(body.as_bytes());
        out
    }
}

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// A message from `key=value` fields, the first `cmd` being the command.
fn from_fields<'a>(fields: impl Iterator<Item = &'a str>, protocol: &str, text: &str) -> io::Result<Msg> {
    let mut cmd = None;
    let mut attrs = Vec::new();
    for f in fields.filter(|f| !f.is_empty()) {
        let (k, v) = f.split_once('=').unwrap_or((f, ""));
        if k == "cmd" && cmd.is_none() {
            cmd = Some(v.to_string());
        } else {
            attrs.push((k.to_string(), v.to_string()));
        }
    }
    let cmd = cmd.ok_or_else(|| bad(format!("{protocol} reply without cmd=: {text:?}")))?;
    Ok(Msg { cmd, attrs })
}

/// Parses a PMI-1 line (without or with its newline).
pub(crate) fn parse_v1(line: &str) -> io::Result<Msg> {
    let line = line.trim_end_matches(['\n', '\r']);
    from_fields(line.split(' '), "PMI-1", line)
}

/// Parses a PMI-2 body (after the length): `cmd=x;k=v;...;`, `;;` an escaped `;`.
pub(crate) fn parse_v2(body: &str) -> io::Result<Msg> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ';' {
            if chars.peek() == Some(&';') {
                chars.next();
                cur.push(';');
            } else {
                fields.push(std::mem::take(&mut cur));
            }
        } else {
            cur.push(c);
        }
    }
    if !cur.is_empty() {
        fields.push(cur);
    }
    from_fields(fields.iter().map(String::as_str), "PMI-2", body)
}

/// The PMI socket, whose reads end at a deadline for the whole reply (each
/// read waits at most what is left of it), not a timeout per read.
pub(crate) struct Deadlined {
    stream: std::os::unix::net::UnixStream,
    pub(crate) deadline: Option<std::time::Instant>,
}

impl Deadlined {
    pub(crate) fn new(stream: std::os::unix::net::UnixStream) -> Self {
        Self { stream, deadline: None }
    }

    /// A second handle on the same connection (for an abort from another thread).
    pub(crate) fn try_clone(&self) -> io::Result<Self> {
        Ok(Self { stream: self.stream.try_clone()?, deadline: None })
    }

    /// Writes `bytes` at once, giving up after 200 ms (an abort must not block).
    pub(crate) fn send_now(&self, bytes: &[u8]) -> io::Result<()> {
        self.stream.set_write_timeout(Some(std::time::Duration::from_millis(200)))?;
        (&self.stream).write_all(bytes)
    }

    /// Whether something (data or the end of the stream) arrives within `limit`.
    pub(crate) fn readable_within(&self, limit: std::time::Duration) -> io::Result<bool> {
        use std::os::fd::AsFd;
        self.stream.set_read_timeout(Some(limit))?;
        // A peek that blocks for at most the socket's read timeout.
        match rustix::net::recv(self.stream.as_fd(), &mut [0u8; 1], rustix::net::RecvFlags::PEEK) {
            Ok(_) => Ok(true),
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

impl Read for Deadlined {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(d) = self.deadline {
            let left = d.checked_duration_since(std::time::Instant::now()).filter(|l| !l.is_zero());
            let left = left.ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "no complete reply before the deadline"))?;
            self.stream.set_read_timeout(Some(left))?;
        }
        self.stream.read(buf)
    }
}

impl Write for Deadlined {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// Longest reply accepted (bounds memory against a confused server).
const MAX_REPLY: usize = 1 << 20;

/// Reads one PMI-1 line; EOF is `UnexpectedEof` (the server closed the connection).
pub(crate) fn read_v1(r: &mut impl BufRead) -> io::Result<Msg> {
    let mut line = Vec::new();
    let n = Read::take(&mut *r, MAX_REPLY as u64).read_until(b'\n', &mut line)?;
    if n == 0 || line.last() != Some(&b'\n') {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the process manager closed the PMI connection"));
    }
    parse_v1(&String::from_utf8_lossy(&line))
}

/// Reads one PMI-2 frame.
pub(crate) fn read_v2(r: &mut impl BufRead) -> io::Result<Msg> {
    let mut len = [0u8; 6];
    r.read_exact(&mut len).map_err(closed)?;
    let text = String::from_utf8_lossy(&len);
    let n: usize = text.trim().parse().map_err(|_| bad(format!("PMI-2 length field {text:?} is not a number")))?;
    if n > MAX_REPLY {
        return Err(bad(format!("PMI-2 reply of {n} bytes")));
    }
    let mut body = vec![0u8; n];
    r.read_exact(&mut body).map_err(closed)?;
    parse_v2(&String::from_utf8_lossy(&body))
}

fn closed(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        io::Error::new(io::ErrorKind::UnexpectedEof, "the process manager closed the PMI connection")
    } else {
        e
    }
}

/// Writes bytes and flushes.
pub(crate) fn send(w: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    w.write_all(bytes)?;
    w.flush()
}

/// Bytes as lowercase hex (PMI values may not hold arbitrary bytes).
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Inverse of [`hex`]; `None` if malformed.
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_lines_roundtrip_and_parse_server_replies() {
        let m = Msg::new("put").with("kvsname", "kvs_1_0").with("key", "fmx-0-1-0").with("value", "1:ab");
        assert_eq!(m.to_v1(), "cmd=put kvsname=kvs_1_0 key=fmx-0-1-0 value=1:ab\n");
        assert_eq!(parse_v1(&m.to_v1()).unwrap(), m);
        let r = parse_v1("cmd=get_result rc=0 msg=success value=(vector,(0,1,4))\n").unwrap();
        assert_eq!((r.cmd.as_str(), r.get("rc"), r.get("value")), ("get_result", Some("0"), Some("(vector,(0,1,4))")));
        assert!(parse_v1("rc=0\n").is_err());
        let mut eof: &[u8] = b"cmd=barrier_out";
        assert_eq!(read_v1(&mut eof).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn v2_frames_have_a_padded_length_and_escape_semicolons() {
        let m = Msg::new("kvs-put").with("key", "k").with("value", "a;b");
        let bytes = m.to_v2();
        assert_eq!(&bytes[..6], b"    29");
        assert_eq!(&bytes[6..], b"cmd=kvs-put;key=k;value=a;;b;");
        let mut r = &bytes[..];
        assert_eq!(read_v2(&mut r).unwrap(), m);
        let mut short: &[u8] = b"    40cmd=kvs";
        assert_eq!(read_v2(&mut short).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        let mut garbage: &[u8] = b"abcdefcmd=x;";
        assert_eq!(read_v2(&mut garbage).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn spawn_uses_the_multiline_form() {
        let m = Msg::new("spawn").with("nprocs", 2).with("execname", "/bin/x");
        assert_eq!(m.to_v1_multiline(), "mcmd=spawn\nnprocs=2\nexecname=/bin/x\nendcmd\n");
    }

    #[test]
    fn hex_roundtrips() {
        let b: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&hex(&b)).unwrap(), b);
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }
}
