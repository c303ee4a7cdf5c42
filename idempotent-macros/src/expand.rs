//! The expand phase: writes the wrapper around a handler that passed every check. Generated paths
//! go through the runtime's versioned private module, so a facade and a macro crate of different
//! versions fail to compile with a message naming that module.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens as _, format_ident, quote, quote_spanned};
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
        if self.handler.receiver.is_none() && self.args.no_companion.is_none() {
            self.expand_with_companion()
        } else {
            self.expand_inline()
        }
    }

    /// A method (or `no_companion`): the wrapper holds the job's description and the run.
    fn expand_inline(&self) -> TokenStream {
        let item = self.handler.item;
        let attrs = &item.attrs;
        let vis = &item.vis;
        let sig = &item.sig;
        let krate = self.krate();
        let private = private_module();
        let mixed = Span::mixed_site();
        let key_var = Ident::new("__idempotent_key", mixed);
        let writer = Ident::new("__idempotent_writer", mixed);
        let job_static = Ident::new("__IDEMPOTENT_JOB", mixed);
        let job = self.job(&krate, &job_static);
        let build_key = self.build_key(&krate, &writer, false);
        let run = self.run(&quote!(&#job_static), &key_var);
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

    /// A free function: the function keeps its signature and forwards to its companion, a type of
    /// the same name (types and functions live in different namespaces, so the name cannot clash
    /// with a function) whose associated functions give the job, the key from the handler's key
    /// inputs, and the run that says whether it ran or replayed.
    fn expand_with_companion(&self) -> TokenStream {
        let item = self.handler.item;
        let attrs = &item.attrs;
        let vis = &item.vis;
        let sig = &item.sig;
        let name = &sig.ident;
        let krate = self.krate();
        let private = private_module();
        let mixed = Span::mixed_site();
        let key_var = Ident::new("__idempotent_key", mixed);
        let writer = Ident::new("__idempotent_writer", mixed);
        let job_static = Ident::new("__IDEMPOTENT_JOB", mixed);
        let job = self.job(&krate, &job_static);
        // The companion's `key` takes its inputs by reference.
        let build_key = self.build_key(&krate, &writer, true);
        let asynchronous = self.handler.is_async();
        let awaited = asynchronous.then(|| quote!(.await));

        // `cfg` goes wherever the function goes; lints apply to the body, which now sits in
        // `outcome` (an `expect` there, so that it is not also expected of the wrapper).
        let cfgs: Vec<_> = attrs.iter().filter(|a| a.path().is_ident("cfg")).collect();
        let lints: Vec<TokenStream> = attrs
            .iter()
            .filter_map(|attr| {
                let path = attr.path();
                if ["allow", "warn", "deny", "forbid"]
                    .iter()
                    .any(|l| path.is_ident(l))
                {
                    Some(quote!(#attr))
                } else if path.is_ident("expect") {
                    let syn::Meta::List(list) = &attr.meta else {
                        return None;
                    };
                    let tokens = &list.tokens;
                    Some(quote!(#[allow(#tokens)]))
                } else {
                    None
                }
            })
            .collect();

        // The key's inputs, in the order of the signature, each by reference.
        let roots: Vec<String> = self
            .key
            .template
            .pieces
            .iter()
            .filter_map(|piece| match piece {
                Piece::Placeholder(p) => match p.path.first() {
                    Some(Segment::Name(root)) => Some(root.clone()),
                    _ => None,
                },
                Piece::Text(_) => None,
            })
            .collect();
        let key_params: Vec<_> = self
            .handler
            .params
            .iter()
            .filter(|p| roots.iter().any(|r| p.ident.unraw() == r.as_str()))
            .collect();
        let key_inputs = key_params.iter().map(|param| {
            let ident = &param.ident;
            let ty = match &param.ty {
                syn::Type::Reference(reference) => {
                    let mut shared = reference.clone();
                    shared.mutability = None;
                    quote!(#shared)
                }
                ty => quote!(&#ty),
            };
            quote!(#ident: #ty)
        });
        let key_args = key_params.iter().map(|param| {
            let ident = &param.ident;
            match &param.ty {
                syn::Type::Reference(reference) if reference.mutability.is_some() => {
                    quote!(&*#ident)
                }
                syn::Type::Reference(_) => quote!(#ident),
                _ => quote!(&#ident),
            }
        });
        let key_types: Vec<TokenStream> = key_params
            .iter()
            .map(|p| {
                let ty = &p.ty;
                quote!(#ty)
            })
            .collect();
        let (key_generics, key_where) = generics_used_by(&sig.generics, &key_types);

        // `outcome`: the handler's own signature, returning the `Outcome`.
        let (ok, err) = result_parts(&sig.output, &krate);
        let mut outcome_sig = sig.clone();
        outcome_sig.ident = Ident::new("outcome", name.span());
        outcome_sig.output = syn::parse_quote! {
            -> ::core::result::Result<#krate::#private::Outcome<#ok>, #err>
        };
        let run = self.run(&quote!(Self::job()), &key_var);

        // The function: its signature as written (patterns bound to names), forwarding.
        let mut forward_sig = sig.clone();
        let mut forward_args = Vec::new();
        for (index, input) in forward_sig.inputs.iter_mut().enumerate() {
            if let syn::FnArg::Typed(typed) = input {
                let ident = match &*typed.pat {
                    syn::Pat::Ident(pat) => pat.ident.clone(),
                    _ => Ident::new(&format!("__idempotent_arg{index}"), mixed),
                };
                *typed.pat = syn::parse_quote!(#ident);
                forward_args.push(ident);
            }
        }
        let turbofish = {
            let params: Vec<_> = sig
                .generics
                .params
                .iter()
                .filter_map(|param| match param {
                    syn::GenericParam::Type(t) => {
                        let ident = &t.ident;
                        Some(quote!(#ident))
                    }
                    syn::GenericParam::Const(c) => {
                        let ident = &c.ident;
                        Some(quote!(#ident))
                    }
                    syn::GenericParam::Lifetime(_) => None,
                })
                .collect();
            (!params.is_empty()).then(|| quote!(::<#(#params),*>))
        };
        // A caller that only calls `outcome` uses the handler: no dead-code warning for the
        // function, which still gets one when neither is used. (Not where an `impl Trait`
        // parameter leaves the function's type to inference.)
        // `impl Trait` anywhere in a parameter's type (`&impl Mailer`, `Option<impl Fn()>`) is a
        // type parameter the function's path alone cannot name.
        let impl_trait_param = sig.inputs.iter().any(|input| match input {
            syn::FnArg::Typed(typed) => mentions_impl(typed.ty.to_token_stream()),
            syn::FnArg::Receiver(_) => false,
        });
        let uses_function = (!impl_trait_param).then(|| quote!(let _ = #name #turbofish;));
        let forward = quote! {
            #name::outcome #turbofish (#(#forward_args),*)#awaited
                .map(#krate::#private::Outcome::into_inner)
        };
        let mut forward = proc_macro2::Group::new(proc_macro2::Delimiter::Brace, forward);
        forward.set_span(item.body_span);

        let doc = format!(
            "The job, the key and the outcome of [`{name}`](fn@{name}), generated by `#[idempotent_job]`.\n\n\
             `{name}::key(..)` builds the key a call with those inputs claims (for look-ups and for \
             `forget`), `{name}::job()` is the job's description, and `{name}::outcome(..)` runs the \
             handler as `{name}(..)` does and says whether it ran or replayed."
        );
        let key_doc = "The key a call with these inputs claims, escaped as the handler escapes it.";
        let outcome_doc = format!(
            "Runs [`{name}`](fn@{name}) and says whether its body ran or a stored result was replayed."
        );
        quote! {
            #(#attrs)*
            #vis #forward_sig #forward

            #(#cfgs)*
            #[doc = #doc]
            #[allow(non_camel_case_types)]
            #vis struct #name {}

            // `outcome` alone is not allowed to be dead: it and the function keep each other alive,
            // so a handler nobody calls still gets its dead-code warning.
            #(#cfgs)*
            #[allow(clippy::needless_lifetimes)]
            impl #name {
                /// The job's description: its name, key template and settings.
                #[allow(dead_code)]
                #vis fn job() -> &'static #krate::#private::Job {
                    #job
                    &#job_static
                }

                #[doc = #key_doc]
                #[allow(dead_code)]
                #vis fn key #key_generics (#(#key_inputs),*) -> #krate::#private::JobKey #key_where {
                    #build_key
                }

                #[doc = #outcome_doc]
                #(#lints)*
                #vis #outcome_sig {
                    #uses_function
                    let #key_var = Self::key(#(#key_args),*);
                    #run
                }
            }
        }
    }

    /// The call of the runtime for `job` and the key in `key_var`, the body as a closure.
    fn run(&self, job: &TokenStream, key_var: &Ident) -> TokenStream {
        let item = self.handler.item;
        let sig = &item.sig;
        let body = &item.body;
        let private = private_module();
        let store = Ident::new("__idempotent_conn", Span::mixed_site());
        let conn = &self.handler.conn().ident;
        let (output, output_span) = match &sig.output {
            syn::ReturnType::Type(_, ty) => (quote!(#ty), syn::spanned::Spanned::span(ty)),
            syn::ReturnType::Default => (quote!(()), Span::call_site()),
        };
        // Blame the return type when `T` cannot be stored or `E` cannot hold our errors, and the
        // connection's type when it is not a connection.
        let conn_span = syn::spanned::Spanned::span(&self.handler.conn().ty);
        let krate = self.krate();
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
        let job_call = self.job_call(&krate, job, key_var);
        let krate_at_output = self.krate_at(output_span);
        let awaited = asynchronous.then(|| quote!(.await));
        quote_spanned! {output_span=>
            #krate_at_output::#private::#runner(
                #conn,
                #reach_store,
                #job_call,
                #closure,
            )#awaited
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
        let in_progress = self.args.in_progress.map(|policy| {
            let policy = match policy {
                crate::args::InProgress::Wait => quote!(Wait),
                crate::args::InProgress::Fail => quote!(Fail),
                crate::args::InProgress::WaitAtMost(millis) => {
                    quote!(WaitAtMost(::core::time::Duration::from_millis(#millis)))
                }
            };
            quote!(.while_in_progress(#krate::#private::WhileInProgress::#policy))
        });
        let redact = self.args.redact_key.map(|_| quote!(.redact_key()));
        let inputs = self.args.fingerprint.as_ref().map(|inputs| {
            let names = inputs.iter().map(|input| &input.name);
            quote!(.fingerprint_inputs(&[#(#names),*]))
        });
        quote! {
            static #job_static: #krate::#private::Job =
                #krate::#private::Job::new(#name, #template)
                    #named_after_function #keep #in_progress #redact #inputs;
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

    /// The key's construction. With `by_reference`, a placeholder that names a whole parameter finds
    /// it as a reference already (the companion's `key`), and is passed on as it is, so that a
    /// type error names the parameter's own type.
    fn build_key(&self, krate: &TokenStream, writer: &Ident, by_reference: bool) -> TokenStream {
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
                let whole_parameter = placeholder.path.len() == 1
                    && !matches!(placeholder.path.first(), Some(Segment::Name(root)) if root == "self");
                let value = if by_reference && whole_parameter {
                    value
                } else {
                    quote!(&#value)
                };
                // Spanned at the parameter, so "does not implement `Display`" points at it.
                quote_spanned! {span=>
                    #krate::#private::KeyValue::write_key(#value, &mut #writer);
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
    fn job_call(&self, krate: &TokenStream, job: &TokenStream, key_var: &Ident) -> TokenStream {
        let private = private_module();
        let call = quote!(#krate::#private::JobCall::new(#job, &#key_var));
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

/// `T` and `E` of the handler's return type: read off `Result<T, E>` when it is spelled so (for
/// readable docs), else projected through `JobResult` (an alias such as `anyhow::Result<T>`).
fn result_parts(output: &syn::ReturnType, krate: &TokenStream) -> (TokenStream, TokenStream) {
    let private = private_module();
    let syn::ReturnType::Type(_, ty) = output else {
        return (quote!(()), quote!(()));
    };
    if let syn::Type::Path(path) = &**ty
        && let Some(last) = path.path.segments.last()
        && last.ident == "Result"
        && let syn::PathArguments::AngleBracketed(args) = &last.arguments
        && args.args.len() == 2
        && let (Some(syn::GenericArgument::Type(ok)), Some(syn::GenericArgument::Type(err))) =
            (args.args.first(), args.args.last())
    {
        return (quote!(#ok), quote!(#err));
    }
    (
        quote!(<#ty as #krate::#private::JobResult>::Ok),
        quote!(<#ty as #krate::#private::JobResult>::Err),
    )
}

/// The generic parameters (and where-clause predicates) that the key's input types mention, so
/// that `key` can be called without naming the ones it does not need.
fn generics_used_by(generics: &syn::Generics, types: &[TokenStream]) -> (TokenStream, TokenStream) {
    fn mentions(tokens: TokenStream, name: &str) -> bool {
        tokens.into_iter().any(|tree| match tree {
            proc_macro2::TokenTree::Ident(ident) => ident == name,
            proc_macro2::TokenTree::Group(group) => mentions(group.stream(), name),
            proc_macro2::TokenTree::Punct(_) | proc_macro2::TokenTree::Literal(_) => false,
        })
    }
    let used = |name: &str| types.iter().any(|ty| mentions(ty.clone(), name));
    let lifetime_used = |lifetime: &syn::Lifetime| {
        types
            .iter()
            .any(|ty| ty.to_string().contains(&lifetime.to_string()))
    };
    let params: Vec<_> = generics
        .params
        .iter()
        .filter(|param| match param {
            syn::GenericParam::Type(t) => used(&t.ident.to_string()),
            syn::GenericParam::Const(c) => used(&c.ident.to_string()),
            syn::GenericParam::Lifetime(l) => lifetime_used(&l.lifetime),
        })
        .collect();
    let predicates: Vec<_> = generics
        .where_clause
        .iter()
        .flat_map(|w| w.predicates.iter())
        .filter(|predicate| match predicate {
            syn::WherePredicate::Type(t) => {
                let bounded = &t.bounded_ty;
                let bounded = quote!(#bounded);
                params.iter().any(|param| match param {
                    syn::GenericParam::Type(ty) => mentions(bounded.clone(), &ty.ident.to_string()),
                    _ => false,
                })
            }
            syn::WherePredicate::Lifetime(l) => lifetime_used(&l.lifetime),
            _ => false,
        })
        .collect();
    let generics = if params.is_empty() {
        quote!()
    } else {
        quote!(<#(#params),*>)
    };
    let where_clause = if predicates.is_empty() {
        quote!()
    } else {
        quote!(where #(#predicates),*)
    };
    (generics, where_clause)
}

/// Whether `tokens` (a type) contain the keyword `impl` anywhere, nested groups included.
fn mentions_impl(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|token| match token {
        proc_macro2::TokenTree::Ident(ident) => ident == "impl",
        proc_macro2::TokenTree::Group(group) => mentions_impl(group.stream()),
        _ => false,
    })
}
