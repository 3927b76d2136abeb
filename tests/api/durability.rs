//! Turns that outlive a process, a database that goes away, replicas.

pub(crate) mod faults;
pub(crate) mod parked;
pub(crate) mod replicas;
pub(crate) mod steer;
pub(crate) mod takeover;
