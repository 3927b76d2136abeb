//! # harness-protocols
//!
//! The protocols a turn is asked and answered in. They reach turns and
//! sessions through the turn service (`harness_core::service`) alone:
//! this crate does not depend on the store's, so the compiler holds
//! that rule.

use harness_base::{events, ids, providers, turn};
use harness_core::{config, files, metrics, outbox, service, tools, vault};

pub mod protocols;
