//! The `#[idempotent_job]` attribute. Use it through the `idempotent-jobs` crate, which documents
//! every argument.
//!
//! This crate parses and checks; it writes no SQL. It works in three phases, each in its module:
//!
//! 1. **parse**: the arguments (`args`), the handler's signature with its body kept as tokens
//!    (`signature`, which also checks what the signature's shape shows: the connection in
//!    `signature::connection`, the return type) and the key template (`check::parse_template`,
//!    with the template language of `idempotent-keys`, the same code the runtime escapes values
//!    with);
//! 2. **check** (`check`): the template and the fingerprint inputs against the parameters;
//! 3. **expand** (`expand`): the handler, its body run by the runtime, and its companion
//!    (`expand::companion`).
//!
//! What only the types can tell (a `Result` behind an alias, a connection behind a pool, a
//! placeholder's `Display`) is checked by the runtime's traits in `idempotent_jobs::handler`,
//! through calls of their own methods, so that an error is the trait's message at the user's token.
//!
//! Every error of every phase goes to one `ctxt::Ctxt`; nothing is expanded while it holds any.
//! Then the handler comes back as written, next to the errors, so that the rest of the crate and
//! the IDE still see it.

mod args;
mod check;
mod ctxt;
mod expand;
mod private_path;
mod scope;
mod signature;

use proc_macro::TokenStream;

/// Makes a job handler safe to run twice. See the `idempotent-jobs` crate for the full
/// documentation of its arguments.
#[proc_macro_attribute]
pub fn idempotent_job(args: TokenStream, item: TokenStream) -> TokenStream {
    entry(args.into(), item.into()).into()
}

fn entry(
    args: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> proc_macro2::TokenStream {
    let cx = ctxt::Ctxt::default();

    // Parse.
    let args = args::Args::parse(args, &cx);
    let item = match signature::parse_item(item.clone()) {
        Ok(item) => item,
        Err(error) => {
            // Not a function we can wrap: give the item back untouched, next to the errors.
            cx.error(error);
            let errors = cx.check_in(args.krate.as_ref()).err();
            return quote::quote! { #errors #item };
        }
    };
    let mut item = item;
    if let Some(repeated) = take_repeated_attribute(&mut item) {
        cx.error(syn::Error::new_spanned(
            &repeated,
            format!(
                "`#[idempotent_job]` is applied twice to `{}`: a handler is one job, with one key; remove one of the two attributes",
                item.sig.ident
            ),
        ));
        let errors = cx.check_in(args.krate.as_ref()).err();
        return quote::quote! { #errors #[allow(unused_variables)] #item };
    }
    let handler = signature::Handler::analyse(&item, args.conn.as_ref(), &cx);
    let key = args.key.as_ref().map(|key| check::parse_template(key, &cx));
    if key.is_none() && !args.wrote("key") {
        cx.error_at(
            proc_macro2::Span::call_site(),
            "`#[idempotent_job]` needs a key template: `#[idempotent_job(key = \"invoice:<month>:<customer_id>\")]`, where each `<name>` is a parameter of the handler",
        );
    }

    // Check.
    if let Some(key) = &key {
        check::check(key, &args, handler.as_ref(), &cx);
    }
    let companion = handler
        .as_ref()
        .is_some_and(|handler| wants_companion(handler, &args, &cx));

    // Expand, only when nothing was found.
    match (cx.check_in(args.krate.as_ref()), handler, key) {
        (Ok(()), Some(handler), Some(key)) => expand::Expansion {
            handler: &handler,
            key: &key,
            args: &args,
            companion,
        }
        .expand(),
        (result, _, _) => {
            // Parameters used only by the key would read as unused without the wrapper; that
            // warning would only distract from the errors.
            let errors = result.err();
            quote::quote! { #errors #[allow(unused_variables)] #item }
        }
    }
}

/// A second `#[idempotent_job]` on the same function (spelled with any path: a renamed import
/// cannot be recognised), taken out of its attributes so that it does not expand again.
fn take_repeated_attribute(item: &mut signature::ItemFn) -> Option<syn::Attribute> {
    let position = item.attrs.iter().position(|attr| {
        attr.path()
            .segments
            .last()
            .is_some_and(|segment| segment.ident == "idempotent_job")
    })?;
    Some(item.attrs.remove(position))
}

/// Whether the handler gets a companion: a free function does, unless `no_companion` says not; a
/// method or an associated function does not, which the signature shows when it has a receiver or
/// names `Self`, and the source file shows otherwise ([`scope`]). A free function whose name a
/// type or module beside it already takes gets an error that says what to write.
fn wants_companion(handler: &signature::Handler<'_>, args: &args::Args, cx: &ctxt::Ctxt) -> bool {
    if handler.receiver.is_some() || handler.mentions_self || args.no_companion.is_some() {
        return false;
    }
    match scope::locate(handler.item) {
        scope::Place::Associated => false,
        scope::Place::Free {
            taken_by: Some(kind),
        } => {
            let name = &handler.item.sig.ident;
            let or = if kind == scope::CRATE_IN_A_PATH {
                format!(
                    "rename the function (for a crate, writing its paths from the root, `::{name}::..`, also does)"
                )
            } else {
                "rename one of the two".to_owned()
            };
            cx.error_at(
                name.span(),
                format!(
                    "`{name}` is also the name of {kind} here, and the companion that `#[idempotent_job]` gives a free function takes the function's name among types and modules; add `no_companion` to the attribute (the function itself is the job), or {or}"
                ),
            );
            false
        }
        scope::Place::Free { taken_by: None } | scope::Place::Unknown => true,
    }
}
