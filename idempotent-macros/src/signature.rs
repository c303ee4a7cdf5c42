//! The annotated item: parsed down to its signature, with the body kept as tokens, and checked for
//! what a handler must be (a connection, a `Result`) before anything is generated.
//!
//! Parsing the body fully would be slow and would fail on syntax syn does not know yet; the
//! wrapper only needs the signature. The checks here go by the signature's shape only; what only
//! the types can tell (is this a `Result` behind an alias, a connection behind a pool) is left to
//! the traits the expansion names, whose messages say the same things.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::ext::IdentExt as _;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned as _;
use syn::{Attribute, FnArg, Ident, Pat, ReturnType, Signature, Token, Type, Visibility};

use crate::ctxt::Ctxt;

mod connection;

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
    pub body_span: Span,
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

/// A parameter bound to a plain name (`month: &str`, `mut count: u32`).
pub struct Param {
    pub ident: Ident,
    pub ty: Type,
    /// Its place among the function's inputs, receiver included.
    pub position: usize,
}

/// A parameter bound by a pattern (`(month, day): (u8, u8)`): its bindings cannot be named by a
/// placeholder, but a message says how to reach them.
pub struct PatternParam {
    /// The pattern, as written.
    pub pattern: String,
    pub ty: Type,
    /// Each name the pattern binds, with the field path that reaches it from the whole value
    /// (`.0`, `.month`), where there is one.
    pub bindings: Vec<(String, Option<String>)>,
}

/// The handler's return type, as far as its spelling tells.
pub struct Output {
    pub ty: Type,
    /// `T` and `E`, when the type is spelled `Result<T, E>` (for readable companion docs; the
    /// expansion projects them through the runtime's `JobResult` otherwise).
    pub parts: Option<(Type, Type)>,
}

/// The parts of a handler the expansion needs.
pub struct Handler<'a> {
    pub item: &'a ItemFn,
    /// `self`, if the handler is a method.
    pub receiver: Option<&'a syn::Receiver>,
    /// Parameters bound to a plain name, in order.
    pub params: Vec<Param>,
    /// Parameters bound by a pattern.
    pub patterns: Vec<PatternParam>,
    /// Index into `params` of the connection.
    pub conn: usize,
    pub output: Output,
    /// Whether `Self` appears anywhere in the item: then it is an associated function, in an
    /// `impl` block where no companion type can stand.
    pub mentions_self: bool,
}

impl<'a> Handler<'a> {
    /// Checks the signature and finds the connection; `None` when an error was recorded.
    pub fn analyse(item: &'a ItemFn, conn_arg: Option<&Ident>, cx: &Ctxt) -> Option<Self> {
        let sig = &item.sig;
        if let Some(constness) = &sig.constness {
            cx.error_at(
                constness.span,
                "a job handler cannot be a `const fn`: it runs in a database transaction; remove `const`",
            );
        }
        if let Some(unsafety) = &sig.unsafety {
            cx.error_at(
                unsafety.span,
                "a job handler cannot be an `unsafe fn`: the attribute calls it for you, so nobody could uphold its contract; remove `unsafe` and keep the unsafe block inside the body",
            );
        }
        if let Some(abi) = &sig.abi {
            cx.error(syn::Error::new_spanned(
                abi,
                "a job handler cannot have an `extern` ABI: it is called from Rust, through the attribute's wrapper; remove it",
            ));
        }
        if let Some(variadic) = &sig.variadic {
            cx.error_at(variadic.span(), "a job handler cannot be variadic");
        }
        let output = check_output(sig, cx);
        if output.is_none() && returns_boxed_future(sig) {
            // The method `#[async_trait]` rewrote: its connection is one an `async fn` takes,
            // and saying "make the handler an `async fn`" of it would mislead.
            return None;
        }

        let mut receiver = None;
        let mut params = Vec::new();
        let mut patterns = Vec::new();
        for (position, input) in sig.inputs.iter().enumerate() {
            match input {
                FnArg::Receiver(r) => receiver = Some(r),
                FnArg::Typed(typed) => match &*typed.pat {
                    Pat::Ident(pat) if pat.subpat.is_none() => params.push(Param {
                        ident: pat.ident.clone(),
                        ty: (*typed.ty).clone(),
                        position,
                    }),
                    pattern => patterns.push(PatternParam {
                        pattern: pattern.to_token_stream().to_string(),
                        ty: (*typed.ty).clone(),
                        bindings: bindings(pattern),
                    }),
                },
            }
        }

        let conn = connection::find(item, &params, conn_arg, cx);
        let output = output?;
        Some(Handler {
            item,
            receiver,
            params,
            patterns,
            conn: conn?,
            output,
            mentions_self: mentions(item.sig.to_token_stream(), "Self")
                || mentions_outside_items(item.body.clone(), "Self"),
        })
    }

    pub fn conn(&self) -> &Param {
        &self.params[self.conn]
    }

    pub fn is_async(&self) -> bool {
        self.item.sig.asyncness.is_some()
    }

    /// The handler's name, as a placeholder or a job name would spell it.
    pub fn name(&self) -> String {
        self.item.sig.ident.unraw().to_string()
    }
}

/// Whether `sig` is a plain `fn` that returns a boxed future ([`is_boxed_future`]).
fn returns_boxed_future(sig: &Signature) -> bool {
    match &sig.output {
        ReturnType::Type(_, ty) if sig.asyncness.is_none() => {
            matches!(strip_groups(ty), Type::Path(path) if is_boxed_future(&path))
        }
        _ => false,
    }
}

/// Whether `path` is a boxed future: `Pin<Box<dyn Future<..>>>` (what `#[async_trait]` makes of an
/// `async fn`'s return type), `BoxFuture` or `LocalBoxFuture` (futures' aliases of it).
fn is_boxed_future(path: &syn::TypePath) -> bool {
    let Some(last) = path.path.segments.last() else {
        return false;
    };
    match last.ident.to_string().as_str() {
        "BoxFuture" | "LocalBoxFuture" => true,
        "Pin" => mentions(last.arguments.to_token_stream(), "Future"),
        _ => false,
    }
}

/// The return type, checked by its shape: a type that cannot be a `Result` whatever it names, or a
/// `Result<T, E>` whose `T` cannot be read back from the database, is an error here; any other
/// path (an alias such as `anyhow::Result<T>`) is left to the `JobResult` trait.
fn check_output(sig: &Signature, cx: &Ctxt) -> Option<Output> {
    let name = &sig.ident;
    let explain = "an `Err` rolls the job back, claim included, so that a retry runs it again, and the `Ok` value is stored for replays";
    let ty = match &sig.output {
        ReturnType::Default => {
            cx.error_at(
                sig.paren_token.span.close(),
                format!(
                    "a job handler must return `Result<T, E>` ({explain}); `{name}` returns nothing: return `Result<(), E>`"
                ),
            );
            return None;
        }
        ReturnType::Type(_, ty) => strip_groups(ty),
    };
    let not_a_result = match &ty {
        Type::ImplTrait(_)
            if sig.asyncness.is_none() && mentions(ty.to_token_stream(), "Future") =>
        {
            cx.error(syn::Error::new_spanned(
                &ty,
                format!(
                    "`{name}` returns a future: write it as an `async fn` that returns the `Result` itself (`async fn {name}(..) -> Result<T, E>`), so that the job's claim and the body run in one transaction"
                ),
            ));
            return None;
        }
        Type::Path(_) if returns_boxed_future(sig) => {
            cx.error(syn::Error::new_spanned(
                &ty,
                format!(
                    "`{name}` returns a boxed future, as `#[async_trait]` rewrites an `async fn` before this attribute sees it: the job's claim and its body must run in one transaction, in the handler itself. Write the trait's method as a native `async fn` (no `#[async_trait]`), or make the job a free `async fn {name}(..) -> Result<T, E>` that the method calls"
                ),
            ));
            return None;
        }
        Type::ImplTrait(_) => Some(
            "name the type: a stored result is read back as the type the handler returns"
                .to_owned(),
        ),
        Type::Path(_) | Type::Macro(_) | Type::Verbatim(_) => None,
        _ => Some(format!("return `Result<{}, E>`", shown(&ty))),
    };
    if let Some(fix) = not_a_result {
        cx.error(syn::Error::new_spanned(
            &ty,
            format!(
                "a job handler must return `Result<T, E>` ({explain}); `{name}` returns `{}`: {fix}",
                shown(&ty)
            ),
        ));
        return None;
    }
    let parts = result_parts(&ty);
    if let Some((ok, _)) = &parts
        && let Some(reason) = not_storable(ok)
    {
        cx.error(syn::Error::new_spanned(ok, reason));
        return None;
    }
    Some(Output { ty, parts })
}

/// `T` and `E` of a type spelled `Result<T, E>`.
fn result_parts(ty: &Type) -> Option<(Type, Type)> {
    let Type::Path(path) = ty else { return None };
    let last = path.path.segments.last()?;
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    let mut types = args.args.iter().filter_map(|arg| match arg {
        syn::GenericArgument::Type(ty) => Some(ty.clone()),
        _ => None,
    });
    let (ok, err) = (types.next()?, types.next()?);
    (last.ident == "Result" && types.next().is_none() && args.args.len() == 2).then_some((ok, err))
}

/// Why an `Ok` type cannot be stored and read back, if it visibly cannot: it borrows, or it is
/// `impl Trait`.
fn not_storable(ok: &Type) -> Option<String> {
    let tokens = ok.to_token_stream();
    if mentions(tokens.clone(), "impl") {
        return Some(format!(
            "the handler's `Ok` type `{}` is not named: a stored result is read back from the database as the type the handler returns, so name it (a struct that derives `Serialize` and `Deserialize`)",
            shown(ok)
        ));
    }
    if !borrows(tokens) {
        return None;
    }
    let owned = match strip_groups(ok) {
        Type::Reference(reference) => match strip_groups(&reference.elem) {
            Type::Path(path) if path.path.is_ident("str") => "`String`".to_owned(),
            Type::Slice(slice) => format!("`Vec<{}>`", shown(&slice.elem)),
            elem => format!("`{}`", shown(&elem)),
        },
        _ => "an owned type (`String` for `&str`, `Vec<T>` for `&[T]`)".to_owned(),
    };
    Some(format!(
        "the handler's `Ok` type `{}` borrows: a stored result is read back from the database on a replay, where there is nothing to borrow from, so it must own its data; return {owned} instead",
        shown(ok)
    ))
}

/// Whether a type contains a reference (`&`), outside of function pointer types.
fn borrows(tokens: TokenStream) -> bool {
    let mut previous_fn = false;
    tokens.into_iter().any(|tree| {
        let found = match &tree {
            TokenTree::Punct(punct) => punct.as_char() == '&',
            TokenTree::Group(group) => !previous_fn && borrows(group.stream()),
            _ => false,
        };
        previous_fn = matches!(&tree, TokenTree::Ident(ident) if ident == "fn" || ident == "Fn" || ident == "FnMut" || ident == "FnOnce");
        found
    })
}

/// A type without the invisible groups `macro_rules!` wraps fragments in.
pub fn strip_groups(ty: &Type) -> Type {
    match ty {
        Type::Group(group) => strip_groups(&group.elem),
        Type::Paren(paren) => strip_groups(&paren.elem),
        other => other.clone(),
    }
}

/// A type as a message shows it: `Result<&'static str, Error>`, not `Result < & 'static str , Error >`.
pub fn shown(ty: &impl ToTokens) -> String {
    let mut text = ty.to_token_stream().to_string();
    for (from, to) in [
        (" < ", "<"),
        ("< ", "<"),
        (" <", "<"),
        (" >", ">"),
        (" ,", ","),
        ("& ", "&"),
        (" :: ", "::"),
        (":: ", "::"),
        ("( ", "("),
        (" )", ")"),
        ("[ ", "["),
        (" ]", "]"),
        (" ;", ";"),
    ] {
        text = text.replace(from, to);
    }
    text
}

/// Whether `tokens` contain the identifier `name` anywhere, nested groups included.
pub fn mentions(tokens: TokenStream, name: &str) -> bool {
    tokens.into_iter().any(|tree| match tree {
        TokenTree::Ident(ident) => ident == name,
        TokenTree::Group(group) => mentions(group.stream(), name),
        TokenTree::Punct(_) | TokenTree::Literal(_) => false,
    })
}

/// Whether `tokens` (a body) contain the identifier `name` outside the items declared in them: a
/// nested `impl`, `trait`, `fn`, `struct`, `enum`, `union` or `mod` is a scope of its own, where
/// `Self` is that item's (the outer one cannot be named there).
pub fn mentions_outside_items(tokens: TokenStream, name: &str) -> bool {
    // Each followed by the item's name (`union` is also a method's name, `fn(u8)` a type).
    const NAMED_ITEMS: &[&str] = &["fn", "trait", "struct", "enum", "union", "mod"];
    let mut trees = tokens.into_iter().peekable();
    while let Some(tree) = trees.next() {
        match &tree {
            TokenTree::Ident(ident) if ident == name => return true,
            TokenTree::Ident(ident)
                if ident == "impl"
                    || (NAMED_ITEMS.iter().any(|item| ident == item)
                        && matches!(trees.peek(), Some(TokenTree::Ident(_)))) =>
            {
                // The item runs to its body's braces, or to a `;` (`struct A(u8);`).
                for tree in trees.by_ref() {
                    match tree {
                        TokenTree::Group(group)
                            if group.delimiter() == proc_macro2::Delimiter::Brace =>
                        {
                            break;
                        }
                        TokenTree::Punct(punct) if punct.as_char() == ';' => break,
                        _ => {}
                    }
                }
            }
            TokenTree::Group(group) if mentions_outside_items(group.stream(), name) => return true,
            _ => {}
        }
    }
    false
}

/// The names a pattern binds, each with the field path that reaches it from the whole value.
fn bindings(pat: &Pat) -> Vec<(String, Option<String>)> {
    fn walk(pat: &Pat, path: Option<String>, out: &mut Vec<(String, Option<String>)>) {
        let field = |base: &Option<String>, member: String| {
            base.as_ref().map(|base| format!("{base}.{member}"))
        };
        match pat {
            Pat::Ident(ident) => {
                out.push((ident.ident.unraw().to_string(), path.clone()));
                if let Some((_, sub)) = &ident.subpat {
                    walk(sub, path, out);
                }
            }
            Pat::Tuple(tuple) => {
                for (index, elem) in tuple.elems.iter().enumerate() {
                    walk(elem, field(&path, index.to_string()), out);
                }
            }
            Pat::TupleStruct(tuple) => {
                for (index, elem) in tuple.elems.iter().enumerate() {
                    walk(elem, field(&path, index.to_string()), out);
                }
            }
            Pat::Struct(strukt) => {
                for field_pat in &strukt.fields {
                    let member = match &field_pat.member {
                        syn::Member::Named(name) => name.unraw().to_string(),
                        syn::Member::Unnamed(index) => index.index.to_string(),
                    };
                    walk(&field_pat.pat, field(&path, member), out);
                }
            }
            Pat::Reference(reference) => walk(&reference.pat, path, out),
            Pat::Paren(paren) => walk(&paren.pat, path, out),
            Pat::Type(typed) => walk(&typed.pat, path, out),
            Pat::Slice(slice) => {
                for elem in &slice.elems {
                    walk(elem, None, out);
                }
            }
            Pat::Or(or) => {
                for case in &or.cases {
                    walk(case, None, out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(pat, Some(String::new()), &mut out);
    out
}

/// The span to blame for a parameter.
pub fn param_span(param: &Param) -> Span {
    param.ident.span()
}

#[cfg(test)]
mod tests {
    use super::{bindings, borrows, not_storable, shown};
    use quote::ToTokens as _;

    #[test]
    fn types_are_shown_as_written() {
        let ty: syn::Type = syn::parse_quote!(Result<&'static str, idempotent_jobs::Error>);
        assert_eq!(shown(&ty), "Result<&'static str, idempotent_jobs::Error>");
        let ty: syn::Type =
            syn::parse_quote!(&mut PooledConnection<ConnectionManager<PgConnection>>);
        assert_eq!(
            shown(&ty),
            "&mut PooledConnection<ConnectionManager<PgConnection>>"
        );
        let ty: syn::Type = syn::parse_quote!((u8, [u16; 2]));
        assert_eq!(shown(&ty), "(u8, [u16; 2])");
    }

    #[test]
    fn self_in_a_nested_item_is_not_the_handlers() {
        use super::mentions_outside_items;
        let body: proc_macro2::TokenStream = syn::parse_quote! {{
            struct Counter(u64);
            impl Counter { fn new(start: u64) -> Self { Self(start) } }
            fn helper() -> u8 { 1 }
            let pointer: fn() -> u8 = helper;
            Ok(Counter::new(pointer().into()).0)
        }};
        assert!(!mentions_outside_items(body, "Self"));
        let body: proc_macro2::TokenStream = syn::parse_quote! {{
            struct Local;
            let made = Self::new();
            Ok(made)
        }};
        assert!(mentions_outside_items(body, "Self"));
        let body: proc_macro2::TokenStream = syn::parse_quote! {{
            let pointer: fn() -> Self = Self::new;
            Ok(pointer())
        }};
        assert!(mentions_outside_items(body, "Self"));
    }

    #[test]
    fn pattern_bindings_know_their_field_paths() {
        let pat: syn::Pat = syn::parse_quote!((month, Period { year, day: d }));
        let names: Vec<(String, Option<String>)> = bindings(&pat);
        assert_eq!(
            names,
            vec![
                ("month".to_owned(), Some(".0".to_owned())),
                ("year".to_owned(), Some(".1.year".to_owned())),
                ("d".to_owned(), Some(".1.day".to_owned())),
            ]
        );
        let pat: syn::Pat = syn::parse_quote!([first, ..]);
        assert_eq!(bindings(&pat), vec![("first".to_owned(), None)]);
    }

    #[test]
    fn borrowed_results_are_found_inside_other_types() {
        let owned: syn::Type = syn::parse_quote!(Vec<(String, Box<fn(&str) -> u8>)>);
        assert!(
            !borrows(owned.to_token_stream()),
            "a `&` inside a fn pointer type is not a borrow"
        );
        let inside: syn::Type = syn::parse_quote!(Option<Vec<&'static str>>);
        assert!(borrows(inside.to_token_stream()));
        let str_ref: syn::Type = syn::parse_quote!(&'static str);
        assert!(not_storable(&str_ref).is_some_and(|m| m.contains("return `String` instead")));
        let slice: syn::Type = syn::parse_quote!(&'static [u8]);
        assert!(not_storable(&slice).is_some_and(|m| m.contains("return `Vec<u8>` instead")));
        let hidden: syn::Type = syn::parse_quote!(impl serde::Serialize);
        assert!(not_storable(&hidden).is_some_and(|m| m.contains("is not named")));
    }
}
