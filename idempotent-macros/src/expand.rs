//! The expand phase: writes the wrapper around a handler that passed every check. Generated paths
//! go through the runtime's versioned private module, so a facade and a macro crate of different
//! versions fail to compile with a message naming that module.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::Ident;
use syn::ext::IdentExt as _;

use idempotent_keys::template::{self, Piece, Segment};

use crate::args::Args;
use crate::check::KeyTemplate;
use crate::signature::{Handler, param_span};

/// The runtime's private module for generated code, named with this crate's version, which the
/// facade pins exactly.
fn private_module() -> Ident {
    format_ident!(
        "__private_{}",
        env!("CARGO_PKG_VERSION").replace(['.', '-', '+'], "_")
    )
}

/// Everything the wrapper is generated from.
pub struct Expansion<'a> {
    pub handler: &'a Handler<'a>,
    pub key: &'a KeyTemplate,
    pub args: &'a Args,
}

impl Expansion<'_> {
    pub fn expand(&self) -> TokenStream {
        let item = self.handler.item;
        let attrs = &item.attrs;
        let vis = &item.vis;
        let sig = &item.sig;
        let body = &item.body;
        let krate = self.krate();
        let private = private_module();
        let mixed = Span::mixed_site();
        let key_var = Ident::new("__idempotent_key", mixed);
        let writer = Ident::new("__idempotent_writer", mixed);
        let store = Ident::new("__idempotent_conn", mixed);

        let job_static = Ident::new("__IDEMPOTENT_JOB", mixed);
        let job = self.job(&krate, &job_static);
        let build_key = self.build_key(&krate, &writer);
        let conn = &self.handler.conn().ident;
        let (output, output_span) = match &sig.output {
            syn::ReturnType::Type(_, ty) => (quote!(#ty), syn::spanned::Spanned::span(ty)),
            syn::ReturnType::Default => (quote!(()), Span::call_site()),
        };
        // Blame the return type when `T` cannot be stored or `E` cannot hold our errors, and the
        // connection's type when it is not a connection.
        let conn_span = syn::spanned::Spanned::span(&self.handler.conn().ty);
        let asynchronous = self.handler.is_async();
        let (reach, runner, closure) = if asynchronous {
            (
                quote_spanned!(conn_span=> AsyncJobConnection as _; #store.async_job_connection()),
                quote!(run_async_with),
                quote!(async move |#conn| -> #output #body),
            )
        } else {
            (
                quote_spanned!(conn_span=> JobConnection as _; #store.job_connection()),
                quote!(run_with),
                quote!(move |#conn| -> #output #body),
            )
        };
        let reach_store = quote_spanned! {conn_span=>
            |#store| {
                use #krate::#private::#reach
            }
        };

        // The original block sits unchanged inside the closure; its parameter rebinds the
        // connection under the user's own name and type, so the body reads exactly as written.
        let job_call = self.job_call(&krate, &job_static, &key_var);
        let krate_at_output = self.krate_at(output_span);
        let awaited = asynchronous.then(|| quote!(.await));
        let run = quote_spanned! {output_span=>
            #krate_at_output::#private::#runner(
                #conn,
                #reach_store,
                #job_call,
                #closure,
            )#awaited
        };
        let wrapper = quote! {
            #job
            let #key_var = {
                #build_key
            };
            #run.map(#krate::#private::Outcome::into_inner)
        };
        let mut wrapper = proc_macro2::Group::new(proc_macro2::Delimiter::Brace, wrapper);
        wrapper.set_span(item.body_span);
        quote! {
            #(#attrs)*
            #vis #sig #wrapper
        }
    }

    fn krate(&self) -> TokenStream {
        self.krate_at(Span::call_site())
    }

    /// The runtime's path, its tokens spanned at `span` so that errors about a call through it
    /// point there.
    fn krate_at(&self, span: Span) -> TokenStream {
        match &self.args.krate {
            Some(path) => quote!(#path),
            None => quote_spanned!(span=> ::idempotent_jobs),
        }
    }

    /// The job's static description, registered so that `registry::check_key_spaces` sees it.
    fn job(&self, krate: &TokenStream, job_static: &Ident) -> TokenStream {
        let private = private_module();
        let (name, named_after_function) = match &self.args.name {
            Some(name) => (name.value(), None),
            None => (
                self.handler.item.sig.ident.unraw().to_string(),
                Some(quote!(.named_after_function())),
            ),
        };
        let template = self.key.literal.value();
        let parts = self.key.template.pieces.iter().map(|piece| match piece {
            Piece::Text(text) => quote!(#krate::#private::Part::Text(#text)),
            Piece::Placeholder(placeholder) => {
                let path = placeholder.display();
                let path = &path[1..path.len() - 1];
                quote!(#krate::#private::Part::Value(#path))
            }
        });
        let keep = self
            .args
            .keep
            .map(|seconds| quote!(.keep_for(::core::time::Duration::from_secs(#seconds))));
        let redact = self.args.redact_key.map(|_| quote!(.redact_key()));
        let inputs = self.args.fingerprint.as_ref().map(|inputs| {
            let names = inputs.iter().map(|input| &input.name);
            quote!(.fingerprint_inputs(&[#(#names),*]))
        });
        quote! {
            static #job_static: #krate::#private::Job =
                #krate::#private::Job::new(#name, #template)
                    #named_after_function #keep #redact #inputs;
            #krate::#private::inventory::submit! {
                #krate::#private::RegisteredJob::new(
                    &#job_static,
                    &[#(#parts),*],
                    ::core::file!(),
                    ::core::line!(),
                )
            }
        }
    }

    fn build_key(&self, krate: &TokenStream, writer: &Ident) -> TokenStream {
        let private = private_module();
        let escapes = self.key.template.escapes();
        let capacity: usize = self
            .key
            .template
            .pieces
            .iter()
            .map(|piece| match piece {
                Piece::Text(text) => text.len(),
                Piece::Placeholder(_) => 16,
            })
            .sum();
        let pushes = self.key.template.pieces.iter().map(|piece| match piece {
            Piece::Text(text) => quote! { #writer.text(#text); },
            Piece::Placeholder(placeholder) => {
                let (value, span) = self.value_expr(&placeholder.path);
                // Spanned at the parameter, so "does not implement `Display`" points at it.
                quote_spanned! {span=>
                    #krate::#private::KeyValue::write_key(&#value, &mut #writer);
                }
            }
        });
        quote! {
            let mut #writer = #krate::#private::KeyWriter::new(#capacity, &[#(#escapes),*]);
            #(#pushes)*
            #writer.finish()
        }
    }

    /// The call: job, key, and the fingerprint of the inputs the attribute names.
    fn job_call(&self, krate: &TokenStream, job_static: &Ident, key_var: &Ident) -> TokenStream {
        let private = private_module();
        let call = quote!(#krate::#private::JobCall::new(&#job_static, &#key_var));
        let Some(inputs) = &self.args.fingerprint else {
            return call;
        };
        let builder = Ident::new("__idempotent_fingerprint", Span::mixed_site());
        let adds = inputs.iter().map(|input| {
            let (value, span) = self.value_expr(&input.path);
            let name = &input.name;
            // Spanned at the parameter, so "does not implement `Serialize`" points at it.
            quote_spanned! {span=>
                let #builder = #krate::#private::FingerprintInput::add_to(&#value, #name, #builder);
            }
        });
        quote! {{
            let #builder = #krate::#private::FingerprintBuilder::default();
            #(#adds)*
            #call.fingerprint_result(#builder.finish())
        }}
    }

    /// The expression for a placeholder's value, and the span to blame for it.
    fn value_expr(&self, path: &[Segment]) -> (TokenStream, Span) {
        let mut segments = path.iter();
        let (mut expr, span) = match segments.next() {
            Some(Segment::Name(root)) if root == "self" => {
                let receiver = self
                    .handler
                    .receiver
                    .map_or_else(Span::call_site, |r| r.self_token.span);
                let token = Ident::new("self", receiver);
                (quote!(#token), receiver)
            }
            Some(Segment::Name(root)) => {
                let param = self
                    .handler
                    .params
                    .iter()
                    .find(|p| p.ident.unraw() == root.as_str());
                match param {
                    Some(param) => {
                        let ident = &param.ident;
                        (quote!(#ident), param_span(param))
                    }
                    None => (quote!(#root), Span::call_site()),
                }
            }
            _ => (quote!(), Span::call_site()),
        };
        for segment in segments {
            match segment {
                Segment::Name(name) => {
                    let field = if template::is_keyword(name) {
                        Ident::new_raw(name, self.key.literal.span())
                    } else {
                        format_ident!("{}", name, span = self.key.literal.span())
                    };
                    expr = quote!(#expr.#field);
                }
                Segment::Index(index) => {
                    let index = syn::Index {
                        index: *index,
                        span: self.key.literal.span(),
                    };
                    expr = quote!(#expr.#index);
                }
            }
        }
        (expr, span)
    }
}
