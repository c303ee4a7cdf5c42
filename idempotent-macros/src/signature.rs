//! The annotated item: parsed down to its signature, with the body kept as tokens.
//!
//! Parsing the body fully would be slow and would fail on syntax syn does not know yet; the
//! wrapper only needs the signature.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt as _;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned as _;
use syn::{Attribute, FnArg, Ident, Pat, ReturnType, Signature, Token, Type, Visibility};

use crate::ctxt::{Ctxt, did_you_mean};

/// A function whose body is kept as tokens.
pub struct ItemFn {
    /// The function's attributes, with the body's inner attributes (`#![allow(..)]`) moved here as
    /// outer ones: the body becomes a closure inside the wrapper, where inner attributes cannot be.
    pub attrs: Vec<Attribute>,
    pub vis: Visibility,
    pub sig: Signature,
    /// The body, braces included.
    pub body: TokenStream,
    /// The span of the body's braces: the wrapper's own body gets it too, so that the item looks
    /// written by the user to lints such as `dead_code`.
    pub body_span: proc_macro2::Span,
}

impl Parse for ItemFn {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        let sig: Signature = input.parse()?;
        if input.peek(Token![;]) {
            return Err(syn::Error::new(
                sig.ident.span(),
                format!(
                    "`#[idempotent_job]` needs a function with a body, and `{}` has none; in a trait, put the attribute on the method of each `impl`",
                    sig.ident
                ),
            ));
        }
        let content;
        let brace = syn::braced!(content in input);
        let mut attrs = attrs;
        for mut inner in content.call(Attribute::parse_inner)? {
            inner.style = syn::AttrStyle::Outer;
            attrs.push(inner);
        }
        let body: TokenStream = content.parse()?;
        let mut block = TokenStream::new();
        brace.surround(&mut block, |tokens| tokens.extend(body));
        Ok(ItemFn {
            attrs,
            vis,
            sig,
            body: block,
            body_span: brace.span.join(),
        })
    }
}

impl ToTokens for ItemFn {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        for attr in &self.attrs {
            attr.to_tokens(tokens);
        }
        self.vis.to_tokens(tokens);
        self.sig.to_tokens(tokens);
        self.body.to_tokens(tokens);
    }
}

/// Parses the item, or explains what the attribute goes on.
pub fn parse_item(tokens: TokenStream) -> syn::Result<ItemFn> {
    match syn::parse2::<ItemFn>(tokens.clone()) {
        Ok(item) => Ok(item),
        Err(error) => {
            let what = match syn::parse2::<syn::Item>(tokens) {
                Ok(syn::Item::Struct(item)) => Some(("a struct", item.ident.span())),
                Ok(syn::Item::Enum(item)) => Some(("an enum", item.ident.span())),
                Ok(syn::Item::Impl(item)) => Some(("an impl block", item.impl_token.span)),
                Ok(syn::Item::Trait(item)) => Some(("a trait", item.ident.span())),
                Ok(syn::Item::Mod(item)) => Some(("a module", item.ident.span())),
                Ok(syn::Item::Const(item)) => Some(("a const", item.ident.span())),
                Ok(syn::Item::Static(item)) => Some(("a static", item.ident.span())),
                Ok(syn::Item::Type(item)) => Some(("a type alias", item.ident.span())),
                _ => None,
            };
            match what {
                Some((what, span)) => Err(syn::Error::new(
                    span,
                    format!("`#[idempotent_job]` goes on a job handler function, not on {what}"),
                )),
                None => Err(error),
            }
        }
    }
}

/// A named parameter of the handler.
pub struct Param {
    pub ident: Ident,
    pub ty: Type,
}

/// The parts of a handler the expansion needs.
pub struct Handler<'a> {
    pub item: &'a ItemFn,
    /// `self`, if the handler is a method.
    pub receiver: Option<&'a syn::Receiver>,
    /// Parameters bound to a plain name, in order.
    pub params: Vec<Param>,
    /// Index into `params` of the connection.
    pub conn: usize,
}

impl<'a> Handler<'a> {
    /// Checks the signature and finds the connection; `None` when an error was recorded.
    pub fn analyse(item: &'a ItemFn, conn_arg: Option<&Ident>, cx: &Ctxt) -> Option<Self> {
        let sig = &item.sig;
        if let Some(constness) = &sig.constness {
            cx.error(syn::Error::new(
                constness.span,
                "a job handler cannot be a `const fn`: it runs in a database transaction",
            ));
        }
        if let Some(variadic) = &sig.variadic {
            cx.error(syn::Error::new(
                variadic.span(),
                "a job handler cannot be variadic",
            ));
        }
        check_return_type(sig, cx);

        let mut receiver = None;
        let mut params = Vec::new();
        for input in &sig.inputs {
            match input {
                FnArg::Receiver(r) => receiver = Some(r),
                FnArg::Typed(typed) => {
                    if let Pat::Ident(pat) = &*typed.pat {
                        params.push(Param {
                            ident: pat.ident.clone(),
                            ty: (*typed.ty).clone(),
                        });
                    }
                }
            }
        }

        let conn = find_conn(sig, &params, conn_arg, cx)?;
        Some(Handler {
            item,
            receiver,
            params,
            conn,
        })
    }

    pub fn conn(&self) -> &Param {
        &self.params[self.conn]
    }

    pub fn is_async(&self) -> bool {
        self.item.sig.asyncness.is_some()
    }
}

fn check_return_type(sig: &Signature, cx: &Ctxt) {
    let explain = "an `Err` rolls the job back, claim included, so that a retry runs it again";
    match &sig.output {
        ReturnType::Default => cx.error(syn::Error::new(
            sig.paren_token.span.close(),
            format!(
                "a job handler must return `Result<T, E>` ({explain}); `{}` returns nothing",
                sig.ident
            ),
        )),
        ReturnType::Type(_, ty) => {
            let is_result = match &**ty {
                Type::Path(path) => path.path.segments.last().is_some_and(|segment| {
                    segment.ident.to_string().ends_with("Result")
                        && matches!(segment.arguments, syn::PathArguments::AngleBracketed(_))
                }),
                _ => false,
            };
            if !is_result {
                cx.error(syn::Error::new(
                    ty.span(),
                    format!(
                        "a job handler must return `Result<T, E>` ({explain}); `{}` returns `{}`",
                        sig.ident,
                        ty.to_token_stream()
                            .to_string()
                            .replace(" < ", "<")
                            .replace(" >", ">")
                    ),
                ));
            }
        }
    }
}

/// The connection: `conn = <name>` if given, else the parameter named `conn`, else the one
/// parameter whose type looks like a connection.
fn find_conn(
    sig: &Signature,
    params: &[Param],
    conn_arg: Option<&Ident>,
    cx: &Ctxt,
) -> Option<usize> {
    let names = || {
        params
            .iter()
            .map(|p| p.ident.unraw().to_string())
            .collect::<Vec<_>>()
    };
    let index = if let Some(wanted) = conn_arg {
        let wanted_name = wanted.unraw().to_string();
        match params.iter().position(|p| p.ident.unraw() == wanted_name) {
            Some(index) => index,
            None => {
                let all = names();
                let mut message = format!(
                    "`conn = {wanted}`: `{}` has no parameter `{wanted}`",
                    sig.ident
                );
                if let Some(suggestion) = did_you_mean(&wanted_name, all.iter().map(String::as_str))
                {
                    message.push_str(&format!("; did you mean `{suggestion}`?"));
                }
                cx.error(syn::Error::new(wanted.span(), message));
                return None;
            }
        }
    } else if let Some(index) = params.iter().position(|p| p.ident == "conn") {
        index
    } else {
        let candidates: Vec<usize> = params
            .iter()
            .enumerate()
            .filter(|(_, p)| looks_like_connection(&p.ty))
            .map(|(i, _)| i)
            .collect();
        match candidates.as_slice() {
            [only] => *only,
            [] => {
                cx.error(syn::Error::new(
                    sig.paren_token.span.join(),
                    format!(
                        "`{}` has no connection parameter: the job's claim runs in the same transaction as its work, so the handler needs one. Take `conn: &mut <a Diesel connection>`, or name yours with `#[idempotent_job(conn = <name>, ...)]`",
                        sig.ident
                    ),
                ));
                return None;
            }
            several => {
                let list = several
                    .iter()
                    .map(|&i| format!("`{}`", params[i].ident))
                    .collect::<Vec<_>>()
                    .join(" and ");
                cx.error(syn::Error::new(
                    sig.paren_token.span.join(),
                    format!(
                        "{list} could each be the connection; say which with `#[idempotent_job(conn = {}, ...)]`",
                        params[several[0]].ident
                    ),
                ));
                return None;
            }
        }
    };

    let param = &params[index];
    match &param.ty {
        Type::Reference(reference) if reference.mutability.is_some() => Some(index),
        Type::Reference(reference) => {
            cx.error(syn::Error::new(
                reference.span(),
                format!(
                    "the connection `{}` must be `&mut`: the job writes its claim through it",
                    param.ident
                ),
            ));
            None
        }
        other => {
            cx.error(syn::Error::new(
                other.span(),
                format!(
                    "the connection `{}` must be taken as `&mut {}`, not by value: the caller keeps its connection (and the pool gets it back)",
                    param.ident,
                    other.to_token_stream()
                ),
            ));
            None
        }
    }
}

/// `&mut SomethingConnection`, `&mut PooledConnection<..>`, `&mut Object<..>`: what a user would
/// recognise as a connection when it is not named `conn`.
fn looks_like_connection(ty: &Type) -> bool {
    let Type::Reference(reference) = ty else {
        return false;
    };
    if reference.mutability.is_none() {
        return false;
    }
    match &*reference.elem {
        Type::Path(path) => path.path.segments.last().is_some_and(|segment| {
            let name = segment.ident.to_string();
            name.ends_with("Connection") || name.ends_with("Conn")
        }),
        _ => false,
    }
}

/// The span to blame for a parameter.
pub fn param_span(param: &Param) -> Span {
    param.ident.span()
}
