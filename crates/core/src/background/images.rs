//! The images and PDFs of the turn a job reads, for the operator who lets
//! memory extraction or the judges see them (`HARNESS_MEMORY_IMAGES`,
//! `HARNESS_JUDGES_IMAGES`); otherwise a job reads the text alone.

use uuid::Uuid;

use crate::{
    files,
    ids::SessionKey,
    providers::Attachment,
    store::{Store, StoreError},
    turn::Source,
};

/// Images and PDFs a job is shown at most: the turn's first.
pub const JOB_IMAGES_MAX: usize = 8;

/// Which jobs see the images of the turn they read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobImages {
    pub memory: bool,
    pub judges: bool,
}

/// The images and PDFs the user's message of `turn_id` carried, with
/// their bytes (a file deleted since, and a text file, left out: its
/// text was read in its own turn), at most [`JOB_IMAGES_MAX`].
pub async fn of_turn(
    store: &dyn Store,
    session_id: &str,
    turn_id: &str,
) -> Result<Vec<Attachment>, StoreError> {
    let session = SessionKey::from_stored(session_id);
    let Ok(turn_id) = Uuid::parse_str(turn_id) else {
        return Ok(Vec::new());
    };
    let Some(turn) = store.get_turn(&session, turn_id).await? else {
        return Ok(Vec::new());
    };
    let mut loaded = Vec::new();
    for asked in &turn.request.attachments {
        if loaded.len() >= JOB_IMAGES_MAX {
            break;
        }
        let Source::FileId(id) = &asked.source else {
            continue;
        };
        let Some(file) = store.file(session.tenant(), id).await? else {
            continue;
        };
        if files::is_text(&file.media_type) {
            continue;
        }
        let bytes = files::read_all(store, &file).await?;
        loaded.push(files::attachment(asked, file, bytes));
    }
    Ok(loaded)
}
