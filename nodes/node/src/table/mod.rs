//! The replicated table in the node: a replica of each declared table,
//! coordinated through the keeper (or Apache ZooKeeper) over the
//! ZooKeeper protocol, with ClickHouse's HTTP interface.

pub mod decl;
pub mod error;
pub mod formats;
pub mod query;
pub mod select;
