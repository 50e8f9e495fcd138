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
}

impl ZkError {
    /// The protocol's number for this code.
    pub fn code(self) -> i32 {
        use ZkError::*;
        match self {
            Ok => 0,
            SystemError => -1,
            RuntimeInconsistency => -2,
            DataInconsistency => -3,
            ConnectionLoss => -4,
            MarshallingError => -5,
            Unimplemented => -6,
            OperationTimeout => -7,
            BadArguments => -8,
            InvalidState => -9,
            ApiError => -100,
            NoNode => -101,
            NoAuth => -102,
            BadVersion => -103,
            NoChildrenForEphemerals => -108,
            NodeExists => -110,
            NotEmpty => -111,
            SessionExpired => -112,
            InvalidCallback => -113,
            InvalidAcl => -114,
            AuthFailed => -115,
            SessionMoved => -118,
            NotReadOnly => -119,
            NoWatcher => -121,
        }
    }

    /// The code for a protocol number, if it is one this server uses.
    pub fn from_code(code: i32) -> Option<ZkError> {
        use ZkError::*;
        const ALL: [ZkError; 24] = [
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
        ];
        ALL.into_iter().find(|e| e.code() == code)
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
        assert_eq!(ZkError::NoNode.code(), -101);
        assert_eq!(ZkError::NodeExists.code(), -110);
        assert_eq!(ZkError::NotEmpty.code(), -111);
        for code in -200..10 {
            if let Some(e) = ZkError::from_code(code) {
                assert_eq!(e.code(), code);
            }
        }
        assert_eq!(
            ZkError::from_code(-108),
            Some(ZkError::NoChildrenForEphemerals)
        );
    }
}
