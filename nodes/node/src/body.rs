//! Reading a request's body within bounds, on every HTTP port of the node.
//!
//! Three bounds, checked as the body arrives rather than after it is held:
//!
//! * a **limit** per request: a body whose declared `Content-Length` is
//!   over it is refused before a byte of it is read, and one sent without
//!   a length (chunked) is refused as soon as it passes the limit;
//! * a **budget** per port, the memory every body being read on that port
//!   may hold together. A body with a declared length waits for its whole
//!   length to be free (holding nothing while it waits, so two large
//!   bodies cannot each hold half and wait for the other); a chunked one
//!   takes its memory as it arrives and is refused when the budget has
//!   none left. The memory returns to the budget when the request is
//!   done with it ([`Held`] is dropped);
//! * a **deadline**: the whole body, the wait for the budget included,
//!   must arrive within it.
//!
//! The body is read into one buffer of its declared size, so a large body
//! is one allocation that goes back to the system when freed, not many
//! small ones that stay in the allocator's heap.

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Incoming};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The memory the bodies being read on one port may hold at once.
#[derive(Clone)]
pub struct Budget {
    sem: Arc<Semaphore>,
    bytes: usize,
}

impl Budget {
    /// A budget of `bytes` (at most `u32::MAX`).
    pub fn new(bytes: usize) -> Budget {
        let bytes = bytes.min(u32::MAX as usize);
        Budget {
            sem: Arc::new(Semaphore::new(bytes)),
            bytes,
        }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes of the budget free now.
    pub fn available(&self) -> usize {
        self.sem.available_permits()
    }

    /// Takes `n` more bytes now, if the budget has them.
    pub fn try_take(&self, n: usize) -> Option<OwnedSemaphorePermit> {
        let n = u32::try_from(n).ok()?;
        if n == 0 {
            return None;
        }
        self.sem.clone().try_acquire_many_owned(n).ok()
    }
}

/// Memory held against a [`Budget`]; it returns when this is dropped.
#[derive(Default)]
pub struct Hold(Option<OwnedSemaphorePermit>);

impl Hold {
    /// Adds `n` bytes taken from `budget` now, or says that it has none.
    pub fn grow(&mut self, budget: &Budget, n: usize) -> Result<(), Refusal> {
        if n == 0 {
            return Ok(());
        }
        let more = budget.try_take(n).ok_or(Refusal::Busy { budget: budget.bytes() })?;
        match &mut self.0 {
            Some(p) => p.merge(more),
            None => self.0 = Some(more),
        }
        Ok(())
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |p| p.num_permits())
    }

    /// Gives `n` of the bytes held back to the budget.
    pub fn shrink(&mut self, n: usize) {
        if let Some(p) = &mut self.0 {
            if n >= p.num_permits() {
                self.0 = None;
            } else {
                drop(p.split(n));
            }
        }
    }
}

/// A body read whole, and the memory it holds against its port's budget.
pub struct Held {
    pub bytes: Bytes,
    pub hold: Hold,
}

/// Why a body was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Over the request's limit: `declared` when its `Content-Length` said
    /// so before anything was read.
    TooLarge { limit: usize, declared: Option<u64> },
    /// The port's budget had no room for it (a chunked body, or a decoded
    /// one growing).
    Busy { budget: usize },
    /// It did not arrive (with the wait for the budget) in time.
    Timeout(Duration),
    /// The connection failed while it was read.
    Read(String),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::TooLarge {
                limit,
                declared: Some(n),
            } => write!(f, "the request body of {n} bytes is over the limit of {limit} bytes"),
            Refusal::TooLarge { limit, declared: None } => {
                write!(f, "the request body is over the limit of {limit} bytes")
            }
            Refusal::Busy { budget } => write!(
                f,
                "the bodies being read on this port hold all {budget} bytes it gives them: try again"
            ),
            Refusal::Timeout(t) => write!(f, "the request body did not arrive within {t:?}"),
            Refusal::Read(e) => write!(f, "the request body could not be read: {e}"),
        }
    }
}

/// Reads `body` whole, within `limit` bytes, `budget` and `deadline`.
pub async fn read(body: Incoming, limit: usize, budget: &Budget, deadline: Duration) -> Result<Held, Refusal> {
    let limit = limit.min(budget.bytes());
    let declared = body.size_hint().exact();
    if let Some(n) = declared {
        if n > limit as u64 {
            return Err(Refusal::TooLarge {
                limit,
                declared: Some(n),
            });
        }
    }
    tokio::time::timeout(deadline, read_within(body, declared, limit, budget))
        .await
        .map_err(|_| Refusal::Timeout(deadline))?
}

async fn read_within(
    mut body: Incoming,
    declared: Option<u64>,
    limit: usize,
    budget: &Budget,
) -> Result<Held, Refusal> {
    let mut hold = Hold::default();
    if let Some(n) = declared.filter(|&n| n > 0) {
        // n <= limit <= u32::MAX (above)
        let permit = budget
            .sem
            .clone()
            .acquire_many_owned(n as u32)
            .await
            .map_err(|_| Refusal::Busy { budget: budget.bytes() })?;
        hold.0 = Some(permit);
    }
    // with its length declared, the body goes straight into one buffer of
    // that size; without, its pieces are kept as they came and joined at
    // the end (a growing buffer would hold up to twice what it counts)
    let mut buf: Vec<u8> = Vec::with_capacity(declared.unwrap_or(0) as usize);
    let mut pieces: Vec<Bytes> = Vec::new();
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Refusal::Read(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if len + data.len() > limit {
            return Err(Refusal::TooLarge { limit, declared });
        }
        len += data.len();
        if declared.is_some() {
            buf.extend_from_slice(&data);
        } else {
            hold.grow(budget, data.len())?;
            pieces.push(data);
        }
    }
    let bytes = match pieces.len() {
        0 => Bytes::from(buf),
        1 => pieces.pop().expect("one piece"),
        _ => {
            // the joined copy is counted while both exist
            hold.grow(budget, len)?;
            let mut joined = Vec::with_capacity(len);
            for p in pieces.drain(..) {
                joined.extend_from_slice(&p);
            }
            hold.shrink(len);
            Bytes::from(joined)
        }
    };
    Ok(Held { bytes, hold })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_returns_its_memory_when_dropped_and_cannot_take_more_than_is_left() {
        let b = Budget::new(100);
        let mut h = Hold::default();
        h.grow(&b, 60).unwrap();
        h.grow(&b, 30).unwrap();
        assert_eq!((h.bytes(), b.available()), (90, 10));
        assert_eq!(h.grow(&b, 11), Err(Refusal::Busy { budget: 100 }));
        assert_eq!(h.bytes(), 90);
        h.shrink(40);
        assert_eq!((h.bytes(), b.available()), (50, 50));
        drop(h);
        assert_eq!(b.available(), 100);
    }
}
