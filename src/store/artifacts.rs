//! The harness's artifact store, backed by the [`Store`].

use std::sync::Arc;

use async_trait::async_trait;
use chrono::Utc;
use uuid::Uuid;

use super::{NewArtifact, Store};
use crate::harness::hooks::{ArtifactStore, HookError};

/// Keeps oversized tool outputs in the `artifacts` table.
pub struct StoreArtifacts(pub Arc<dyn Store>);

#[async_trait]
impl ArtifactStore for StoreArtifacts {
    async fn put(
        &self,
        session_id: &str,
        turn_id: &str,
        call_id: &str,
        tool: &str,
        content: &str,
    ) -> Result<String, HookError> {
        let id = format!("art_{}", Uuid::now_v7().simple());
        self.0
            .put_artifact(&NewArtifact {
                id: id.clone(),
                session_id: session_id.to_owned(),
                turn_id: turn_id.to_owned(),
                call_id: call_id.to_owned(),
                tool: tool.to_owned(),
                content: content.to_owned(),
                created_at: Utc::now(),
            })
            .await
            .map_err(HookError::new)?;
        Ok(id)
    }
}
