//! drift-node: the runtime driver that turns sockets, timers and files into
//! inputs of the sans-IO node cores and executes their effects (`drift node`).
//! It has no code yet.
