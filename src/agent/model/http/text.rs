//! Error text fit for a message: an endpoint's error body reduced to one
//! line, a transport error without its URL, a long text cut short.

/// Longest error body excerpt kept in an error message.
const ERROR_EXCERPT: usize = 300;
/// Longest error line kept from an endpoint's error body.
const ERROR_LINE: usize = 200;

/// An error body as one line of at most [`ERROR_LINE`] characters: markup
/// (an HTML error page) dropped, entities of the common kind decoded,
/// whitespace and control characters collapsed.
pub(in crate::agent::model) fn one_line(body: &str) -> String {
    let mut text = String::with_capacity(body.len().min(4 * ERROR_LINE));
    let mut in_tag = false;
    let mut skipping = None::<&str>; // inside <script> or <style>
    let lower = body.to_ascii_lowercase();
    let mut index = 0;
    for (at, c) in body.char_indices() {
        if at < index {
            continue;
        }
        if let Some(end) = skipping {
            if lower[at..].starts_with(end) {
                skipping = None;
                index = at + end.len();
            }
            continue;
        }
        match c {
            '<' => {
                in_tag = true;
                if lower[at..].starts_with("<script") {
                    skipping = Some("</script>");
                } else if lower[at..].starts_with("<style") {
                    skipping = Some("</style>");
                }
                text.push(' ');
            }
            '>' if in_tag => in_tag = false,
            _ if in_tag => {}
            c if c.is_control() || c.is_whitespace() => text.push(' '),
            c => text.push(c),
        }
        if text.len() > 8 * ERROR_LINE {
            break;
        }
    }
    let text = text
        .replace("&nbsp;", " ")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&");
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match collapsed.char_indices().nth(ERROR_LINE) {
        Some((cut, _)) => format!("{}…", &collapsed[..cut]),
        None => collapsed,
    }
}

/// A transport error without the request URL (it may carry credentials).
pub(in crate::agent::model) fn describe(error: &reqwest::Error) -> String {
    let kind = if error.is_connect() {
        "connection failed"
    } else if error.is_timeout() {
        "timed out"
    } else if error.is_body() || error.is_decode() {
        "the response body broke off"
    } else {
        "request failed"
    };
    let mut source = std::error::Error::source(error);
    let mut detail = String::new();
    while let Some(cause) = source {
        detail = cause.to_string();
        source = cause.source();
    }
    if detail.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}: {}", excerpt(&detail))
    }
}

pub(in crate::agent::model) fn excerpt(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(ERROR_EXCERPT) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}
