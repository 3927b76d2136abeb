//! Markdown notes split into chunks by heading: each chunk keeps the note's
//! path and its heading as the anchor a citation points at
//! (`notes/project.md#Open loops`).

/// Longest chunk, in characters: a longer section is split at paragraph
/// breaks (and a longer paragraph at a character boundary).
pub const CHUNK_CHARS: usize = 2000;

/// Most chunks kept of one note.
pub const MAX_CHUNKS_PER_NOTE: usize = 2000;

pub use crate::store::VaultChunk;

/// The heading of an ATX heading line (`## Open loops ##` → `Open loops`).
fn heading_of(line: &str) -> Option<&str> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    if indent > 3 {
        return None;
    }
    let rest = &line[indent..];
    let level = rest.len() - rest.trim_start_matches('#').len();
    if !(1..=6).contains(&level) {
        return None;
    }
    let rest = &rest[level..];
    if !(rest.is_empty() || rest.starts_with([' ', '\t'])) {
        return None;
    }
    let title = rest.trim();
    // A closing sequence of `#`s, preceded by a space, is not part of it.
    let title = match title.trim_end_matches('#') {
        stripped if stripped.is_empty() || stripped.ends_with([' ', '\t']) => stripped.trim_end(),
        _ => title,
    };
    Some(title)
}

/// Whether `line` opens or closes a fenced code block.
fn fence_of(line: &str) -> Option<&str> {
    let trimmed = line.trim_start();
    ["```", "~~~"]
        .into_iter()
        .find(|fence| trimmed.starts_with(fence))
}

/// The text after a YAML front matter block, if the note has one.
fn without_front_matter(text: &str) -> &str {
    let Some(rest) = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))
    else {
        return text;
    };
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        offset += line.len();
        if matches!(line.trim_end(), "---" | "...") {
            return &rest[offset..];
        }
    }
    text
}

/// Splits `body` into pieces of at most [`CHUNK_CHARS`] characters, at
/// paragraph breaks where it can.
fn split_long(body: &str) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut current = String::new();
    for paragraph in body.split("\n\n").map(str::trim).filter(|p| !p.is_empty()) {
        if !current.is_empty()
            && current.chars().count() + 2 + paragraph.chars().count() > CHUNK_CHARS
        {
            pieces.push(std::mem::take(&mut current));
        }
        if paragraph.chars().count() > CHUNK_CHARS {
            let chars: Vec<char> = paragraph.chars().collect();
            for window in chars.chunks(CHUNK_CHARS) {
                pieces.push(window.iter().collect());
            }
            continue;
        }
        if !current.is_empty() {
            current.push_str("\n\n");
        }
        current.push_str(paragraph);
    }
    if !current.is_empty() {
        pieces.push(current);
    }
    pieces
}

/// The chunks of the note at `path` (its path in the vault, `/`-separated).
pub fn chunk_note(path: &str, text: &str) -> Vec<VaultChunk> {
    let text = without_front_matter(text);
    let mut sections: Vec<(String, String)> = vec![(String::new(), String::new())];
    let mut fence: Option<&str> = None;
    for line in text.lines() {
        match (fence, fence_of(line)) {
            (None, Some(opened)) => fence = Some(opened),
            (Some(open), Some(closing)) if open == closing => fence = None,
            _ => {}
        }
        let heading = if fence.is_none() {
            heading_of(line)
        } else {
            None
        };
        match (heading, sections.last_mut()) {
            (Some(title), _) => sections.push((title.to_owned(), String::new())),
            (None, Some((_, body))) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    let mut chunks = Vec::new();
    for (heading, body) in sections {
        let anchor = if heading.is_empty() {
            path.to_owned()
        } else {
            format!("{path}#{heading}")
        };
        let mut pieces = split_long(&body);
        // A heading with nothing under it is still something to find.
        if pieces.is_empty() && !heading.is_empty() {
            pieces.push(heading.clone());
        }
        for text in pieces {
            chunks.push(VaultChunk {
                heading: heading.clone(),
                anchor: anchor.clone(),
                text,
                embedding: None,
            });
        }
    }
    chunks.truncate(MAX_CHUNKS_PER_NOTE);
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_is_split_by_heading_with_anchors() {
        let note = "---\ntitle: x\n---\nIntro line.\n\n# Project\nAbout it.\n\n## Open loops ##\n\
                    - call Anna\n\n```\n# not a heading\n```\n## Empty\n";
        let chunks = chunk_note("notes/project.md", note);
        let anchors: Vec<&str> = chunks.iter().map(|c| c.anchor.as_str()).collect();
        assert_eq!(
            anchors,
            [
                "notes/project.md",
                "notes/project.md#Project",
                "notes/project.md#Open loops",
                "notes/project.md#Empty"
            ]
        );
        assert_eq!(chunks[0].text, "Intro line.");
        assert!(
            chunks[2].text.contains("# not a heading"),
            "{:?}",
            chunks[2]
        );
        assert_eq!(chunks[3].text, "Empty");
        assert!(!chunks.iter().any(|c| c.text.contains("title: x")));
    }

    #[test]
    fn a_long_section_is_split_at_paragraphs_and_nothing_is_lost() {
        let paragraph = "word ".repeat(150);
        let body: Vec<String> = (0..10).map(|i| format!("{i} {paragraph}")).collect();
        let note = format!("# Long\n{}\n\n{}", body.join("\n\n"), "x".repeat(5000));
        let chunks = chunk_note("long.md", &note);
        assert!(chunks.len() > 3, "{}", chunks.len());
        assert!(chunks.iter().all(|c| c.text.chars().count() <= CHUNK_CHARS));
        assert!(chunks.iter().all(|c| c.anchor == "long.md#Long"));
        let total: usize = chunks.iter().map(|c| c.text.matches("word").count()).sum();
        assert_eq!(total, 1500);
        let xs: usize = chunks.iter().map(|c| c.text.matches('x').count()).sum();
        assert_eq!(xs, 5000);
    }

    #[test]
    fn what_is_not_a_heading_stays_text() {
        for line in ["#hashtag", "    # indented code", "####### seven"] {
            assert_eq!(heading_of(line), None, "{line}");
        }
        assert_eq!(heading_of("### C# notes"), Some("C# notes"));
        assert_eq!(heading_of("# Title #"), Some("Title"));
    }
}
