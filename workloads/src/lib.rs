//! drift-workloads: generators and clients for the znode, insert-retry and
//! delete workloads `drift test` drives. It has no code yet.
