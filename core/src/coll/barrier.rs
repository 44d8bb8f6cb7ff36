use super::util::{sendrecv, tag};
use crate::comm::Comm;
use crate::error::Result;

impl Comm {
    /// Blocks until every rank has entered (dissemination algorithm).
    pub fn barrier(&self) -> Result<()> {
        self.sh.check_live("barrier")?;
        let _c = self.enter("barrier", None, 0, 0)?;
        let (n, r) = (self.size(), self.rank());
        let mut k = 1;
        let mut round = 0;
        while k < n {
            sendrecv::<u8>(self, &[], (r + k) % n, &mut [], (r + n - k) % n, tag::BARRIER + round)?;
            k *= 2;
            round += 1;
        }
        Ok(())
    }
}
