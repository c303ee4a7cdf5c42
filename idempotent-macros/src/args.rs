//! The attribute's arguments: `key = "..."` and the optional rest, each settable once.

use proc_macro2::{Span, TokenStream};
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned as _;
use syn::{Ident, LitStr, Path};

use crate::errors::{Errors, did_you_mean};

/// Every argument the attribute takes, for "unknown argument" messages.
const ARGUMENTS: &[&str] = &["key", "conn", "name", "once", "crate"];

#[derive(Default)]
pub struct Args {
    pub key: Option<LitStr>,
    /// `key` was written, even if its value was refused.
    pub key_written: bool,
    pub conn: Option<Ident>,
    pub name: Option<LitStr>,
    /// `once`: the template has no placeholder on purpose; every call shares one key.
    pub once: Option<Span>,
    pub krate: Option<Path>,
}

impl Args {
    /// Parses the attribute's arguments, recording every problem in `errors`.
    pub fn parse(tokens: TokenStream, errors: &mut Errors) -> Args {
        let mut args = Args::default();
        let parser = syn::meta::parser(|meta| {
            if let Err(error) = args.one(&meta) {
                errors.push(error);
            }
            Ok(())
        });
        if let Err(error) = syn::parse::Parser::parse2(parser, tokens) {
            errors.push(error);
        }
        args
    }

    fn one(&mut self, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
        let path = &meta.path;
        let name = path
            .get_ident()
            .map(ToString::to_string)
            .unwrap_or_else(|| quote::quote!(#path).to_string().replace(' ', ""));
        match name.as_str() {
            "key" => {
                self.key_written = true;
                let value = string_value(meta, "key", "invoice:<month>:<customer_id>")?;
                set_once(&mut self.key, value, meta)
            }
            "name" => {
                let value = string_value(meta, "name", "send_invoice")?;
                if value.value().trim().is_empty() {
                    return Err(syn::Error::new(
                        value.span(),
                        "the job name cannot be empty",
                    ));
                }
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
            "once" => {
                if meta.input.peek(syn::Token![=]) {
                    return Err(meta.error("`once` takes no value: write `once`"));
                }
                set_once(&mut self.once, path.span(), meta)
            }
            _ => {
                // Skip the value, if any, so the next argument still parses.
                if meta.input.peek(syn::Token![=]) {
                    let _: syn::Expr = meta.value()?.parse()?;
                } else if meta.input.peek(syn::token::Paren) {
                    let _ = meta.parse_nested_meta(|_| Ok(()));
                }
                let valid = ARGUMENTS
                    .iter()
                    .map(|a| format!("`{a}`"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let message = match did_you_mean(&name, ARGUMENTS.iter().copied()) {
                    Some(suggestion) => format!(
                        "unknown argument `{name}`; did you mean `{suggestion}`? (`#[idempotent_job]` takes {valid})"
                    ),
                    None => format!("unknown argument `{name}`: `#[idempotent_job]` takes {valid}"),
                };
                Err(syn::Error::new(path.span(), message))
            }
        }
    }
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
