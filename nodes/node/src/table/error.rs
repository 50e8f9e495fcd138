//! Errors as ClickHouse sends them over HTTP: a status, the
//! `X-ClickHouse-Exception-Code` header, and a body
//! `Code: N. DB::Exception: <message>. (NAME) (version …)`.
//!
//! The codes are ClickHouse's, so a client written for ClickHouse (and
//! the dedup checker, which tells definite failures from indeterminate
//! ones by code) reads them the same way.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Code(pub u32, pub &'static str);

pub const CANNOT_PARSE_INPUT: Code = Code(27, "CANNOT_PARSE_INPUT_ASSERTION_FAILED");
pub const BAD_ARGUMENTS: Code = Code(36, "BAD_ARGUMENTS");
pub const CHECKSUM_DOESNT_MATCH: Code = Code(40, "CHECKSUM_DOESNT_MATCH");
pub const ILLEGAL_TYPE_OF_ARGUMENT: Code = Code(43, "ILLEGAL_TYPE_OF_ARGUMENT");
pub const UNKNOWN_IDENTIFIER: Code = Code(47, "UNKNOWN_IDENTIFIER");
pub const NOT_IMPLEMENTED: Code = Code(48, "NOT_IMPLEMENTED");
pub const LOGICAL_ERROR: Code = Code(49, "LOGICAL_ERROR");
pub const UNKNOWN_TABLE: Code = Code(60, "UNKNOWN_TABLE");
pub const SYNTAX_ERROR: Code = Code(62, "SYNTAX_ERROR");
pub const UNKNOWN_FORMAT: Code = Code(73, "UNKNOWN_FORMAT");
pub const UNKNOWN_DATABASE: Code = Code(81, "UNKNOWN_DATABASE");
pub const UNKNOWN_COMPRESSION_METHOD: Code = Code(89, "UNKNOWN_COMPRESSION_METHOD");
pub const UNKNOWN_SETTING: Code = Code(115, "UNKNOWN_SETTING");
pub const INCORRECT_DATA: Code = Code(117, "INCORRECT_DATA");
pub const TIMEOUT_EXCEEDED: Code = Code(159, "TIMEOUT_EXCEEDED");
pub const READONLY: Code = Code(164, "READONLY");
pub const NO_ZOOKEEPER: Code = Code(225, "NO_ZOOKEEPER");
pub const NO_REPLICA_HAS_PART: Code = Code(234, "NO_REPLICA_HAS_PART");
pub const MEMORY_LIMIT_EXCEEDED: Code = Code(241, "MEMORY_LIMIT_EXCEEDED");
pub const TABLE_IS_READ_ONLY: Code = Code(242, "TABLE_IS_READ_ONLY");
pub const CANNOT_DECOMPRESS: Code = Code(271, "CANNOT_DECOMPRESS");
pub const TOO_FEW_LIVE_REPLICAS: Code = Code(285, "TOO_FEW_LIVE_REPLICAS");
pub const UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE: Code = Code(286, "UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE");
pub const UNKNOWN_STATUS_OF_INSERT: Code = Code(319, "UNKNOWN_STATUS_OF_INSERT");
pub const KEEPER_EXCEPTION: Code = Code(999, "KEEPER_EXCEPTION");

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Code: {}. {message} ({})", .code.0, .code.1)]
pub struct TableError {
    pub code: Code,
    pub message: String,
}

impl TableError {
    pub fn new(code: Code, message: impl Into<String>) -> TableError {
        TableError {
            code,
            message: message.into(),
        }
    }

    /// The HTTP status ClickHouse answers this code with.
    pub fn http_status(&self) -> u16 {
        match self.code.0 {
            27 | 36 | 43 | 62 | 117 => 400,
            164 => 403,
            47 | 60 | 73 | 81 | 115 => 404,
            89 | 271 => 400,
            48 => 501,
            _ => 500,
        }
    }

    /// The response body.
    pub fn body(&self) -> String {
        format!(
            "Code: {}. DB::Exception: {}. ({}) (version drift {})\n",
            self.code.0,
            self.message.trim_end_matches('.'),
            self.code.1,
            env!("CARGO_PKG_VERSION")
        )
    }
}

pub type TResult<T> = Result<T, TableError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_read_like_clickhouse() {
        let e = TableError::new(
            TOO_FEW_LIVE_REPLICAS,
            "Number of alive replicas (1) is less than requested quorum (2/3).",
        );
        assert_eq!(e.http_status(), 500);
        assert!(e
            .body()
            .starts_with("Code: 285. DB::Exception: Number of alive replicas (1) is less than requested quorum (2/3). (TOO_FEW_LIVE_REPLICAS) (version drift "));
        assert_eq!(TableError::new(SYNTAX_ERROR, "x").http_status(), 400);
        assert_eq!(TableError::new(UNKNOWN_TABLE, "x").http_status(), 404);
    }
}
