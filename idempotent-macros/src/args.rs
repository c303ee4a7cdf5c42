//! The attribute's arguments: `key = "..."` and the optional rest, each settable once.

use proc_macro2::{Span, TokenStream};
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned as _;
use syn::{Ident, LitStr, Path};

use std::time::Duration;

use idempotent_keys::duration::{self, DurationError};
use idempotent_keys::template::Segment;

use crate::ctxt::{Ctxt, did_you_mean};

/// The longest job name, in characters (`Job::MAX_NAME_CHARS` in the runtime).
const MAX_NAME_CHARS: usize = 255;

/// Every argument the attribute takes, for "unknown argument" messages.
const ARGUMENTS: &[&str] = &[
    "key",
    "conn",
    "name",
    "fingerprint",
    "keep",
    "in_progress",
    "redact_key",
    "once",
    "no_companion",
    "crate",
];

/// The attribute's arguments as written; each is `None` when absent or refused (the refusal is in
/// the error context).
#[derive(Default)]
pub struct Args {
    /// Every argument written, valid or not: a refused `key` is not also reported missing.
    pub written: Vec<String>,
    pub key: Option<LitStr>,
    pub conn: Option<Ident>,
    pub name: Option<LitStr>,
    /// `once`: the template has no placeholder on purpose; every call shares one key.
    pub once: Option<Span>,
    pub krate: Option<Path>,
    /// `fingerprint(a, b.c)`: the inputs that must match on a replay.
    pub fingerprint: Option<Vec<Input>>,
    /// `keep = "30d"`: how long a key holds.
    pub keep: Option<Duration>,
    /// `in_progress = "fail"`: what a call does while another run of its key is in progress.
    pub in_progress: Option<InProgress>,
    /// `redact_key`: show the key as a digest prefix in events, errors and `job_key`.
    pub redact_key: Option<Span>,
    /// `no_companion`: no companion type beside the function (for an associated function, which
    /// sits in an `impl` block where a type cannot).
    pub no_companion: Option<Span>,
}

/// `in_progress = "..."`: the job's in-progress policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InProgress {
    /// `"wait"`: wait for the other run (the default, written out).
    Wait,
    /// `"fail"`: fail at once.
    Fail,
    /// `"wait at most 5s"`: wait up to this long.
    WaitAtMost(Duration),
}

impl InProgress {
    /// Parses `"wait"`, `"fail"` or `"wait at most <duration>"`, the duration in the project's one
    /// grammar ([`idempotent_keys::duration`]).
    pub fn parse(text: &str) -> Result<Self, DurationError> {
        let text = text.trim();
        match text {
            "wait" => return Ok(InProgress::Wait),
            "fail" => return Ok(InProgress::Fail),
            _ => {}
        }
        let limit = text
            .strip_prefix("wait at most")
            .ok_or_else(|| DurationError::Invalid("not a policy".to_owned()))?;
        duration::parse(limit).map(InProgress::WaitAtMost)
    }
}

/// A fingerprint input: a parameter, or a field path into one.
pub struct Input {
    /// As written: `amount`, `order.total`.
    pub name: String,
    pub path: Vec<Segment>,
    pub span: Span,
}

impl Args {
    /// Parses the attribute's arguments, recording every problem in `cx`.
    pub fn parse(tokens: TokenStream, cx: &Ctxt) -> Args {
        let mut args = Args::default();
        let parser = syn::meta::parser(|meta| {
            if let Err(error) = args.one(&meta) {
                cx.error(error);
            }
            Ok(())
        });
        if let Err(error) = syn::parse::Parser::parse2(parser, tokens) {
            cx.error(error);
        }
        args
    }

    /// Whether the argument `name` was written, whatever its value.
    pub fn wrote(&self, name: &str) -> bool {
        self.written.iter().any(|written| written == name)
    }

    fn one(&mut self, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
        let path = &meta.path;
        let name = path
            .get_ident()
            .map(ToString::to_string)
            .unwrap_or_else(|| quote::quote!(#path).to_string().replace(' ', ""));
        self.written.push(name.clone());
        match name.as_str() {
            "key" => {
                let value = string_value(meta, "key", "invoice:<month>:<customer_id>")?;
                set_once(&mut self.key, value, meta)
            }
            "name" => {
                let value = string_value(meta, "name", "send_invoice")?;
                check_name(&value)?;
                set_once(&mut self.name, value, meta)
            }
            "conn" => {
                let value: Ident = meta.value()?.parse().map_err(|e| {
                    syn::Error::new(
                        e.span(),
                        "`conn` takes the name of the connection parameter, like `conn = db`",
                    )
                })?;
                set_once(&mut self.conn, value, meta)
            }
            "crate" => {
                let input = meta.value()?;
                let value = if input.peek(LitStr) {
                    input.parse::<LitStr>()?.parse::<Path>()?
                } else {
                    input.parse::<Path>()?
                };
                set_once(&mut self.krate, value, meta)
            }
            "fingerprint" => {
                let inputs = fingerprint_inputs(meta)?;
                set_once(&mut self.fingerprint, inputs, meta)
            }
            "keep" => {
                let value = string_value(meta, "keep", "30d")?;
                let keep = keep_duration(&value)?;
                set_once(&mut self.keep, keep, meta)
            }
            "in_progress" => {
                let value = string_value(meta, "in_progress", "fail")?;
                let policy = in_progress_policy(&value)?;
                set_once(&mut self.in_progress, policy, meta)
            }
            "redact_key" => {
                let span = flag(meta, "redact_key")?;
                set_once(&mut self.redact_key, span, meta)
            }
            "no_companion" => {
                let span = flag(meta, "no_companion")?;
                set_once(&mut self.no_companion, span, meta)
            }
            "once" => {
                let span = flag(meta, "once")?;
                set_once(&mut self.once, span, meta)
            }
            _ => Err(unknown_argument(meta, &name)),
        }
    }
}

/// A flag argument such as `once`: its span, or an error when it was given a value.
fn flag(meta: &ParseNestedMeta<'_>, name: &str) -> syn::Result<Span> {
    if meta.input.peek(syn::Token![=]) {
        let _: syn::Expr = meta.value()?.parse()?;
        return Err(meta.error(format!("`{name}` takes no value: write `{name}`")));
    }
    Ok(meta.path.span())
}

/// `fingerprint(a, b.c)`.
fn fingerprint_inputs(meta: &ParseNestedMeta<'_>) -> syn::Result<Vec<Input>> {
    let content;
    syn::parenthesized!(content in meta.input);
    let exprs =
        syn::punctuated::Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated(&content)?;
    let inputs = exprs
        .iter()
        .map(input_path)
        .collect::<syn::Result<Vec<_>>>()?;
    if inputs.is_empty() {
        return Err(meta.error(
            "`fingerprint()` names no input; list the parameters that must match on a replay, like `fingerprint(amount, currency)`",
        ));
    }
    Ok(inputs)
}

/// `keep = "30d"` as a duration, or what is wrong with it.
fn keep_duration(value: &LitStr) -> syn::Result<Duration> {
    let text = value.value();
    let message = match duration::parse(&text) {
        Ok(keep) => return Ok(keep),
        Err(DurationError::Zero) => format!(
            "`keep = \"{text}\"` would keep a key for no time at all, so every delivery would run the job again; leave `keep` out to keep keys forever, or give a positive duration like \"30d\""
        ),
        Err(DurationError::TooLong) => format!(
            "`keep = \"{text}\"` is longer than the 100 years the runtime accepts; leave `keep` out to keep keys forever"
        ),
        Err(DurationError::Invalid(_))
            if [
                "forever",
                "always",
                "never",
                "infinite",
                "infinity",
                "permanent",
                "none",
            ]
            .contains(&text.trim().to_lowercase().as_str()) =>
        {
            format!(
                "keys are kept forever when `keep` is left out: remove `keep = \"{text}\"` (`keep` takes a duration after which a key lapses, like \"30d\")"
            )
        }
        Err(DurationError::Invalid(_)) => format!(
            "`keep = \"{text}\"` is not a duration: write a number and a unit, like \"90s\", \"15min\", \"12h\", \"30d\", \"30 days\", \"2w\" or \"1d 12h\"; to keep keys forever, leave `keep` out"
        ),
    };
    Err(syn::Error::new(value.span(), message))
}

/// `in_progress = "..."` as a policy, or what is wrong with it.
fn in_progress_policy(value: &LitStr) -> syn::Result<InProgress> {
    let text = value.value();
    match InProgress::parse(&text) {
        Ok(policy) => Ok(policy),
        Err(DurationError::Zero) => Err(syn::Error::new(
            value.span(),
            format!(
                "`in_progress = \"{text}\"` waits for no time at all: to give the worker back at once, write \"fail\"; to wait, give a positive duration like \"wait at most 5s\""
            ),
        )),
        Err(DurationError::TooLong) => Err(syn::Error::new(
            value.span(),
            format!(
                "`in_progress = \"{text}\"` is longer than the 100 years the runtime accepts; to wait as long as the other run takes, write \"wait\""
            ),
        )),
        Err(DurationError::Invalid(_)) => Err(syn::Error::new(
            value.span(),
            format!(
                "`in_progress = \"{text}\"` is not a policy; write \"wait\" (the default: wait for the other run, then replay or run), \"fail\" (give the worker back at once with Error::InProgress) or \"wait at most 5s\" (a duration like \"500ms\", \"5s\", \"2min\")"
            ),
        )),
    }
}

/// An argument the attribute does not take: the error lists the ones it does.
fn unknown_argument(meta: &ParseNestedMeta<'_>, name: &str) -> syn::Error {
    // Skip the value, if any, so the next argument still parses.
    if meta.input.peek(syn::Token![=]) {
        let _ = meta.value().and_then(|value| value.parse::<syn::Expr>());
    } else if meta.input.peek(syn::token::Paren) {
        let _ = meta.parse_nested_meta(|_| Ok(()));
    }
    let valid = ARGUMENTS
        .iter()
        .map(|a| format!("`{a}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let message = match did_you_mean(name, ARGUMENTS.iter().copied()) {
        Some(suggestion) => format!(
            "unknown argument `{name}`; did you mean `{suggestion}`? (`#[idempotent_job]` takes {valid})"
        ),
        None => format!("unknown argument `{name}`: `#[idempotent_job]` takes {valid}"),
    };
    syn::Error::new(meta.path.span(), message)
}

fn set_once<T>(slot: &mut Option<T>, value: T, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    if slot.is_some() {
        let name = meta
            .path
            .get_ident()
            .map_or_else(String::new, ToString::to_string);
        return Err(meta.error(format!("`{name}` is given twice; give it once")));
    }
    *slot = Some(value);
    Ok(())
}

/// A job name the runtime can store and show: not empty, no control character, no trailing space,
/// at most [`MAX_NAME_CHARS`] characters.
fn check_name(value: &LitStr) -> syn::Result<()> {
    if value.value().trim().is_empty() {
        return Err(syn::Error::new(
            value.span(),
            "the job name cannot be empty",
        ));
    }
    if let Some(control) = value.value().chars().find(|c| c.is_control()) {
        return Err(syn::Error::new(
            value.span(),
            format!(
                "the job name holds the control character {control:?}: PostgreSQL refuses `\\0` in text, so every call would fail there, and the others would print the name broken; give a name without one"
            ),
        ));
    }
    if value.value().ends_with(' ') {
        return Err(syn::Error::new(
            value.span(),
            "the job name ends with a space: MySQL and MariaDB compare `done_jobs.job_name` ignoring trailing spaces, so the keys API and the operator CLI would count it as the job without them; drop the trailing space",
        ));
    }
    let chars = value.value().chars().count();
    if chars > MAX_NAME_CHARS {
        return Err(syn::Error::new(
            value.span(),
            format!(
                "the job name is {chars} characters long; at most {MAX_NAME_CHARS} fit `done_jobs.job_name` (MySQL's `VARCHAR(255)`), so give a shorter `name`"
            ),
        ));
    }
    Ok(())
}

/// The value of `name = "..."`: a plain string literal, with a message that shows the form.
fn string_value(meta: &ParseNestedMeta<'_>, name: &str, example: &str) -> syn::Result<LitStr> {
    let expected = format!(
        "`{name}` must be a string literal, like `{name} = \"{example}\"`; the attribute reads the text at compile time, so constants and macros cannot be used"
    );
    let input = meta.value()?;
    let mut expr: syn::Expr = input.parse()?;
    // A literal passed through `macro_rules!` arrives wrapped in an invisible group.
    while let syn::Expr::Group(group) = expr {
        expr = *group.expr;
    }
    match &expr {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(lit),
            ..
        }) => {
            if !lit.suffix().is_empty() {
                return Err(syn::Error::new(
                    lit.span(),
                    format!("`{name}` cannot have a suffix (`{}`)", lit.suffix()),
                ));
            }
            if lit.value().is_empty() {
                return Err(syn::Error::new(
                    lit.span(),
                    format!(
                        "`{name}` cannot be empty; write the job's purpose, like `{name} = \"{example}\"`"
                    ),
                ));
            }
            Ok(lit.clone())
        }
        _ => Err(syn::Error::new(expr.span(), expected)),
    }
}

/// A fingerprint input written as `name` or `name.field.field` (tuple fields too).
fn input_path(expr: &syn::Expr) -> syn::Result<Input> {
    fn walk(expr: &syn::Expr, path: &mut Vec<Segment>) -> bool {
        match expr {
            syn::Expr::Path(p) if p.qself.is_none() => match p.path.get_ident() {
                Some(ident) => {
                    path.push(Segment::Name(syn::ext::IdentExt::unraw(ident).to_string()));
                    true
                }
                None => false,
            },
            syn::Expr::Field(field) => {
                if !walk(&field.base, path) {
                    return false;
                }
                path.push(match &field.member {
                    syn::Member::Named(ident) => {
                        Segment::Name(syn::ext::IdentExt::unraw(ident).to_string())
                    }
                    syn::Member::Unnamed(index) => Segment::Index(index.index),
                });
                true
            }
            _ => false,
        }
    }
    let mut path = Vec::new();
    if walk(expr, &mut path) {
        let name = quote::ToTokens::to_token_stream(expr)
            .to_string()
            .replace(' ', "");
        Ok(Input {
            name,
            path,
            span: expr.span(),
        })
    } else {
        Err(syn::Error::new(
            expr.span(),
            "`fingerprint` takes parameter names and field paths, like `fingerprint(amount, order.currency)`",
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{DurationError, InProgress};

    #[test]
    fn in_progress_policies() {
        assert_eq!(InProgress::parse("fail"), Ok(InProgress::Fail));
        assert_eq!(InProgress::parse(" wait "), Ok(InProgress::Wait));
        assert_eq!(
            InProgress::parse("wait at most 5s"),
            Ok(InProgress::WaitAtMost(Duration::from_secs(5)))
        );
        assert_eq!(
            InProgress::parse("wait at most 250ms"),
            Ok(InProgress::WaitAtMost(Duration::from_millis(250)))
        );
        for bad in ["wait at most", "wait at most ms", "sometimes"] {
            assert!(
                matches!(InProgress::parse(bad), Err(DurationError::Invalid(_))),
                "{bad:?}"
            );
        }
        assert_eq!(
            InProgress::parse("wait at most 0s"),
            Err(DurationError::Zero)
        );
        assert_eq!(
            InProgress::parse("wait at most 0ms"),
            Err(DurationError::Zero)
        );
        assert_eq!(
            InProgress::parse("wait at most 99999999999999999999ms"),
            Err(DurationError::TooLong)
        );
    }
}
