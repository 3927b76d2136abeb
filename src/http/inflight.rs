//! How many requests a tenant may hold open in this process.
//!
//! A request holds a permit from the moment it is admitted until its
//! response body ends: an event stream holds it as long as it is open, a
//! queued start (`multitask: "enqueue"`) while it waits, a JSON caller
//! while its turn runs. Each tenant may hold its `max_streams`
//! (`HARNESS_TENANT_MAX_STREAMS`, or its own limit); past it, 429
//! `too_many_streams` at once. All tenants together may hold all the
//! connections but [`reserved`] of them, so that `/healthz`, `/readyz`
//! and `/metrics` always find a connection: the connection loop gives a
//! new connection the slot of one without a request in flight, and the
//! reserved ones never have a tenant's.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use axum::{
    extract::{Request, State},
    middleware::Next,
    response::Response,
};

use super::OPEN_PATHS;
use crate::app::AppState;
use crate::ids::Tenant;
use crate::protocols::error::ApiError;

/// The connections kept from tenants' requests out of `max_connections`.
pub(super) fn reserved(max_connections: usize) -> usize {
    (max_connections / 64)
        .clamp(2, 64)
        .min(max_connections.saturating_sub(1))
}

/// The requests each tenant holds, and all of them.
pub(super) struct InFlight {
    held: Mutex<Held>,
    /// What all tenants together may hold.
    most: usize,
}

#[derive(Default)]
struct Held {
    /// By tenant; a tenant that holds none has no entry (at most as many
    /// entries as requests in flight).
    by_tenant: HashMap<String, u32>,
    total: usize,
}

impl InFlight {
    pub(super) fn new(max_connections: usize) -> Arc<Self> {
        Arc::new(Self {
            held: Mutex::new(Held::default()),
            most: max_connections
                .saturating_sub(reserved(max_connections))
                .max(1),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `tenant` may have one more request (`most` its own limit).
    pub(super) fn check(&self, tenant: &str, most: u32) -> Result<(), ApiError> {
        Self::room(&self.lock(), self.most, tenant, most).map(|_| ())
    }

    /// The requests `tenant` holds, if it may have one more.
    fn room(held: &Held, all: usize, tenant: &str, most: u32) -> Result<u32, ApiError> {
        if held.total >= all {
            return Err(ApiError::TooManyStreams(
                "every connection left for requests is taken; retry in a moment".into(),
            ));
        }
        let mine = held.by_tenant.get(tenant).copied().unwrap_or(0);
        if mine >= most {
            return Err(ApiError::TooManyStreams(format!(
                "this tenant has {mine} requests open, as many as it may \
                 (HARNESS_TENANT_MAX_STREAMS); close one or retry when one ends"
            )));
        }
        Ok(mine)
    }

    /// A permit for one more request of `tenant`, if it may have one.
    fn take(self: &Arc<Self>, tenant: &str, most: u32) -> Result<Permit, ApiError> {
        let mut held = self.lock();
        let mine = Self::room(&held, self.most, tenant, most)?;
        held.by_tenant.insert(tenant.to_owned(), mine + 1);
        held.total += 1;
        Ok(Permit {
            of: self.clone(),
            tenant: tenant.to_owned(),
        })
    }
}

/// One admitted request; given back when dropped.
struct Permit {
    of: Arc<InFlight>,
    tenant: String,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("tenant", &self.tenant)
            .finish_non_exhaustive()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut held = self.of.lock();
        held.total = held.total.saturating_sub(1);
        if let Some(mine) = held.by_tenant.get_mut(&self.tenant) {
            *mine = mine.saturating_sub(1);
            if *mine == 0 {
                held.by_tenant.remove(&self.tenant);
            }
        }
    }
}

/// The requests `tenant` may hold open in this process.
pub(super) async fn max_streams(app: &AppState, tenant: &str) -> Result<u32, ApiError> {
    Ok(app
        .runner
        .tenant_limits(tenant)
        .await?
        .max_streams
        .unwrap_or(u32::MAX))
}

/// Admits a tenant's request if it may hold one more (see the module);
/// the permit lives as long as the response's body.
pub(super) async fn admit(
    State((app, in_flight)): State<(AppState, Arc<InFlight>)>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let tenant = request.extensions().get::<Tenant>().map(|t| t.0.clone());
    let Some(tenant) = tenant.filter(|_| !OPEN_PATHS.contains(&request.uri().path())) else {
        return Ok(next.run(request).await);
    };
    let most = max_streams(&app, &tenant).await?;
    let permit = in_flight.take(&tenant, most)?;
    let response = next.run(request).await;
    Ok(response.map(|body| super::server::Holding::body(body, permit)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_holds_its_share_and_all_leave_the_reserve() {
        let in_flight = InFlight::new(10);
        assert_eq!(reserved(10), 2);
        let a: Vec<Permit> = (0..3).map(|_| in_flight.take("a", 3).unwrap()).collect();
        assert_eq!(
            in_flight.take("a", 3).unwrap_err().code(),
            "too_many_streams"
        );
        let b: Vec<Permit> = (0..5).map(|_| in_flight.take("b", 100).unwrap()).collect();
        // 8 of 10 held: the last two are the probes'.
        assert_eq!(
            in_flight.take("c", 100).unwrap_err().code(),
            "too_many_streams"
        );
        drop(a);
        assert!(in_flight.take("a", 3).is_ok());
        drop(b);
        assert!(in_flight.lock().by_tenant.is_empty(), "given back");
        assert_eq!(in_flight.lock().total, 0);
    }
}
