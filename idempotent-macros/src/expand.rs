//! The expand phase: the wrapper around a handler that passed every check, and its companion.
//!
//! The handler stays the user's function: its attributes, visibility, signature (bindings, `mut`,
//! patterns) and body as written; only the body moves into a closure that the runtime runs once
//! per key, and the connection's `mut`, if any, moves with it onto the closure's parameter, where
//! the body uses the connection. Lints see the function as the user wrote it, once.
//!
//! Everything else is generated code, and spanned so: tokens copied from the signature into
//! generated items keep their place for error messages but take the attribute's expansion as their
//! context (`Span::call_site().located_at(..)`), so that lints, which skip code from another crate's
//! macro, never report the user's code twice or through generated items.
//!
//! A free function gets a companion: a hidden type holding the job's description, the key and an
//! `outcome` that calls the handler and says whether it ran or replayed, aliased under the
//! function's name (types and functions live in different namespaces). The handler itself reaches
//! the hidden type by its own name, so a type or module of the user's that takes the function's
//! name fails only the alias, with one error. A method, an associated function (one that mentions
//! `Self`, or that its source file shows in an `impl` or `trait` block: `crate::scope`) and
//! `no_companion` get none: the job's description then lives in the function.
//!
//! Generated paths go through the runtime's versioned private module, so a facade and a macro crate
//! of different versions fail to compile with a message naming that module.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens as _, format_ident, quote, quote_spanned};
use syn::Ident;
use syn::ext::IdentExt as _;

use idempotent_keys::template::{self, Piece, Segment};

use crate::args::Args;
use crate::check::KeyTemplate;
use crate::private_path::private_module_at;
use crate::signature::{Handler, param_span};

mod companion;

/// The runtime's private module for generated code, named with this crate's version, which the
/// facade pins exactly.
fn private_module() -> Ident {
    private_module_at(Span::call_site())
}

/// `tokens`, each placed where it is but in the attribute's expansion: errors still point at the
/// user's tokens, and lints, which skip another crate's macro output, do not report them again.
/// `$crate` keeps its own span, which says which crate it means.
pub fn respan(tokens: TokenStream) -> TokenStream {
    tokens
        .into_iter()
        .map(|tree| match tree {
            TokenTree::Group(group) => {
                let mut respanned =
                    proc_macro2::Group::new(group.delimiter(), respan(group.stream()));
                respanned.set_span(Span::call_site().located_at(group.span()));
                TokenTree::Group(respanned)
            }
            TokenTree::Ident(ident) if ident == "$crate" => TokenTree::Ident(ident),
            mut other => {
                other.set_span(Span::call_site().located_at(other.span()));
                other
            }
        })
        .collect()
}

/// `ident` where the user wrote it, in the attribute's expansion: for a name the companion declares
/// and uses itself.
pub fn located(ident: &Ident) -> Ident {
    let mut located = ident.clone();
    located.set_span(Span::call_site().located_at(ident.span()));
    located
}

/// The spans of the first and the last token of `tokens`, for generated code whose errors should
/// underline all of them (rustc joins the spans of an expression's first and last token).
pub fn first_and_last(tokens: &TokenStream) -> (Span, Span) {
    fn last(tokens: TokenStream) -> Option<Span> {
        tokens.into_iter().last().map(|tree| match tree {
            TokenTree::Group(group) => group.span_close(),
            other => other.span(),
        })
    }
    let first = tokens
        .clone()
        .into_iter()
        .next()
        .map_or_else(Span::call_site, |tree| match tree {
            TokenTree::Group(group) => group.span_open(),
            other => other.span(),
        });
    let last = last(tokens.clone()).unwrap_or(first);
    (
        Span::call_site().located_at(first),
        Span::call_site().located_at(last),
    )
}

/// Everything the wrapper is generated from.
pub struct Expansion<'a> {
    pub handler: &'a Handler<'a>,
    pub key: &'a KeyTemplate,
    pub args: &'a Args,
    /// Whether a companion stands beside the function (see `wants_companion`).
    pub companion: bool,
}

impl Expansion<'_> {
    pub fn expand(&self) -> TokenStream {
        let handler = self.handler;
        if self.companion {
            let hidden = format_ident!(
                "__IdempotentJob_{}",
                handler.name(),
                span = Span::call_site()
            );
            let function = self.function(Some(&hidden));
            let companion = self.companion(&hidden);
            quote! { #companion #function }
        } else {
            self.function(None)
        }
    }

    /// The handler: the user's function, its body run by the runtime. With a companion, the job
    /// and the key come from it (through the hidden type); without, the job is a static here.
    fn function(&self, hidden: Option<&Ident>) -> TokenStream {
        let item = self.handler.item;
        let attrs = &item.attrs;
        let vis = &item.vis;
        let sig = self.signature_without_conn_mut();
        let krate = self.krate();
        let mixed = Span::mixed_site();
        let key_var = Ident::new("__idempotent_key", mixed);
        let job_static = Ident::new("__IDEMPOTENT_JOB", mixed);
        let (setup, job, key) = match hidden {
            Some(hidden) => {
                let args = self.key_params().into_iter().map(key_argument);
                let turbofish = self.key_generics().turbofish;
                (
                    quote!(),
                    quote!(<#hidden>::job()),
                    quote!(<#hidden>::key #turbofish (#(#args),*)),
                )
            }
            None => {
                let writer = Ident::new("__idempotent_writer", mixed);
                let build = self.build_key(&krate, &writer, false);
                (
                    self.job(&krate, &job_static),
                    quote!(&#job_static),
                    quote!({ #build }),
                )
            }
        };
        let run = self.run(&job, &key_var);
        let body = quote! {
            #setup
            let #key_var = #key;
            #run
        };
        let mut body = proc_macro2::Group::new(proc_macro2::Delimiter::Brace, body);
        body.set_span(item.body_span);
        quote! {
            #(#attrs)*
            #vis #sig #body
        }
    }

    /// The signature as written, but for the connection's `mut` and lint attributes: the
    /// connection is only handed on here, and rebound (with the `mut` and the lint attributes) as
    /// the body's closure's parameter, where the body uses it.
    fn signature_without_conn_mut(&self) -> syn::Signature {
        let mut sig = self.handler.item.sig.clone();
        let position = self.handler.conn().position;
        if let Some(syn::FnArg::Typed(typed)) = sig.inputs.iter_mut().nth(position) {
            typed.attrs.retain(|attr| !is_lint_attribute(attr));
            if let syn::Pat::Ident(pat) = &mut *typed.pat {
                pat.mutability = None;
            }
        }
        sig
    }

    /// The connection's pattern as written (`conn`, `mut conn`), with its lint attributes
    /// (`#[allow(unused_variables)]`), for the body's closure.
    fn conn_pattern(&self) -> TokenStream {
        let position = self.handler.conn().position;
        match self.handler.item.sig.inputs.iter().nth(position) {
            Some(syn::FnArg::Typed(typed)) => {
                let attrs = typed.attrs.iter().filter(|attr| is_lint_attribute(attr));
                let pat = &typed.pat;
                quote!(#(#attrs)* #pat)
            }
            _ => self.handler.conn().ident.to_token_stream(),
        }
    }

    /// The runtime's run of the body: `<Ret as JobResult>::run_sync(conn, reach, call, body)`.
    /// The path is spanned across the return type, so that "not a `Result`" and "cannot be stored"
    /// underline it; the reach at the connection's type, so that "not a connection" points there.
    fn run(&self, job: &TokenStream, key_var: &Ident) -> TokenStream {
        let handler = self.handler;
        let body = &handler.item.body;
        let private = private_module();
        let store = Ident::new("__idempotent_conn", Span::mixed_site());
        let conn = &handler.conn().ident;
        let conn_pattern = self.conn_pattern();
        let ret = respan(handler.output.ty.to_token_stream());
        let asynchronous = handler.is_async();
        let (runner, reach_trait, reach_method, closure, awaited) = if asynchronous {
            (
                self.result_item("run_async"),
                quote!(AsyncJobConnection),
                "async_job_connection",
                quote!(async move |#conn_pattern| -> #ret #body),
                Some(quote!(.await)),
            )
        } else {
            (
                self.result_item("run_sync"),
                quote!(JobConnection),
                "job_connection",
                quote!(move |#conn_pattern| -> #ret #body),
                None,
            )
        };
        let conn_ty = handler.conn().ty.to_token_stream();
        let (_, conn_last) = first_and_last(&conn_ty);
        let reach_method = Ident::new(reach_method, conn_last);
        let krate = self.krate();
        let reach = quote! {
            |#store| {
                use #krate::#private::#reach_trait as _;
                #store.#reach_method()
            }
        };
        let job_call = self.job_call(&krate, job, key_var);
        let (compared, equality) = self.equality(&ret);
        quote! {
            #compared
            #runner(
                #conn,
                #reach,
                #job_call,
                #equality,
                #closure,
            )#awaited
        }
    }

    /// The result type's `PartialEq`, where it has one (`None` otherwise), found where the return
    /// type `ret` is known: `Compared<Result<T, E>>` has it by value when `T: PartialEq`, and
    /// `&Compared<R>` always answers `None` (one autoref later), for `Compared::<Ret>::NEW.equality()`. A replay must return what the
    /// first run returned, and values serde writes alike are told apart only by `==`.
    ///
    /// The `use` of the two traits, a statement before the call, and the expression: spanned from
    /// the return type's first token to its last, as the runner's path is, so that a return type
    /// that is not a `Result` is reported once (the argument's type names `<Ret as JobResult>::Ok`).
    fn equality(&self, ret: &TokenStream) -> (TokenStream, TokenStream) {
        let private = private_module();
        let krate = self.krate();
        let compared = quote! {
            use #krate::#private::{ComparedByEq as _, ComparedByShape as _};
        };
        let (first, last) = first_and_last(&self.handler.output.ty.to_token_stream());
        let (krate, private) = (
            self.krate_at(first),
            Ident::new(&private.to_string(), first),
        );
        let compared_type = quote_spanned!(first=> #krate::#private::Compared::<#ret>::);
        let (new, method) = (Ident::new("NEW", last), Ident::new("equality", last));
        let mut arguments = proc_macro2::Group::new(proc_macro2::Delimiter::Parenthesis, quote!());
        arguments.set_span(last);
        let dot = quote_spanned!(last=> .);
        (
            compared,
            quote!(#compared_type #new #dot #method #arguments),
        )
    }

    /// `<Ret as JobResult>::item`, its first token placed at the return type's first and its last
    /// at the return type's last, so that an error about `Ret: JobResult` underlines the return
    /// type; every use of it is placed alike, so that rustc reports such an error once.
    fn result_item(&self, item: &str) -> TokenStream {
        let output = self.handler.output.ty.to_token_stream();
        let (first, last) = first_and_last(&output);
        let ret = respan(output);
        let private = private_module();
        let krate = self.krate();
        let item = Ident::new(item, last);
        let open = quote_spanned!(first=> <);
        quote!(#open #ret as #krate::#private::JobResult>::#item)
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
            None => (self.handler.name(), Some(quote!(.named_after_function()))),
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
        let keep = self.args.keep.map(|keep| {
            let (secs, nanos) = (keep.as_secs(), keep.subsec_nanos());
            quote!(.keep_for(::core::time::Duration::new(#secs, #nanos)))
        });
        let in_progress = self.args.in_progress.map(|policy| {
            let policy = match policy {
                crate::args::InProgress::Wait => quote!(Wait),
                crate::args::InProgress::Fail => quote!(Fail),
                crate::args::InProgress::WaitAtMost(limit) => {
                    let (secs, nanos) = (limit.as_secs(), limit.subsec_nanos());
                    quote!(WaitAtMost(::core::time::Duration::new(#secs, #nanos)))
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

    /// The parameters the key reads, in the order of the signature.
    fn key_params(&self) -> Vec<&crate::signature::Param> {
        let roots: Vec<String> = self
            .key
            .template
            .placeholders()
            .filter_map(|placeholder| match placeholder.path.first() {
                Some(Segment::Name(root)) => Some(root.clone()),
                _ => None,
            })
            .collect();
        self.handler
            .params
            .iter()
            .filter(|p| roots.iter().any(|r| p.ident.unraw() == r.as_str()))
            .collect()
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
                    quote_spanned!(span=> &#value)
                };
                // Spanned at the parameter, so "does not implement `Display`" points at it; a
                // call of the trait's own method, so the error is the trait's message alone.
                let krate = self.krate_at(span);
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
            let (mut value, span) = self.value_expr(&input.path);
            let name = &input.name;
            let krate = self.krate_at(span);
            if let Some(depth) = self.hash_set_depth(&input.path) {
                // Its elements in an order of their own, not the set's (`Unordered`).
                let derefs = (0..depth).map(|_| quote!(*));
                value = quote_spanned!(span=> #krate::#private::Unordered(&#(#derefs)* #value));
            }
            // Spanned at the parameter, so "does not implement `Serialize`" points at it.
            quote_spanned! {span=>
                let #builder = #krate::#private::FingerprintInput::add_to(&#value, #name, #builder);
            }
        });
        quote! {{
            // Not through the prelude's `Default`: a module may have `#[no_implicit_prelude]`.
            let #builder =
                <#krate::#private::FingerprintBuilder as ::core::default::Default>::default();
            #(#adds)*
            #call.fingerprint_result(#builder.finish())
        }}
    }

    /// Where a fingerprint input is a parameter whose type is a `HashSet` (`FxHashSet`,
    /// `AHashSet`: a path whose last segment is one of the three names; not a set that keeps an
    /// order of its own, such as `IndexSet`), behind how many references.
    fn hash_set_depth(&self, path: &[Segment]) -> Option<usize> {
        let [Segment::Name(root)] = path else {
            return None;
        };
        let param = self
            .handler
            .params
            .iter()
            .find(|p| p.ident.unraw() == root.as_str())?;
        let mut ty = crate::signature::strip_groups(&param.ty);
        let mut depth = 0;
        while let syn::Type::Reference(reference) = ty {
            ty = crate::signature::strip_groups(&reference.elem);
            depth += 1;
        }
        match &ty {
            syn::Type::Path(path) if path.qself.is_none() => path
                .path
                .segments
                .last()
                .is_some_and(|last| {
                    ["HashSet", "FxHashSet", "AHashSet"].contains(&last.ident.to_string().as_str())
                })
                .then_some(depth),
            _ => None,
        }
    }

    /// The expression for a placeholder's value, and the span to blame for it: the parameter as
    /// the user wrote it (the companion's `key` declares its parameters with the same tokens, so
    /// that they resolve alike when a `macro_rules!` made the handler, and errors point at them).
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
            // The literal's own span: an unknown field is the template's, and rustc then lists
            // the fields there are.
            let at = self.key.literal.span();
            match segment {
                Segment::Name(name) => {
                    let field = if template::is_keyword(name) {
                        Ident::new_raw(name, at)
                    } else {
                        format_ident!("{}", name, span = at)
                    };
                    expr = quote!(#expr.#field);
                }
                Segment::Index(index) => {
                    let index = syn::Index {
                        index: *index,
                        span: at,
                    };
                    expr = quote!(#expr.#index);
                }
            }
        }
        (expr, span)
    }
}

/// A lint level (`allow`, `expect`, `warn`, `deny`, `forbid`), or a `cfg_attr` that may set one.
fn is_lint_attribute(attr: &syn::Attribute) -> bool {
    ["allow", "expect", "warn", "deny", "forbid", "cfg_attr"]
        .iter()
        .any(|name| attr.path().is_ident(name))
}

/// How the handler passes a key input to the companion's `key`, which takes each by reference.
fn key_argument(param: &crate::signature::Param) -> TokenStream {
    let ident = &param.ident;
    match crate::signature::strip_groups(&param.ty) {
        syn::Type::Reference(reference) if reference.mutability.is_some() => quote!(&*#ident),
        syn::Type::Reference(_) => quote!(#ident),
        _ => quote!(&#ident),
    }
}
