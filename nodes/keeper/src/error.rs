//! ZooKeeper error codes, as the wire protocol numbers them
//! (`KeeperException.Code`). The core returns them in responses; the wire
//! codec sends the number unchanged.

/// A ZooKeeper result code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ZkError {
    Ok,
    SystemError,
    RuntimeInconsistency,
    DataInconsistency,
    ConnectionLoss,
    MarshallingError,
    Unimplemented,
    OperationTimeout,
    BadArguments,
    InvalidState,
    ApiError,
    NoNode,
    NoAuth,
    BadVersion,
    NoChildrenForEphemerals,
    NodeExists,
    NotEmpty,
    SessionExpired,
    InvalidCallback,
    InvalidAcl,
    AuthFailed,
    SessionMoved,
    NotReadOnly,
    NoWatcher,
    ReconfigDisabled,
}

/// Every code with its protocol number.
const CODES: [(ZkError, i32); 25] = [
    (ZkError::Ok, 0),
    (ZkError::SystemError, -1),
    (ZkError::RuntimeInconsistency, -2),
    (ZkError::DataInconsistency, -3),
    (ZkError::ConnectionLoss, -4),
    (ZkError::MarshallingError, -5),
    (ZkError::Unimplemented, -6),
    (ZkError::OperationTimeout, -7),
    (ZkError::BadArguments, -8),
    (ZkError::InvalidState, -9),
    (ZkError::ApiError, -100),
    (ZkError::NoNode, -101),
    (ZkError::NoAuth, -102),
    (ZkError::BadVersion, -103),
    (ZkError::NoChildrenForEphemerals, -108),
    (ZkError::NodeExists, -110),
    (ZkError::NotEmpty, -111),
    (ZkError::SessionExpired, -112),
    (ZkError::InvalidCallback, -113),
    (ZkError::InvalidAcl, -114),
    (ZkError::AuthFailed, -115),
    (ZkError::SessionMoved, -118),
    (ZkError::NotReadOnly, -119),
    (ZkError::NoWatcher, -121),
    (ZkError::ReconfigDisabled, -123),
];

impl ZkError {
    /// The protocol's number for this code.
    pub fn code(self) -> i32 {
        CODES
            .iter()
            .find(|(e, _)| *e == self)
            .map(|(_, c)| *c)
            .expect("every code is listed")
    }

    /// The code for a protocol number, if it is one this server uses.
    pub fn from_code(code: i32) -> Option<ZkError> {
        CODES.iter().find(|(_, c)| *c == code).map(|(e, _)| *e)
    }
}

impl std::fmt::Display for ZkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?} ({})", self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_match_the_protocol() {
        for (e, c) in CODES {
            assert_eq!((e.code(), ZkError::from_code(c)), (c, Some(e)));
        }
        assert_eq!(ZkError::NoNode.code(), -101);
        assert_eq!(ZkError::NodeExists.code(), -110);
        assert_eq!(ZkError::NotEmpty.code(), -111);
        for code in -200..10 {
            if let Some(e) = ZkError::from_code(code) {
                assert_eq!(e.code(), code);
            }
        }
        assert_eq!(ZkError::from_code(-108), Some(ZkError::NoChildrenForEphemerals));
    }
}
