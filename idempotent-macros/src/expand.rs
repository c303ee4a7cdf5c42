//! Checks the template against the handler and writes the wrapper.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt as _;
use syn::{Ident, LitStr};

use crate::args::Args;
use crate::errors::{Errors, did_you_mean};
use crate::signature::{Handler, param_span};
use crate::template::{self, Piece, Segment, Template};

/// Parses the key template and checks every placeholder against the handler's parameters.
pub fn check_template(
    key: &LitStr,
    args: &Args,
    handler: Option<&Handler<'_>>,
    errors: &mut Errors,
) -> Option<Template> {
    let source = key.value();
    let (template, template_errors) = template::parse(&source);
    let mut ok = template_errors.is_empty();
    for error in template_errors {
        errors.push(syn::Error::new(
            key.span(),
            format!("in key template `{source}`: {}", error.message),
        ));
    }

    if ok && template.placeholders().next().is_none() && args.once.is_none() {
        let example = handler
            .and_then(|h| {
                h.params
                    .iter()
                    .enumerate()
                    .find(|(i, _)| *i != h.conn)
                    .map(|(_, p)| p.ident.unraw().to_string())
            })
            .unwrap_or_else(|| "date".to_owned());
        errors.push(syn::Error::new(
            key.span(),
            format!(
                "the key `{source}` has no placeholder, so every call would share one key and the job would run once, ever. Add the inputs that identify one unit of work (`{source}:<{example}>`), or add `once` to the attribute if that is what you want"
            ),
        ));
        ok = false;
    }
    if let Some(once) = args.once
        && template.placeholders().next().is_some()
    {
        errors.push(syn::Error::new(
            once,
            "`once` is for a key with no placeholders; this key has some, so leave `once` out",
        ));
        ok = false;
    }

    let handler = handler?;
    let names: Vec<String> = handler
        .params
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != handler.conn)
        .map(|(_, p)| p.ident.unraw().to_string())
        .collect();
    for placeholder in template.placeholders() {
        if let Err(message) = check_path(&placeholder.display(), &placeholder.path, handler, &names)
        {
            errors.push(syn::Error::new(
                key.span(),
                format!("in key template `{source}`: {message}"),
            ));
            ok = false;
        }
    }
    for input in args.fingerprint.iter().flatten() {
        if let Err(message) = check_path(&input.name, &input.path, handler, &names) {
            errors.push(syn::Error::new(
                input.span,
                format!(
                    "fingerprint input {}",
                    message.replacen("unknown placeholder ", "", 1)
                ),
            ));
            ok = false;
        }
    }
    ok.then_some(template)
}

/// Checks that a placeholder or fingerprint input names a parameter (or `self`'s field).
fn check_path(
    shown: &str,
    path: &[Segment],
    handler: &Handler<'_>,
    names: &[String],
) -> Result<(), String> {
    let root = match path.first() {
        Some(Segment::Name(name)) => name.as_str(),
        _ => "",
    };
    let function = &handler.item.sig.ident;
    if root == "self" {
        if handler.receiver.is_none() {
            return Err(format!(
                "`{shown}`: `{function}` is not a method, so there is no `self`"
            ));
        }
        if path.len() == 1 {
            return Err(format!(
                "`{shown}` names the whole receiver; name a field of it instead, like `self.id`"
            ));
        }
        return Ok(());
    }
    let conn = &handler.conn().ident;
    if conn.unraw() == root {
        return Err(format!(
            "`{shown}` names the connection parameter `{conn}`; a key is built from the job's inputs, not from the connection"
        ));
    }
    if names.iter().any(|name| name == root) {
        return Ok(());
    }
    let mut message =
        format!("unknown placeholder `{shown}`: `{function}` has no parameter `{root}`");
    if let Some(suggestion) = did_you_mean(root, names.iter().map(String::as_str)) {
        message.push_str(&format!("; did you mean `{suggestion}`?"));
    } else if names.is_empty() {
        message.push_str(" (it has no parameters besides the connection)");
    } else {
        message.push_str(&format!(
            "; its parameters are {}",
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Err(message)
}

/// Everything the wrapper is generated from.
pub struct Expansion<'a> {
    pub handler: &'a Handler<'a>,
    pub template: &'a Template,
    pub key: &'a LitStr,
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
                use #krate::__private::#reach
            }
        };

        // The original block sits unchanged inside the closure; its parameter rebinds the
        // connection under the user's own name and type, so the body reads exactly as written.
        let job_call = self.job_call(&krate, &job_static, &key_var);
        let krate_at_output = self.krate_at(output_span);
        let awaited = asynchronous.then(|| quote!(.await));
        let run = quote_spanned! {output_span=>
            #krate_at_output::__private::#runner(
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
            #run.map(#krate::__private::Outcome::into_inner)
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
        let name = match &self.args.name {
            Some(name) => name.value(),
            None => self.handler.item.sig.ident.unraw().to_string(),
        };
        let template = self.key.value();
        let parts = self.template.pieces.iter().map(|piece| match piece {
            Piece::Text(text) => quote!(#krate::__private::Part::Text(#text)),
            Piece::Placeholder(placeholder) => {
                let path = placeholder.display();
                let path = &path[1..path.len() - 1];
                quote!(#krate::__private::Part::Value(#path))
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
            static #job_static: #krate::__private::Job =
                #krate::__private::Job::new(#name, #template) #keep #redact #inputs;
            #krate::__private::inventory::submit! {
                #krate::__private::RegisteredJob::new(
                    &#job_static,
                    &[#(#parts),*],
                    ::core::file!(),
                    ::core::line!(),
                )
            }
        }
    }

    fn build_key(&self, krate: &TokenStream, writer: &Ident) -> TokenStream {
        let escapes = self.template.escapes();
        let capacity: usize = self
            .template
            .pieces
            .iter()
            .map(|piece| match piece {
                Piece::Text(text) => text.len(),
                Piece::Placeholder(_) => 16,
            })
            .sum();
        let pushes = self.template.pieces.iter().map(|piece| match piece {
            Piece::Text(text) => quote! { #writer.text(#text); },
            Piece::Placeholder(placeholder) => {
                let (value, span) = self.value_expr(&placeholder.path);
                // Spanned at the parameter, so "does not implement `Display`" points at it.
                quote_spanned! {span=>
                    #krate::__private::KeyValue::write_key(&#value, &mut #writer);
                }
            }
        });
        quote! {
            let mut #writer = #krate::__private::KeyWriter::new(#capacity, &[#(#escapes),*]);
            #(#pushes)*
            #writer.finish()
        }
    }

    /// The call: job, key, and the fingerprint of the inputs the attribute names.
    fn job_call(&self, krate: &TokenStream, job_static: &Ident, key_var: &Ident) -> TokenStream {
        let call = quote!(#krate::__private::JobCall::new(&#job_static, &#key_var));
        let Some(inputs) = &self.args.fingerprint else {
            return call;
        };
        let builder = Ident::new("__idempotent_fingerprint", Span::mixed_site());
        let adds = inputs.iter().map(|input| {
            let (value, span) = self.value_expr(&input.path);
            let name = &input.name;
            // Spanned at the parameter, so "does not implement `Serialize`" points at it.
            quote_spanned! {span=>
                let #builder = #krate::__private::FingerprintInput::add_to(&#value, #name, #builder);
            }
        });
        quote! {{
            let #builder = #krate::__private::FingerprintBuilder::default();
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
                        Ident::new_raw(name, self.key.span())
                    } else {
                        format_ident!("{}", name, span = self.key.span())
                    };
                    expr = quote!(#expr.#field);
                }
                Segment::Index(index) => {
                    let index = syn::Index {
                        index: *index,
                        span: self.key.span(),
                    };
                    expr = quote!(#expr.#index);
                }
            }
        }
        (expr, span)
    }
}
