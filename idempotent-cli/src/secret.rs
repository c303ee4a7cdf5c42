//! Finding the secrets in a database URL or a libpq connection string, and hiding them.
//!
//! Three forms hold a password: the user info of a URL (`postgres://app:PASSWORD@db/main`), a
//! query parameter (`?password=PASSWORD`, also `sslpassword`), and a `password=` pair of a libpq
//! key=value string (`host=db password='PASSWORD'`). [`redact_url`] and [`redact_conninfo`] read
//! those forms exactly, for the URL the CLI was given; [`scrub_text`] finds them in any text (a
//! clap message quoting a mistyped argument, a driver's error), as a last line of defence for
//! everything the CLI prints on stderr.

/// What a URL or connection string holds, read apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redacted {
    /// The text to show: every secret replaced by `***`.
    pub shown: String,
    /// The text to give the driver: the password percent-encoded where it was not, so that the
    /// driver reads it whole (and never quotes a piece of it back in an error).
    pub driver: String,
    /// Every secret, as written, percent-decoded and re-encoded, longest first.
    pub secrets: Vec<String>,
}

/// Why a connection string cannot be read (no part of it is quoted: it may hold a password).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable(pub String);

/// The keywords of a libpq connection string: text starting with one of these and `=` is one.
pub const LIBPQ_KEYWORDS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "channel_binding",
    "connect_timeout",
    "client_encoding",
    "options",
    "application_name",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "replication",
    "gssencmode",
    "sslmode",
    "sslnegotiation",
    "sslcompression",
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslcertmode",
    "sslrootcert",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "requirepeer",
    "require_auth",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "service",
    "target_session_attrs",
    "load_balance_hosts",
];

/// The parameters of the MySQL client's URLs and of SQLite's `file:` URIs.
const OTHER_PARAMETERS: &[&str] = &[
    "unix_socket",
    "ssl_mode",
    "ssl_ca",
    "ssl_cert",
    "ssl_key",
    "mode",
    "cache",
    "immutable",
    "vfs",
    "psow",
    "nolock",
];

/// Whether the value of a parameter of this name is hidden: a secret, or a name no driver knows
/// (a misspelt `password`, say).
fn is_hidden_name(name: &str) -> bool {
    let name = name.trim();
    is_secret_name(name) || !(LIBPQ_KEYWORDS.contains(&name) || OTHER_PARAMETERS.contains(&name))
}

/// Whether a parameter of this name holds a secret.
pub fn is_secret_name(name: &str) -> bool {
    let name = name.trim().to_ascii_lowercase();
    ["passw", "pwd", "secret", "token"]
        .iter()
        .any(|part| name.contains(part))
        || name == "pass"
}

/// Reads a URL (`scheme://[user[:password]@]host...`): its password hidden, and percent-encoded
/// for the driver.
pub fn redact_url(url: &str) -> Redacted {
    let mut secrets = Vec::new();
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return Redacted {
            shown: url.to_owned(),
            driver: url.to_owned(),
            secrets,
        };
    };
    let (scheme, rest) = url.split_at(scheme_end);
    let (mut shown, mut driver) = (scheme.to_owned(), scheme.to_owned());
    let after_userinfo = match userinfo_end(rest) {
        Some(at) => {
            let userinfo = &rest[..at];
            let (user, password) = match userinfo.split_once(':') {
                Some((user, password)) => (user, Some(password)),
                None => (userinfo, None),
            };
            shown.push_str(user);
            driver.push_str(&encode_component(user));
            if let Some(password) = password {
                shown.push_str(":***");
                driver.push(':');
                driver.push_str(&encode_component(password));
                add_secret(&mut secrets, password);
            }
            shown.push('@');
            driver.push('@');
            &rest[at + 1..]
        }
        None => rest,
    };
    match after_userinfo.split_once('?') {
        Some((base, query)) => {
            shown.push_str(base);
            driver.push_str(base);
            shown.push('?');
            driver.push('?');
            let (shown_query, driver_query) = redact_query(query, &mut secrets);
            shown.push_str(&shown_query);
            driver.push_str(&driver_query);
        }
        None => {
            shown.push_str(after_userinfo);
            driver.push_str(after_userinfo);
        }
    }
    finish(shown, driver, secrets)
}

/// Where the user info after `scheme://` ends (the index of its `@`), if there is one.
///
/// An empty authority (`file:///path`, `postgres:///db?host=/tmp`) has none. Otherwise it ends at
/// the first `@` that a host, a path and a query follow ([`is_host_path_query`]): a raw password
/// may hold `@`, `/`, `?`, `:` or spaces, and a query value or a path an `@`
/// (`?application_name=ops/x@h`, `?ssl_ca=/etc/x@y`). Failing that, at the last `@`, which hides
/// too much rather than too little.
fn userinfo_end(rest: &str) -> Option<usize> {
    // No authority (`scheme:///path`), or one that reads whole as a host, a path and a query: no
    // user info, whatever `@` the query holds (`postgres://db/app?application_name=deploy@ci`
    // went to host `ci` as user `db/app?application_name=deploy`).
    if rest.starts_with('/') || is_host_path_query(rest) {
        return None;
    }
    rest.match_indices('@')
        .map(|(at, _)| at)
        .find(|&at| is_host_path_query(&rest[at + 1..]))
        .or_else(|| rest.rfind('@'))
}

/// Whether `text` reads as what follows a URL's user info: `host [/path] [?query]`, the hosts
/// ([`is_host_list`]) without `@`, `/` or `?`, the path one segment without `@`, the query empty
/// or `&`-separated `name=value` pairs whose names are letters, digits, `_`, `.` or `-`.
fn is_host_path_query(text: &str) -> bool {
    let (before_query, query) = match text.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (text, None),
    };
    let (host, path) = match before_query.split_once('/') {
        Some((host, path)) => (host, path),
        None => (before_query, ""),
    };
    let name_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    is_host_list(host)
        && !path.contains(['/', '@'])
        && query.is_none_or(|query| {
            query
                .split('&')
                .filter(|pair| !pair.is_empty())
                .all(|pair| {
                    pair.split_once('=')
                        .is_some_and(|(name, _)| !name.is_empty() && name.chars().all(name_char))
                })
        })
}

/// Whether `text` reads as a URL's hosts: comma-separated, each a name without `@` or `:` (or an
/// IPv6 address in brackets), its port, where given, digits (`[::1]:5432`, `h1:5432,h2:5433`,
/// `%2Fvar%2Frun`; `u:secret` is no host).
fn is_host_list(text: &str) -> bool {
    text.split(',').all(|entry| {
        let (name, port) = match entry.strip_prefix('[') {
            Some(bracketed) => match bracketed.split_once(']') {
                Some((_, "")) => ("", None),
                Some((_, after)) => match after.strip_prefix(':') {
                    Some(port) => ("", Some(port)),
                    None => return false,
                },
                None => return false,
            },
            None => match entry.split_once(':') {
                Some((name, port)) => (name, Some(port)),
                None => (entry, None),
            },
        };
        !name.contains('@')
            && port.is_none_or(|port| !port.is_empty() && port.chars().all(|c| c.is_ascii_digit()))
    })
}

/// A query string with the values of secret parameters hidden (shown) and encoded (driver).
fn redact_query(query: &str, secrets: &mut Vec<String>) -> (String, String) {
    let mut shown = Vec::new();
    let mut driver = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some((name, value)) if is_hidden_name(name) => {
                add_secret(secrets, value);
                shown.push(format!("{name}=***"));
                driver.push(format!("{name}={}", encode_component(value)));
            }
            _ => {
                shown.push(pair.to_owned());
                driver.push(pair.to_owned());
            }
        }
    }
    (shown.join("&"), driver.join("&"))
}

/// Reads a libpq key=value connection string (`host=db user=app password='x y'`) as libpq does:
/// pairs separated by whitespace, `=` with optional whitespace around it, values in single quotes
/// or unquoted, `\` escaping the next character.
pub fn redact_conninfo(text: &str) -> Result<Redacted, Unreadable> {
    let mut secrets = Vec::new();
    let mut shown = Vec::new();
    for (position, pair) in conninfo_pairs(text)?.into_iter().enumerate() {
        if pair.keyword.is_empty() {
            return Err(Unreadable(format!(
                "pair {} of the connection string has no keyword before its `=`",
                position + 1
            )));
        }
        if is_hidden_name(pair.keyword) {
            add_secret(&mut secrets, pair.raw_value);
            add_secret(&mut secrets, &pair.value);
            shown.push(format!("{}=***", pair.keyword));
        } else {
            shown.push(format!("{}={}", pair.keyword, pair.raw_value));
        }
    }
    Ok(finish(shown.join(" "), text.to_owned(), secrets))
}

/// Reads text that is neither a URL nor a connection string (a SQLite path) as typed text: shown
/// as [`scrub_typed`] shows it, each value it hides kept as a secret (the error of a missing file
/// quotes the path in another form: `sqlite:pw=x` as `pw=x`).
///
/// A URL whose `://` was mistyped (`postgres:/u:pw@h/db`, `postgres//u:pw@h/db`,
/// `postgres:u:pw@h/db`) is such text too: its user info's password is hidden as well
/// ([`mistyped_userinfo_password`]), and kept as a secret, so that the missing file's error, which
/// quotes the whole path, shows none of it.
pub fn redact_typed(text: &str) -> Redacted {
    let mut secrets = Vec::new();
    let unmasked = match mistyped_userinfo_password(text) {
        Some(password) => {
            add_secret(&mut secrets, &text[password.clone()]);
            format!("{}***{}", &text[..password.start], &text[password.end..])
        }
        None => text.to_owned(),
    };
    let mut hidden = Vec::new();
    let shown = scrub_parameters(
        &scrub_url_userinfo(&unmasked),
        |name| !name.starts_with('-') && is_hidden_name(name),
        Some(&mut hidden),
    );
    for value in hidden {
        add_secret(&mut secrets, &value);
        if let Some((unquoted, _)) = value
            .starts_with('\'')
            .then(|| conninfo_value(&value, 0))
            .flatten()
        {
            add_secret(&mut secrets, &unquoted);
        }
    }
    finish(shown, text.to_owned(), secrets)
}

/// Where the password of a would-be user info is, in text that is no well-formed URL but has an
/// `@`: from the first `:` of what reads as the user info (after a leading `scheme:` and any `/`s;
/// it ends at an `@` as a URL's does, [`userinfo_end`]) or, without one, from the last `:` before
/// that `@`, to that `@`. No `:` before it: no password (`/data/u@x.db`, `postgres//app@db/main`).
///
/// This hides too much rather than too little: a real SQLite path with a `:` and an `@` in it
/// (`C:\db\u@x.db`, `file:/data/a:b@c.db`) is shown partly masked (`C:***@x.db`), which is
/// acceptable; only the text shown changes, the driver still gets the path as written.
fn mistyped_userinfo_password(text: &str) -> Option<std::ops::Range<usize>> {
    let scheme_end = text
        .find(':')
        .filter(|&colon| is_scheme(&text[..colon]))
        .map_or(0, |colon| colon + 1);
    let body_start = text.len() - text[scheme_end..].trim_start_matches('/').len();
    let at = body_start + userinfo_end(&text[body_start..])?;
    let start = match text[body_start..at].find(':') {
        Some(colon) => body_start + colon + 1,
        None => text[..at].rfind(':')? + 1,
    };
    Some(start..at)
}

/// Whether `text` is a URL scheme (a letter, then letters, digits, `+`, `-` or `.`).
pub fn is_scheme(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// One `keyword=value` of a libpq connection string.
#[derive(Debug)]
pub struct ConninfoPair<'a> {
    /// The keyword.
    pub keyword: &'a str,
    /// The value as written, quotes and escapes included.
    pub raw_value: &'a str,
    /// The value as libpq reads it.
    pub value: String,
}

/// The pairs of a libpq connection string, or why it does not parse (never quoting it).
pub fn conninfo_pairs(text: &str) -> Result<Vec<ConninfoPair<'_>>, Unreadable> {
    let bytes = text.as_bytes();
    let mut pairs = Vec::new();
    let mut i = 0;
    let skip_space = |mut i: usize| {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    loop {
        i = skip_space(i);
        if i >= bytes.len() {
            return Ok(pairs);
        }
        let start = i;
        while i < bytes.len() && !bytes[i].is_ascii_whitespace() && bytes[i] != b'=' {
            i += 1;
        }
        let keyword = &text[start..i];
        i = skip_space(i);
        if bytes.get(i) != Some(&b'=') {
            return Err(Unreadable(format!(
                "word {} of the connection string is not a keyword=value pair (a value with spaces goes in single quotes, as in application_name='my app')",
                pairs.len() + 1
            )));
        }
        i = skip_space(i + 1);
        let value_start = i;
        // The pair is named by its number, never by its keyword: a password typed unquoted with
        // a space and a quote (`password=abc def='x`) makes a piece of it a keyword.
        let (value, end) = conninfo_value(text, i).ok_or_else(|| {
            Unreadable(format!(
                "the value of pair {} of the connection string has no closing single quote (a quote inside a quoted value is written \\')",
                pairs.len() + 1
            ))
        })?;
        pairs.push(ConninfoPair {
            keyword,
            raw_value: &text[value_start..end],
            value,
        });
        i = end;
    }
}

/// The value starting at `start` and where it ends; `None` when a quote is not closed.
fn conninfo_value(text: &str, start: usize) -> Option<(String, usize)> {
    let mut value = String::new();
    let mut chars = text[start..].char_indices().peekable();
    let quoted = text[start..].starts_with('\'');
    if quoted {
        chars.next();
    }
    while let Some((offset, c)) = chars.next() {
        match c {
            '\\' => {
                if let Some((_, escaped)) = chars.next() {
                    value.push(escaped);
                }
            }
            '\'' if quoted => return Some((value, start + offset + 1)),
            c if !quoted && c.is_ascii_whitespace() => return Some((value, start + offset)),
            c => value.push(c),
        }
    }
    (!quoted).then_some((value, text.len()))
}

/// Hides, in any text, the secrets of every URL (`scheme://user:password@`) and every secret
/// parameter (`password=...`, `password = '...'`, `sslpassword=...`) it holds.
pub fn scrub_text(text: &str) -> String {
    scrub_parameters(&scrub_url_userinfo(text), is_secret_name, None)
}

/// [`scrub_text`] for a message that quotes what a person typed (clap's, a panic's): the value of
/// every `name=value` whose name no driver knows is hidden too (a misspelt `pasword=`, in a URL's
/// query or a key=value string), but for command-line flags (`--since=1h`). A typed value may
/// hold spaces (`password=Sek r1t`): an unquoted one runs to a quote, a line's end, or the next
/// `name=`.
pub fn scrub_typed(text: &str) -> String {
    scrub_parameters(
        &scrub_url_userinfo(text),
        |name| !name.starts_with('-') && is_hidden_name(name),
        Some(&mut Vec::new()),
    )
}

/// `scheme://user:password@` to `scheme://user:***@`, anywhere in `text`.
fn scrub_url_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(found) = rest.find("://") {
        let quote = quote_before_scheme(&rest[..found]);
        let after = found + 3;
        out.push_str(&rest[..after]);
        rest = &rest[after..];
        let end = url_end(rest, quote);
        let url = &rest[..end];
        match userinfo_end(url) {
            Some(at) if url[..at].contains(':') => {
                let colon = url[..at].find(':').unwrap_or(at);
                out.push_str(&url[..colon]);
                out.push_str(":***");
                rest = &rest[at..];
            }
            _ => {}
        }
    }
    out.push_str(rest);
    out
}

/// The quote (`'` or `"`) right before the scheme that `before` ends with, if any.
fn quote_before_scheme(before: &str) -> Option<char> {
    let scheme = before
        .trim_end_matches(|c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    scheme
        .chars()
        .next_back()
        .filter(|c| matches!(c, '\'' | '"'))
}

/// Where a URL starting `rest` (after its `scheme://`) ends. A quoted URL runs to its closing
/// quote (the first one on its line with an `@` before it, where a password holds that quote), so
/// that a password with a space is hidden whole; any other, or one whose quote is not closed on
/// its line, to the next whitespace.
fn url_end(rest: &str, quote: Option<char>) -> usize {
    let to_space = rest.find(char::is_whitespace).unwrap_or(rest.len());
    let Some(quote) = quote else {
        return to_space;
    };
    let line = rest.find('\n').unwrap_or(rest.len());
    let mut closing = rest[..line].match_indices(quote).map(|(i, _)| i);
    let Some(first) = closing.next() else {
        return to_space;
    };
    std::iter::once(first)
        .chain(closing)
        .find(|&i| rest[..i].contains('@'))
        .unwrap_or(first)
}

/// `name=value` to `name=***` for every parameter name `hide` says holds a secret, anywhere in
/// `text`. An unquoted value runs to whitespace, `&` or a quote; in text a person typed (`typed`,
/// which collects the values hidden), to a quote, a line's end, or whitespace or `&` before the
/// next `name=` (a password typed with spaces).
fn scrub_parameters(
    text: &str,
    hide: impl Fn(&str) -> bool,
    mut typed: Option<&mut Vec<String>>,
) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(eq) = rest.find('=') {
        let before = rest[..eq].trim_end();
        let name_start = before
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
            .map_or(0, |i| {
                i + before[i..].chars().next().map_or(1, char::len_utf8)
            });
        let name = &before[name_start..];
        out.push_str(&rest[..=eq]);
        rest = &rest[eq + 1..];
        if name.is_empty() || !hide(name) {
            continue;
        }
        let spaces = rest.len() - rest.trim_start().len();
        out.push_str(&rest[..spaces]);
        rest = &rest[spaces..];
        if rest.starts_with("***") {
            // Hidden already.
            continue;
        }
        let end = if rest.starts_with('\'') {
            conninfo_value(rest, 0).map_or(rest.len(), |(_, end)| end)
        } else if typed.is_some() {
            typed_value_end(rest)
        } else {
            // An unquoted value runs to whitespace, the next URL parameter or a quote (a password
            // may hold `;` or `)`, whose tail would show).
            rest.find(|c: char| c.is_whitespace() || matches!(c, '&' | '\'' | '"'))
                .unwrap_or(rest.len())
        };
        if let Some(hidden) = typed.as_deref_mut() {
            hidden.push(rest[..end].to_owned());
        }
        out.push_str("***");
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Where an unquoted value a person typed ends: at a quote or a line's end, or at whitespace or
/// `&` that the next `name=` follows; else at the text's end.
fn typed_value_end(rest: &str) -> usize {
    for (i, c) in rest.char_indices() {
        if matches!(c, '\'' | '"' | '\n' | '\r') {
            return i;
        }
        if (c.is_whitespace() || c == '&') && starts_with_parameter(rest[i..].trim_start()) {
            return i;
        }
    }
    rest.len()
}

/// Whether `text` starts with `name=` (or `name =`), the name of letters, digits, `_`, `.`, `-`.
fn starts_with_parameter(text: &str) -> bool {
    let text = text.strip_prefix('&').unwrap_or(text);
    let name_end = text
        .find(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '.' | '-')))
        .unwrap_or(text.len());
    name_end > 0 && text[name_end..].trim_start().starts_with('=')
}

/// Percent-encodes every character but the URL's unreserved ones, keeping `%XX` escapes: a
/// password with `/`, `?`, `#`, `@` or a stray `%` is read whole by libpq and the `url` crate.
pub fn encode_component(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    for (i, &byte) in bytes.iter().enumerate() {
        let escape = byte == b'%'
            && bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
            && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit);
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') || escape {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `%XX` sequences decoded (as UTF-8, lossily); anything else kept.
pub fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(byte) = text
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Records a secret in each form a driver could quote it in.
fn add_secret(secrets: &mut Vec<String>, secret: &str) {
    for form in [
        secret.to_owned(),
        percent_decode(secret),
        encode_component(secret),
    ] {
        if !form.is_empty() {
            secrets.push(form);
        }
    }
}

/// Sorts the secrets longest first (a longer one may hold a shorter one), without duplicates.
/// Very short secrets would blank out ordinary words of an error message; a driver never quotes
/// them, since it gets the password encoded and reads it whole.
fn finish(shown: String, driver: String, mut secrets: Vec<String>) -> Redacted {
    secrets.retain(|secret| secret.chars().count() >= 4);
    secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    secrets.dedup();
    Redacted {
        shown,
        driver,
        secrets,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unquoted value is hidden whole, up to whitespace, the next URL parameter or a quote: a
    /// `;` or `)` in a password showed its tail (`pasword=***;def`). Help's own `key=value`
    /// words are no secret's; a typed one no driver knows is.
    #[test]
    fn unquoted_values_are_hidden_whole() {
        for text in [
            "error: unexpected argument 'host=h pasword=abc;def' found",
            "error: 'postgres://u@h/d?pasword=abc)def&sslmode=disable'",
            "password=abc;def)ghi next",
        ] {
            let shown = scrub_typed(text);
            assert!(
                !shown.contains("abc") && !shown.contains("def") && !shown.contains("ghi"),
                "{text} -> {shown}"
            );
        }
        assert!(scrub_typed("x sslmode=disable&pasword=abc").contains("sslmode=disable"));
        assert!(scrub_text("libpq `key=value` strings").contains("key=value"));
    }

    #[test]
    fn urls() {
        for (url, shown, driver) in [
            (
                "postgres://app:s3cret@db:5432/main",
                "postgres://app:***@db:5432/main",
                "postgres://app:s3cret@db:5432/main",
            ),
            (
                "postgres://app:p@ss/w0rd@db/main?sslmode=require",
                "postgres://app:***@db/main?sslmode=require",
                "postgres://app:p%40ss%2Fw0rd@db/main?sslmode=require",
            ),
            (
                "mysql://root@127.0.0.1:3306/test",
                "mysql://root@127.0.0.1:3306/test",
                "mysql://root@127.0.0.1:3306/test",
            ),
            (
                "postgres://db/main?user=app&password=hunter22",
                "postgres://db/main?user=app&password=***",
                "postgres://db/main?user=app&password=hunter22",
            ),
            (
                "mysql://app:%40secret@db",
                "mysql://app:***@db",
                "mysql://app:%40secret@db",
            ),
            (
                "postgres://u:Top?Secret5@h:1/db?application_name=b@c",
                "postgres://u:***@h:1/db?application_name=b@c",
                "postgres://u:Top%3FSecret5@h:1/db?application_name=b@c",
            ),
            (
                "postgres://u:Top%zzS@h/db",
                "postgres://u:***@h/db",
                "postgres://u:Top%25zzS@h/db",
            ),
        ] {
            let redacted = redact_url(url);
            assert_eq!(redacted.shown, shown, "{url}");
            assert_eq!(redacted.driver, driver, "{url}");
        }
        let redacted = redact_url("mysql://app:%40secret@db");
        assert!(redacted.secrets.contains(&"@secret".to_owned()));
    }

    /// A valid URL with `@` (and `/`) in its query or path keeps its host and database: the user
    /// info ends at the first `@` after which a host, a path and a query follow. Before, the user
    /// info ran to the last `@` before the last `/`, or to the last `@` of all: the CLI connected
    /// to database `postgres` with the password `pw@127.0.0.1/keys_explore?application_name=ops/x`,
    /// to host `corp`, to host `y`, or opened `/app.db`.
    #[test]
    fn an_at_sign_in_the_query_or_path_is_not_user_info() {
        for url in [
            "postgres://postgres:pw@127.0.0.1/keys_explore?application_name=ops/x@127.0.0.1",
            "postgres://postgres:pw@127.0.0.1/keys_explore?application_name=ops/alice@corp",
            "mysql://root:pw@127.0.0.1/db?ssl_ca=/etc/x@y",
            "postgres://u:pw@[::1]:5432/db?application_name=a@b",
            "postgres://u:pw@h1:5432,h2:5433/db?target_session_attrs=any&application_name=x/y@z",
            "postgres://u:pw@%2Fvar%2Frun%2Fpostgresql/db?application_name=a/b@c",
        ] {
            let redacted = redact_url(url);
            assert_eq!(redacted.driver, url, "{url}");
            assert_eq!(redacted.shown, url.replacen(":pw@", ":***@", 1), "{url}");
        }
        // No authority at all (`scheme:///path`), or one with no user info (it reads whole as
        // hosts, a path and a query): none, whatever the path or the query holds. Before, the
        // `@` in `application_name` was taken for the user info's end: host `localhost`.
        for url in [
            "postgres://127.0.0.1:5432/test?application_name=ops@localhost",
            "postgres://db.internal/app?application_name=deploy@ci",
            "postgres://[::1]:5432,h2/app?application_name=a@b",
            "file:///work/scratch/u@h/app.db",
            "sqlite:///work/scratch/u:p@h/app.db",
            "postgres:///db?host=/tmp&application_name=a@b",
        ] {
            let redacted = redact_url(url);
            assert_eq!(
                (redacted.shown.as_str(), redacted.driver.as_str()),
                (url, url)
            );
        }
        // Raw passwords holding `@`, `/`, `?`, `:` or a space are still read whole.
        for (url, password) in [
            ("postgres://u:x@y/z@h/db", "x%40y%2Fz"),
            ("postgres://u:a?b@h/db?sslmode=disable", "a%3Fb"),
            ("postgres://u:a?x=y@h/db", "a%3Fx%3Dy"),
            ("postgres://u:a:b c@h/db", "a%3Ab%20c"),
            (
                "postgres://u:p@h/db@h2/db2?application_name=a@b",
                "p%40h%2Fdb",
            ),
        ] {
            let redacted = redact_url(url);
            assert!(
                redacted.driver.contains(&format!("u:{password}@h")),
                "{url}: {redacted:?}"
            );
            assert!(
                redacted.shown.starts_with("postgres://u:***@h"),
                "{url}: {redacted:?}"
            );
        }
    }

    /// A URL in single or double quotes runs to its closing quote: a password with a space was
    /// shown from the space on (`unexpected argument 'postgres://u:Sek r1tPW@h/db'` was printed
    /// whole). In typed text, an unquoted secret value runs to a quote, or to whitespace before
    /// the next `name=` (`password=*** r1tPW` showed the tail).
    #[test]
    fn quoted_urls_and_typed_values_are_hidden_whole() {
        for (text, shown) in [
            (
                "error: unexpected argument 'postgres://u:Sek r1tPW@127.0.0.1/db' found",
                "error: unexpected argument 'postgres://u:***@127.0.0.1/db' found",
            ),
            (
                "at \"mysql://u:a b'c@h/db\": refused",
                "at \"mysql://u:***@h/db\": refused",
            ),
            (
                "error: unexpected argument 'host=127.0.0.1 password=Sek r1tPW' found",
                "error: unexpected argument 'host=127.0.0.1 password=***' found",
            ),
            (
                "password=Sek r1t PW port=5432 dbname=x",
                "password=*** port=5432 dbname=x",
            ),
            (
                "?pasword=a&b&sslmode=disable",
                "?pasword=***&sslmode=disable",
            ),
        ] {
            assert_eq!(scrub_typed(text), shown, "{text}");
        }
        assert_eq!(
            scrub_text("error: unexpected argument 'postgres://u:Sek r1tPW@127.0.0.1/db' found"),
            "error: unexpected argument 'postgres://u:***@127.0.0.1/db' found"
        );
    }

    #[test]
    fn conninfo() {
        let redacted =
            redact_conninfo("host=db  user = app password='a \\'b c' dbname=main").expect("parses");
        assert_eq!(redacted.shown, "host=db user=app password=*** dbname=main");
        for secret in ["'a \\'b c'", "a 'b c", "a%20%27b%20c"] {
            assert!(redacted.secrets.contains(&secret.to_owned()), "{secret}");
        }
        assert!(redacted.secrets.contains(&"a 'b c".to_owned()));
        for bad in [
            "host=db password",
            "host=db password='open",
            "host=db =x",
            "a b=c",
        ] {
            let error = redact_conninfo(bad).expect_err(bad);
            assert!(!error.0.contains("open"), "{error:?}");
        }
        // A password typed unquoted with a space and a quote: its second word was quoted as the
        // keyword whose value has no closing quote.
        let error =
            redact_conninfo("host=h password=abc hunter2secret='x").expect_err("no closing quote");
        assert!(!error.0.contains("hunter2"), "{error:?}");
        assert!(error.0.contains("pair 3"), "{error:?}");
    }

    /// A URL with a mistyped `://` is read as a path: its user info's password is hidden, and
    /// kept as a secret (it was shown whole). A path with an `@` but no `:` before it is shown.
    #[test]
    fn mistyped_urls_hide_their_password() {
        for (text, shown, secret) in [
            (
                "postgres:/postgres:hunter2secret@127.0.0.1/test",
                "postgres:/postgres:***@127.0.0.1/test",
                "hunter2secret",
            ),
            (
                "postgres//postgres:hunter2secret@127.0.0.1/test",
                "postgres//postgres:***@127.0.0.1/test",
                "hunter2secret",
            ),
            (
                "postgres:postgres:hunter2secret@127.0.0.1/test",
                "postgres:postgres:***@127.0.0.1/test",
                "hunter2secret",
            ),
            (
                "postgres:/u:a:b@c d@h/db?application_name=x@y",
                "postgres:/u:***@h/db?application_name=x@y",
                "a:b@c d",
            ),
            ("postgres:hunter2@h/db", "postgres:***@h/db", "hunter2"),
            (
                "/tmp/a:b@c/x.db?pw=hunter2",
                "/tmp/a:***@c/x.db?pw=***",
                "hunter2",
            ),
        ] {
            let redacted = redact_typed(text);
            assert_eq!(redacted.shown, shown, "{text}");
            assert_eq!(redacted.driver, text, "{text}");
            assert!(
                redacted.secrets.contains(&secret.to_owned()),
                "{redacted:?}"
            );
        }
        for text in [
            "/data/u@x.db",
            "postgres//app@db/main",
            "sqlite:/tmp/app.db",
        ] {
            assert_eq!(redact_typed(text).shown, text);
        }
    }

    #[test]
    fn any_text() {
        assert_eq!(
            scrub_text("error: unrecognized subcommand 'postgres://u:Top/Secret5@h:1/test'"),
            "error: unrecognized subcommand 'postgres://u:***@h:1/test'"
        );
        assert_eq!(
            scrub_text("at host=h password = 'a b' port=1 and ?user=x&PassWord=y&z=1"),
            "at host=h password = *** port=1 and ?user=x&PassWord=***&z=1"
        );
        assert_eq!(scrub_text("a = b, c=d"), "a = b, c=d");
        assert_eq!(
            scrub_text("at h password=***: refused"),
            "at h password=***: refused"
        );
        assert_eq!(
            scrub_text("mssql://sa:p@h/x?sslpassword=q"),
            "mssql://sa:***@h/x?sslpassword=***"
        );
    }
}
