//! The `#[idempotent_job]` attribute. Use it through the `idempotent-jobs` crate, which documents it.
//!
//! This crate only parses and checks: the key template against the handler's parameters at compile
//! time, then generates a call into the runtime (`idempotent_jobs::__private::run_with`). No SQL here.

mod args;
mod errors;
mod expand;
mod signature;
mod template;

use proc_macro::TokenStream;

/// Makes a job handler safe to run twice. See the `idempotent-jobs` crate for the full documentation.
#[proc_macro_attribute]
pub fn idempotent_job(args: TokenStream, item: TokenStream) -> TokenStream {
    entry(args.into(), item.into()).into()
}

fn entry(
    args: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> proc_macro2::TokenStream {
    let mut errors = errors::Errors::default();
    let args = args::Args::parse(args, &mut errors);
    let item = match signature::parse_item(item.clone()) {
        Ok(item) => item,
        Err(error) => {
            // Not a function we can wrap: report, and give the item back untouched so the rest of
            // the crate still sees it.
            errors.push(error);
            let errors = errors.to_compile_errors();
            return quote::quote! { #errors #item };
        }
    };

    let handler = signature::Handler::analyse(&item, args.conn.as_ref(), &mut errors);
    let template = match &args.key {
        Some(key) => expand::check_template(key, &args, handler.as_ref(), &mut errors),
        None if args.key_written => None, // its value was refused, and said so
        None => {
            errors.push(syn::Error::new(
                proc_macro2::Span::call_site(),
                "`#[idempotent_job]` needs a key template: `#[idempotent_job(key = \"invoice:<month>:<customer_id>\")]`, where each `<name>` is a parameter of the handler",
            ));
            None
        }
    };

    match (errors.is_empty(), handler, template, &args.key) {
        (true, Some(handler), Some(template), Some(key)) => expand::Expansion {
            handler: &handler,
            template: &template,
            key,
            args: &args,
        }
        .expand(),
        _ => {
            // Give the function back as written, so that IDEs and the rest of the crate keep
            // working, next to every error found. Parameters used only by the key would read as
            // unused without the wrapper; that warning would only distract from the errors.
            let errors = errors.to_compile_errors();
            quote::quote! { #errors #[allow(unused_variables)] #item }
        }
    }
}
