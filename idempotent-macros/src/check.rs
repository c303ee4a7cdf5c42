//! The check phase: the template and the fingerprint inputs against the handler's parameters. Every
//! problem goes to the error context; nothing here generates code.

use std::ops::Range;

use idempotent_keys::template::{self, Segment, Template};
use proc_macro2::Span;
use syn::LitStr;
use syn::ext::IdentExt as _;

use crate::args::Args;
use crate::ctxt::{Ctxt, did_you_mean};
use crate::signature::Handler;

/// A key template, parsed, with the literal it came from.
pub struct KeyTemplate {
    pub literal: LitStr,
    /// Every piece that parsed, so that its placeholders are checked even next to syntax errors.
    pub template: Template,
    /// Whether the template parsed without a syntax error.
    pub well_formed: bool,
}

/// Parses the key template, reporting each syntax error at its place in the literal.
pub fn parse_template(literal: &LitStr, cx: &Ctxt) -> KeyTemplate {
    let source = literal.value();
    let (template, errors) = template::parse(&source);
    let well_formed = errors.is_empty();
    for error in errors {
        cx.error_at(
            span_in(literal, &error.range),
            format!("in key template `{source}`: {}", error.message),
        );
    }
    KeyTemplate {
        literal: literal.clone(),
        template,
        well_formed,
    }
}

/// The span of `range` (bytes of the template's value) inside the literal, where the compiler can
/// point inside a string; otherwise the whole literal. Only a literal written without escapes maps
/// value bytes to source bytes one to one.
fn span_in(literal: &LitStr, range: &Range<usize>) -> Span {
    let token = literal.token().to_string();
    let value = literal.value();
    let offset = if token.len() == value.len() + 2 && token[1..token.len() - 1] == value {
        1
    } else if let Some(hashes) = token
        .strip_prefix('r')
        .map(|t| t.len() - t.trim_start_matches('#').len())
        && token.len() == value.len() + 3 + 2 * hashes
    {
        2 + hashes
    } else {
        return literal.span();
    };
    literal
        .token()
        .subspan(range.start + offset..range.end + offset)
        .unwrap_or_else(|| literal.span())
}

/// Checks the template's placeholders and the fingerprint inputs against the handler, and the
/// `once` argument against the template.
pub fn check(key: &KeyTemplate, args: &Args, handler: Option<&Handler<'_>>, cx: &Ctxt) {
    let source = key.literal.value();
    let has_placeholders = key.template.placeholders().next().is_some();
    if key.well_formed && !has_placeholders && args.once.is_none() {
        let example = handler
            .and_then(|h| {
                h.params
                    .iter()
                    .enumerate()
                    .find(|(i, _)| *i != h.conn)
                    .map(|(_, p)| p.ident.unraw().to_string())
            })
            .unwrap_or_else(|| "date".to_owned());
        cx.error_at(
            key.literal.span(),
            format!(
                "the key `{source}` has no placeholder, so every call would share one key and the job would run once, ever. Add the inputs that identify one unit of work (`{source}:<{example}>`), or add `once` to the attribute if that is what you want"
            ),
        );
    }
    if let Some(once) = args.once
        && has_placeholders
    {
        cx.error_at(
            once,
            "`once` is for a key with no placeholders; this key has some, so leave `once` out",
        );
    }

    let Some(handler) = handler else { return };
    let names: Vec<String> = handler
        .params
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != handler.conn)
        .map(|(_, p)| p.ident.unraw().to_string())
        .collect();
    for placeholder in key.template.placeholders() {
        if let Err(message) = check_path(
            &placeholder.display(),
            &placeholder.path,
            handler,
            &names,
            Naming::Placeholder,
        ) {
            cx.error_at(
                span_in(&key.literal, &placeholder.range),
                format!("in key template `{source}`: {message}"),
            );
        }
    }
    for input in args.fingerprint.iter().flatten() {
        if let Err(message) = check_path(
            &input.name,
            &input.path,
            handler,
            &names,
            Naming::FingerprintInput,
        ) {
            cx.error_at(
                input.span,
                format!(
                    "fingerprint input {}",
                    message.replacen("unknown placeholder ", "", 1)
                ),
            );
        }
    }
}

/// What names a parameter: a placeholder of the key, or an input of the fingerprint.
#[derive(Clone, Copy)]
enum Naming {
    Placeholder,
    FingerprintInput,
}

impl Naming {
    /// `path` as this kind of name is written.
    fn written(self, path: &str) -> String {
        match self {
            Naming::Placeholder => format!("`<{path}>`"),
            Naming::FingerprintInput => format!("`fingerprint({path})`"),
        }
    }

    fn what(self) -> &'static str {
        match self {
            Naming::Placeholder => "a placeholder",
            Naming::FingerprintInput => "a fingerprint input",
        }
    }
}

/// Checks that a placeholder or fingerprint input names a parameter (or `self`'s field).
fn check_path(
    shown: &str,
    path: &[Segment],
    handler: &Handler<'_>,
    names: &[String],
    naming: Naming,
) -> Result<(), String> {
    let root = match path.first() {
        Some(Segment::Name(name)) => name.as_str(),
        _ => "",
    };
    let function = &handler.item.sig.ident;
    if root == "self" {
        if handler.receiver.is_none() {
            return Err(format!(
                "`{shown}`: `{function}` is not a method, so there is no `self`"
            ));
        }
        if path.len() == 1 {
            return Err(format!(
                "`{shown}` names the whole receiver; name a field of it instead, like `self.id`"
            ));
        }
        return Ok(());
    }
    let conn = &handler.conn().ident;
    if conn.unraw() == root {
        return Err(format!(
            "`{shown}` names the connection parameter `{conn}`; a key is built from the job's inputs, not from the connection"
        ));
    }
    if names.iter().any(|name| name == root) {
        return Ok(());
    }
    if let Some(message) = bound_by_pattern(shown, root, path, handler, naming) {
        return Err(message);
    }
    Err(unknown(shown, root, handler, names))
}

/// `<month>` where `month` is bound inside a pattern parameter such as `(month, day): (u8, u8)`:
/// a placeholder reaches a parameter by its name, so the parameter needs one.
fn bound_by_pattern(
    shown: &str,
    root: &str,
    path: &[Segment],
    handler: &Handler<'_>,
    naming: Naming,
) -> Option<String> {
    let (pattern, field) = handler.patterns.iter().find_map(|pattern| {
        pattern
            .bindings
            .iter()
            .find(|(name, _)| name == root)
            .map(|(_, field)| (pattern, field))
    })?;
    let ty = crate::signature::shown(&pattern.ty);
    let rest: String = path[1..]
        .iter()
        .map(|segment| match segment {
            Segment::Name(name) => format!(".{name}"),
            Segment::Index(index) => format!(".{index}"),
        })
        .collect();
    let fix = match field {
        Some(field) => format!(
            "bind that parameter to a name (`param: {ty}`, destructured in the body) and write {}",
            naming.written(&format!("param{field}{rest}"))
        ),
        None => format!(
            "bind that parameter to a name (`param: {ty}`), destructure it in the body, and name the value through it"
        ),
    };
    Some(format!(
        "`{shown}`: `{root}` is bound inside the pattern `{}` of a parameter of `{}`, and {} names a parameter (or a field of one); {fix}",
        pattern.pattern.replace(" ,", ","),
        handler.item.sig.ident,
        naming.what()
    ))
}

/// The message for a placeholder that names nothing the handler has.
fn unknown(shown: &str, root: &str, handler: &Handler<'_>, names: &[String]) -> String {
    let function = &handler.item.sig.ident;
    let mut message =
        format!("unknown placeholder `{shown}`: `{function}` has no parameter `{root}`");
    if let Some(suggestion) = did_you_mean(root, names.iter().map(String::as_str)) {
        message.push_str(&format!("; did you mean `{suggestion}`?"));
    } else if !names.is_empty() {
        message.push_str(&format!(
            "; its parameters are {}",
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    } else if handler.receiver.is_some() {
        message.push_str(
            " (besides the connection it has only `self`: name a field of it, like `<self.id>`)",
        );
    } else if handler.patterns.is_empty() {
        message.push_str(" (it has no parameters besides the connection)");
    }
    message
}
