//! What a task's log pushes to its configurations (the outbox delivers
//! it: [`crate::outbox::pushes`]): its status updates as they come (text
//! deltas are not pushed), and before the end, the answer as one whole
//! artifact each.

use serde_json::Value;
use uuid::Uuid;

use crate::{
    events::StoredEvent,
    ids::SessionKey,
    outbox::pushes::{PushFold, Said, TaskPushes},
    protocols::{
        a2a::{task::TaskFold, wire::StreamResponse},
        jsonrpc::to_value,
        typed,
    },
};

/// A2A's pushes.
pub struct A2aPushes;

impl TaskPushes for A2aPushes {
    fn fold(&self, task_id: Uuid, session: &SessionKey, after: i64) -> Box<dyn PushFold> {
        Box::new(TaskPushFold {
            fold: TaskFold::new(task_id.to_string(), session.id().to_owned()),
            after,
            said: Said::default(),
        })
    }
}

/// The pushes of each event of a task's log after `after`.
struct TaskPushFold {
    fold: TaskFold,
    after: i64,
    said: Said,
}

impl PushFold for TaskPushFold {
    fn feed(&mut self, stored: &StoredEvent) -> bool {
        let Some(event) = typed(stored) else {
            return self.fold.ended();
        };
        let said = self.fold.event(stored, event);
        if stored.seq > self.after {
            let mut pushes = Vec::new();
            for update in said {
                match update {
                    StreamResponse::ArtifactUpdate(_) => continue,
                    StreamResponse::StatusUpdate(_) if self.fold.ended() => {
                        pushes.extend(self.whole_answer());
                    }
                    _ => {}
                }
                pushes.push(to_value(&update));
            }
            self.said.events.push((stored.seq, pushes));
        }
        self.fold.ended()
    }

    fn said(self: Box<Self>) -> Said {
        let ended = self.fold.ended();
        Said { ended, ..self.said }
    }
}

impl TaskPushFold {
    /// The task's artifacts, each whole.
    fn whole_answer(&self) -> Vec<Value> {
        let task = self.fold.task(None);
        task.artifacts
            .into_iter()
            .flatten()
            .map(|artifact| to_value(&self.fold.artifact_update(artifact, false, true)))
            .collect()
    }
}
