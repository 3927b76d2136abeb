//! A turn's images and files, made files of its tenant before it begins
//! (inline data and URLs stored as files of the session, the same bytes
//! once), checked against what its model reads, and loaded for its calls.
//! The request the turn keeps names files, never bytes.

use base64::Engine as _;

use super::{StartError, TurnRunner};
use crate::{
    files::{self, FileError, Kind, NewFile, Spool},
    ids::SessionKey,
    providers::Attachment,
    store::{FileRecord, StoreError},
    turn::{AskedKind, Source, TurnRequest},
};

/// The files a resolution stored for the turn (to take back if it does
/// not begin).
pub(super) type Made = Vec<String>;

impl TurnRunner {
    /// Makes every attachment of `spec` a file of `session`'s tenant and
    /// checks it against the turn's model; the files it stored.
    pub(super) async fn resolve_attachments(
        &self,
        session: &SessionKey,
        spec: &mut TurnRequest,
    ) -> Result<Made, StartError> {
        let mut made = Vec::new();
        if spec.attachments.is_empty() {
            return Ok(made);
        }
        let (model, reads) = self.inner.harness.reads(spec);
        let mut attachments = std::mem::take(&mut spec.attachments);
        let resolved = async {
            for (at, asked) in attachments.iter_mut().enumerate() {
                let field = asked.field_or(at);
                let file = self.file_of(session, &field, asked, &mut made).await?;
                let kind = files::kind_of(&file.media_type);
                if asked.kind == AskedKind::Image && kind != Some(Kind::Image) {
                    return Err(StartError::InvalidAttachment {
                        field,
                        detail: format!("an image part names a file of {}", file.media_type),
                    });
                }
                let what = match kind {
                    Some(Kind::Image) if !reads.image => Some("images"),
                    Some(Kind::Pdf) if !reads.pdf => Some("PDFs"),
                    _ => None,
                };
                if let Some(what) = what {
                    return Err(StartError::UnsupportedContent {
                        model: model.clone(),
                        what,
                    });
                }
                // Kept for the provider that takes it
                // (`HARNESS_FILE_URLS=pass`): an image's alone.
                if let Source::Url(url) = &asked.source
                    && kind == Some(Kind::Image)
                    && self.inner.config.policy.pass_urls
                {
                    asked.url = Some(url.clone());
                }
                asked.source = Source::FileId(file.id);
                asked.filename = Some(asked.filename.take().unwrap_or(file.filename));
            }
            Ok(())
        }
        .await;
        spec.attachments = attachments;
        match resolved {
            Ok(()) => Ok(made),
            Err(e) => {
                self.take_back(session, &made).await;
                Err(e)
            }
        }
    }

    /// Deletes the files a resolution made, when its turn did not begin.
    pub(super) async fn take_back(&self, session: &SessionKey, made: &[String]) {
        for id in made {
            if let Err(e) = self.inner.store.delete_file(session.tenant(), id).await {
                tracing::warn!(error = %e, file = %id, "an inline file was left");
            }
        }
    }

    /// The file an attachment is, stored first when it came inline or by
    /// URL.
    async fn file_of(
        &self,
        session: &SessionKey,
        at: &str,
        asked: &crate::turn::Asked,
        made: &mut Made,
    ) -> Result<FileRecord, StartError> {
        let store = &self.inner.store;
        let tenant = session.tenant();
        let (declared, spooled) = match &asked.source {
            Source::FileId(id) => {
                return store
                    .file(tenant, id)
                    .await?
                    .ok_or_else(|| StartError::FileNotFound(id.clone()));
            }
            Source::Data { media_type, data } => {
                (Some(media_type.as_str()), self.decoded(at, data).await?)
            }
            Source::Url(url) => (None, self.fetched(at, url).await?),
        };
        // The same bytes the session already has inline are that file:
        // a request sent again names the same files.
        if let Some(file) = store
            .session_files(session.as_str())
            .await?
            .into_iter()
            .find(|f| f.sha256 == spooled.sha256)
        {
            return Ok(file);
        }
        let default_name = match asked.kind {
            AskedKind::Image => "image",
            AskedKind::File => "file",
        };
        let new = NewFile {
            tenant,
            filename: files::clean_filename(asked.filename.as_deref().unwrap_or(default_name)),
            purpose: "inline",
            declared,
            session_id: Some(session.as_str().to_owned()),
            user_id: None,
        };
        let limits = self.inner.config.policy.files;
        let file = files::put(store.as_ref(), limits, new, &spooled)
            .await
            .map_err(|error| attachment_error(at, error))?;
        made.push(file.id.clone());
        Ok(file)
    }

    /// Inline base64 data, spooled.
    async fn decoded(&self, at: &str, data: &str) -> Result<files::Spooled, StartError> {
        let invalid = |detail: &str| StartError::InvalidAttachment {
            field: at.to_owned(),
            detail: detail.to_owned(),
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|_| invalid("its `data` is not base64"))?;
        let limits = self.inner.config.policy.files;
        let mut spool = Spool::new(limits.max_bytes).map_err(|e| attachment_error(at, e))?;
        spool
            .write(&bytes)
            .await
            .map_err(|e| attachment_error(at, e))?;
        spool.finish().await.map_err(|e| attachment_error(at, e))
    }

    /// An `https` URL's bytes, fetched through the outbound guard within
    /// the file limit.
    async fn fetched(&self, at: &str, url: &str) -> Result<files::Spooled, StartError> {
        use futures::StreamExt as _;
        let invalid = |detail: String| StartError::InvalidAttachment {
            field: at.to_owned(),
            detail,
        };
        let Some(outbound) = &self.inner.outbound else {
            return Err(invalid(
                "URLs cannot be fetched here: send the bytes".into(),
            ));
        };
        let url = outbound
            .checked(url)
            .map_err(|why| invalid(format!("its URL is refused: {why}")))?;
        let response = outbound.client.get(url).send().await.map_err(|e| {
            invalid(format!(
                "its URL could not be fetched: {}",
                crate::outbox::unreachable(e)
            ))
        })?;
        if !response.status().is_success() {
            return Err(invalid(format!(
                "its URL answered {}",
                response.status().as_u16()
            )));
        }
        let limits = self.inner.config.policy.files;
        let mut spool = Spool::new(limits.max_bytes).map_err(|e| attachment_error(at, e))?;
        let mut body = response.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| {
                invalid(format!(
                    "its URL could not be read: {}",
                    crate::outbox::unreachable(e)
                ))
            })?;
            spool
                .write(&chunk)
                .await
                .map_err(|e| attachment_error(at, e))?;
        }
        spool.finish().await.map_err(|e| attachment_error(at, e))
    }

    /// A turn's attachments with their bytes, as its calls send them
    /// (its request names files alone).
    pub(super) async fn load_attachments(
        &self,
        session: &SessionKey,
        spec: &TurnRequest,
    ) -> Result<Vec<Attachment>, StoreError> {
        let store = self.inner.store.as_ref();
        let mut loaded = Vec::with_capacity(spec.attachments.len());
        for asked in &spec.attachments {
            let Source::FileId(id) = &asked.source else {
                return Err(StoreError::Corrupt(
                    "an attachment was not made a file".into(),
                ));
            };
            let file = store
                .file(session.tenant(), id)
                .await?
                .ok_or_else(|| StoreError::Corrupt(format!("the turn's file {id} is gone")))?;
            let bytes = files::read_all(store, &file).await?;
            loaded.push(files::attachment(asked, file, bytes));
        }
        Ok(loaded)
    }
}

/// Images and PDFs of earlier messages sent again at most, the newest.
pub const EARLIER_MAX: usize = 8;

impl TurnRunner {
    /// A session's stored history as the model reads it: each user
    /// message with the images and PDFs it carried (loaded: the newest
    /// [`EARLIER_MAX`]), an older one, a deleted one or a text file named
    /// in its text instead; and those loaded (a call after a take-over
    /// gets their bytes from them).
    pub(super) async fn history_of(
        &self,
        session: &SessionKey,
        records: Vec<crate::store::MessageRecord>,
    ) -> Result<(Vec<crate::providers::ChatMessage>, Vec<Attachment>), StoreError> {
        use crate::providers::{ChatMessage, Role};
        let store = self.inner.store.as_ref();
        let mut loaded: Vec<Attachment> = Vec::new();
        let mut messages = Vec::with_capacity(records.len());
        for record in records.into_iter().rev() {
            let Some(role) = record
                .role
                .parse::<Role>()
                .ok()
                .filter(|r| r.is_conversational())
            else {
                continue;
            };
            let mut message = ChatMessage::new(role, record.content);
            let asked: Vec<crate::turn::Asked> = record
                .attachments
                .as_deref()
                .and_then(|json| serde_json::from_str(json).ok())
                .unwrap_or_default();
            let mut left_out = 0;
            for asked in asked.into_iter().rev() {
                let Source::FileId(id) = &asked.source else {
                    continue;
                };
                let file = store.file(session.tenant(), id).await?;
                let Some(file) = file.filter(|f| !files::is_text(&f.media_type)) else {
                    left_out += 1;
                    continue;
                };
                if loaded.len() >= EARLIER_MAX {
                    left_out += 1;
                    continue;
                }
                let bytes = files::read_all(store, &file).await?;
                let attachment = files::attachment(&asked, file, bytes);
                loaded.push(attachment.clone());
                message.attachments.insert(0, attachment);
            }
            if left_out > 0 {
                message.content.push_str(&format!(
                    "\n[{left_out} file(s) the user attached here are not shown again]"
                ));
            }
            messages.push(message);
        }
        messages.reverse();
        Ok((messages, loaded))
    }
}

fn attachment_error(at: &str, error: FileError) -> StartError {
    match error {
        FileError::Store(e) => StartError::Store(e),
        error => StartError::Attachment {
            field: at.to_owned(),
            error,
        },
    }
}
