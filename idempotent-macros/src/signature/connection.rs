//! The connection parameter: which one it is, and whether its shape can be a connection at all.
//!
//! What the spelling of a type shows is checked here, with the fix at the type: a connection taken
//! by value or by `&`, a parameter that is plainly not a connection (`i64`, `&str`), a sync Diesel
//! connection in an `async fn` and a diesel-async one in a plain `fn`. Anything else (a type alias,
//! a user type) is checked by the runtime's connection traits, whose messages say the same.

use syn::ext::IdentExt as _;
use syn::{Ident, Type};

use super::{ItemFn, Param, mentions, shown, strip_groups};
use crate::ctxt::{Ctxt, did_you_mean};

/// Value types that are never a database connection, by the last segment of their path.
const NOT_CONNECTIONS: &[&str] = &[
    "bool",
    "char",
    "str",
    "String",
    "i8",
    "i16",
    "i32",
    "i64",
    "i128",
    "isize",
    "u8",
    "u16",
    "u32",
    "u64",
    "u128",
    "usize",
    "f32",
    "f64",
    "Option",
    "Vec",
    "HashMap",
    "BTreeMap",
    "HashSet",
    "BTreeSet",
    "Cow",
    "Uuid",
    "Duration",
    "Instant",
    "SystemTime",
    "PathBuf",
    "Path",
];

/// Diesel's sync connections, each with the async connection that takes its place in an
/// `async fn`.
const SYNC_CONNECTIONS: &[(&str, &str)] = &[
    (
        "SqliteConnection",
        "SyncConnectionWrapper<SqliteConnection>",
    ),
    ("PgConnection", "AsyncPgConnection"),
    ("MysqlConnection", "AsyncMysqlConnection"),
];

/// diesel-async's connections and pools, each with the sync connection that takes its place in a
/// plain `fn`.
const ASYNC_CONNECTIONS: &[(&str, &str)] = &[
    ("SyncConnectionWrapper", "SqliteConnection"),
    ("AsyncPgConnection", "PgConnection"),
    ("AsyncMysqlConnection", "MysqlConnection"),
    (
        "AsyncDieselConnectionManager",
        "a Diesel connection from an r2d2 pool",
    ),
];

/// The connection: `conn = <name>` if given, else the parameter named `conn`, else the one
/// parameter whose type looks like a connection. `None` when an error was recorded.
pub fn find(item: &ItemFn, params: &[Param], conn_arg: Option<&Ident>, cx: &Ctxt) -> Option<usize> {
    let sig = &item.sig;
    let (index, named) = if let Some(wanted) = conn_arg {
        (named_by_argument(sig, params, wanted, cx)?, true)
    } else if let Some(index) = params.iter().position(|p| p.ident.unraw() == "conn") {
        (index, false)
    } else {
        (found_by_type(sig, params, cx)?, false)
    };
    check_shape(item, params, index, named, cx).then_some(index)
}

fn named_by_argument(
    sig: &syn::Signature,
    params: &[Param],
    wanted: &Ident,
    cx: &Ctxt,
) -> Option<usize> {
    let wanted_name = wanted.unraw().to_string();
    if let Some(index) = params.iter().position(|p| p.ident.unraw() == wanted_name) {
        return Some(index);
    }
    let names: Vec<String> = params.iter().map(|p| p.ident.unraw().to_string()).collect();
    let mut message = format!(
        "`conn = {wanted}`: `{}` has no parameter `{wanted}`",
        sig.ident
    );
    if let Some(suggestion) = did_you_mean(&wanted_name, names.iter().map(String::as_str)) {
        message.push_str(&format!("; did you mean `{suggestion}`?"));
    } else if !names.is_empty() {
        let list: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
        message.push_str(&format!("; its parameters are {}", list.join(", ")));
    }
    cx.error_at(wanted.span(), message);
    None
}

fn found_by_type(sig: &syn::Signature, params: &[Param], cx: &Ctxt) -> Option<usize> {
    let candidates: Vec<usize> = params
        .iter()
        .enumerate()
        .filter(|(_, p)| looks_like_connection(&p.ty))
        .map(|(i, _)| i)
        .collect();
    match candidates.as_slice() {
        [only] => Some(*only),
        [] => {
            if let Some(unnamed) = unnamed_connection(sig) {
                cx.error_at(
                    unnamed,
                    format!(
                        "`{}`'s connection parameter is `_`: the attribute passes the connection to the runtime by its name; name it (`conn: &mut ..`), with `let _ = conn;` in the body if the body does not use it",
                        sig.ident
                    ),
                );
                return None;
            }
            cx.error_at(
                sig.paren_token.span.join(),
                format!(
                    "`{}` has no connection parameter: the job's claim runs in the same transaction as its work, so the handler needs one. Take `conn: &mut <a Diesel connection>`, or name yours with `#[idempotent_job(conn = <name>, ...)]`",
                    sig.ident
                ),
            );
            None
        }
        several => {
            let list: Vec<String> = several
                .iter()
                .map(|&i| format!("`{}`", params[i].ident))
                .collect();
            cx.error_at(
                sig.paren_token.span.join(),
                format!(
                    "{} could each be the connection; say which with `#[idempotent_job(conn = {}, ...)]`",
                    list.join(" and "),
                    params[several[0]].ident
                ),
            );
            None
        }
    }
}

/// Checks what the spelling of the connection's type shows; `false` when an error was recorded.
fn check_shape(item: &ItemFn, params: &[Param], index: usize, named: bool, cx: &Ctxt) -> bool {
    let param = &params[index];
    let ty = strip_groups(&param.ty);
    let ident = &param.ident;
    let problem = match &ty {
        Type::Reference(reference) if reference.mutability.is_some() => {
            if plainly_not_a_connection(&reference.elem) {
                not_a_connection(params, index, named)
            } else {
                return check_flavour(item, &ty, cx);
            }
        }
        Type::Reference(reference) if plainly_not_a_connection(&reference.elem) => {
            not_a_connection(params, index, named)
        }
        Type::Reference(reference) => format!(
            "the connection `{ident}` must be `&mut {}`, not `&`: the job writes its claim and its work through it",
            shown(&reference.elem)
        ),
        other if plainly_not_a_connection(other) => not_a_connection(params, index, named),
        other => format!(
            "the connection `{ident}` must be taken as `&mut {}`, not by value: the caller keeps its connection (and the pool gets it back)",
            shown(other)
        ),
    };
    cx.error(syn::Error::new_spanned(&param.ty, problem));
    false
}

fn not_a_connection(params: &[Param], index: usize, named: bool) -> String {
    let param = &params[index];
    let ident = &param.ident;
    let ty = shown(&param.ty);
    let how = "a job claims its key in the transaction of its work, so the handler takes `&mut` a Diesel connection (`conn: &mut PgConnection`, a pooled connection, or a diesel-async connection in an `async fn`)";
    let candidate = params
        .iter()
        .enumerate()
        .find(|(i, p)| *i != index && looks_like_connection(&p.ty))
        .map(|(_, p)| &p.ident);
    match (named, candidate) {
        (true, Some(conn)) => format!(
            "`conn = {ident}` names `{ident}: {ty}`, which is not a database connection: {how}; did you mean `conn = {conn}`?"
        ),
        (true, None) => format!(
            "`conn = {ident}` names `{ident}: {ty}`, which is not a database connection: {how}; add one, and name it in `conn = ...`"
        ),
        (false, Some(conn)) => format!(
            "the parameter `{ident}` is a `{ty}`, not a database connection: {how}; rename this one, or say which is the connection with `#[idempotent_job(conn = {conn}, ...)]`"
        ),
        (false, None) => format!(
            "the parameter `{ident}` is a `{ty}`, not a database connection: {how}; add one (and rename this parameter, or name the connection with `#[idempotent_job(conn = <name>, ...)]`)"
        ),
    }
}

/// A sync Diesel connection in an `async fn`, or a diesel-async one in a plain `fn`.
fn check_flavour(item: &ItemFn, ty: &Type, cx: &Ctxt) -> bool {
    let tokens = quote::ToTokens::to_token_stream(ty);
    let name = &item.sig.ident;
    let found = |list: &'static [(&'static str, &'static str)]| {
        list.iter()
            .find(|(connection, _)| mentions(tokens.clone(), connection))
    };
    // `AsyncConnectionWrapper` makes an async connection a sync one: its type names both.
    if mentions(tokens.clone(), "AsyncConnectionWrapper") {
        return true;
    }
    let asynchronous = found(ASYNC_CONNECTIONS);
    let message = match (
        item.sig.asyncness.is_some(),
        asynchronous,
        found(SYNC_CONNECTIONS),
    ) {
        (true, None, Some((_, instead))) if sync_outside(ty) => format!(
            "`{name}` is an `async fn`, but its connection `{}` is a sync Diesel connection: make the handler a plain `fn` (remove `async`), or take a diesel-async connection (`&mut {instead}`)",
            shown(ty)
        ),
        (false, Some((_, instead)), _) => format!(
            "`{name}` is a plain `fn`, but its connection `{}` is a diesel-async connection: make the handler an `async fn`, or take a sync Diesel connection (`&mut {instead}`)",
            shown(ty)
        ),
        _ => return true,
    };
    cx.error(syn::Error::new_spanned(ty, message));
    false
}

/// Whether the type behind the reference is, outside, a sync Diesel connection or r2d2's pooled
/// one: `&mut SqliteConnection`, `&mut PooledConnection<ConnectionManager<PgConnection>>`. A type
/// of another name that holds one (`&mut Wrapped<SqliteConnection>`, with
/// `use ...::SyncConnectionWrapper as Wrapped`) may be a diesel-async connection: not refused
/// here (the compiler says so if it is not one).
fn sync_outside(ty: &Type) -> bool {
    let inner = match strip_groups(ty) {
        Type::Reference(reference) => strip_groups(&reference.elem),
        other => other,
    };
    let Type::Path(path) = inner else {
        return false;
    };
    path.path.segments.last().is_some_and(|segment| {
        let name = segment.ident.to_string();
        name == "PooledConnection"
            || SYNC_CONNECTIONS
                .iter()
                .any(|(connection, _)| name == *connection)
    })
}

/// `&mut SomethingConnection`, `&mut PooledConnection<..>`, `&mut Object<..>`: what a user would
/// recognise as a connection when it is not named `conn`.
fn looks_like_connection(ty: &Type) -> bool {
    let Type::Reference(reference) = strip_groups(ty) else {
        return false;
    };
    if reference.mutability.is_none() {
        return false;
    }
    match strip_groups(&reference.elem) {
        Type::Path(path) => path.path.segments.last().is_some_and(|segment| {
            let name = segment.ident.to_string();
            name.ends_with("Connection") || name.ends_with("Conn")
        }),
        _ => false,
    }
}

/// A type that is a value, never a connection, by its shape or its name: `i64`, `&str`,
/// `(u8, u8)`, `Vec<u8>`.
fn plainly_not_a_connection(ty: &Type) -> bool {
    match strip_groups(ty) {
        Type::Path(path) => {
            path.qself.is_none()
                && path
                    .path
                    .segments
                    .last()
                    .is_some_and(|segment| NOT_CONNECTIONS.iter().any(|name| segment.ident == name))
        }
        Type::Reference(reference) => plainly_not_a_connection(&reference.elem),
        Type::Tuple(_)
        | Type::Array(_)
        | Type::Slice(_)
        | Type::Never(_)
        | Type::BareFn(_)
        | Type::Ptr(_) => true,
        _ => false,
    }
}

/// The span of a parameter `_: &mut <a connection>` (a pattern, so not among the named parameters).
fn unnamed_connection(sig: &syn::Signature) -> Option<proc_macro2::Span> {
    sig.inputs.iter().find_map(|input| match input {
        syn::FnArg::Typed(typed)
            if matches!(&*typed.pat, syn::Pat::Wild(_)) && looks_like_connection(&typed.ty) =>
        {
            Some(syn::spanned::Spanned::span(&typed.pat))
        }
        _ => None,
    })
}
