//! HTML: escaping, the page around every view, and the style sheet.
//!
//! Pages are server-rendered, work without JavaScript (there is none: the content security policy
//! forbids scripts), fit a phone's width, and keep to WCAG AA contrast with visible focus.

use std::fmt::Write as _;

/// Text made safe inside HTML elements and quoted attributes; control characters and the
/// Unicode direction controls shown as escapes (`\u{202e}`).
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Direction overrides and isolates too, as the CLI's `printable`: a key that reads
            // `invoice:cust_481` must not be `invoice:\u{202e}184_tsuc`.
            c if c.is_control()
                || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}') =>
            {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// A value for a URL's query string.
pub fn url_value(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// Which part of the site a page belongs to, for the navigation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// The overview.
    Overview,
    /// Keys: list and look up.
    Keys,
    /// Look a key up.
    Lookup,
    /// The outbox.
    Outbox,
    /// Logging in.
    Login,
}

/// What the page around a view shows.
pub struct Frame<'a> {
    /// The page's title.
    pub title: &'a str,
    /// Where in the site.
    pub section: Section,
    /// The database, as shown (no password).
    pub database: &'a str,
    /// Whether writes are allowed.
    pub writes: bool,
    /// The session's CSRF token, when logged in with a session (for the log-out form).
    pub csrf: Option<&'a str>,
    /// Refresh the page by itself every this many seconds.
    pub refresh: Option<u32>,
}

/// A whole page: head, navigation, the view's HTML, footer.
pub fn page(frame: &Frame<'_>, body: &str) -> String {
    let refresh = frame
        .refresh
        .map(|s| format!("<meta http-equiv=\"refresh\" content=\"{s}\">"))
        .unwrap_or_default();
    let nav = if frame.section == Section::Login {
        String::new()
    } else {
        nav(frame)
    };
    let mode = if frame.writes {
        "<span class=\"badge writes\">writes allowed</span>"
    } else {
        "<span class=\"badge\">read-only</span>"
    };
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">{refresh}\
<title>{title} · idempotent-jobs</title><link rel=\"stylesheet\" href=\"/static/app.css\"></head>\
<body><a class=\"skip\" href=\"#main\">Skip to content</a>\
<header><div class=\"brand\">idempotent-jobs</div>{nav}</header>\
<main id=\"main\"><h1>{title}</h1>{body}</main>\
<footer><span>{mode}</span> <span class=\"db\">database: <code>{database}</code></span></footer>\
</body></html>\n",
        title = esc(frame.title),
        database = esc(frame.database),
    )
}

/// The navigation bar, with the log-out form.
fn nav(frame: &Frame<'_>) -> String {
    let mut out = String::from("<nav aria-label=\"Main\"><ul>");
    for (section, href, label) in [
        (Section::Overview, "/", "Overview"),
        (Section::Keys, "/keys", "Keys"),
        (Section::Lookup, "/lookup", "Look up"),
        (Section::Outbox, "/outbox", "Outbox"),
    ] {
        let current = if frame.section == section {
            " aria-current=\"page\""
        } else {
            ""
        };
        let _ = write!(out, "<li><a href=\"{href}\"{current}>{label}</a></li>");
    }
    out.push_str("</ul>");
    if let Some(csrf) = frame.csrf {
        let _ = write!(
            out,
            "<form method=\"post\" action=\"/logout\" class=\"logout\">{}<button type=\"submit\">Log out</button></form>",
            csrf_field(csrf)
        );
    }
    out.push_str("</nav>");
    out
}

/// The hidden field that carries the session's CSRF token.
pub fn csrf_field(csrf: &str) -> String {
    format!(
        "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        esc(csrf)
    )
}

/// A notice box (`role=status`), or an error box (`role=alert`): the text escaped, its lines shown
/// as lines.
pub fn notice(text: &str, error: bool) -> String {
    // An error of several lines (the operation's, then what `verify` finds) shows them as lines,
    // each escaped.
    let lines = text.lines().map(esc).collect::<Vec<_>>().join("<br>");
    if error {
        format!("<div class=\"notice error\" role=\"alert\">{lines}</div>")
    } else {
        format!("<div class=\"notice\" role=\"status\">{lines}</div>")
    }
}

/// A table: a caption, headers, and rows of cells already HTML.
pub fn table(caption: &str, headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!(
        "<div class=\"scroll\" tabindex=\"0\" role=\"region\" aria-label=\"{c}\"><table><caption>{c}</caption><thead><tr>",
        c = esc(caption)
    );
    for header in headers {
        let _ = write!(out, "<th scope=\"col\">{}</th>", esc(header));
    }
    out.push_str("</tr></thead><tbody>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>");
    out
}

/// The style sheet: system fonts, a readable measure, tables that scroll sideways on a phone,
/// AA contrast (text #1a1a1a on white, links #0b57d0), a visible focus ring.
pub const CSS: &str = r#":root{color-scheme:light;--fg:#1a1a1a;--muted:#4a4a4a;--line:#c8c8c8;--link:#0b57d0;--bg2:#f3f4f6;--bad:#a50e0e;--ok:#0d652d}
*{box-sizing:border-box}
body{margin:0;font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:#fff}
a{color:var(--link)}
:focus-visible{outline:3px solid #e37400;outline-offset:2px}
.skip{position:absolute;left:-999px}.skip:focus{left:8px;top:8px;background:#fff;padding:4px 8px}
header{display:flex;flex-wrap:wrap;align-items:center;gap:.5rem 1.5rem;padding:.5rem 1rem;border-bottom:1px solid var(--line);background:var(--bg2)}
.brand{font-weight:700}
nav{display:flex;flex-wrap:wrap;align-items:center;gap:.5rem;flex:1}
nav ul{display:flex;flex-wrap:wrap;gap:.25rem 1rem;list-style:none;margin:0;padding:0;flex:1}
nav a{display:inline-block;padding:.4rem .2rem;text-decoration:none;font-weight:600}
nav a[aria-current=page]{text-decoration:underline;text-underline-offset:4px;text-decoration-thickness:3px}
main{max-width:72rem;margin:0 auto;padding:1rem}
h1{font-size:1.5rem;margin:.5rem 0 1rem}h2{font-size:1.2rem;margin:1.5rem 0 .5rem}
footer{max-width:72rem;margin:2rem auto;padding:1rem;color:var(--muted);border-top:1px solid var(--line);display:flex;flex-wrap:wrap;gap:1rem}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.9em;word-break:break-all}
.scroll{overflow-x:auto;margin:.5rem 0 1rem}
table{border-collapse:collapse;min-width:100%}
caption{text-align:left;font-weight:600;padding:.25rem 0}
th,td{border-bottom:1px solid var(--line);padding:.4rem .6rem;text-align:left;vertical-align:top}
th{background:var(--bg2)}
td.num,th.num{text-align:right}
form.card,.card{border:1px solid var(--line);border-radius:6px;padding:1rem;margin:1rem 0}
label{display:block;font-weight:600;margin:.5rem 0 .25rem}
.hint{color:var(--muted);font-size:.9rem;margin:.25rem 0}
input[type=text],input[type=password],input[type=search],textarea,select{width:100%;max-width:40rem;font:inherit;padding:.5rem;border:1px solid #767676;border-radius:4px}
button{font:inherit;font-weight:600;padding:.5rem 1rem;border-radius:4px;border:1px solid #0b57d0;background:#0b57d0;color:#fff;cursor:pointer;margin-top:.5rem}
button.danger{background:var(--bad);border-color:var(--bad)}
button.secondary{background:#fff;color:#0b57d0}
.logout button{margin:0;padding:.3rem .8rem;background:#fff;color:#0b57d0}
.check{display:flex;gap:.5rem;align-items:flex-start;font-weight:400}
.notice{border-left:4px solid var(--ok);background:#e6f4ea;padding:.75rem 1rem;margin:1rem 0}
.notice.error{border-color:var(--bad);background:#fce8e6}
.badge{display:inline-block;padding:.1rem .5rem;border-radius:999px;border:1px solid var(--muted)}
.badge.writes{border-color:var(--bad);color:var(--bad);font-weight:600}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(10rem,1fr));gap:.75rem;margin:1rem 0}
.stat{border:1px solid var(--line);border-radius:6px;padding:.75rem}.stat b{display:block;font-size:1.6rem}
figure{margin:1rem 0}figcaption{font-weight:600}
svg.chart{width:100%;height:auto;max-height:16rem;background:#fff}
.legend{display:flex;flex-wrap:wrap;gap:.25rem 1rem;list-style:none;padding:0;margin:.25rem 0}
.swatch{display:inline-block;width:.9rem;height:.9rem;margin-right:.3rem;vertical-align:-.1rem;border:1px solid #0003}
pre{white-space:pre-wrap;word-break:break-all;margin:0}
.inline{display:inline}
@media (max-width:40rem){main{padding:.75rem}th,td{padding:.35rem .4rem}h1{font-size:1.3rem}}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        assert_eq!(
            esc("<a href=\"x\">'&'\n"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;\\u{a}"
        );
        assert_eq!(url_value("invoice:a b/c"), "invoice%3Aa+b%2Fc");
    }

    /// A notice of several lines (an error, then what `verify` finds) shows them as lines, each
    /// escaped: it showed a literal `\u{a}` between them.
    #[test]
    fn notices_show_their_lines_as_lines() {
        assert_eq!(
            notice("failed <x>\nand verify finds: a & b\n  - c\u{1b}", true),
            "<div class=\"notice error\" role=\"alert\">failed &lt;x&gt;<br>and verify finds: a &amp; b<br>  - c\\u{1b}</div>"
        );
        assert!(!notice("a\nb", false).contains("\\u{a}"));
    }

    #[test]
    fn direction_controls_are_shown_as_the_cli_shows_them() {
        assert_eq!(
            esc("invoice:\u{202E}184_tsuc \u{202a}\u{2066}\u{2069}"),
            "invoice:\\u{202e}184_tsuc \\u{202a}\\u{2066}\\u{2069}"
        );
        assert_eq!(esc("\u{202E}x"), crate::table::printable("\u{202E}x"));
    }
}
