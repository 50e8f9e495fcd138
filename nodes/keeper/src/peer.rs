//! What travels between servers of a keeper cluster, and its encoding:
//! a u32 length, then a tag and the body. The transport that carries
//! these frames (sockets, the peers' handshake) is the driver's; the
//! server core sends and receives [`PeerMsg`] values.

use crate::codec::DecodeError;

/// Largest peer frame other than a snapshot: a Raft append holds up to
/// `max_size_per_msg` (1 MiB) of entries, or one larger entry of at most
/// [`crate::limit::WRITE_BYTES_MAX`] (about 2 MiB) with its
/// envelope; a forwarded write is one such write.
pub const FRAME_BYTES_MAX: usize = 8 << 20;
/// Largest snapshot frame: a snapshot travels whole in one Raft message,
/// and a compressed snapshot of a tree of millions of znodes is hundreds
/// of MiB at most.
pub const SNAPSHOT_FRAME_BYTES_MAX: usize = 512 << 20;
pub const TAG_RAFT: u8 = 1;
pub const TAG_FORWARD: u8 = 2;
pub const TAG_REFUSED: u8 = 3;
pub const TAG_TOUCH: u8 = 4;
pub const TAG_SNAPSHOT: u8 = 5;

/// The most bytes a frame (tag and body) with `tag` may hold.
pub fn frame_bytes_max(tag: u8) -> usize {
    if tag == TAG_SNAPSHOT {
        SNAPSHOT_FRAME_BYTES_MAX
    } else {
        FRAME_BYTES_MAX
    }
}

/// What travels between nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerMsg {
    /// A Raft message (protobuf bytes), other than a snapshot.
    Raft(Vec<u8>),
    /// A Raft `MsgSnapshot` (protobuf bytes): the one message allowed to be
    /// larger than [`FRAME_BYTES_MAX`].
    Snapshot(Vec<u8>),
    /// A client write for the leader to propose: origin node, its request
    /// id, the session, and the encoded request.
    Forward {
        origin: u64,
        req: u64,
        session: i64,
        write: Vec<u8>,
    },
    /// The leader could not propose a forwarded request.
    Refused { req: u64 },
    /// Sessions alive on the sender since its last touch.
    Touch { sessions: Vec<i64> },
}

impl PeerMsg {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        self.encode_into(&mut b);
        b
    }

    /// Appends the message's frame (length included) to `b`: a driver
    /// that batches a peer's frames writes them in place, not each into
    /// its own buffer first.
    pub fn encode_into(&self, b: &mut Vec<u8>) {
        let start = b.len();
        b.extend_from_slice(&[0u8; 4]);
        match self {
            PeerMsg::Raft(m) => {
                b.push(TAG_RAFT);
                b.extend_from_slice(m);
            }
            PeerMsg::Snapshot(m) => {
                b.push(TAG_SNAPSHOT);
                b.extend_from_slice(m);
            }
            PeerMsg::Forward {
                origin,
                req,
                session,
                write,
            } => {
                b.push(TAG_FORWARD);
                b.extend_from_slice(&origin.to_be_bytes());
                b.extend_from_slice(&req.to_be_bytes());
                b.extend_from_slice(&session.to_be_bytes());
                b.extend_from_slice(write);
            }
            PeerMsg::Refused { req } => {
                b.push(TAG_REFUSED);
                b.extend_from_slice(&req.to_be_bytes());
            }
            PeerMsg::Touch { sessions } => {
                b.push(TAG_TOUCH);
                for s in sessions {
                    b.extend_from_slice(&s.to_be_bytes());
                }
            }
        }
        let n = (b.len() - start - 4) as u32;
        b[start..start + 4].copy_from_slice(&n.to_be_bytes());
    }

    pub fn decode(p: &[u8]) -> Result<PeerMsg, DecodeError> {
        let bad = |offset: usize, reason: &str| DecodeError {
            offset,
            reason: format!("peer frame: {reason}"),
        };
        let (&tag, body) = p.split_first().ok_or_else(|| bad(0, "empty"))?;
        let word = |i: usize| -> Result<[u8; 8], DecodeError> {
            body.get(i..i + 8)
                .map(|s| s.try_into().expect("8 bytes"))
                .ok_or_else(|| bad(1 + i, &format!("too short ({} bytes)", p.len())))
        };
        Ok(match tag {
            TAG_RAFT => PeerMsg::Raft(body.to_vec()),
            TAG_SNAPSHOT => PeerMsg::Snapshot(body.to_vec()),
            TAG_FORWARD => PeerMsg::Forward {
                origin: u64::from_be_bytes(word(0)?),
                req: u64::from_be_bytes(word(8)?),
                session: i64::from_be_bytes(word(16)?),
                write: body.get(24..).unwrap_or_default().to_vec(),
            },
            TAG_REFUSED => PeerMsg::Refused {
                req: u64::from_be_bytes(word(0)?),
            },
            TAG_TOUCH => {
                if body.len() % 8 != 0 {
                    return Err(bad(1, "a touch frame whose length is not a multiple of 8"));
                }
                PeerMsg::Touch {
                    sessions: body
                        .chunks(8)
                        .map(|c| i64::from_be_bytes(c.try_into().expect("8 bytes")))
                        .collect(),
                }
            }
            t => return Err(bad(0, &format!("unknown message tag {t}"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_messages_round_trip() {
        for m in [
            PeerMsg::Raft(vec![1, 2, 3]),
            PeerMsg::Snapshot(vec![4, 5]),
            PeerMsg::Forward {
                origin: 2,
                req: 9,
                session: -1,
                write: vec![7; 5],
            },
            PeerMsg::Refused { req: 4 },
            PeerMsg::Touch { sessions: vec![1, 5] },
        ] {
            let bytes = m.encode();
            assert_eq!(PeerMsg::decode(&bytes[4..]).unwrap(), m);
            // appended after another frame: the same bytes, its own length
            let mut batch = PeerMsg::Refused { req: 1 }.encode();
            let first = batch.len();
            m.encode_into(&mut batch);
            assert_eq!(&batch[first..], &bytes[..]);
        }
        assert!(PeerMsg::decode(&[9]).is_err());
        assert!(PeerMsg::decode(&[2, 1]).is_err());
    }
}
