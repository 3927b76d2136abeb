//! HTML to readable text: the page's words, with line breaks where its
//! blocks end, without scripts, styles or markup. Linear in the page's
//! size; no allocation beyond the text it returns.

/// Elements whose content is not text a reader sees.
const SKIPPED: &[&str] = &[
    "script", "style", "noscript", "template", "svg", "head", "iframe", "object", "canvas",
];

/// Elements that end a line.
const BLOCKS: &[&str] = &[
    "p",
    "div",
    "br",
    "hr",
    "li",
    "ul",
    "ol",
    "dl",
    "dt",
    "dd",
    "tr",
    "table",
    "section",
    "article",
    "header",
    "footer",
    "nav",
    "aside",
    "main",
    "blockquote",
    "pre",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "figure",
    "figcaption",
    "form",
    "address",
    "details",
    "summary",
];

/// The text of the page's `<title>`, if it has one.
pub fn title(html: &str) -> Option<String> {
    let lower = html.to_ascii_lowercase();
    let start = lower.find("<title")?;
    let open_end = start + lower[start..].find('>')? + 1;
    let close = open_end + lower[open_end..].find("</title")?;
    let text = decode_entities(html[open_end..close].trim());
    let text = collapse_spaces(&text);
    (!text.is_empty()).then_some(text)
}

/// The readable text of an HTML page.
pub fn to_text(html: &str) -> String {
    let mut out = String::with_capacity(html.len() / 2);
    let mut rest = html;
    while let Some(at) = rest.find('<') {
        push_text(&mut out, &rest[..at]);
        rest = &rest[at..];
        if let Some(comment) = rest.strip_prefix("<!--") {
            rest = comment.find("-->").map_or("", |end| &comment[end + 3..]);
            continue;
        }
        let Some(end) = tag_end(rest) else {
            // A `<` that opens no tag is text.
            push_text(&mut out, "<");
            rest = &rest[1..];
            continue;
        };
        let tag = &rest[1..end];
        rest = &rest[end + 1..];
        let closing = tag.starts_with('/');
        let name: String = tag
            .trim_start_matches('/')
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect::<String>()
            .to_ascii_lowercase();
        if name.is_empty() {
            continue;
        }
        if !closing && SKIPPED.contains(&name.as_str()) && !tag.ends_with('/') {
            // Everything up to the matching close is dropped.
            rest = match find_close(rest, &name) {
                Some(at) => {
                    let after = &rest[at..];
                    after.find('>').map_or("", |gt| &after[gt + 1..])
                }
                None => "",
            };
            continue;
        }
        if BLOCKS.contains(&name.as_str()) {
            out.push('\n');
            if name == "li" && !closing {
                out.push_str("- ");
            }
        } else if matches!(name.as_str(), "td" | "th") && !closing {
            out.push(' ');
        }
    }
    push_text(&mut out, rest);
    tidy(&out)
}

/// Where `</name` starts in `s`, the name in any case.
fn find_close(s: &str, name: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = s[from..].find("</") {
        let start = from + at;
        let candidate = s.as_bytes().get(start + 2..start + 2 + name.len())?;
        if candidate.eq_ignore_ascii_case(name.as_bytes()) {
            return Some(start);
        }
        from = start + 2;
    }
    None
}

/// Where the tag starting at `s[0] == '<'` ends (its `>`), quotes
/// respected; `None` when this `<` opens no tag.
fn tag_end(s: &str) -> Option<usize> {
    let first = s[1..].chars().next()?;
    if !(first.is_ascii_alphabetic() || first == '/' || first == '!' || first == '?') {
        return None;
    }
    let mut quote: Option<char> = None;
    for (i, c) in s.char_indices().skip(1) {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '>') => return Some(i),
            _ => {}
        }
    }
    None
}

fn push_text(out: &mut String, raw: &str) {
    if raw.is_empty() {
        return;
    }
    out.push_str(&decode_entities(raw));
}

/// One space for each run of spaces, tabs and line breaks.
fn collapse_spaces(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Lines with single spaces and no blank lines (a page's own spacing
/// between tags is layout, not text).
fn tidy(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines().map(collapse_spaces) {
        if line.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&line);
    }
    out
}

/// `&amp;`, `&#39;`, `&#x27;` and the common named entities.
pub fn decode_entities(text: &str) -> String {
    if !text.contains('&') {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let end = rest.find(';').filter(|&e| e <= 10);
        let decoded = end.and_then(|e| entity(&rest[1..e]));
        match (end, decoded) {
            (Some(e), Some(c)) => {
                out.push(c);
                rest = &rest[e + 1..];
            }
            _ => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn entity(name: &str) -> Option<char> {
    if let Some(number) = name.strip_prefix('#') {
        let code = match number.strip_prefix(['x', 'X']) {
            Some(hex) => u32::from_str_radix(hex, 16).ok()?,
            None => number.parse().ok()?,
        };
        return char::from_u32(code).filter(|c| *c != '\0');
    }
    Some(match name {
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        "apos" => '\'',
        "nbsp" => ' ',
        "ndash" => '–',
        "mdash" => '—',
        "hellip" => '…',
        "laquo" => '«',
        "raquo" => '»',
        "lsquo" => '‘',
        "rsquo" => '’',
        "ldquo" => '“',
        "rdquo" => '”',
        "copy" => '©',
        "reg" => '®',
        "euro" => '€',
        "middot" => '·',
        "eacute" => 'é',
        "egrave" => 'è',
        "uuml" => 'ü',
        "ouml" => 'ö',
        "auml" => 'ä',
        "szlig" => 'ß',
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_becomes_its_readable_text() {
        let page = r#"<!doctype html><html><head><title>Trains &amp; Tickets</title>
            <style>body { color: red }</style><script>var x = "<p>no</p>";</script></head>
            <body><!-- a comment --><nav><a href="/">Home</a></nav>
            <h1>Eurostar</h1><p>Book <b>early</b>: prices&nbsp;rise.</p>
            <ul><li>London</li><li>Paris &#8211; Nord</li></ul>
            <table><tr><td>a</td><td>b</td></tr></table>
            <p data-x="1 > 0">2 &lt; 3 &unknown; &#x1F600;</p></body></html>"#;
        assert_eq!(title(page).as_deref(), Some("Trains & Tickets"));
        let text = to_text(page);
        assert_eq!(
            text,
            "Home\nEurostar\nBook early: prices rise.\n- London\n- Paris – Nord\na b\n2 < 3 &unknown; 😀"
        );
        assert!(!text.contains("color") && !text.contains("var x"));
    }

    #[test]
    fn broken_markup_loses_no_text_and_ends() {
        assert_eq!(to_text("a < b and c > d"), "a < b and c > d");
        assert_eq!(to_text("<p>open <script>never closed"), "open");
        assert_eq!(to_text("text <!-- never closed"), "text");
        assert_eq!(to_text("<div title='a>b'>x</div>"), "x");
    }
}
